"""jax: a capture records only its own thread (nnx and equinox modules' ``__call__`` are wrapped on their
classes while the jaxpr is traced, and those classes are shared by every thread)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")

from thread_checks import ROUNDS, beside_plain_calls, raised, run_together, same_trace, same_value  # noqa: E402

import torchlens as tl  # noqa: E402


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.fc = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
        return jax.nn.relu(self.fc(x)) + x


class Deep(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([Block(rngs) for _ in range(6)])
        self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class EqxNet(eqx.Module):
    layers: list

    def __init__(self, key) -> None:
        k1, k2 = jax.random.split(key)
        self.layers = [eqx.nn.Linear(5, 4, key=k1), eqx.nn.Linear(4, 2, key=k2)]

    def __call__(self, x):
        return self.layers[1](jnp.tanh(self.layers[0](x)))


def _numpy(v):
    return np.asarray(v)


@pytest.fixture(scope="module")
def models():
    deep, deep2 = Deep(nnx.Rngs(0)), Deep(nnx.Rngs(1))  # one class, two models
    other = EqxNet(jax.random.key(0))
    x, y = jax.random.normal(jax.random.key(1), (4, 8)), jax.random.normal(jax.random.key(2), (5,))
    plain = {"deep": deep(x), "deep2": deep2(x), "other": other(y)}
    ref = {"deep": tl.trace(deep, x), "deep2": tl.trace(deep2, x), "other": tl.trace(other, y)}
    return {"deep": deep, "deep2": deep2, "other": other}, {"deep": x, "deep2": x, "other": y}, plain, ref


def _state() -> tuple:
    return tuple(vars(cls).get("__call__") for cls in (Block, Deep, EqxNet, nnx.Linear, eqx.nn.Linear))


@pytest.mark.parametrize(
    "pair",
    [("deep", "deep"), ("deep", "deep2"), ("deep", "other")],
    ids=["same model", "same class", "different models"],
)
def test_two_threads_tracing(models, pair) -> None:
    model, inp, _, ref = models
    a, b = pair
    before = _state()
    for r in range(ROUNDS):
        first, second = run_together(lambda: tl.trace(model[a], inp[a]), lambda: tl.trace(model[b], inp[b]))
        same_trace(first, ref[a], _numpy, f"round {r}, {a}")
        same_trace(second, ref[b], _numpy, f"round {r}, {b}")
        assert _state() == before


@pytest.mark.parametrize("plain_model", ["deep", "deep2", "other"])
def test_trace_beside_plain_forwards(models, plain_model: str) -> None:
    model, inp, plain, ref = models
    before = _state()
    for r in range(ROUNDS):
        trace, outs = beside_plain_calls(
            lambda: tl.trace(model["deep"], inp["deep"]), lambda: model[plain_model](inp[plain_model])
        )
        same_trace(trace, ref["deep"], _numpy, f"round {r}")
        for out in outs:
            same_value(out, plain[plain_model], _numpy, f"round {r}, plain forward")
    assert _state() == before


def test_audit_of_traces_taken_together(models) -> None:
    model, inp, _, _ = models
    results = run_together(lambda: tl.trace(model["deep"], inp["deep"]), lambda: tl.trace(model["deep2"], inp["deep2"]))
    raised(results)
    assert results[0].audit() and results[1].audit()
