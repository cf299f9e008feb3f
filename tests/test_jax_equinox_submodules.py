"""jax: an equinox model's submodules are found in the copy a capture traces by the paths walked on the model.

A capture needs the submodules twice: the model's, and those of the copy it
rebuilds from the parameter leaves. The copy has the same structure, so the
second walk follows the first one's paths (torchlens_jax.modules); a module
reachable by two paths is two modules in the copy, which is then walked. Module
outputs are checked against each submodule called by hand outside TorchLens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
eqx = pytest.importorskip("equinox")

import torchlens as tl  # noqa: E402
from torchlens_jax import modules  # noqa: E402


class Block(eqx.Module):
    lin: eqx.nn.Linear

    def __init__(self, key: Any) -> None:
        self.lin = eqx.nn.Linear(4, 4, key=key)

    def __call__(self, x: Any) -> Any:
        return jnp.tanh(self.lin(x))


class Net(eqx.Module):
    blocks: list[Block]
    heads: dict[str, eqx.nn.Linear]

    def __init__(self, key: Any) -> None:
        keys = jax.random.split(key, 4)
        self.blocks = [Block(keys[0]), Block(keys[1])]
        self.heads = {"a": eqx.nn.Linear(4, 2, key=keys[2]), "b": eqx.nn.Linear(4, 3, key=keys[3])}

    def __call__(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return self.heads["a"](x), self.heads["b"](x)


class Tied(eqx.Module):
    """One Block object under two names: two modules once the model is flattened and rebuilt."""

    first: Block
    second: Block

    def __init__(self, key: Any) -> None:
        self.first = self.second = Block(key)

    def __call__(self, x: Any) -> Any:
        return self.second(self.first(x))


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the walks of a model's submodules."""
    counted: list[int] = []
    real = modules._equinox_submodules

    def counting(model: Any) -> Any:
        counted.append(1)
        return real(model)

    monkeypatch.setattr(modules, "_equinox_submodules", counting)
    return counted


def _close(actual: Any, expected: Any) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_the_copys_submodules_are_found_by_path(walks: list[int]) -> None:
    net, x = Net(jax.random.PRNGKey(0)), jnp.linspace(-1.0, 1.0, 4)
    trace = tl.trace(net, x, backend="jax")
    assert len(walks) == 1  # the model's; the copy's submodules were followed by path
    assert set(trace.modules) >= {"blocks.0", "blocks.0.lin", "blocks.1", "heads.a", "heads.b"}
    h0 = net.blocks[0](x)
    _close(trace.modules["blocks.0"].passes[0].out, h0)
    _close(trace.modules["blocks.1"].passes[0].out, net.blocks[1](h0))
    _close(trace.modules["heads.b"].passes[0].out, net.heads["b"](net.blocks[1](h0)))
    assert trace.audit(untraced=True)


def test_a_module_reached_by_two_paths_has_its_copy_walked(walks: list[int]) -> None:
    tied, x = Tied(jax.random.PRNGKey(1)), jnp.linspace(-1.0, 1.0, 4)
    view = modules.view_model(tied)
    assert view.module_paths is None  # the copy holds two Blocks where the model holds one
    walks.clear()
    trace = tl.trace(tied, x, backend="jax")
    assert len(walks) == 2  # the model's, and the copy's
    h = tied.first(x)
    _close(trace.modules["first"].passes[0].out, h)
    _close(trace.modules["second"].passes[0].out, tied.second(h))
    assert trace.audit(untraced=True)
