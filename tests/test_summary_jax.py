"""trace.summary() on JAX: an nnx.List of blocks (never called itself) shows the blocks that ran; every
parameter is counted once, against flax's own count (nnx.state(model, nnx.Param))."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

import torchlens as tl  # noqa: E402
from torchlens_core.views.summary import summary_rows  # noqa: E402


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.fc = nnx.Linear(16, 16, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)

    def __call__(self, x):
        return self.norm(jax.nn.relu(self.fc(x)))


class Stack(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.inp = nnx.Linear(8, 16, rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(3)])
        self.head = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_nnx_list_blocks_have_rows_and_every_parameter_counts() -> None:
    model = Stack(nnx.Rngs(0))
    x = jax.numpy.ones((2, 8))
    trace = tl.trace(model, x)
    want = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    for depth in (1, 2, None):
        rows = summary_rows(trace, depth)
        assert sum(p.numel for row in rows for p in row.params) == want, depth
    text = trace.summary()
    for i in range(3):
        row = next(line for line in text.splitlines() if f" blocks.{i} (Block)" in line)
        assert "| [2,16] " in row and "| 304 " in row, row
    assert f"Params: {want:,} unique" in text
