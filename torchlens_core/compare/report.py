"""``tl.compare(a, b)``: two traces aligned op by op, and where they stop agreeing.

The two traces may come from one framework or two, live or loaded from disk
with neither framework installed: alignment (:mod:`.align`) reads only the
records, and values are compared in NumPy (:mod:`.metrics`) after putting
``a``'s value in ``b``'s layout (:mod:`.layout`).
"""

from __future__ import annotations

from typing import Any

import attrs

from torchlens_core.backend.manager import hook
from torchlens_core.compare.align import array_value, best_pairs, groups, points, scores
from torchlens_core.compare.classes import TABLE_VERSION, register_equivalence
from torchlens_core.compare.layout import NONE, Layout, candidates
from torchlens_core.compare.metrics import Agreement, agreement, least_precise, tolerance_for
from torchlens_core.compare.params import ParamPair, compare_params
from torchlens_core.ir.errors import ArgumentTypeError
from torchlens_core.ir.trace import Trace

VERDICTS = ("agrees", "diverges", "shape", "unknown")
MAX_SCORE = 13.0  # every piece of evidence at once: a module output, its module, class, shape and values
CONTEXT = 4  # agreeing pairs shown before the first divergence, and pairs after it, in print(cmp)
COLUMNS = {"a": "string", "b": "string", "a_group": "object", "b_group": "object", "module": "string",
           "verdict": "string", "layout": "string", "max_abs": "Float64", "max_rel": "Float64", "mean_abs": "Float64",
           "cosine": "Float64", "ulp": "Float64", "within": "Float64", "confidence": "Float64", "evidence": "object",
           "note": "string", "local_max_abs": "Float64", "inherited": "Float64", "amplification": "Float64",
           "origin": "string"}


@attrs.define(slots=True, eq=False)
class AlignedPair:
    """An op (or a group of ops) of ``a`` and its counterpart in ``b``, and how their values agree.

    ``a``/``b`` are the ops whose outputs are compared (labels); ``a_group``
    and ``b_group`` every op each side ran to get there since the previous
    pair (one torch ``layer_norm`` against ten JAX primitives). ``verdict``
    is ``agrees``, ``diverges`` (values outside tolerance), ``shape`` (no
    layout makes one the other's shape) or ``unknown`` (a value was not
    saved). ``layout`` says how ``a``'s value was put in ``b``'s order.
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

    @property
    def diverges(self) -> bool:
        return self.verdict in ("diverges", "shape")

    def __repr__(self) -> str:
        numbers = "" if self.agreement is None else f", max |diff| {self.agreement.max_abs:.3g}"
        return f"<AlignedPair {self.a} ~ {self.b}: {self.verdict}{numbers}>"


class Comparison:
    """The result of ``tl.compare(a, b)``; ``print`` it for the aligned table around the first divergence."""

    def __init__(self, a: Trace, b: Trace, pairs: list[AlignedPair], unmatched_a: list[str],
                 unmatched_b: list[str], upstream: list[list[int]],
                 groups: list[tuple[list[int], list[int]]], tolerance: tuple[float | None, float | None]) -> None:
        self.a, self.b = a, b
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
        """The first diverging pair in execution order; None when every compared pair agrees."""
        return next((p for p in self.pairs if p.diverges), None)

    @property
    def roots(self) -> list[AlignedPair]:
        """Where separate errors start, in order: diverging pairs fed only by agreeing ones.

        With ``teacher_forcing=True``, every pair that introduced an error of its
        own, even downstream of another divergence.
        """
        return [p for k, p in enumerate(self.pairs) if p.diverges and (
            p.origin == "introduced" or (p.origin is None and not any(self.pairs[u].diverges
                                                                       for u in self._upstream[k])))]

    def to_pandas(self) -> Any:
        from torchlens_core.views.tables import frame

        rows = []
        for p in self.pairs:
            g = p.agreement
            numbers = {k: (getattr(g, k) if g is not None else None)
                       for k in ("max_abs", "max_rel", "mean_abs", "cosine", "ulp", "within")}
            rows.append({"a": p.a, "b": p.b, "a_group": p.a_group, "b_group": p.b_group, "module": p.module,
                         "verdict": p.verdict, "layout": str(p.layout), **numbers, "confidence": p.confidence,
                         "evidence": p.evidence, "note": p.note,
                         "local_max_abs": None if p.local is None else p.local.max_abs, "inherited": p.inherited,
                         "amplification": p.amplification, "origin": p.origin})
        return frame(rows, COLUMNS)

    def __str__(self) -> str:
        first = self.first_divergence
        head = (f"Comparison of {self.a.backend} {self.a.model_name} ({len(self.a.ops)} ops) with "
                f"{self.b.backend} {self.b.model_name} ({len(self.b.ops)} ops): {len(self.pairs)} aligned pairs, "
                f"{len(self.unmatched_a)} unmatched in a, {len(self.unmatched_b)} in b.")
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
        rows = [("a", "b", "layout", "max |diff|", "max rel", "cosine", "verdict")]
        for k in shown:
            p = self.pairs[k]
            g = p.agreement
            a_name = p.a + (f" (+{len(p.a_group) - 1})" if len(p.a_group) > 1 else "")
            b_name = p.b + (f" (+{len(p.b_group) - 1})" if len(p.b_group) > 1 else "")
            numbers = ("-", "-", "-") if g is None else (
                f"{g.max_abs:.3g}", f"{g.max_rel:.3g}", "-" if g.cosine is None else f"{g.cosine:.6f}")
            verdict = p.verdict + (f", {p.origin}" if p.origin else "") + (f" ({p.note})" if p.note else "")
            rows.append((a_name, b_name, str(p.layout), *numbers, verdict))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = [head]
        if shown and shown[0] > 0:
            lines.append(f"  ... {shown[0]} earlier pairs")
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows[:1]]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows[1:]]
        if shown and shown[-1] < len(self.pairs) - 1:
            lines.append(f"  ... {len(self.pairs) - 1 - shown[-1]} later pairs")
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = self.first_divergence
        where = "no divergence" if first is None else f"first divergence {first.a} ~ {first.b}"
        return f"<Comparison {self.a.backend}:{self.a.model_name} ~ {self.b.backend}:{self.b.model_name}, " \
               f"{len(self.pairs)} pairs, {where}>"


def compare(a: Trace, b: Trace, *, rtol: float | None = None, atol: float | None = None,
            match: dict[str, str] | None = None, teacher_forcing: bool = False) -> Comparison:
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
            raise ArgumentTypeError(f"tl.compare takes two traces (tl.trace or tl.load); {name} is a "
                                    f"{type(trace).__name__}")
    if match is not None and (not isinstance(match, dict) or
                              not all(isinstance(k, str) and isinstance(v, str) for k, v in match.items())):
        raise ArgumentTypeError("match= maps module paths of a to module paths of b: a dict of strings, "
                                "{'encoder.layer.0': 'encoder/layer_0'}")
    if not isinstance(teacher_forcing, bool):
        raise ArgumentTypeError(f"teacher_forcing= is True or False, not {teacher_forcing!r}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ArgumentTypeError(f"{name}= is a non-negative number, not {value!r}")
    for backend in {a.backend, b.backend}:  # the backends' own names for the equivalence table
        for cls, funcs in (hook().torchlens_op_classes(backend=backend) or {}).items():
            register_equivalence(cls, funcs=tuple(funcs))
    pa, pb = points(a, match), points(b)
    score = scores(pa, pb)
    matched = best_pairs(score)
    a_anchor = [pa[i].index for i, _ in matched]
    b_anchor = [pb[j].index for _, j in matched]
    a_groups, b_groups = groups(a, a_anchor), groups(b, b_anchor)
    pairs = []
    for (i, j), ga, gb in zip(matched, a_groups, b_groups):
        op_a, op_b = a.ops[pa[i].index], b.ops[pb[j].index]
        pairs.append(AlignedPair(op_a.label, op_b.label, tuple(a.ops[k].label for k in ga),
                                 tuple(b.ops[k].label for k in gb), op_a.module_passes[-1][0]
                                 if op_a.module_passes else "", round(min(1.0, score[i, j] / MAX_SCORE), 3),
                                 _evidence(pa[i], pb[j])))
    owner = {k: n for n, group in enumerate(a_groups) for k in group}
    upstream = [sorted({owner[p] for k in group for p in a.ops[k].parent_indices
                        if p in owner and owner[p] != n}) for n, group in enumerate(a_groups)]
    _judge(a, b, pairs, a_anchor, b_anchor, upstream, rtol, atol)
    _randomness(a, b, pairs, a_groups, b_groups)
    if teacher_forcing:
        from torchlens_core.compare.forcing import force

        force(a, b, pairs, a_anchor, b_anchor, b_groups, upstream, rtol, atol)
    in_a = {k for g in a_groups for k in g}
    in_b = {k for g in b_groups for k in g}
    unmatched_a = [op.label for op in a.ops if op.index not in in_a and op.source not in ("parameter", "constant")]
    unmatched_b = [op.label for op in b.ops if op.index not in in_b and op.source not in ("parameter", "constant")]
    return Comparison(a, b, pairs, unmatched_a, unmatched_b, upstream, list(zip(a_groups, b_groups)), (rtol, atol))


def _evidence(pa: Any, pb: Any) -> tuple[str, ...]:
    found = []
    if pa.module_outputs & pb.module_outputs:
        found.append("module output")
    elif pa.module and pa.module == pb.module:
        found.append("module")
    if pa.cls is not None and pa.cls == pb.cls:
        found.append(f"class {pa.cls}")
    if pa.shape is not None and pb.shape is not None and sorted(pa.shape) == sorted(pb.shape):
        found.append("shape")
    if pa.fingerprint is not None and pb.fingerprint is not None and pa.size == pb.size:
        import numpy as np

        gap = float(np.max(np.abs(pa.fingerprint - pb.fingerprint))) / max(pa.scale, pb.scale, 1e-30)
        if gap <= 3e-2:
            found.append("values")
    return tuple(found)


def _judge(a: Trace, b: Trace, pairs: list[AlignedPair], a_anchor: list[int], b_anchor: list[int],
           upstream: list[list[int]], rtol: float | None, atol: float | None) -> None:
    """Each pair's layout, agreement and verdict; layouts found upstream are tried first downstream."""
    for n, pair in enumerate(pairs):
        op_a, op_b = a.ops[a_anchor[n]], b.ops[b_anchor[n]]
        va, vb = array_value(a, op_a), array_value(b, op_b)
        if va is None or vb is None:
            pair.note = "value not saved" if not (op_a.saved and op_b.saved) else "not one float array"
            continue
        nearby = _carried(pairs, upstream, n)
        options = candidates(va.shape, vb.shape, nearby)
        if options == [NONE]:
            pair.verdict = "shape"
            pair.note = f"{tuple(va.shape)} vs {tuple(vb.shape)}"
            continue
        tolerance = tolerance_for(op_a.dtype, op_b.dtype, rtol=rtol, atol=atol)
        precision = least_precise(op_a.dtype, op_b.dtype)
        best: tuple[Layout, Agreement] | None = None
        for layout in options:
            found = agreement(layout.apply(va), vb, tolerance, precision)
            if best is None or (found.ok and not best[1].ok) or (found.ok == best[1].ok and
                                                                   found.max_abs < best[1].max_abs):
                best = (layout, found)
            if found.ok:
                break
        assert best is not None
        pair.layout, pair.agreement = best
        pair.verdict = "agrees" if best[1].ok else "diverges"


def _carried(pairs: list[AlignedPair], upstream: list[list[int]], n: int) -> list[tuple[Layout, str]]:
    """Permuted layouts of the pairs upstream of pair ``n``, nearest first (breadth-first, bounded)."""
    found: list[tuple[Layout, str]] = []
    frontier, seen = list(reversed(upstream[n])), set()
    while frontier and len(seen) < 64:
        k = frontier.pop(0)
        if k in seen:
            continue
        seen.add(k)
        layout = pairs[k].layout
        if layout.kind == "permuted" and all(layout.perm != f.perm or layout.via_shape != f.via_shape
                                             for f, _ in found):
            found.append((layout, f"{pairs[k].a} ~ {pairs[k].b}"))
        elif layout.kind == "carried":
            continue  # a flatten's layout is carried from further up; do not carry it twice
        frontier.extend(reversed(upstream[k]))
    return found


def _randomness(a: Trace, b: Trace, pairs: list[AlignedPair], a_groups: list[list[int]],
                b_groups: list[list[int]]) -> None:
    """Say so when a pair's ops on one side include a random op (dropout left on, sampling)."""
    for pair, ga, gb in zip(pairs, a_groups, b_groups):
        for side, trace, group in (("a", a, ga), ("b", b, gb)):
            random = [trace.ops[k].label for k in group if _is_random(trace, trace.ops[k])]
            if random:
                note = f"random op in {side}: {random[0]} (dropout or sampling left on?)"
                pair.note = f"{pair.note}; {note}" if pair.note else note


def _is_random(trace: Trace, op: Any) -> bool:
    from torchlens_core.compare.classes import op_class

    if op.source == "random" or op_class(op) == "random":
        return True
    if op_class(op) != "dropout" or not op.parent_indices:
        return False
    out, parent = array_value(trace, op), array_value(trace, trace.ops[op.parent_indices[0]])
    return out is not None and parent is not None and out.shape == parent.shape and bool((out != parent).any())


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
        for label in (pair.a_group if side == "a" else pair.b_group):
            found[label] = color
    return found
