"""Steps that must stay linear in the number of ops (issue 38; bench/scale.py times them at 1k to 50k ops).

No timings here: each test counts the work a step does (walks over the ops, entries of a pairwise matrix) on a
trace with many modules or ops, where the quadratic code did work in proportion to the square; and each checks
the step's answer against an independent one (the labels computed directly, the dense matrix it replaces).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.compare import align, evidence  # noqa: E402
from torchlens_core.compare.points import points  # noqa: E402
from torchlens_core.replay import audit  # noqa: E402


class Deep(nn.Module):
    """``blocks`` residual blocks (linear, layer norm, GELU, add), each a module pass of its own."""

    def __init__(self, blocks: int = 40, width: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()) for _ in range(blocks)
        )
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x), self.head(x).argmax(-1)  # an integer output too: it pairs exactly


def _trace(seed: int = 0, blocks: int = 40, jitter: float = 0.0) -> tl.Trace:
    """``Deep(blocks)`` on one fixed input; another ``seed`` gives other weights from the first layer on."""
    torch.manual_seed(seed)
    model = Deep(blocks).eval()
    if jitter:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(jitter * torch.randn_like(p))
    with torch.no_grad():
        return tl.trace(model, torch.randn(4, 8, generator=torch.Generator().manual_seed(1)))


class Walks(list):
    """A trace's op list that counts the walks over it."""

    walks = 0

    def __iter__(self):
        Walks.walks += 1
        return super().__iter__()


def test_counts_agree_walks_the_ops_a_constant_number_of_times(monkeypatch):
    trace = _trace()
    passes = sum(m.num_passes for m in trace.modules.values())
    assert passes > 100
    # the reference: each pass's ops, found op by op from the records' own module passes
    expected = {
        (mp.path, mp.pass_num): [op.label for op in trace.ops if (mp.path, mp.pass_num) in op.module_passes]
        for m in trace.modules.values()
        for mp in m.passes
    }
    assert all(expected[(mp.path, mp.pass_num)] == mp.ops for m in trace.modules.values() for mp in m.passes)
    monkeypatch.setattr(trace, "ops", Walks(trace.ops))
    Walks.walks = 0
    assert list(audit._counts_agree(trace)) == []
    assert Walks.walks <= 5  # the old check walked the ops once per module pass (here > 100 times)
    # a pass that lists an op it did not run is still caught
    mp = trace.modules["blocks.3.0"].passes[0]
    monkeypatch.setattr(mp, "ops", [*mp.ops, trace.ops[1].label])
    found = list(audit._counts_agree(trace))
    assert [f.detail for f in found] == [f"{mp.label} lists {len(mp.ops)} ops, {len(mp.ops) - 1} ran inside it"]


def test_compare_builds_no_matrix_over_every_pair_of_ops(monkeypatch):
    a, b = _trace(), _trace()
    pa, pb = points(a), points(b)
    assert len(pa) > 150
    areas: list[int] = []

    def counted(function):
        def wrapper(x, y, *args, **kwargs):
            areas.append(len(x) * len(y))
            return function(x, y, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(align, "scores", counted(evidence.scores))
    monkeypatch.setattr(align, "fingerprint_gaps", counted(evidence.fingerprint_gaps), raising=False)
    cmp = tl.compare(a, b)
    # two traces of one model on one input: every op pairs with itself, and agrees
    assert [(p.a, p.b, p.verdict) for p in cmp.pairs] == [(p.a, p.a, "agrees") for p in cmp.pairs]
    assert {p.a for p in cmp.pairs} >= {op.label for op in a.ops if op.kind == "op" and op.func_name != "argmax"}
    # the old aligner built len(pa) x len(pb) matrices of gaps and scores; rows of a few candidates do now
    assert areas and max(areas) < len(pa) * len(pb) / 20
    assert sum(areas) < len(pa) * len(pb) / 5


def test_gaps_on_demand_are_the_dense_gaps():
    """evidence.Gaps, entry by entry and through its index, against the dense matrix it replaces."""
    pa, pb = points(_trace()), points(_trace(jitter=1e-4))
    dense = evidence.fingerprint_gaps(pa, pb)
    gaps = evidence.Gaps(pa, pb)
    everything = gaps.block(list(range(len(pa))), list(range(len(pb))))
    assert np.array_equal(everything, dense)  # inf where the values cannot pair, bit for bit elsewhere
    assert np.isfinite(dense).any() and np.isinf(dense).any()
    finite = np.isfinite(dense)
    for limit in (0.0, 1e-3, 3e-2, 0.3, 0.7):
        assert (dense[finite] <= limit).any()
        for k in range(len(pa)):
            near, found = gaps.within(k, limit)
            expected = np.flatnonzero(dense[k] <= limit)
            assert near.tolist() == expected.tolist(), (k, limit)
            assert np.array_equal(found, dense[k, expected])


def _dense_best_pairs(score: np.ndarray) -> list[tuple[int, int]]:
    """The reference: the order-preserving alignment with free gaps over the whole matrix (Needleman-Wunsch), as
    the aligner ran it before it kept only the live cells."""
    n, m = score.shape
    total = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        prev = total[i - 1]
        total[i, 1:] = np.maximum.accumulate(np.maximum(prev[1:], prev[:-1] + score[i - 1]))
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        if total[i, j] == total[i - 1, j]:
            i -= 1
        elif total[i, j] == total[i, j - 1]:
            j -= 1
        else:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    return pairs[::-1]


def test_best_pairs_over_live_cells_is_the_dense_alignment_tie_for_tie():
    rng = np.random.default_rng(0)
    for trial in range(600):
        n, m = (int(v) for v in rng.integers(0, 40, 2))
        # the scores the aligner builds (sums of a few evidence weights): many ties, which the walk back must break
        # as the dense table's does; and arbitrary ones
        values = rng.choice([3.0, 3.5, 4.0, 5.0, 6.5, 7.0], (n, m)) if trial % 2 else rng.uniform(3, 9, (n, m))
        score = np.where(rng.random((n, m)) < rng.choice([0.05, 0.3, 0.8]), values, evidence.NO_PAIR)
        cells = evidence.Cells.from_dense(score)
        assert len(cells) == int((score > evidence.NO_PAIR).sum())
        assert evidence.best_pairs(cells) == _dense_best_pairs(score), trial


def _left(aligner: align.Aligner) -> tuple[list[int], list[int]]:
    """The points the structural step aligns: those the value pass left unpaired, as _structural_pairs picks them."""
    return (
        [k for k in range(len(aligner.pa)) if k not in aligner.b_of_a and not aligner._relaid("a", k)],
        [c for c in range(len(aligner.pb)) if c not in aligner.a_of_b and not aligner._relaid("b", c)],
    )


def test_structural_candidates_are_the_live_cells_of_the_dense_matrix():
    """Two traces that diverge at the first layer (other weights): almost nothing pairs by value, and the cells
    found through the indexes are every cell of the dense score matrix the frontier filter keeps, score for score."""
    a, b = _trace(seed=0, blocks=12), _trace(seed=1, blocks=12)
    aligner = align.Aligner(a, b, points(a), points(b), None, None)
    aligner._value_pairs()
    left_a, left_b = _left(aligner)
    assert len(left_a) > 0.8 * len(aligner.pa) and len(left_b) > 0.8 * len(aligner.pb)  # diverged early
    fb = {c: aligner._canon(aligner._mapped(aligner._frontier_b(aligner.pb[c].index))) for c in left_b}
    cells = aligner._candidates(left_a, left_b, {}, fb)
    sa, sb = [aligner.pa[k] for k in left_a], [aligner.pb[c] for c in left_b]
    dense = evidence.scores(sa, sb, evidence.fingerprint_gaps(sa, sb), aligner._keys)
    for x, k in enumerate(left_a):
        frontier = aligner._canon(aligner._frontier_a(aligner.pa[k].index, {}))
        inputs = [
            a.ops[aligner.pa[k].index].kind == "input" and b.ops[aligner.pb[c].index].kind == "input" for c in left_b
        ]
        keep = [frontier & fb[c] or inputs[y] for y, c in enumerate(left_b)]
        expected = np.flatnonzero((dense[x] > evidence.NO_PAIR) & np.array(keep, dtype=bool))
        ys, values = cells.row(x)
        assert ys.tolist() == expected.tolist(), x
        assert np.array_equal(values, dense[x, expected])
    assert 0 < len(cells) < len(left_a) * len(left_b) / 4


def test_early_divergence_builds_no_matrix_over_every_pair_of_ops(monkeypatch):
    """The structural step's largest score matrix stays bounded as the traces grow; it was every unpaired op of
    ``a`` by every unpaired op of ``b`` (quadratic: 50,000 ops diverging at the first layer made 20 GB)."""
    largest: dict[int, int] = {}
    areas: list[int] = []

    def counted(x, y, *args, **kwargs):
        areas.append(len(x) * len(y))
        return evidence.scores(x, y, *args, **kwargs)

    monkeypatch.setattr(align, "scores", counted)
    for blocks in (16, 48):
        a, b = _trace(seed=0, blocks=blocks), _trace(seed=1, blocks=blocks)
        areas.clear()
        cmp = tl.compare(a, b)
        # the first linear layer is the first op whose weights differ: where the divergence starts
        assert cmp.first_divergence is not None and cmp.first_divergence.a == "linear_1_1"
        assert [p.verdict for p in cmp.pairs[:2]] == ["agrees", "diverges"]  # the input, then the first linear
        largest[len(a)] = max(areas)
    (small, area_small), (large, area_large) = sorted(largest.items())
    assert large > 2.5 * small
    # linear at most: the old code's grew with the square (about (large / small) ** 2 = 8.7 times here)
    assert area_large <= area_small * large / small
    assert area_large <= align.BLOCK + large


class SharedTable(nn.Module):
    """``Deep``'s blocks, each scaling its output by one table computed from no weight (as a decoder's rotary
    tables and masks): the table pairs by value however the weights differ, and every block's ``mul`` reads it."""

    def __init__(self, blocks: int, width: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks))

    def forward(self, x):
        table = torch.cos(torch.arange(x.shape[-1], dtype=x.dtype) / 3)
        for block in self.blocks:
            x = x + block(x) * table
        return x


def test_a_table_every_layer_reads_keeps_structural_candidates_per_op_bounded():
    """Past an early divergence the table is every op's paired input, on both sides: each ``mul`` of ``a`` had
    every ``mul`` of ``b`` as a candidate (cells growing with the square of the blocks); now the ones nearest its
    place. The cells kept are cells of the dense matrix, score for score, and the blocks still align in order."""
    blocks = 150
    torch.manual_seed(0)
    one, other = SharedTable(blocks).eval(), SharedTable(blocks).eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = tl.trace(one, x), tl.trace(other, x)
    aligner = align.Aligner(a, b, points(a), points(b), None, None)
    aligner._value_pairs()
    table = next(k for k, p in enumerate(aligner.pa) if a.ops[p.index].func_name == "cos")
    assert aligner.matches[table].basis == "values"  # the table pairs by value: on every later op's frontier
    left_a, left_b = _left(aligner)
    fb = {c: aligner._canon(aligner._mapped(aligner._frontier_b(aligner.pb[c].index))) for c in left_b}
    cells = aligner._candidates(left_a, left_b, {}, fb)
    muls = [x for x, k in enumerate(left_a) if aligner.pa[k].func == "mul"]
    assert len(muls) == blocks
    # the old code's mul rows held every mul of b (150 here): bounded by CANDIDATES now, and never empty
    assert max(len(cells.row(x)[0]) for x in range(cells.n)) <= align.CANDIDATES
    assert all(len(cells.row(x)[0]) == align.CANDIDATES for x in muls[align.CANDIDATES :])
    # the reference: the dense score matrix of the whole sides; every cell kept is a live cell with its score
    sa, sb = [aligner.pa[k] for k in left_a], [aligner.pb[c] for c in left_b]
    dense = evidence.scores(sa, sb, evidence.fingerprint_gaps(sa, sb), aligner._keys)
    for x in range(cells.n):
        ys, values = cells.row(x)
        assert np.array_equal(values, dense[x, ys]), x
    # the mul of block i keeps the muls of the blocks around block i (the same architecture: the same positions)
    mul_b = [y for y, c in enumerate(left_b) if aligner.pb[c].func == "mul"]
    for n, x in enumerate(muls):
        ys = set(cells.row(x)[0].tolist())
        assert mul_b[n] in ys
    cmp = tl.compare(a, b)
    first_linear = next(op.label for op in a.ops if op.func_name == "linear")
    assert cmp.first_divergence is not None and cmp.first_divergence.a == first_linear
    # every pair the structure aligns is an op with its own counterpart: the op of the same label
    assert [p.a for p in cmp.pairs if p.a != p.b] == []
    assert {p.a for p in cmp.pairs} >= {a.ops[aligner.pa[left_a[x]].index].label for x in muls[:60]}
