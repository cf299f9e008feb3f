"""What the tf backend's cheaper capture keeps exact: call sites, op attributes, variable snapshots and reads.

The capture walks each op's call site only up to its layer call (PassSites), keeps one CallSites across
captures, reuses the attribute tuples and keyword arguments of ops it has seen, reads every variable in one
op, and takes the buffer addresses of variables only when an input may be an unseen read. Each test checks
the result against something TorchLens does not compute: the source lines, the attributes given, the
variables' own values, a plain call.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import types
import weakref

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402
from source_sites import marked_line, sites  # noqa: E402

import torchlens as tl  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")


def _line(marker: str, path: str = __file__) -> int:
    return marked_line(marker, path)


def _scale(x):
    return x * 3.0  # site: helper


class Inner(keras.layers.Layer):
    def call(self, x):
        y = x * 2.0  # site: inner-mul
        return _scale(y)  # site: inner-helper


class Outer(keras.layers.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def call(self, x):
        a = self.inner(x)  # site: outer-first
        b = self.inner(a)  # site: outer-second
        return b + 1.0  # site: outer-add


class Failing(keras.layers.Layer):
    def call(self, x):
        raise ValueError("refused")


class Nested(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.outer = Outer()
        self.failing = Failing()

    def call(self, x):
        h = self.outer(x)  # site: model-outer
        try:
            self.failing(h)
        except ValueError:
            pass
        return h - 1.0  # site: model-sub


def test_call_sites_inside_nested_and_repeated_layers_are_the_source_lines() -> None:
    model = Nested()
    x = tf.constant([[1.0, 2.0]])
    model(x)
    here = __file__
    outer = (here, _line("model-outer"), "call")
    for _ in range(2):  # the second capture reuses the call-site verdicts of the first
        trace = tl.trace(model, x)
        muls = [op for op in trace.ops if op.func_name == "mul"]
        assert len(muls) == 4  # Inner's x * 2 and _scale's * 3, in each of Inner's two calls
        first, second = (here, _line("outer-first"), "call"), (here, _line("outer-second"), "call")
        inner_mul, helper = (here, _line("inner-mul"), "call"), (here, _line("helper"), "_scale")
        inner_helper = (here, _line("inner-helper"), "call")
        assert sites(muls[0]) == [inner_mul, first, outer]
        assert sites(muls[1]) == [helper, inner_helper, first]
        assert sites(muls[2]) == [inner_mul, second, outer]  # the second pass: its own call line
        assert sites(muls[3]) == [helper, inner_helper, second]
        add = next(op for op in trace.ops if op.func_name == "add")
        assert sites(add) == [(here, _line("outer-add"), "call"), outer]
        sub = next(op for op in trace.ops if op.func_name == "sub")  # after a layer call that raised
        assert sites(sub) == [(here, _line("model-sub"), "call")]
        np.testing.assert_allclose(trace.output, (x * 2 * 3 * 2 * 3 + 1) - 1)


def test_a_package_imported_later_is_internal_from_the_next_capture(tmp_path, monkeypatch) -> None:
    # The call-site verdicts are kept across captures, by the set of files treated as internal: a framework
    # package imported since (tensorflow_probability here, faked) must make a new set, and its frames
    # stop being the user's.
    package = tmp_path / "fake_tfp"
    package.mkdir()
    source = package / "__init__.py"
    source.write_text("def double(x):\n    return x * 2.0  # site: package\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    double = namespace["double"]

    def model(x):
        return double(x)  # site: calls-package

    x = tf.constant([1.0])
    calls = (__file__, _line("calls-package"), "model")
    before = tl.trace(model, x)
    assert sites(before["mul_1"])[:2] == [(str(source), _line("package", str(source)), "double"), calls]
    fake = types.ModuleType("tensorflow_probability")
    fake.__file__ = str(source)
    monkeypatch.setitem(sys.modules, "tensorflow_probability", fake)
    after = tl.trace(model, x)
    assert sites(after["mul_1"])[0] == calls


def test_ops_keep_their_own_attributes_across_captures() -> None:
    # Attribute sets seen before are reused: each op must still get exactly its own, as a new dict and
    # new lists, the same on a first capture and a repeat one.
    def model(x, w):
        a = tf.reduce_sum(x, axis=1, keepdims=True)
        b = tf.reduce_sum(x, axis=1, keepdims=False)
        c = tf.linalg.matmul(x, w, transpose_b=True)
        d = tf.linalg.matmul(x, w)
        e = tf.nn.leaky_relu(x, alpha=0.0)
        f = tf.nn.leaky_relu(x, alpha=-0.0)
        g = tf.nn.max_pool2d(x[None, :, :, None], ksize=2, strides=1, padding="VALID")
        h = tf.nn.max_pool2d(x[None, :, :, None], ksize=2, strides=1, padding="VALID")
        i = tf.raw_ops.Cast(x=x, DstT=tf.float64)  # the same attribute as a DType ...
        j = tf.raw_ops.Cast(x=x, DstT=tf.float64.as_datatype_enum)  # ... and as its enum, as given
        return a, b, c, d, e, f, g, h, i, j

    x = tf.constant([[1.0, -2.0], [3.0, -4.0]])
    w = tf.constant([[0.5, 1.0], [2.0, -1.0]])
    from torchlens_tf import capture

    capture._ATTRS.clear()
    first, repeat = tl.trace(model, x, w), tl.trace(model, x, w)
    for trace in (first, repeat):
        sums = [op for op in trace.ops if op.func_name == "sum"]
        assert [op.kwargs["keep_dims"] for op in sums] == [True, False]
        mm = [op for op in trace.ops if op.func_name == "matmul"]
        assert [(op.kwargs["transpose_a"], op.kwargs["transpose_b"]) for op in mm] == [(False, True), (False, False)]
        relus = [op for op in trace.ops if op.func_name == "leaky_relu"]
        assert [math.copysign(1.0, op.kwargs["alpha"]) for op in relus] == [1.0, -1.0]
        pools = [op for op in trace.ops if op.func_name == "max_pool"]
        assert [op.kwargs["ksize"] for op in pools] == [[1, 2, 2, 1]] * 2
        assert pools[0].kwargs["ksize"] is not pools[1].kwargs["ksize"]
        casts = [op for op in trace.ops if op.func_name == "cast"]
        assert [type(op.kwargs["DstT"]) for op in casts] == [tf.dtypes.DType, int]
        lists = [v for op in pools for v in op.call.attrs if isinstance(v, list)]
        assert lists and len({id(v) for v in lists}) == len(lists)  # no op shares a list with another
        for got, want in zip(trace.output, model(x, w)):
            np.testing.assert_array_equal(got, want)
        assert trace.audit()
    for a, b in zip(first.ops, repeat.ops):  # a repeat capture (from the cache) records what the first did
        assert a.kwargs == b.kwargs and [type(v) for v in a.kwargs.values()] == [type(v) for v in b.kwargs.values()]
        assert getattr(a.call, "attrs", None) == getattr(b.call, "attrs", None)


class TwoVariables(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.count = tf.Variable(0.0)
        self.scale = tf.Variable(5.0)

    def __call__(self, x):
        self.count.assign_add(1.0)
        return x * self.scale  # read inside TensorFlow's C++ fast path: no callback sees it


def test_an_unwritten_variable_read_unseen_is_found_after_another_is_written() -> None:
    # Variable buffers are looked up only once an input may be such a read, after `count` moved its buffer.
    module = TwoVariables()
    x = tf.constant([2.0])
    trace = tl.trace(module, x)
    mul = trace["mul_1"]
    assert mul.params == ("scale",) and mul.meta["implicit_variable_reads"] == ["scale"]
    np.testing.assert_array_equal(mul.out, [10.0])
    assert float(trace.params["count"].value) == 0.0 and float(module.count) == 1.0
    assert trace.audit()


class MixedVariables(keras.layers.Layer):
    def build(self, input_shape) -> None:
        self.w = self.add_weight(shape=(2, 3), initializer="ones", name="w")
        self.steps = self.add_weight(shape=(), initializer="zeros", dtype="int32", trainable=False, name="steps")
        self.mask = self.add_weight(shape=(3,), initializer="zeros", dtype="bool", trainable=False, name="mask")
        self.moving = self.add_weight(shape=(3,), initializer="zeros", dtype="float64", trainable=False, name="moving")

    def call(self, x):
        self.steps.assign_add(1)
        y = tf.matmul(x, self.w)
        self.moving.assign(tf.cast(tf.reduce_mean(y, axis=0), tf.float64))
        return tf.where(self.mask, 0.0, y)


def test_parameters_are_the_variables_values_before_the_forward() -> None:
    layer = MixedVariables()
    x = tf.constant([[1.0, 2.0]])
    layer(x)
    for step in range(2):  # values changed between captures: each capture reads them anew
        layer.w.assign(np.full((2, 3), step + 2.0, np.float32))
        layer.mask.assign([True, False, step == 1])
        before = {v.path.split("/")[-1]: v.numpy().copy() for v in layer.weights}
        trace = tl.trace(layer, x)
        by_name = {name.split(".")[-1]: p for name, p in trace.params.items()}
        assert set(by_name) == set(before)
        for name, value in before.items():
            got = by_name[name].value.numpy()
            assert got.dtype == value.dtype
            np.testing.assert_array_equal(got, value)  # steps and moving as they were, not as written
        assert int(layer.steps.numpy()) == int(before["steps"]) + 1
        assert trace.audit()


_SEEN: list = []  # weak references to values a layer computed (not a layer attribute: Keras would track it)


class Exp(keras.layers.Layer):
    def call(self, x):
        return tf.exp(x) + 1.0


class Halting(keras.Model):
    """Notes a weak reference to a value it computes and passes to a layer, which the trace does not keep."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Exp()

    def call(self, x):
        h = tf.nn.relu(x * 2.0)
        _SEEN.append(weakref.ref(h))
        return self.inner(h) * 3.0


def test_a_halt_inside_a_layer_leaves_no_frame_holding_dropped_values() -> None:
    # The call-site walk holds the frames of open layer calls; a halt leaves calls open. Those frames (and
    # the values in their locals) must go with the capture, not wait for the cyclic GC.
    model = Halting()
    x = tf.constant([[1.0, -1.0]])
    model(x)
    _SEEN.clear()
    gc.collect()
    gc.disable()
    try:
        trace = tl.trace(model, x, save=tl.func("exp"), halt=tl.func("exp"))
        assert trace.halted and [op.func_name for op in trace.ops if op.saved] == ["input", "exp"]
        np.testing.assert_allclose(trace["exp_1"].out, np.exp(np.maximum(x.numpy() * 2.0, 0.0)), rtol=1e-6)
        assert len(_SEEN) == 1 and _SEEN[0]() is None  # relu's value: dropped by save=, and freed
    finally:
        gc.enable()
