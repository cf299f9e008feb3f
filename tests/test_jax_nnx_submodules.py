"""jax: an nnx model's submodules are walked once per structure, and found again by their paths.

nnx.iter_modules walks every node of a model's graph, arrays included; a capture
needs the submodules twice (the model's, and those of the copy it traces). They
are walked once per graph definition and followed by path after that
(torchlens_jax.modules). Each module output is checked against the submodule
called by hand outside TorchLens, on captures that walked and on captures that
followed the paths.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

import torchlens as tl  # noqa: E402
from torchlens_jax import modules  # noqa: E402


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.lin = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return jnp.tanh(self.lin(x))


class Reversed(nnx.List):
    """A list whose indexing counts from the end: a path (name, 0) does not lead where nnx's walk found it."""

    def __getitem__(self, i: Any) -> Any:
        return super().__getitem__(-1 - i) if isinstance(i, int) else super().__getitem__(i)


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, reverse: bool = False) -> None:
        shared = nnx.Linear(4, 4, rngs=rngs)
        self.blocks = (Reversed if reverse else nnx.List)([Block(rngs) for _ in range(3)])
        self.heads = nnx.Dict({"a": nnx.Linear(4, 2, rngs=rngs), "b": shared})
        self.seq = nnx.Sequential(Block(rngs), Block(rngs))
        self.extra = nnx.data((Block(rngs), [Block(rngs)]))
        self.shared = shared

    def __call__(self, x: Any) -> Any:
        for i in range(3):
            x = nnx.List.__getitem__(self.blocks, i)(x)
        x = self.seq(x) + self.shared(x) + self.extra[1][0](self.extra[0](x))
        return self.heads["a"](x) + self.heads["b"](x)[..., :2]


def expected_outputs(net: Net, x: Any) -> dict[tuple[str, int], Any]:
    """Each submodule call's output by (path, pass), computed by hand (the forward above, step by step). The
    shared layer is listed once, under its first path ("heads.b" sorts before "shared"): two passes of it."""
    blocks = [nnx.List.__getitem__(net.blocks, i) for i in range(3)]
    out: dict[tuple[str, int], Any] = {}
    for i, block in enumerate(blocks):
        out[f"blocks.{i}.lin", 1] = block.lin(x)
        x = out[f"blocks.{i}", 1] = block(x)
    s0 = out["seq.layers.0", 1] = net.seq.layers[0](x)
    out["seq.layers.1", 1] = net.seq.layers[1](s0)
    out["seq", 1] = net.seq(x)
    out["heads.b", 1] = net.shared(x)
    e0 = out["extra.0", 1] = net.extra[0](x)
    out["extra.1.0", 1] = net.extra[1][0](e0)
    x = out["seq", 1] + out["heads.b", 1] + out["extra.1.0", 1]
    out["heads.a", 1] = net.heads["a"](x)
    out["heads.b", 2] = net.heads["b"](x)
    return out


def check_module_outputs(trace: Any, net: Net, x: Any) -> None:
    assert "shared" not in trace.modules
    for (path, n), value in expected_outputs(net, x).items():
        got = trace.modules[path].passes[n - 1].out
        np.testing.assert_allclose(np.asarray(got), np.asarray(value), rtol=1e-5, atol=1e-5, err_msg=f"{path}:{n}")


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times nnx.iter_modules ran (one entry per call)."""
    calls: list[int] = []
    original = nnx.iter_modules

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(nnx, "iter_modules", counted)
    monkeypatch.setattr(modules, "_NNX_PATHS", type(modules._NNX_PATHS)())  # no structure seen yet
    return calls


def test_a_structure_is_walked_once_and_its_paths_followed_after(walks: list[int]) -> None:
    x = jax.random.normal(jax.random.key(0), (2, 4))
    net = Net(nnx.Rngs(0))
    first = tl.trace(net, x, backend="jax")
    assert len(walks) == 1  # the model's own submodules; the traced copy's were followed by path
    check_module_outputs(first, net, x)
    again = tl.trace(net, x, backend="jax")
    other = Net(nnx.Rngs(1))  # another model of the same structure: its paths are the same
    third = tl.trace(other, x, backend="jax")
    assert len(walks) == 1
    check_module_outputs(again, net, x)
    check_module_outputs(third, other, x)
    assert sorted(third.modules) == sorted(first.modules)
    np.testing.assert_allclose(np.asarray(third.output), np.asarray(other(x)), rtol=1e-5, atol=1e-5)


def test_paths_that_do_not_lead_back_to_the_walked_modules_are_never_followed(walks: list[int]) -> None:
    x = jax.random.normal(jax.random.key(0), (2, 4))
    net = Net(nnx.Rngs(0), reverse=True)
    view = modules.view_model(net)
    assert view.module_paths is None  # ("blocks", 0) leads to the last block: the walk is trusted instead
    for _ in range(2):
        trace = tl.trace(net, x, backend="jax")
        check_module_outputs(trace, net, x)
    assert len(walks) >= 3  # walked at every capture, and for every copy


def test_a_changed_structure_is_walked_again(walks: list[int]) -> None:
    x = jax.random.normal(jax.random.key(0), (2, 4))
    net = Net(nnx.Rngs(0))
    tl.trace(net, x, backend="jax")
    net.seq.layers.append(Block(nnx.Rngs(2)))  # a third layer: a new graph definition
    trace = tl.trace(net, x, backend="jax")
    assert len(walks) == 2
    assert "seq.layers.2" in trace.modules
    np.testing.assert_allclose(
        np.asarray(trace.modules["seq"].passes[0].out),
        np.asarray(
            net.seq(
                nnx.List.__getitem__(net.blocks, 2)(
                    nnx.List.__getitem__(net.blocks, 1)(nnx.List.__getitem__(net.blocks, 0)(x))
                )
            )
        ),
        rtol=1e-5,
        atol=1e-5,
    )
