"""tl.compat.report on the other backends: their capture's own refusals, found before anything runs."""

import pytest

import torchlens as tl


def _wrapper_row(report):
    (row,) = [r for r in report.rows if r.area == "wrapper"]
    return row


def test_tinygrad_refuses_a_tinyjit_in_the_report_as_the_capture_does():
    tinygrad = pytest.importorskip("tinygrad")
    from tinygrad import Tensor, TinyJit

    def f(x):
        return (x * 2).relu()

    x = Tensor.ones(3)
    assert _wrapper_row(tl.compat.report(f, x, backend="tinygrad")).status == "pass"
    jitted = TinyJit(f)
    row = _wrapper_row(tl.compat.report(jitted, x, backend="tinygrad"))
    with pytest.raises(tl.UnsupportedError) as refused:
        tl.trace(jitted, x, backend="tinygrad")
    assert row.status == "known_broken" and row.reason == str(refused.value)
    assert tinygrad is not None


def test_paddle_refuses_to_static_in_the_report_as_the_capture_does():
    paddle = pytest.importorskip("paddle")
    layer = paddle.nn.Linear(3, 3)
    x = paddle.ones([2, 3])
    assert _wrapper_row(tl.compat.report(layer, x, backend="paddle")).status == "pass"
    static = paddle.jit.to_static(paddle.nn.Linear(3, 3))
    row = _wrapper_row(tl.compat.report(static, x, backend="paddle"))
    with pytest.raises(tl.UnsupportedError) as refused:
        tl.trace(static, x, backend="paddle")
    assert row.status == "known_broken" and row.reason == str(refused.value)


def test_tf_refuses_a_concrete_function_in_the_report_as_the_capture_does():
    tf = pytest.importorskip("tensorflow")
    fn = tf.function(lambda x: tf.nn.relu(x) * 2)
    x = tf.ones([3])
    assert _wrapper_row(tl.compat.report(fn, x, backend="tf")).status == "pass"
    concrete = fn.get_concrete_function(tf.TensorSpec([3], tf.float32))
    row = _wrapper_row(tl.compat.report(concrete, x, backend="tf"))
    with pytest.raises(tl.UnsupportedError) as refused:
        tl.trace(concrete, x, backend="tf")
    assert row.status == "known_broken" and row.reason == str(refused.value)
