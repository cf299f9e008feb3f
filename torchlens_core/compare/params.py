"""``cmp.params``: the parameters of two traces paired through the aligned ops that read them.

Parameter names differ across frameworks (``features.0.weight`` against
``features.layers.0.kernel``, Keras's ``dense_2/kernel``) and so do their
layouts (``[out, in]`` against ``[in, out]``; OIHW against HWIO). So the
pairing follows the op alignment: the parameters the ops of one aligned pair
read on each side are matched by role (``weight``/``kernel``/``scale`` are
one role, ``bias``/``beta`` another) and size, and each pair's layout is the
axis permutation that makes the values agree. A weight copied without its
transpose shows up twice: its layout differs from that of every other
parameter of its role and rank, and the values disagree under the layout
the rest use.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs

from torchlens_core.compare.layout import NONE, Layout, candidates
from torchlens_core.compare.metrics import Agreement, agreement, as_numpy, least_precise, tolerance_for
from torchlens_core.ir.trace import Trace

ROLES = {
    "weight": "weight",
    "kernel": "weight",
    "w": "weight",
    "scale": "weight",
    "gamma": "weight",
    "embedding": "weight",
    "bias": "bias",
    "b": "bias",
    "beta": "bias",
    "offset": "bias",
    "running_mean": "mean",
    "moving_mean": "mean",
    "mean": "mean",
    "running_var": "var",
    "moving_variance": "var",
    "var": "var",
    "variance": "var",
}


@attrs.define(slots=True, eq=False)
class ParamPair:
    """A parameter of ``a`` and its counterpart in ``b``; ``via`` is the aligned op pair that reads both."""

    a: str
    b: str
    via: str
    layout: Layout = NONE
    agreement: Agreement | None = None
    verdict: str = "unknown"  # agrees | diverges | shape | unknown (a value is not held)
    note: str = ""

    def __repr__(self) -> str:
        return f"<ParamPair {self.a} ~ {self.b}: {self.verdict}, layout {self.layout}>"


def role(name: str) -> str:
    """``weight``, ``bias``, ``mean``, ``var`` or the parameter's own last name."""
    last = name.replace("/", ".").split(".")[-1].split(":")[0].lower()
    return ROLES.get(last, last)


def compare_params(
    a: Trace, b: Trace, pair_groups: list[tuple[str, list[int], list[int]]], rtol: float | None, atol: float | None
) -> tuple[list[ParamPair], list[str], list[str]]:
    """Pair and compare the parameters read by each aligned pair's groups; then what is left, by role and size."""
    found: list[ParamPair] = []
    taken_a: set[str] = set()
    taken_b: set[str] = set()
    for via, group_a, group_b in pair_groups:
        names_a = [n for n in _read(a, group_a) if n not in taken_a]
        names_b = [n for n in _read(b, group_b) if n not in taken_b]
        for name_a, name_b in _match(a, b, names_a, names_b):
            taken_a.add(name_a)
            taken_b.add(name_b)
            found.append(ParamPair(name_a, name_b, via))
    for pair in found:
        _judge(a, b, pair, rtol, atol)
    _odd_layouts(a, found)
    unmatched_a = [n for n in a.params if n not in taken_a and not a.params[n].is_buffer]
    unmatched_b = [n for n in b.params if n not in taken_b and not b.params[n].is_buffer]
    return found, unmatched_a, unmatched_b


def _read(trace: Trace, group: list[int]) -> list[str]:
    """The parameters the group's ops read, in order of first read, each once."""
    seen: dict[str, None] = {}
    for k in group:
        for name in trace.ops[k].params:
            if name in trace.params:
                seen.setdefault(name, None)
    return list(seen)


def _match(a: Trace, b: Trace, names_a: list[str], names_b: list[str]) -> list[tuple[str, str]]:
    """Same role and size first, then same size, each in order of first read."""
    pairs: list[tuple[str, str]] = []
    left_b = list(names_b)
    for strict in (True, False):
        for name_a in names_a:
            if any(name_a == p[0] for p in pairs):
                continue
            for name_b in left_b:
                if a.params[name_a].numel == b.params[name_b].numel and (not strict or role(name_a) == role(name_b)):
                    pairs.append((name_a, name_b))
                    left_b.remove(name_b)
                    break
    return pairs


def _judge(a: Trace, b: Trace, pair: ParamPair, rtol: float | None, atol: float | None) -> None:
    ra, rb = a.params[pair.a], b.params[pair.b]
    if ra.value is None or rb.value is None:
        pair.note = "value not held"
        return
    va, vb = as_numpy(ra.value, a.backend), as_numpy(rb.value, b.backend)
    options = candidates(va.shape, vb.shape, [])
    if options == [NONE]:
        pair.verdict, pair.note = "shape", f"{tuple(va.shape)} vs {tuple(vb.shape)}"
        return
    tolerance = tolerance_for(ra.dtype, rb.dtype, rtol=rtol, atol=atol)
    best: tuple[Layout, Agreement] | None = None
    for layout in options:
        found = agreement(layout.apply(va), vb, tolerance, least_precise(ra.dtype, rb.dtype))
        if best is None or (found.ok, -found.max_abs) > (best[1].ok, -best[1].max_abs):
            best = (layout, found)
    assert best is not None
    pair.layout, pair.agreement = best
    pair.verdict = "agrees" if best[1].ok else "diverges"


def _odd_layouts(a: Trace, pairs: list[ParamPair]) -> None:
    """Note a parameter whose layout differs from the one most parameters of its role and rank have."""
    groups: dict[tuple[str, int], list[ParamPair]] = {}
    for pair in pairs:
        if pair.verdict in ("agrees", "diverges"):
            groups.setdefault((role(pair.a), len(a.params[pair.a].shape)), []).append(pair)
    for (param_role, rank), members in groups.items():
        if len(members) < 2 or rank < 2:
            continue
        layouts = Counter(_axes(p.layout) for p in members)
        usual, count = layouts.most_common(1)[0]
        if count <= len(members) // 2:
            continue
        for pair in members:
            if _axes(pair.layout) != usual:
                note = f"layout {pair.layout} where {count} other {param_role}s of rank {rank} have {usual}"
                pair.note = f"{pair.note}; {note}" if pair.note else note


def _axes(layout: Layout) -> Any:
    return layout.perm if layout.kind == "permuted" else layout.kind
