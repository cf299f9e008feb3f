"""Which ops of one trace correspond to which ops of another: the alignment behind ``tl.compare``.

Two implementations of one model, written by different people, compute q, k
and v in different orders, merge axes the other keeps, broadcast a table the
other materializes and fuse what the other decomposes. Values are the one
evidence that does not depend on how the code was written, so values decide
wherever they can, and structure only where values cannot (past a real
divergence):

1. **Value pairs.** In ``a``'s execution order, each op is paired with an op of
   ``b`` whose value is the same under some layout (:mod:`.layout`): found by
   fingerprint (:mod:`.points`), confirmed element for element. Order does not
   matter, so pairs may cross. Among several ``b`` ops holding the same value,
   the one whose inputs are the counterparts of the op's inputs wins (its
   *frontier*: the nearest paired ops upstream), then the same class and module.
   A value that says little (a constant, a 0/1 mask, a tiny array) pairs only
   with an op computed from the counterparts of its inputs.
2. **Structural pairs.** The ops left over on both sides — where values stop
   agreeing — are aligned in order by class, module and shape (a
   Needleman-Wunsch alignment with free gaps), and only between ops computed
   from counterpart inputs, each op against the ``CANDIDATES`` such ops of
   ``b`` nearest its place there (a table every layer reads would otherwise
   make every layer's op of its class a candidate).
3. **Honest verdicts.** A structural pair whose values disagree while every
   input agrees is the start of a divergence only when the structure singles it
   out: the output of the same module, or the same op class, or nearly equal
   values, and no other candidate as good. Otherwise it is reported as *could
   not align* (:class:`Unaligned`), never as a divergence. A structural pair
   downstream of a divergence inherits it (basis ``structure``).

A pair's *group* on each side is its op and the ops before it that no earlier
pair covers (:func:`groups`): one torch ``layer_norm`` pairs with the ten
primitives of JAX's ``LayerNorm``, a fused attention op with the matmuls and
softmax of the other side, compared at the group's output.
"""

from __future__ import annotations

from typing import Any

import attrs

from torchlens_core.compare.evidence import CLOSE, MIN_SCORE, NEAR, NO_PAIR, PLAIN, Cells, Gaps, best_pairs, scores
from torchlens_core.compare.layout import NONE, Layout, candidates
from torchlens_core.compare.metrics import EXACT, Agreement, agreement, least_precise, tolerance_for
from torchlens_core.compare.points import Point, read_value
from torchlens_core.ir.progress import progress
from torchlens_core.ir.trace import Trace

CHECKED = 6  # value candidates checked element for element per op
BLOCK = 4096  # cells of the structural scores worked out in one call (a few rows' candidates)
FRONTIER_WALK = 256  # ops visited looking for the nearest paired ones upstream
# Structural candidates of one op of a, besides the outputs of its own modules: the ones nearest its place in b.
# Past an early divergence the paired points every layer reads (rotary tables, masks) are on every op's
# frontier, so an op's class would otherwise make every same-class op of every layer a candidate (_near).
CANDIDATES = 64
HEALING_HOPS = 24  # how far downstream an agreeing pair shows a disagreement was no divergence (Aligner._healed)
# Classes of ops that are layers of a model, not steps of arithmetic inside one (Aligner._healed).
LAYERS = frozenset(
    {
        "matmul",
        "linear",
        "conv",
        "layer_norm",
        "batch_norm",
        "group_norm",
        "attention",
        "embedding",
        "softmax",
        "max_pool",
        "avg_pool",
        "gelu",
        "relu",
        "silu",
        "dropout",
    }
)


@attrs.define(slots=True)
class Match:
    """A pair of ops (point indices ``i`` of ``a``, ``j`` of ``b``), why they pair, and how their values agree.

    ``basis`` is ``values`` (the values agree), ``inputs`` (they disagree, every
    input agrees, and the structure singles the pair out: where a divergence
    starts) or ``structure`` (aligned by structure downstream of a divergence).
    """

    i: int
    j: int
    basis: str
    layout: Layout = NONE
    agreement: Agreement | None = None
    exact: bool = False  # integer or boolean values, compared exactly
    note: str = ""


@attrs.frozen
class Unaligned:
    """An op of ``a`` the aligner could not stand behind a counterpart for, the candidate it had, and why."""

    a: str
    b: str | None
    why: str


class Aligner:
    """The alignment of two traces' points; :meth:`run` returns the matches in ``a``'s order."""

    def __init__(
        self, a: Trace, b: Trace, pa: list[Point], pb: list[Point], rtol: float | None, atol: float | None
    ) -> None:
        self.a, self.b, self.pa, self.pb = a, b, pa, pb
        self.rtol, self.atol = rtol, atol
        # Gaps and scores are read for the pairs that need them, never as n x m matrices: the value pass finds its
        # candidates through sorted indexes (evidence.Gaps), the structural step through indexes of b by frontier,
        # class and module output (_candidates), and aligns only those cells (evidence.Cells).
        self.gaps = Gaps(pa, pb)
        self._keys = self._module_keys()
        # Pairs are of points (an op, or one array of an op that returned several): point index of a <-> of b.
        self.b_of_a: dict[int, int] = {}
        self.a_of_b: dict[int, int] = {}
        self.matches: dict[int, Match] = {}  # point index of a -> its match
        self.paired_a: dict[int, list[int]] = {}  # op index -> its paired points (several for unbind's arrays)
        self.paired_b: dict[int, list[int]] = {}
        self.unaligned: list[Unaligned] = []
        self._values: dict[tuple[str, int], tuple[Any, str]] = {}
        self._points_a = {p.index: k for k, p in enumerate(pa) if not p.path}  # ops with one array
        self._points_b = {p.index: c for c, p in enumerate(pb) if not p.path}
        self._chains: dict[tuple[str, int], int] = {}
        self._canons: dict[frozenset[int], frozenset[int]] = {}  # a frontier -> its points by chain (_canon)
        self._role: set[tuple[int, int]] = set()  # pairs that end each side's chain of ops on one same input
        self._close, self._close_b = self._closeness(a, pa), self._closeness(b, pb)
        self._close_b_max = float(self._close_b.max(initial=0.0))
        self._children_a: dict[int, list[int]] = {}
        self._children_b: dict[int, list[int]] = {}
        for trace, children in ((a, self._children_a), (b, self._children_b)):
            for op in trace.ops:
                for parent in op.parent_indices:
                    children.setdefault(parent, []).append(op.index)

    def run(self) -> list[Match]:
        self._value_pairs()
        if self._learn_prefix():
            self._keys = self._module_keys()
        self._structural_pairs()
        return sorted(self.matches.values(), key=lambda m: m.i)

    # -- 1. values ------------------------------------------------------------------------------------------------
    def _value_pairs(self) -> None:
        import numpy as np

        frontiers: dict[int, frozenset[int]] = {}
        outputs_b: dict[str, list[int]] = {}
        for c, q in enumerate(self.pb):
            for key in q.module_outputs:
                outputs_b.setdefault(key, []).append(c)
        with progress("tl.compare: pairing values", total=len(self.pa)) as bar:  # shown only past a few seconds
            for k, p in enumerate(bar.each(self.pa)):
                frontier = self._frontier_a(p.index, frontiers)
                near, gaps = self.gaps.within(k, 0.0 if p.kind == "int" else max(self._close[k], self._close_b_max))
                keep = gaps <= (0.0 if p.kind == "int" else np.maximum(self._close[k], self._close_b[near]))
                near, gaps = near[keep], gaps[keep]
                row = dict(zip(near.tolist(), gaps.tolist()))
                found = [
                    c
                    for c in near.tolist()
                    if c not in self.a_of_b and not self._inside_other_output(p, self.pb[c], outputs_b)
                ]
                if not found:
                    continue
                score = dict(zip(found, self._scores([k], found, gaps[np.searchsorted(near, found)][None, :])[0]))
                # Several ops of b may hold the value (a chain of reshapes and transposes): the one computed from the
                # counterparts of the op's inputs first, then one of the same class, one of the same shape (no layout
                # change), the same module, the closest fingerprint, the earliest.
                found.sort(
                    key=lambda c: (
                        p.cls is None or self.pb[c].cls != p.cls,
                        self.pb[c].func != p.func,
                        self.pb[c].shape != p.shape,
                        -score[c],
                        row[c],
                        self.pb[c].index,
                    )
                )
                consistency = {
                    c: _consistency(
                        self._canon(frontier), self._canon(self._mapped(self._frontier_b(self.pb[c].index)))
                    )
                    for c in found[: 2 * CHECKED]
                }
                for c in sorted(consistency, key=lambda c: -consistency[c])[:CHECKED]:
                    consistent = consistency[c]
                    telling = p.distinct > 2 and (p.size or 0) > 2 and p.kind == "float"
                    is_input = self.a.ops[p.index].kind == "input" and self.b.ops[self.pb[c].index].kind == "input"
                    # A value that says little (all zeros, a 0/1 mask, a position count) pairs only with an op of its
                    # kind computed from the same inputs: an all-False comparison is not a gather of zeros.
                    if not (
                        telling
                        or is_input
                        or (consistent == 2 and _kin(p, self.pb[c]))
                        or (consistent and p.distinct > 2)
                    ):
                        continue
                    match = self._judge(k, c, "values")
                    if match.agreement is not None and match.agreement.ok:
                        self._accept(match)
                        break

    def _module_keys(self) -> tuple[set[str], set[str]]:
        """The module outputs named anywhere on each side (what evidence.scores reads of the whole sides)."""
        return ({key for p in self.pa for key in p.module_outputs}, {key for q in self.pb for key in q.module_outputs})

    def _scores(self, ks: list[int], cs: list[int], gap: Any) -> Any:
        """``evidence.scores`` of the whole sides at rows ``ks`` and columns ``cs`` (``gap``: their gaps)."""
        return scores([self.pa[k] for k in ks], [self.pb[c] for c in cs], gap, self._keys)

    def _inside_other_output(self, p: Point, q: Point, outputs_b: dict[str, list[int]]) -> bool:
        """Whether ``p`` is the output of a module pass that ``b`` ran too, returning an op other than ``q``.

        A module's output pairs with the same module's output: another value
        of ``b`` that happens to equal it (the input of a dropout left on, a
        dtype copy of the softmax before it, a copy at the module's boundary)
        is a coincidence of values, not the counterpart. Where the two
        modules' outputs disagree, the structural step pairs them, as a
        divergence.
        """
        return any(key not in q.module_outputs and outputs_b.get(key) for key in p.module_outputs)

    def _closeness(self, trace: Trace, side: list[Point]) -> Any:
        """Per point: the fingerprint gap under which a pair is worth checking element for element (its dtype's)."""
        import numpy as np

        return np.array(
            [
                max(CLOSE, 4 * (self.rtol if self.rtol is not None else tolerance_for(trace.ops[p.index].dtype).rtol))
                for p in side
            ]
        )

    def _learn_prefix(self) -> bool:
        """Module paths that differ by a prefix (``vision_model.encoder...`` against ``encoder...``), learnt from
        the value pairs: ``b``'s paths rewritten to ``a``'s for the structural step. True if they were."""
        from collections import Counter

        votes: Counter[tuple[tuple[str, ...], tuple[str, ...]]] = Counter()
        for match in self.matches.values():
            for key_a in self.pa[match.i].module_outputs:
                for key_b in self.pb[match.j].module_outputs:
                    found = _prefix_difference(key_a.rpartition(":")[0], key_b.rpartition(":")[0])
                    if found is not None:
                        votes[found] += 1
        if not votes:
            return False
        (extra_a, extra_b), count = votes.most_common(1)[0]
        if (not extra_a and not extra_b) or count < 3 or count < 0.6 * sum(votes.values()):
            return False
        for q in self.pb:
            q.module = _swap_prefix(q.module, extra_b, extra_a)
            q.module_outputs = frozenset(
                _swap_prefix(key.rpartition(":")[0], extra_b, extra_a) + ":" + key.rpartition(":")[2]
                for key in q.module_outputs
            )
        return True

    # -- 2. structure ---------------------------------------------------------------------------------------------
    def _structural_pairs(self) -> None:
        # A value that only re-lays out one already paired (a view of a paired op) has its counterpart: the chain's.
        left_a = [k for k in range(len(self.pa)) if k not in self.b_of_a and not self._relaid("a", k)]
        left_b = [c for c in range(len(self.pb)) if c not in self.a_of_b and not self._relaid("b", c)]
        if not left_a or not left_b:
            return
        fa: dict[int, frozenset[int]] = {}
        fb = {c: self._canon(self._mapped(self._frontier_b(self.pb[c].index))) for c in left_b}
        sub = self._candidates(left_a, left_b, fa, fb)
        self._same_role(sub, left_a, left_b, fa, fb)
        # The pairs come in a's order and a frontier reads only ops before its op, so the frontiers worked out for
        # one pair stay true for the next: a pair accepted since is paired, which _frontier_a looks at first.
        frontiers: dict[int, frozenset[int]] = {}
        for x, y in best_pairs(sub):
            self._classify(left_a[x], left_b[y], x, y, sub, left_a, left_b, frontiers)

    def _candidates(
        self, left_a: list[int], left_b: list[int], fa: dict[int, frozenset[int]], fb: dict[int, frozenset[int]]
    ) -> Cells:
        """The structural scores of ``left_a`` against ``left_b``, kept only between ops computed from counterpart
        inputs (frontiers that meet) or two inputs: found through indexes of ``b``, never as the dense matrix.

        A score reaches MIN_SCORE only with the same class, the same module output or nearly equal values (the
        rest adds up to 2 at most): so the candidates of an op of ``a`` are the ops of ``b`` of its class on one
        of its frontier's points, those returned by one of its modules, those within NEAR of its value, and
        ``b``'s inputs for an input. Only they are scored, and scored as the dense matrix scored them.
        """
        import numpy as np

        position = {c: y for y, c in enumerate(left_b)}
        by_class: dict[tuple[int, str], list[int]] = {}  # (a point on the frontier, a class) -> positions in left_b
        by_output: dict[str, list[int]] = {}
        for y, c in enumerate(left_b):
            q = self.pb[c]
            if q.cls is not None:
                for point in fb[c]:
                    by_class.setdefault((point, q.cls), []).append(y)
            for key in q.module_outputs:
                by_output.setdefault(key, []).append(y)
        inputs_b = [y for y, c in enumerate(left_b) if self.b.ops[self.pb[c].index].kind == "input"]
        of_class: dict[tuple[frozenset[int], str], list[int]] = {}  # many ops share a frontier and a class
        wanted: list[tuple[int, Any]] = []  # (row, its candidate columns), rows with candidates only
        with progress("tl.compare: aligning by structure", total=len(left_a)) as bar:
            for x, k in enumerate(bar.each(left_a)):
                p = self.pa[k]
                frontier = self._canon(self._frontier_a(p.index, fa))
                place = x * len(left_b) / len(left_a)  # where the op would sit in b if the two ran alike
                found = set(_near(self._of_class(frontier, p.cls, by_class, of_class), place))
                near, _ = self.gaps.within(k, NEAR)
                outputs = {y for key in p.module_outputs for y in by_output.get(key, ())}
                others = outputs | {position[c] for c in near.tolist() if c in position}
                found.update(y for y in others - found if frontier & fb[left_b[y]])
                if self.a.ops[p.index].kind == "input":
                    found.update(_near(inputs_b, place))
                if len(found) > CANDIDATES:  # the nearest; its own modules' outputs whatever their place
                    found = set(_near(sorted(found - outputs), place)) | (found & outputs)
                if found:
                    wanted.append((x, np.array(sorted(found), dtype=np.int64)))
        cells = Cells(len(left_a), len(left_b))
        start = 0
        while start < len(wanted):  # a few rows scored at once, against the union of their candidates (bounded)
            stop, union = start + 1, wanted[start][1]
            while stop < len(wanted) and (stop - start + 1) * (len(union) + len(wanted[stop][1])) <= BLOCK:
                union = np.union1d(union, wanted[stop][1])
                stop += 1
            xs = [x for x, _ in wanted[start:stop]]
            ks, cs = [left_a[x] for x in xs], [left_b[y] for y in union.tolist()]
            block = self._scores(ks, cs, self.gaps.block(ks, cs))
            for row, (x, ys) in zip(block, wanted[start:stop]):
                score = row[np.searchsorted(union, ys)]
                live = score > NO_PAIR
                cells.set_row(x, ys[live], score[live])
            start = stop
        return cells

    @staticmethod
    def _of_class(
        frontier: frozenset[int],
        cls: str | None,
        by_class: dict[tuple[int, str], list[int]],
        memo: dict[tuple[frozenset[int], str], list[int]],
    ) -> list[int]:
        """The positions in ``b`` of ops of class ``cls`` with a point of ``frontier`` on their frontier."""
        if cls is None:
            return []
        found = memo.get((frontier, cls))
        if found is None:
            found = memo[(frontier, cls)] = sorted({y for point in frontier for y in by_class.get((point, cls), ())})
        return found

    def _same_role(
        self,
        sub: Cells,
        left_a: list[int],
        left_b: list[int],
        fa: dict[int, frozenset[int]],
        fb: dict[int, frozenset[int]],
    ) -> None:
        """Pair the last op of each side's chain of one-input ops on the same value (``self._role``).

        An activation and its replacement (SiLU against GELU's eight
        primitives) share no class, module or value: what ties them is their
        role, the end of a chain of ops computed from one and the same input
        before it meets any other.
        """
        ends_a = {
            k: f
            for k in left_a
            if len(f := self._canon(self._frontier_a(self.pa[k].index, fa))) == 1
            and self._chain_end(self.a, self.pa[k].index, f, lambda i: self._canon(self._frontier_a(i, fa)))
        }
        ends_b: dict[frozenset[int], list[int]] = {}
        for c in left_b:
            if len(fb[c]) == 1 and self._chain_end(
                self.b, self.pb[c].index, fb[c], lambda i: self._canon(self._mapped(self._frontier_b(i)))
            ):
                ends_b.setdefault(fb[c], []).append(c)
        position_b = {c: y for y, c in enumerate(left_b)}
        for x, k in enumerate(left_a):
            ys = []
            for c in ends_b.get(ends_a.get(k, frozenset()), []) if k in ends_a else []:
                if self.pa[k].size == self.pb[c].size and self.pa[k].kind == self.pb[c].kind == "float":
                    ys.append(position_b[c])
                    self._role.add((k, c))
            if ys:
                sub.raise_to(x, ys, MIN_SCORE)

    def _chain_end(self, trace: Trace, index: int, frontier: frozenset[int], frontier_of: Any) -> bool:
        """Whether op ``index`` ends its chain: every op reading it is a layer (a linear...), changes the size,
        or is computed from more than ``frontier``."""
        side, points_of = (self.pa, self._points_a) if trace is self.a else (self.pb, self._points_b)
        children = (self._children_a if trace is self.a else self._children_b).get(index, ())
        size = side[points_of[index]].size if index in points_of else None

        def ends(child: int) -> bool:
            point = points_of.get(child)
            return (
                point is None or side[point].cls in LAYERS or side[point].size != size or frontier_of(child) != frontier
            )

        return bool(children) and all(ends(child) for child in children)

    def _classify(
        self,
        k: int,
        c: int,
        x: int,
        y: int,
        sub: Cells,
        left_a: list[int],
        left_b: list[int],
        frontiers: dict[int, frozenset[int]],
    ) -> None:
        match = self._judge(k, c, "structure")
        if match.agreement is not None and match.agreement.ok:
            p = self.pa[k]
            if p.distinct > 2 or _kin(p, self.pb[c]):  # two all-zero arrays agree, and say nothing of each other
                match.basis = "values"
                self._accept(match)
            return
        upstream = self._frontier_a(self.pa[k].index, frontiers) | self._mapped(self._frontier_b(self.pb[c].index))
        inherited = [u for u in upstream if u in self.matches and self.matches[u].basis != "values"]
        if inherited:
            self._accept(match)  # downstream of a divergence: it inherits the error
            return
        label_a, label_b = self.a.ops[self.pa[k].index].label, self.b.ops[self.pb[c].index].label
        pa, pb = self.pa[k], self.pb[c]
        near = self.gaps.pair(k, c) <= NEAR and pa.kind == "float"  # integers: equal or not, never "nearly"
        by_structure = (
            bool(pa.module_outputs & pb.module_outputs)
            or (k, c) in self._role
            or (pa.cls is not None and pa.cls == pb.cls and pa.cls not in PLAIN)
        )
        strong = by_structure or near
        if match.agreement is not None and self._same_multiset(k, c, match.agreement.tolerance):
            self.unaligned.append(Unaligned(label_a, label_b, "the same values, in an order no layout explains"))
            return
        if not strong:
            self.unaligned.append(
                Unaligned(
                    label_a,
                    label_b,
                    "values disagree while every input agrees, and neither module, class nor values tie the two",
                )
            )
            return
        # A rival fits as well, is not on the chosen op's own chain, and sits as many ops past the agreeing inputs
        # (the dropout of a later layer, far downstream of the same inputs, is no rival of this one's).
        depth_a, depth_b = _depth(self.a, pa.index, self.paired_a), _depth(self.b, pb.index, self.paired_b)
        chosen = sub.get(x, y)
        ys, row = sub.row(x)
        xs, column = sub.column(y)
        rivals = [
            r
            for r in (left_b[v] for v in ys[row >= chosen].tolist() if v != y)
            if not _chained(self.b, self.pb[r].index, pb.index, self.paired_b)
            and abs(_depth(self.b, self.pb[r].index, self.paired_b) - depth_b) <= 1
        ]
        rivals += [
            r
            for r in (left_a[u] for u in xs[column >= chosen].tolist() if u != x)
            if not _chained(self.a, self.pa[r].index, pa.index, self.paired_a)
            and abs(_depth(self.a, self.pa[r].index, self.paired_a) - depth_a) <= 1
        ]
        if rivals:
            self.unaligned.append(
                Unaligned(
                    label_a,
                    label_b,
                    f"values disagree while every input agrees, and {len(rivals)} other candidates fit as well",
                )
            )
            return
        healed = self._healed(k, c)
        if healed is not None:
            self.unaligned.append(
                Unaligned(
                    label_a,
                    label_b,
                    f"values disagree, but {healed}, computed from both, agrees again: not where a divergence starts",
                )
            )
            return
        match.basis = "inputs"
        self._accept(match)

    def _healed(self, k: int, c: int) -> str | None:
        """An agreeing pair that every path downstream of both ops reaches within a few plain ops, if there is one.

        A real divergence carries on downstream. Two ops whose every consumer,
        a few arithmetic ops on, agrees again were never counterparts: an
        intermediate of one side's decomposition paired with the other side's
        input to it (``x + 0.044715 x³`` against ``x`` inside GELU's tanh
        form), scores computed before a scale on one side and after it on the
        other, a position bias returned with or without the mask added. A path
        through a layer (an activation, a linear, a norm, a softmax: a softmax
        may squeeze a real error below the tolerance), a module's output or a
        pair that disagrees leaves the question open: not healed. A value
        nobody reads (a dead end) says nothing either way.
        """
        index_a, index_b = self.pa[k].index, self.pb[c].index
        agreeing = None
        stack, seen = [(child, 1) for child in self._children_a.get(index_a, ())], set()
        if not stack:
            return None
        while stack:
            op, hops = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            if op in self.paired_a:
                found = [
                    self.pb[self.matches[point].j].index
                    for point in self.paired_a[op]
                    if self.matches[point].basis == "values"
                ]
                found = [j for j in found if index_b in self._ancestors_b(j, index_b)]
                if not found:
                    return None
                agreeing = agreeing or f"{self.a.ops[op].label} ~ {self.b.ops[found[0]].label}"
                continue
            point = self._points_a.get(op)
            passed_on = bool(self.a.ops[op].meta.get("identity"))  # a value a module returned as it was given
            layer = point is not None and (
                self.pa[point].cls in LAYERS or (bool(self.pa[point].module_outputs) and not passed_on)
            )
            if hops >= HEALING_HOPS or layer:
                return None
            stack.extend((child, hops + 1) for child in self._children_a.get(op, ()))  # a dead end reaches nothing
        return agreeing

    def _ancestors_b(self, index: int, stop_at: int) -> set[int]:
        """Ops of ``b`` upstream of op ``index``, no earlier than op ``stop_at`` (a bounded walk)."""
        found: set[int] = set()
        stack = list(self.b.ops[index].parent_indices)
        while stack and len(found) < FRONTIER_WALK:
            op = stack.pop()
            if op in found or op < stop_at:
                continue
            found.add(op)
            if op == stop_at:
                break
            stack.extend(self.b.ops[op].parent_indices)
        return found

    # -- judging one pair ---------------------------------------------------------------------------------------
    def _judge(self, k: int, c: int, basis: str) -> Match:
        """The layout that puts ``a``'s value in ``b``'s order best, and how the values agree under it."""
        match = Match(k, c, basis)
        op_a, op_b = self.a.ops[self.pa[k].index], self.b.ops[self.pb[c].index]
        va, kind_a = self._value("a", k)
        vb, kind_b = self._value("b", c)
        if va is None or vb is None:
            match.note = "value not saved" if not (op_a.saved and op_b.saved) else "not an array"
            return match
        options = candidates(va.shape, vb.shape, self._carried(op_a.index))
        if options == [NONE]:
            match.note = f"{tuple(va.shape)} vs {tuple(vb.shape)}"
            return match
        match.exact = kind_a == "int" or kind_b == "int"
        tolerance = EXACT if match.exact else tolerance_for(op_a.dtype, op_b.dtype, rtol=self.rtol, atol=self.atol)
        precision = least_precise(op_a.dtype, op_b.dtype)
        best: tuple[Layout, Agreement] | None = None
        for layout in options:
            left, right = layout.pair(va, vb)
            if best is not None and best[1].ok is False and not _roughly(left, right, tolerance):
                continue
            found = agreement(left, right, tolerance, precision)
            if (
                best is None
                or (found.ok and not best[1].ok)
                or (found.ok == best[1].ok and found.max_abs < best[1].max_abs)
            ):
                best = (layout, found)
            if found.ok:
                break
        assert best is not None
        match.layout, match.agreement = best
        return match

    def _same_multiset(self, k: int, c: int, tolerance: Any) -> bool:
        """Whether the two values hold the same numbers (sorted, within tolerance), whatever their order."""
        import numpy as np

        va, _ = self._value("a", k)
        vb, _ = self._value("b", c)
        if va is None or vb is None or va.size != vb.size or self.gaps.pair(k, c) > NEAR:
            return False
        return agreement(np.sort(va, axis=None), np.sort(vb, axis=None), tolerance).ok

    def _value(self, side: str, point: int) -> tuple[Any, str]:
        key = (side, point)
        if key not in self._values:
            trace, p = (self.a, self.pa[point]) if side == "a" else (self.b, self.pb[point])
            op = trace.ops[p.index]
            found = read_value(trace, op, p.path)
            if op.stored is not None:  # on disk (save_to=): read again when asked, not held for the whole compare
                return found
            self._values[key] = found
        return self._values[key]

    def _carried(self, index: int) -> list[tuple[Layout, str]]:
        """Permuted layouts of the pairs upstream of op ``index`` of ``a``, nearest first (bounded)."""
        found: list[tuple[Layout, str]] = []
        frontier, seen = list(self.a.ops[index].parent_indices), set[int]()
        while frontier and len(seen) < 64:
            k = frontier.pop(0)
            if k in seen:
                continue
            seen.add(k)
            matches = [self.matches[point] for point in self.paired_a.get(k, ())]
            for match in matches:
                if match.layout.kind == "permuted" and all(
                    match.layout.perm != f.perm or match.layout.via_shape != f.via_shape for f, _ in found
                ):
                    found.append((match.layout, f"{self.a.ops[k].label} ~ {self.b.ops[self.pb[match.j].index].label}"))
            if not any(match.layout.kind == "carried" for match in matches):  # carried from further up already
                frontier.extend(self.a.ops[k].parent_indices)
        return found

    def _accept(self, match: Match) -> None:
        self.matches[match.i] = match
        self.b_of_a[match.i], self.a_of_b[match.j] = match.j, match.i
        self.paired_a.setdefault(self.pa[match.i].index, []).append(match.i)
        self.paired_b.setdefault(self.pb[match.j].index, []).append(match.j)

    # -- frontiers: the nearest paired ops upstream -------------------------------------------------------------
    def _frontier_a(self, index: int, memo: dict[int, frozenset[int]]) -> frozenset[int]:
        """Points of ``a``: the nearest paired ones upstream of op ``index`` (memo: earlier results)."""
        found: set[int] = set()
        for parent in self.a.ops[index].parent_indices:
            if parent in self.paired_a:
                found.update(self.paired_a[parent])
            elif parent in memo:
                found |= memo[parent]
            else:
                found |= self._frontier_a(parent, memo) if len(memo) < 100_000 else set()
        memo[index] = frozenset(found)
        return memo[index]

    def _frontier_b(self, index: int) -> frozenset[int]:
        """Points of ``b``: the nearest paired ones upstream of op ``index`` (a bounded walk)."""
        found, stack, seen = set[int](), list(self.b.ops[index].parent_indices), set[int]()
        while stack and len(seen) < FRONTIER_WALK:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            if k in self.paired_b:
                found.update(self.paired_b[k])
            else:
                stack.extend(self.b.ops[k].parent_indices)
        return frozenset(found)

    def _canon(self, frontier: frozenset[int]) -> frozenset[int]:
        """Points of ``a`` named by the first op of their chain of layout changes (a view, a permute, a copy).

        Two sides that pair such a chain crosswise (a's view with b's reshape,
        a's permute with b's transpose) still hold the same values upstream of
        what follows: frontiers are compared by chain, not by op.
        """
        found = self._canons.get(frontier)
        if found is None:  # frontiers repeat (the ops of one stretch share one), and past a divergence grow long
            found = self._canons[frontier] = frozenset(self._chain_start("a", k) for k in frontier)
        return found

    def _chain_start(self, side: str, k: int) -> int:
        """The first point of the chain of layout changes (one input, the same values) that ends at point ``k``."""
        found = self._chains.get((side, k))
        if found is not None:
            return found
        trace, side_points, singles = (
            (self.a, self.pa, self._points_a) if side == "a" else (self.b, self.pb, self._points_b)
        )
        found, p = k, side_points[k]
        parents = [q for q in trace.ops[p.index].parent_indices if q in singles]
        if len(parents) == 1 and p.fingerprint is not None:
            q = singles[parents[0]]
            up = side_points[q]
            if (
                up.size == p.size
                and up.fingerprint is not None
                and up.kind == p.kind
                and float(abs(up.fingerprint - p.fingerprint).max()) <= 1e-7 * max(p.scale, 1e-30)
            ):
                found = self._chain_start(side, q)
        self._chains[(side, k)] = found
        return found

    def _relaid(self, side: str, k: int) -> bool:
        """Whether point ``k`` only re-lays out a value that is paired and agrees: it has its counterpart already.

        A layer that passed its input on unchanged (a dropout at inference) is
        still a layer: the other side's may not have, and that is a divergence.
        """
        start = self._chain_start(side, k)
        paired = self.b_of_a if side == "a" else self.a_of_b
        if start == k or start not in paired or (self.pa if side == "a" else self.pb)[k].cls in LAYERS:
            return False
        match = self.matches[start if side == "a" else paired[start]]
        return match.basis == "values"

    def _mapped(self, frontier_b: frozenset[int]) -> frozenset[int]:
        return frozenset(self.a_of_b[k] for k in frontier_b)


def _prefix_difference(path_a: str, path_b: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The leading parts one path has and the other lacks, when the rest is the same (at least two parts)."""
    pa, pb = tuple(path_a.split(".")) if path_a else (), tuple(path_b.split(".")) if path_b else ()
    for extra_a in range(len(pa) + 1):
        for extra_b in range(len(pb) + 1):
            if (extra_a == 0 or extra_b == 0) and len(pa) - extra_a >= 2 and pa[extra_a:] == pb[extra_b:]:
                return pa[:extra_a], pb[:extra_b]
    return None


def _swap_prefix(path: str, old: tuple[str, ...], new: tuple[str, ...]) -> str:
    parts = tuple(path.split(".")) if path else ()
    if parts[: len(old)] != old:
        return path
    return ".".join(new + parts[len(old) :])


def _depth(trace: Trace, index: int, paired: dict[int, list[int]]) -> int:
    """How many ops op ``index`` sits past the nearest paired op upstream (a bounded breadth-first walk)."""
    frontier, seen, depth = list(trace.ops[index].parent_indices), set[int](), 1
    while frontier and len(seen) < FRONTIER_WALK:
        if any(k in paired for k in frontier):
            return depth
        seen.update(frontier)
        frontier = [p for k in frontier for p in trace.ops[k].parent_indices if p not in seen]
        depth += 1
    return depth


def _chained(trace: Trace, one: int, other: int, paired: dict[int, list[int]]) -> bool:
    """Whether one op feeds the other through unpaired ops only: the two ends of one group, a benign tie."""
    low, high = min(one, other), max(one, other)
    stack, seen = list(trace.ops[high].parent_indices), set[int]()
    while stack and len(seen) < 64:
        k = stack.pop()
        if k == low:
            return True
        if k in seen or k in paired or k < low:
            continue
        seen.add(k)
        stack.extend(trace.ops[k].parent_indices)
    return False


def _near(ys: list[int], place: float) -> list[int]:
    """The ``CANDIDATES`` positions of ``ys`` (ascending) nearest ``place``, the earlier of two as near; all of
    them when there are no more. Read from a window of the list, so as cheap for a list of every layer's ops.

    Structure aligns in order, and a counterpart sits near the op's place in ``b``: the same class forty layers
    away is no candidate. Longer lists come from a paired table every layer of a deep trace reads; the ports
    and the comparison menagerie have none.
    """
    import bisect

    if len(ys) <= CANDIDATES:
        return ys
    at = bisect.bisect_left(ys, place)
    window = ys[max(0, at - CANDIDATES) : at + CANDIDATES]
    return sorted(sorted(window, key=lambda y: (abs(y - place), y))[:CANDIDATES])


def _kin(p: Point, q: Point) -> bool:
    """The same class, the same function or the output of the same module."""
    return (p.cls is not None and p.cls == q.cls) or p.func == q.func or bool(p.module_outputs & q.module_outputs)


def _consistency(frontier_a: frozenset[int], frontier_b: frozenset[int]) -> int:
    """2: the same paired inputs; 1: some in common; 0: none (or no paired input on either side)."""
    if not frontier_a or not frontier_b:
        return 0
    return 2 if frontier_a == frontier_b else (1 if frontier_a & frontier_b else 0)


def _roughly(a: Any, b: Any, tolerance: Any) -> bool:
    """A cheap look at a strided sample: could these agree? (Full agreement is several passes over the arrays.)"""
    import numpy as np

    step = max(1, a.size // 4096)
    sa, sb = np.ravel(a)[::step], np.ravel(b)[::step]
    scale = float(np.max(np.abs(sb[np.isfinite(sb)]), initial=0.0))
    with np.errstate(invalid="ignore"):
        return bool(np.nanmax(np.abs(sa - sb), initial=0.0) <= max(10 * tolerance.rtol * scale, tolerance.atol))


def groups(trace: Trace, anchors: list[int]) -> list[list[int]]:
    """For each anchor op, the ops it covers: itself and the ancestors no anchor before it covers.

    Anchors are walked in the trace's own execution order (pairs may cross),
    and the groups returned in the order of ``anchors``. Input nodes belong to
    no group but their own; an ancestor already covered stops the walk. An op
    anchoring several pairs (one per array it returned) is in the first one's
    group; the others' groups hold it alone.
    """
    covered: set[int] = set()
    anchored = set(anchors)
    found: dict[int, list[int]] = {}
    for n in sorted(range(len(anchors)), key=lambda n: (anchors[n], n)):
        anchor = anchors[n]
        if anchor in covered:
            found[n] = [anchor]
            continue
        group, stack = [], [anchor]
        while stack:
            index = stack.pop()
            if index in covered or (index != anchor and index in anchored):
                continue
            op = trace.ops[index]
            if op.kind == "input" and index != anchor:
                continue
            covered.add(index)
            group.append(index)
            stack.extend(op.parent_indices)
        found[n] = sorted(group)
    return [found[n] for n in range(len(anchors))]
