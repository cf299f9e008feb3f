"""save_to= on the backends besides torch (each test runs where its framework is installed).

Streaming lives in the core (the TraceBuilder writes what save= keeps), so
every backend gets it; each test checks the streamed values against the
framework's own computation of the same intermediate, then reloads the folder.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
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


# Each framework's chain of 80 elementwise ops on a 2 MiB float32 vector: 160 MiB of values, kept as they come.
CHAINS = {
    "jax": """
        import jax, jax.numpy as jnp
        jax.config.update("jax_platforms", "cpu")
        def model(x):
            for _ in range(40):
                x = x * 1.0001 + 0.5
            return x.sum()
        ones, to_numpy = (lambda n: jnp.ones(n, jnp.float32)), np.asarray
    """,
    "paddle": """
        import paddle
        paddle.set_device("cpu")
        class Chain(paddle.nn.Layer):
            def forward(self, x):
                for _ in range(40):
                    x = x * 1.0001 + 0.5
                return x.sum()
        model = Chain()
        ones, to_numpy = (lambda n: paddle.ones([n], dtype="float32")), (lambda v: v.numpy())
    """,
    "tinygrad": """
        from tinygrad import Tensor
        def model(x):
            for _ in range(40):
                x = x * 1.0001 + 0.5
            return x.sum()
        ones, to_numpy = (lambda n: Tensor.ones(n).contiguous().realize()), (lambda v: v.numpy())
    """,
    "tensorflow": """
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        def model(x):
            for _ in range(40):
                x = x * 1.0001 + 0.5
            return tf.reduce_sum(x)
        ones, to_numpy = (lambda n: tf.ones([n], tf.float32)), np.asarray
    """,
}

# XLA, TensorFlow and Paddle reserve gigabytes of address space at import, so RLIMIT_AS cannot cap
# them as it does torch (tests/test_save_to.py): the cap is on resident memory instead. The child
# resets the kernel's peak-RSS mark (clear_refs "5") once warm and reads VmHWM after the steps.
CAPPED = """
import os, sys
import numpy as np
import torchlens as tl
{chain}

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

def steps(x, folder, stream):
    t = tl.trace(model, x, save_to=os.path.join(folder, "a") if stream else None)
    assert t.audit(), t.audit()
    t2 = tl.trace(model, x, save_to=os.path.join(folder, "b") if stream else None)
    assert tl.compare(t, t2)
    again = tl.load(os.path.join(folder, "a"), lazy=True) if stream else t
    assert again.audit()
    kept = [op for op in again.ops if op.kind == "op" and op.func_name == "add"]
    expected = np.full(to_numpy(x).shape, 1.0, np.float32)
    for _ in range(40):  # numpy's own chain, to the last op kept
        expected = expected * np.float32(1.0001) + np.float32(0.5)
    np.testing.assert_allclose(to_numpy(kept[-1].out), expected, rtol=1e-5)
    return sum(op.num_bytes or 0 for op in t.ops if op.kind == "op")

folder, stream = sys.argv[1], sys.argv[2] == "stream"
steps(ones(1024), folder, stream)  # imports, compilations and first-use allocations
to_numpy(model(ones(1 << 19)))  # the forward's own working set, at full size
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
total = steps(ones(1 << 19), folder, stream)
print("BASE", base, "PEAK", status("VmHWM"), "BYTES", total)
"""

CAP = 48 << 20


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's /proc")
@pytest.mark.parametrize("framework", ["jax", "paddle", "tensorflow", "tinygrad"])
def test_trace_larger_than_the_memory_cap(framework: str, tmp_path: pathlib.Path) -> None:
    """Captured, audited, compared and reopened within a cap a third of the trace's size; without save_to= not."""
    pytest.importorskip(framework)
    script = tmp_path / "child.py"
    script.write_text(CAPPED.format(chain=textwrap.dedent(CHAINS[framework])))
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # freed values go back

    def run(mode: str) -> dict[str, int]:
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path), mode], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        words = done.stdout.split("BASE")[-1].split()
        return {"base": int(words[0]), "peak": int(words[2]), "bytes": int(words[4])}

    streamed = run("stream")
    assert streamed["bytes"] >= 3 * CAP
    assert streamed["peak"] - streamed["base"] <= CAP, streamed
    plain = run("plain")  # the same capture, values kept in memory: over the cap, so the cap does bound
    assert plain["peak"] - plain["base"] > CAP, plain
