"""tf: a capture records only its own thread (Layer.__call__, tf.function calls and value reads are process-wide)."""

from __future__ import annotations

import os
import threading

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402
from thread_checks import ROUNDS, beside_plain_calls, raised, run_together, same_trace, same_value  # noqa: E402

import torchlens as tl  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")


class Gated(keras.Model):
    """Layers, a tf.function (run eagerly for the capture) and a value read deciding a branch."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = [keras.layers.Dense(8, activation="relu", name=f"fc{i}") for i in range(6)]
        self.head = keras.layers.Dense(3, name="head")

    @tf.function
    def mix(self, h):
        return tf.nn.relu(h) * 2.0 - h

    def call(self, x):
        for block in self.blocks:
            x = block(x) + x
        if float(tf.reduce_sum(x)) > -1e9:  # always taken: the ops below are conditioned on it
            x = self.mix(x)
        return self.head(x)


def _state() -> tuple:
    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    from tensorflow.python.framework import ops

    value_reads = tuple(vars(ops._EagerTensorBase).get(name) for name in ("__bool__", "__float__", "numpy"))
    return (
        keras.layers.Layer.__dict__["__call__"],
        polymorphic_function.Function.__dict__["__call__"],
        tf.config.functions_run_eagerly(),
        value_reads,
    )


@pytest.fixture(scope="module")
def models():
    keras.utils.set_random_seed(0)
    gated = Gated()
    other = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh", name="a"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Dense(2, name="b"),
        ]
    )
    x = tf.random.stateless_normal((4, 8), seed=(0, 1))
    y = tf.random.stateless_normal((3, 5), seed=(2, 1))
    gated(x)
    plain = {"gated": gated(x), "other": other(y)}
    return gated, other, x, y, plain, {"gated": tl.trace(gated, x), "other": tl.trace(other, y)}


def _numpy(v):
    return np.asarray(v)


def test_two_threads_tracing_the_same_model(models) -> None:
    gated, _, x, _, _, ref = models
    assert ref["gated"].notes["tf_functions_run_eagerly"] == ["mix"] and any(op.conditions for op in ref["gated"])
    before = _state()
    for r in range(ROUNDS):
        for trace in run_together(lambda: tl.trace(gated, x), lambda: tl.trace(gated, x)):
            same_trace(trace, ref["gated"], _numpy, f"round {r}")
            assert trace.notes["tf_functions_run_eagerly"] == ["mix"]
        assert _state() == before


def test_two_threads_tracing_different_models(models) -> None:
    gated, other, x, y, _, ref = models
    before = _state()
    for r in range(ROUNDS):
        a, b = run_together(lambda: tl.trace(gated, x), lambda: tl.trace(other, y))
        same_trace(a, ref["gated"], _numpy, f"round {r}, gated")
        same_trace(b, ref["other"], _numpy, f"round {r}, other")
        assert _state() == before


def test_trace_beside_plain_forwards(models) -> None:
    gated, _, x, _, plain, ref = models
    before = _state()
    for r in range(ROUNDS):
        trace, outs = beside_plain_calls(lambda: tl.trace(gated, x), lambda: gated(x))
        same_trace(trace, ref["gated"], _numpy, f"round {r}")
        for out in outs:
            same_value(out, plain["gated"], _numpy, f"round {r}, plain forward")
        assert _state() == before


def test_other_threads_tf_functions_stay_graph_functions(models) -> None:
    """A capture runs its own thread's tf.functions eagerly; another thread's keep running as graphs."""
    gated, _, x, _, _, ref = models
    python_runs = []

    @tf.function
    def plain_fn(v):
        python_runs.append(1)  # a graph function runs its Python only when it is traced
        return tf.reduce_sum(v * v)

    plain_fn(x)
    traced_once = len(python_runs)

    def plain():
        flags = tf.config.functions_run_eagerly()
        return plain_fn(x), flags

    for r in range(5):
        trace, outs = beside_plain_calls(lambda: tl.trace(gated, x), plain)
        same_trace(trace, ref["gated"], _numpy, f"round {r}")
        assert not any(flag for _, flag in outs)
    assert len(python_runs) == traced_once


def test_nested_capture_is_refused(models) -> None:
    gated, _, x, _, _, _ = models

    def outer(v):
        return tl.trace(gated, v).output

    before = _state()
    with pytest.raises(tl.UnsupportedError, match="do not nest"):
        tl.trace(outer, x)
    assert _state() == before


def test_audit_of_traces_taken_together(models) -> None:
    gated, other, x, y, _, _ = models
    results = run_together(lambda: tl.trace(gated, x), lambda: tl.trace(other, y), lambda: gated(x))
    raised(results)
    assert results[0].audit() and results[1].audit()


def test_op_callbacks_switched_off_by_another_thread_are_not_a_silent_gap(models) -> None:
    """TensorFlow's remove_op_callback switches the eager fallback path's callbacks off for every thread: a
    capture that saw it happen raises instead of returning a trace that may miss ops."""
    from tensorflow.python.eager import execute
    from tensorflow.python.framework import op_callbacks

    _, other, _, y, _, _ = models
    inside, switched = threading.Event(), threading.Event()

    def pause(x):
        inside.set()
        assert switched.wait(30)
        return x

    def traced(v):
        return other(pause(v))

    def switcher():
        assert inside.wait(30)
        try:

            def noop(*args, **kwargs):
                return None

            op_callbacks.add_op_callback(noop)
            op_callbacks.remove_op_callback(noop)  # execute.execute = quick_execute, for every thread
        finally:
            switched.set()

    before = _state()
    failed, _ = run_together(lambda: tl.trace(traced, y), switcher)
    assert isinstance(failed, tl.CaptureError) and "switched off" in str(failed), failed
    assert _state() == before and execute.execute is execute.quick_execute
