"""save_to= on the backends besides torch (each test runs where its framework is installed).

Streaming lives in the core (the TraceBuilder writes what save= keeps), so
every backend gets it; each test checks the streamed values against the
framework's own computation of the same intermediate, then reloads the folder.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

import torchlens as tl


def check(t: Any, folder: pathlib.Path, func: str, expected: np.ndarray, to_numpy: Any) -> None:
    """The op ``func`` holds ``expected`` in the streamed trace, in tl.load's and in tl.load(lazy=True)'s."""
    ops = [op for op in t.ops if op.kind == "op"]
    assert ops and all(op.stored is not None for op in ops if op.saved)
    for trace in (t, tl.load(folder), tl.load(folder, lazy=True)):
        found = [op for op in trace.ops if op.func_name == func]
        assert found, [op.func_name for op in trace.ops]
        np.testing.assert_allclose(to_numpy(found[0].out), expected, rtol=1e-6, atol=1e-6)
    assert t.audit()


def test_jax(tmp_path: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    x = jnp.linspace(-1, 1, 12).reshape(3, 4)

    def f(w: Any, x: Any) -> Any:
        return (jnp.tanh(x @ w) * 2).sum(axis=1)

    t = tl.trace(f, w, x, save_to=tmp_path / "t")
    check(t, tmp_path / "t", "tanh", np.tanh(np.asarray(x) @ np.asarray(w)), np.asarray)
    again = tl.trace(f, w, x, save_to=tmp_path / "t")  # a second capture (JAX's capture cache) replaces it
    check(again, tmp_path / "t", "tanh", np.tanh(np.asarray(x) @ np.asarray(w)), np.asarray)


def test_paddle(tmp_path: pathlib.Path) -> None:
    paddle = pytest.importorskip("paddle")
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 3))
    x = paddle.randn([5, 4])
    t = tl.trace(model, x, save=tl.func("relu"), save_to=tmp_path / "t")
    hidden = np.maximum(x.numpy() @ model[0].weight.numpy() + model[0].bias.numpy(), 0)
    check(t, tmp_path / "t", "relu", hidden, lambda v: v.numpy())
    assert [op.func_name for op in t.ops if op.saved and op.kind == "op"] == ["relu"]


def test_tinygrad(tmp_path: pathlib.Path) -> None:
    tinygrad = pytest.importorskip("tinygrad")
    Tensor = tinygrad.Tensor
    Tensor.manual_seed(0)
    w = Tensor.randn(4, 8)
    x = Tensor.randn(3, 4)

    def f(x: Any) -> Any:
        return (x @ w).relu().sum(axis=1)

    t = tl.trace(f, x, save_to=tmp_path / "t")
    check(t, tmp_path / "t", "relu", np.maximum(x.numpy() @ w.numpy(), 0), lambda v: v.numpy())


def test_tf(tmp_path: pathlib.Path) -> None:
    tf = pytest.importorskip("tensorflow")
    tf.random.set_seed(0)
    w = tf.random.normal((4, 8))
    x = tf.random.normal((3, 4))

    def f(x: Any) -> Any:
        return tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)), axis=1)

    t = tl.trace(f, x, save_to=tmp_path / "t")
    check(t, tmp_path / "t", "relu", np.maximum(x.numpy() @ w.numpy(), 0), np.asarray)
