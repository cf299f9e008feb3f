"""``tl.compare(a, b)``: two traces aligned op by op, and where they stop agreeing.

The two traces may come from one framework or two, live or loaded from disk
with neither framework installed: alignment (:mod:`.align`) reads only the
records, and values are compared in NumPy (:mod:`.metrics`) after putting
``a``'s value in ``b``'s layout (:mod:`.layout`).
"""

from __future__ import annotations

from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.compare.align import Aligner, Match, Unaligned, groups
from torchlens_core.compare.classes import TABLE_VERSION, register_equivalence
from torchlens_core.compare.layout import NONE, Layout
from torchlens_core.compare.metrics import Agreement
from torchlens_core.compare.params import ParamPair, compare_params
from torchlens_core.compare.points import Point, array_value, points
from torchlens_core.ir.errors import ArgumentTypeError
from torchlens_core.ir.trace import Trace

VERDICTS = ("agrees", "diverges", "shape", "unknown")
CONTEXT = 4  # agreeing pairs shown before the first divergence, and pairs after it, in print(cmp)
COLUMNS = {
    "a": "string",
    "b": "string",
    "a_group": "object",
    "b_group": "object",
    "module": "string",
    "verdict": "string",
    "layout": "string",
    "max_abs": "Float64",
    "max_rel": "Float64",
    "mean_abs": "Float64",
    "cosine": "Float64",
    "ulp": "Float64",
    "within": "Float64",
    "confidence": "Float64",
    "evidence": "object",
    "note": "string",
    "local_max_abs": "Float64",
    "inherited": "Float64",
    "amplification": "Float64",
    "origin": "string",
    "basis": "string",
}


@attrs.define(slots=True, eq=False)
class AlignedPair:
    """An op (or a group of ops) of ``a`` and its counterpart in ``b``, and how their values agree.

    ``a``/``b`` are the ops whose outputs are compared (labels); ``a_group``
    and ``b_group`` every op each side ran to get there since the previous
    pair (one torch ``layer_norm`` against ten JAX primitives). ``verdict``
    is ``agrees``, ``diverges`` (values outside tolerance), ``shape`` (no
    layout makes one the other's shape) or ``unknown`` (a value was not
    saved). ``layout`` says how ``a``'s value was put in ``b``'s order.
    ``basis`` says what ties the two ops: ``values`` (they agree),
    ``inputs`` (they disagree while every input agrees: a divergence starts
    here) or ``structure`` (downstream of a divergence, aligned by module,
    class and shape).
    """

    a: str
    b: str
    a_group: tuple[str, ...]
    b_group: tuple[str, ...]
    module: str
    confidence: float
    evidence: tuple[str, ...]
    layout: Layout = NONE
    agreement: Agreement | None = None
    verdict: str = "unknown"
    note: str = ""
    # teacher_forcing=True (see torchlens_core.compare.forcing): b's group run on a's inputs
    local: Agreement | None = None  # the group's own error
    inherited: float | None = None  # the largest relative error among the pairs feeding it
    amplification: float | None = None  # this pair's relative error over the inherited one
    forced: bool | None = None  # every input of the group came from a (else some kept b's value)
    origin: str | None = None  # a diverging pair: "introduced" (its own error) or "inherited"
    basis: str = "values"
    a_path: tuple[Any, ...] = ()  # where the compared array sits in what ``a`` returned, when it returned several
    b_path: tuple[Any, ...] = ()

    @property
    def diverges(self) -> bool:
        return self.verdict in ("diverges", "shape")

    def __repr__(self) -> str:
        numbers = "" if self.agreement is None else f", max |diff| {self.agreement.max_abs:.3g}"
        return f"<AlignedPair {self.a} ~ {self.b}: {self.verdict}{numbers}>"


@attrs.frozen
class Coverage:
    """Of one side's ops that compute from an input (``ops``): how many had their own value compared with a
    counterpart (``compared``: one to one, or as the output of a group), and how many more sat inside a compared
    group (``in_groups``: checked only through the group's output)."""

    ops: int
    compared: int
    in_groups: int

    @property
    def fraction(self) -> float:
        return self.compared / self.ops if self.ops else 1.0

    def __str__(self) -> str:
        return f"{self.compared} of {self.ops} ops compared ({100 * self.fraction:.0f}%), {self.in_groups} in groups"


class Comparison:
    """The result of ``tl.compare(a, b)``; ``print`` it for the aligned table around the first divergence."""

    def __init__(
        self,
        a: Trace,
        b: Trace,
        pairs: list[AlignedPair],
        unmatched_a: list[str],
        unmatched_b: list[str],
        upstream: list[list[int]],
        groups: list[tuple[list[int], list[int]]],
        tolerance: tuple[float | None, float | None],
        unaligned: list[Unaligned],
        coverage: dict[str, Coverage],
    ) -> None:
        self.a, self.b = a, b
        self.unaligned = unaligned  # ops of a with a candidate the aligner could not stand behind, and why
        self.coverage = coverage  # "a" and "b": how many ops had their values compared
        self.pairs = pairs
        self.unmatched_a, self.unmatched_b = unmatched_a, unmatched_b
        self.table_version = TABLE_VERSION
        self._upstream = upstream
        self._groups = groups
        self._tolerance = tolerance
        self._params: tuple[list[ParamPair], list[str], list[str]] | None = None

    @property
    def params(self) -> list[ParamPair]:
        """The parameters each aligned pair reads on both sides, paired by role and size, layouts detected."""
        return self._param_comparison()[0]

    @property
    def unmatched_params(self) -> tuple[list[str], list[str]]:
        """Parameters of ``a`` and of ``b`` that no pair of :attr:`params` holds."""
        _, left_a, left_b = self._param_comparison()
        return left_a, left_b

    def to_dot(self, side: str = "a", **options: Any) -> str:
        """The DOT source of :meth:`draw` (no Graphviz needed)."""
        from torchlens_core.views.draw import to_dot

        return to_dot(self._side(side), colors=colors(self, side), **options)

    def draw(self, path: str | None = None, side: str = "a", **options: Any) -> str:
        """Draw one side's graph with each op coloured by its pair's error; returns the file written.

        Green agrees; light to dark red diverges (relative error below 1e-3,
        below 1e-1, above); orange is a shape divergence; grey was not
        compared; white ops are in no pair. ``options`` are ``trace.draw``'s
        (``file_format``, ``vis_mode``, ``collapse``, ``module``).
        """
        from torchlens_core.views.draw import draw

        return draw(self._side(side), path, colors=colors(self, side), **options)

    def _side(self, side: str) -> Trace:
        if side not in ("a", "b"):
            raise ArgumentTypeError(f"side= is 'a' or 'b', not {side!r}")
        return self.a if side == "a" else self.b

    def _param_comparison(self) -> tuple[list[ParamPair], list[str], list[str]]:
        if self._params is None:  # worked out on first use: large weights take a while to compare
            via = [(f"{p.a} ~ {p.b}", ga, gb) for p, (ga, gb) in zip(self.pairs, self._groups)]
            self._params = compare_params(self.a, self.b, via, *self._tolerance)
        return self._params

    @property
    def first_divergence(self) -> AlignedPair | None:
        """The first pair in ``a``'s execution order where a divergence starts; None when every compared pair agrees.

        A pair aligned by structure alone (basis ``structure``) only inherits a
        divergence from upstream, so it is never the first one.
        """
        return next(
            (p for p in self.pairs if p.diverges and p.basis != "structure"),
            next((p for p in self.pairs if p.diverges), None),
        )

    @property
    def roots(self) -> list[AlignedPair]:
        """Where separate errors start, in order: diverging pairs fed only by agreeing ones.

        With ``teacher_forcing=True``, every pair that introduced an error of its
        own, even downstream of another divergence.
        """
        return [
            p
            for k, p in enumerate(self.pairs)
            if p.diverges
            and (
                p.origin == "introduced"
                or (p.origin is None and not any(self.pairs[u].diverges for u in self._upstream[k]))
            )
        ]

    def to_pandas(self) -> Any:
        from torchlens_core.views.tables import frame

        rows = []
        for p in self.pairs:
            g = p.agreement
            numbers = {
                k: (getattr(g, k) if g is not None else None)
                for k in ("max_abs", "max_rel", "mean_abs", "cosine", "ulp", "within")
            }
            rows.append(
                {
                    "a": p.a,
                    "b": p.b,
                    "a_group": p.a_group,
                    "b_group": p.b_group,
                    "module": p.module,
                    "verdict": p.verdict,
                    "layout": str(p.layout),
                    **numbers,
                    "confidence": p.confidence,
                    "evidence": p.evidence,
                    "note": p.note,
                    "local_max_abs": None if p.local is None else p.local.max_abs,
                    "inherited": p.inherited,
                    "amplification": p.amplification,
                    "origin": p.origin,
                    "basis": p.basis,
                }
            )
        return frame(rows, COLUMNS)

    def __str__(self) -> str:
        head, rows, shown = self._table()
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = [head]
        if shown and shown[0] > 0:
            lines.append(f"  ... {shown[0]} earlier pairs")
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows[:1]]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows[1:]]
        if shown and shown[-1] < len(self.pairs) - 1:
            lines.append(f"  ... {len(self.pairs) - 1 - shown[-1]} later pairs")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """A notebook shows the same table as ``print``, diverging pairs marked."""
        from torchlens_core.ir.html import table

        head, rows, shown = self._table()
        before = [("...", f"{shown[0]} earlier pairs", *[""] * 5)] if shown and shown[0] > 0 else []
        after = (
            [("...", f"{len(self.pairs) - 1 - shown[-1]} later pairs", *[""] * 5)]
            if shown and shown[-1] < len(self.pairs) - 1
            else []
        )
        marks = [None] * len(before) + ["#fdd" if self.pairs[k].diverges else None for k in shown] + [None] * len(after)
        return table([*before, *rows[1:], *after], header=rows[0], caption=head, marks=marks)

    def _table(self) -> tuple[str, list[tuple[str, ...]], list[int]]:
        """The head line, the header and rows around the first divergence, and the positions of the pairs shown."""
        first = self.first_divergence
        head = (
            f"Comparison of {self.a.backend} {self.a.model_name} ({len(self.a.ops)} ops) with "
            f"{self.b.backend} {self.b.model_name} ({len(self.b.ops)} ops): {len(self.pairs)} aligned pairs, "
            f"{len(self.unmatched_a)} unmatched in a, {len(self.unmatched_b)} in b. Values compared: "
            f"a {self.coverage['a']}; b {self.coverage['b']}."
        )
        if self.unaligned:
            count = len(self.unaligned)
            head += (
                f" {count} op{'s' if count > 1 else ''} could not be aligned ({self.unaligned[0].a}: "
                f"{self.unaligned[0].why}{'; cmp.unaligned lists all' if count > 1 else ''})."
            )
        if first is None:
            head += " Every compared pair agrees."
            shown = list(range(max(0, len(self.pairs) - 2 * CONTEXT), len(self.pairs)))
        else:
            at = self.pairs.index(first)
            head += f" First divergence: {first.a} ~ {first.b}" + (f" in {first.module}" if first.module else "")
            roots = self.roots
            if len(roots) > 1:
                head += f"; {len(roots)} independent starts ({', '.join(r.a for r in roots[:5])})"
            shown = list(range(max(0, at - CONTEXT), min(len(self.pairs), at + CONTEXT + 1)))
        rows: list[tuple[str, ...]] = [("a", "b", "layout", "max |diff|", "max rel", "cosine", "verdict")]
        for k in shown:
            p = self.pairs[k]
            g = p.agreement
            a_name = p.a + _path(p.a_path) + (f" (+{len(p.a_group) - 1})" if len(p.a_group) > 1 else "")
            b_name = p.b + _path(p.b_path) + (f" (+{len(p.b_group) - 1})" if len(p.b_group) > 1 else "")
            numbers = (
                ("-", "-", "-")
                if g is None
                else (f"{g.max_abs:.3g}", f"{g.max_rel:.3g}", "-" if g.cosine is None else f"{g.cosine:.6f}")
            )
            verdict = p.verdict + (f", {p.origin}" if p.origin else "") + (f" ({p.note})" if p.note else "")
            rows.append((a_name, b_name, str(p.layout), *numbers, verdict))
        return head, rows, shown

    def __repr__(self) -> str:
        first = self.first_divergence
        where = "no divergence" if first is None else f"first divergence {first.a} ~ {first.b}"
        return (
            f"<Comparison {self.a.backend}:{self.a.model_name} ~ {self.b.backend}:{self.b.model_name}, "
            f"{len(self.pairs)} pairs, {where}>"
        )


def compare(
    a: Trace,
    b: Trace,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    match: dict[str, str] | None = None,
    teacher_forcing: bool = False,
) -> Comparison:
    """Align ``b`` with ``a`` op by op and compare each aligned pair's values.

    ``rtol``/``atol`` override the per-dtype tolerances
    (:data:`torchlens_core.compare.metrics.PRECISION`); ``match`` maps module
    paths of ``a`` to those of ``b`` (``{"encoder.layer.0": "encoder/layer_0"}``)
    where the two sides name their modules differently. ``teacher_forcing=True``
    (``b``'s framework installed) runs each of ``b``'s aligned groups again on
    ``a``'s values and says whether each diverging pair introduced its error or
    inherited it (:mod:`torchlens_core.compare.forcing`).
    """
    for name, trace in (("a", a), ("b", b)):
        if not isinstance(trace, Trace):
            raise ArgumentTypeError(
                f"tl.compare takes two traces (tl.trace or tl.load); {name} is a {type(trace).__name__}"
            )
    if match is not None and (
        not isinstance(match, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in match.items())
    ):
        raise ArgumentTypeError(
            "match= maps module paths of a to module paths of b: a dict of strings, "
            "{'encoder.layer.0': 'encoder/layer_0'}"
        )
    if not isinstance(teacher_forcing, bool):
        raise ArgumentTypeError(f"teacher_forcing= is True or False, not {teacher_forcing!r}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ArgumentTypeError(f"{name}= is a non-negative number, not {value!r}")
    for backend in {a.backend, b.backend}:  # the backends' own names for the equivalence table
        for cls, funcs in (backend_named(backend, missing_ok=True).op_classes() or {}).items():
            register_equivalence(cls, funcs=tuple(funcs))
    pa, pb = points(a, match), points(b)
    aligner = Aligner(a, b, pa, pb, rtol, atol)
    matched = aligner.run()
    a_anchor = [pa[m.i].index for m in matched]
    b_anchor = [pb[m.j].index for m in matched]
    a_groups, b_groups = groups(a, a_anchor), groups(b, b_anchor)
    pairs = []
    for m, ga, gb in zip(matched, a_groups, b_groups):
        op_a, op_b = a.ops[pa[m.i].index], b.ops[pb[m.j].index]
        pair = AlignedPair(
            op_a.label,
            op_b.label,
            tuple(a.ops[k].label for k in ga),
            tuple(b.ops[k].label for k in gb),
            op_a.module_passes[-1][0] if op_a.module_passes else "",
            _confidence(m, pa[m.i], pb[m.j]),
            _evidence(m, pa[m.i], pb[m.j]),
            m.layout,
            m.agreement,
            note=m.note,
            basis=m.basis,
            a_path=pa[m.i].path,
            b_path=pb[m.j].path,
        )
        if m.agreement is not None:
            pair.verdict = "agrees" if m.agreement.ok else "diverges"
            if m.exact:
                pair.note = "compared exactly (integers)" + (f"; {pair.note}" if pair.note else "")
        elif m.layout == NONE and " vs " in m.note:
            pair.verdict = "shape"
        pairs.append(pair)
    owner = {k: n for n, group in enumerate(a_groups) for k in group}
    upstream = [
        sorted({owner[p] for k in group for p in a.ops[k].parent_indices if p in owner and owner[p] != n})
        for n, group in enumerate(a_groups)
    ]
    _randomness(a, b, pairs, a_groups, b_groups)
    if teacher_forcing:
        from torchlens_core.compare.forcing import force

        force(a, b, pairs, a_anchor, b_anchor, b_groups, upstream, rtol, atol)
    in_a = {k for g in a_groups for k in g}
    in_b = {k for g in b_groups for k in g}
    unmatched_a = [op.label for op in a.ops if op.index not in in_a and op.source not in ("parameter", "constant")]
    unmatched_b = [op.label for op in b.ops if op.index not in in_b and op.source not in ("parameter", "constant")]
    coverage = {"a": _coverage(a, pa, a_anchor, a_groups, pairs), "b": _coverage(b, pb, b_anchor, b_groups, pairs)}
    return Comparison(
        a,
        b,
        pairs,
        unmatched_a,
        unmatched_b,
        upstream,
        list(zip(a_groups, b_groups)),
        (rtol, atol),
        aligner.unaligned,
        coverage,
    )


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{key!r}]" for key in path)


def _coverage(
    trace: Trace, side_points: list[Point], anchors: list[int], side_groups: list[list[int]], pairs: list[AlignedPair]
) -> Coverage:
    """Of the ops that compute from an input, how many had their value compared, and how many sat in a group."""
    data = {p.index for p in side_points if trace.ops[p.index].kind not in ("input", "output")}
    compared = data & {anchor for anchor, pair in zip(anchors, pairs) if pair.agreement is not None}
    inside = data & {k for group, pair in zip(side_groups, pairs) if pair.agreement is not None for k in group}
    return Coverage(len(data), len(compared), len(inside - compared))


def _confidence(m: Match, pa: Point, pb: Point) -> float:
    """How sure the aligner is that the two ops correspond, by what ties them (docs/compare.md, "Confidence").

    Values that agree element for element are the strongest tie (0.8 to 1);
    the start of a divergence rests on its inputs agreeing and on structure
    (0.5 to 0.8); a pair downstream of a divergence on structure alone (0.2 to
    0.5).
    """
    module_output = bool(pa.module_outputs & pb.module_outputs)
    same_class = pa.cls is not None and pa.cls == pb.cls
    if m.basis == "values":
        telling = pa.distinct > 2 and (pa.size or 0) > 2 and not m.exact
        return round(0.8 + 0.1 * telling + 0.05 * module_output + 0.05 * same_class, 3)
    base = 0.5 if m.basis == "inputs" else 0.2
    return round(base + 0.1 * module_output + 0.1 * same_class + 0.1 * (pa.module == pb.module != ""), 3)


def _evidence(m: Match, pa: Point, pb: Point) -> tuple[str, ...]:
    found = []
    if m.basis == "values":
        found.append("values")
    elif m.basis == "inputs":
        found.append("inputs agree")
    if pa.module_outputs & pb.module_outputs:
        found.append("module output")
    elif pa.module and pa.module == pb.module:
        found.append("module")
    if pa.cls is not None and pa.cls == pb.cls:
        found.append(f"class {pa.cls}")
    if pa.shape is not None and pb.shape is not None and sorted(pa.shape) == sorted(pb.shape):
        found.append("shape")
    return tuple(found)


def _randomness(
    a: Trace, b: Trace, pairs: list[AlignedPair], a_groups: list[list[int]], b_groups: list[list[int]]
) -> None:
    """Say so when a pair's ops on one side include a random op (dropout left on, sampling)."""
    for pair, ga, gb in zip(pairs, a_groups, b_groups):
        for side, trace, group in (("a", a, ga), ("b", b, gb)):
            for k in group:
                found = _randomness_of(trace, trace.ops[k])
                if found:
                    note = (
                        f"random op in {side}: {trace.ops[k].label} (dropout or sampling left on?)"
                        if found == "random"
                        else f"{found} in {side}: {trace.ops[k].label}"
                    )
                    pair.note = f"{pair.note}; {note}" if pair.note else note
                    break


def _randomness_of(trace: Trace, op: Any) -> str:
    """ "random" (a draw, a dropout that zeroed elements), "dropout scales by c" (an eval-mode dropout that
    rescales: deterministic, but not the identity) or ""."""
    import numpy as np

    from torchlens_core.compare.classes import op_class

    if op.source == "random" or op_class(op) == "random":
        return "random"
    if op_class(op) != "dropout" or not op.parent_indices:
        return ""
    out, parent = array_value(trace, op), array_value(trace, trace.ops[op.parent_indices[0]])
    if out is None or parent is None or out.shape != parent.shape or not (out != parent).any():
        return ""
    nonzero = parent != 0
    ratios = out[nonzero] / parent[nonzero]
    if ratios.size and np.allclose(ratios, ratios[0], rtol=1e-5) and (out[~nonzero] == 0).all():
        return f"dropout scales by {float(ratios[0]):.6g}"  # Paddle's downscale_in_infer at inference
    return "random"


# fill colours for Comparison.draw: agreeing, diverging (darker with the error), shape, not compared
AGREES, SHAPE, UNKNOWN = "#c7e9c0", "#fdae6b", "#e0e0e0"
DIVERGES = ("#fcbba1", "#fb6a4a", "#cb181d")  # relative error below 1e-3, below 1e-1, above


def colors(cmp: Comparison, side: str) -> dict[str, str]:
    """Op label -> fill colour of one side's drawing: every op of a pair's group takes the pair's colour."""
    found = {}
    for pair in cmp.pairs:
        if pair.verdict == "agrees":
            color = AGREES
        elif pair.verdict == "shape":
            color = SHAPE
        elif pair.verdict == "diverges":
            g = pair.agreement
            rel = g.relative if g is not None else 1.0
            color = DIVERGES[0] if rel < 1e-3 else DIVERGES[1] if rel < 1e-1 else DIVERGES[2]
        else:
            color = UNKNOWN
        for label in pair.a_group if side == "a" else pair.b_group:
            found[label] = color
    return found
