"""``tl.bundle``: named runs of one model side by side, compared site by site against a baseline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from torchlens_core.capture.selectors import Selector, find
from torchlens_core.compare.metrics import Difference, as_numpy, difference
from torchlens_core.ir.errors import ArgumentTypeError, LabelNotFoundError, UnsupportedError, shown
from torchlens_core.ir.records import ModulePass, OpRecord, refs_in
from torchlens_core.ir.trace import Trace

COLUMNS = {
    "run": "string",
    "baseline": "bool",
    "edited": "bool",
    "max_abs_diff": "Float64",
    "rel_l2_diff": "Float64",
    "cosine": "Float64",
    "norm": "Float64",
    "note": "string",
}


@attrs.frozen
class RunAtSite:
    """One run's value at the compared site, against the baseline's."""

    run: str
    baseline: bool
    edited: bool  # an intervention changed this site's value in this run
    difference: Difference | None  # None when the run has no value there (see note)
    note: str = ""


@attrs.frozen
class SiteComparison:
    """``bundle.compare_at(site)``: one row per run; prints as a table, ``.to_pandas()`` for a DataFrame."""

    site: str
    rows: tuple[RunAtSite, ...]

    def to_pandas(self) -> Any:
        from torchlens_core.views.tables import frame

        return frame([_row(r) for r in self.rows], COLUMNS)

    def __str__(self) -> str:
        header, body = self._rows()
        widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
        lines = [f"Site {self.site}, against the baseline:"]
        for row in (header, *body):
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """A notebook shows the runs as a table."""
        from torchlens_core.ir.html import table

        header, body = self._rows()
        return table(body, header=header, caption=f"Site {self.site}, against the baseline:")

    def _rows(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        header: tuple[str, ...] = ("run", "max |diff|", "rel L2", "cosine", "norm", "")
        body: list[tuple[str, ...]] = []
        for r in self.rows:
            d = r.difference
            marks = ", ".join(m for m, on in (("baseline", r.baseline), ("edited", r.edited)) if on)
            if d is None or d.shape_mismatch:
                body.append((r.run, "-", "-", "-", "-" if d is None else f"{d.norm:.4g}", r.note or "shape differs"))
            else:
                cos = "-" if d.cosine is None else f"{d.cosine:.6f}"
                body.append(
                    (
                        r.run,
                        f"{d.max_abs:.4g}",
                        f"{d.rel_l2:.4g}",
                        cos,
                        f"{d.norm:.4g}",
                        ", ".join(filter(None, (marks, r.note))),
                    )
                )
        return header, body

    __repr__ = __str__


def _row(r: RunAtSite) -> dict[str, Any]:
    d = r.difference
    usable = d if d is not None and not d.shape_mismatch else None
    return {
        "run": r.run,
        "baseline": r.baseline,
        "edited": r.edited,
        "max_abs_diff": usable.max_abs if usable else None,
        "rel_l2_diff": usable.rel_l2 if usable else None,
        "cosine": usable.cosine if usable else None,
        "norm": d.norm if d is not None else None,
        "note": r.note,
    }


class Bundle:
    """Named traces of the same model; ``compare_at(site)`` sets each beside the baseline."""

    def __init__(self, runs: Mapping[str, Trace], baseline: str) -> None:
        if not isinstance(runs, Mapping) or not runs:
            raise ArgumentTypeError(
                "tl.bundle takes a dict of named traces: tl.bundle({'clean': a, 'patched': b}, baseline='clean')"
            )
        for name, run in runs.items():
            if not isinstance(run, Trace):
                raise ArgumentTypeError(f"run {name!r} of the bundle is a {type(run).__name__}, not a trace")
        if baseline not in runs:
            raise LabelNotFoundError(f"baseline {shown(baseline)} is not one of the runs: {', '.join(map(repr, runs))}")
        models = {run.model_name for run in runs.values()}
        if len(models) > 1:
            raise UnsupportedError(
                f"a bundle holds runs of one model; these are of {', '.join(sorted(models))} "
                f"(tl.compare sets different models side by side)"
            )
        self.runs = dict(runs)
        self.baseline = baseline

    def __getitem__(self, name: str) -> Trace:
        return self.runs[name]

    def __repr__(self) -> str:
        return f"<Bundle of {len(self.runs)} runs of {self.runs[self.baseline].model_name}, baseline {self.baseline!r}>"

    def _repr_html_(self) -> str:
        """A notebook shows the runs: name, ops, edits, and which is the baseline."""
        from torchlens_core.ir.html import table

        rows = [
            (name, len(run.ops), len(run.interventions), "baseline" if name == self.baseline else "")
            for name, run in self.runs.items()
        ]
        return table(rows, header=("run", "ops", "edits", ""), caption=repr(self))

    def compare_at(self, site: str | Selector) -> SiteComparison:
        """Every run's value at ``site`` (a label, a module path, or a selector picking one op) vs the baseline's."""
        key = self._key(site)
        base_value, _ = _value(self.runs[self.baseline], key)
        if base_value is None:
            raise UnsupportedError(
                f"the baseline {self.baseline!r} holds no value at {key}: capture it with a save= that keeps it"
            )
        base = self.runs[self.baseline]
        expected = as_numpy(base_value, base.backend)
        rows = []
        for name, run in self.runs.items():
            value, edited = _value(run, key)
            if value is None:
                rows.append(RunAtSite(name, name == self.baseline, edited, None, "no value saved here"))
                continue
            rows.append(
                RunAtSite(name, name == self.baseline, edited, difference(as_numpy(value, run.backend), expected))
            )
        return SiteComparison(key, tuple(rows))

    def _key(self, site: str | Selector) -> str:
        base = self.runs[self.baseline]
        if isinstance(site, Selector):
            picked = find(base, site)
            if len(picked) != 1:
                shown_labels = ", ".join(op.label for op in picked[:8])
                raise LabelNotFoundError(
                    f"{shown(site, 120)} picks {len(picked)} sites in the baseline "
                    f"({shown_labels}{', ...' if len(picked) > 8 else ''}): compare_at needs "
                    f"one; name it by label"
                )
            return _site_key(picked[0])
        if not isinstance(site, str):
            raise ArgumentTypeError(f"compare_at takes a label, a module path or a selector, not {shown(site)}")
        return _site_key(base[site])


def _site_key(found: OpRecord | ModulePass) -> str:
    if isinstance(found, ModulePass):
        return found.label
    return f"{found.layer_label}:{found.pass_num}"


def _value(run: Trace, key: str) -> tuple[Any, bool]:
    """A run's value at ``key`` and whether an edit made it; a module's several returned arrays are joined."""
    found = run[key]
    if isinstance(found, OpRecord):
        return (found.out if found.saved else None), found.edited
    ops = [run.ops[ref.index] for ref in refs_in(found.out_template)]
    edited = any(op.edited for op in ops)
    if not ops or any(not op.saved for op in ops):
        return None, edited
    values = [run.resolve(ref) for ref in refs_in(found.out_template)]
    if len(values) == 1:
        return values[0], edited
    import numpy as np

    return np.concatenate([as_numpy(v, run.backend).ravel() for v in values]), edited


def bundle(runs: Mapping[str, Trace], baseline: str) -> Bundle:
    """Named traces of one model side by side: ``tl.bundle({'clean': a, 'patched': b}, baseline='clean')``."""
    return Bundle(runs, baseline)
