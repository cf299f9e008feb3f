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
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())
                                    for _ in range(blocks))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x), self.head(x).argmax(-1)  # an integer output too: it pairs exactly


def _trace(seed: int = 0, blocks: int = 40, jitter: float = 0.0) -> tl.Trace:
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
    expected = {(mp.path, mp.pass_num): [op.label for op in trace.ops if (mp.path, mp.pass_num) in op.module_passes]
                for m in trace.modules.values() for mp in m.passes}
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
