"""Replay on new inputs on the tf backend: every Python value the forward made from a tensor is checked.

The reference for every replay is the model (or function) itself, called
plainly on the new inputs, or, for edits, the model with the edit written
into its code. Each conversion path has new inputs that keep the converted
value (replay must equal the plain call) and new inputs that change it
(replay must raise GraphDoesNotHold naming the op whose value was converted,
where without the report it would silently give the recorded graph's answer).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError, TorchLensError, UnsupportedError  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")

X = tf.constant([[0.5, 1.5, 2.25, -0.25], [1.0, -0.75, 2.0, 0.125]])


def _same(v: Any) -> Any:
    return v


def close(actual: Any, expected: Any, tol: float = 1e-5) -> bool:
    a, e = np.asarray(actual), np.asarray(expected)
    return a.shape == e.shape and a.dtype == e.dtype and np.allclose(a, e, rtol=tol, atol=tol)


def converted(t: tl.Trace) -> list[tuple[str, str]]:
    """(op label, conversion) of every Python value the capture reported."""
    return [(op.label, how) for op in t.ops for _, how, _ in op.meta.get("to_python", ())]


def raises_naming(t: tl.Trace, func_name: str, *args: Any, **kwargs: Any) -> None:
    """Replay on these inputs raises GraphDoesNotHold naming an op of ``func_name``."""
    with pytest.raises(tl.GraphDoesNotHold) as caught:
        t.replay(*args, **kwargs)
    labels = [op.label for op in t.ops if op.func_name == func_name]
    assert labels and any(f"{label}'s" in str(caught.value) for label in labels), str(caught.value)


# -- each conversion: (name, function, new inputs keeping the value, new inputs changing it, op converted) ---
TABLE = tf.constant([10.0, 20.0, 30.0, 40.0])  # a constant the forward indexes with Python ints


def by_bool(x):
    if tf.reduce_sum(x) > 0:  # EagerTensor.__bool__
        return x * 2.0
    return x - 1.0


def by_int(x):
    return x * int(tf.reduce_max(x))  # 2.25 -> 2


def by_float(x):
    return x - float(tf.reduce_min(x))


def by_index(x):
    return x * TABLE[[1, 2, 3, 0][tf.argmax(tf.reshape(x, [-1])) % 4]]  # a list indexed by a tensor


def by_range(x):
    n = tf.reduce_sum(tf.cast(x > 1.0, tf.int32))
    h = x
    for _ in range(n):  # a loop count: operator.index
        h = h * 1.5
    return h


def distinct(x):
    """The distinct rounded values of ``x``: an output of tf.unique, a multi-output op of value-dependent shape."""
    values, _ = tf.unique(tf.reshape(tf.round(x), [-1]))
    return values


def by_len(x):
    return x * len(distinct(x))  # how many: decided by the values


def by_iter(x):
    terms = [v * 2.0 for v in distinct(x)]  # iterating: the count is a Python value
    return tf.add_n(terms) + x


def by_numpy_scalar(x):
    return x / tf.reduce_max(x).numpy()


def by_numpy_array(x):
    low, high = tf.reduce_min(x, axis=0).numpy()[:2]  # two elements of an array
    return x * (float(high) - float(low))


def by_asarray(x):
    return x + np.asarray(tf.reduce_mean(x)).item()  # through the buffer protocol, seen at np.asarray


def by_keras_convert(x):
    return x * keras.ops.convert_to_numpy(tf.reduce_max(x, axis=1))[0]


def by_format(x):
    return x * len(f"{tf.reduce_sum(x):.0f}")  # "5" and "15" differ in length


def by_complex(x):
    return x * complex(tf.reduce_max(x)).real


def by_unique_shape(x):
    return tf.reduce_sum(x) * tf.ones([distinct(x).shape[0]])  # a shape read into a constant's shape


def by_while_loop(x):
    _, h = tf.while_loop(lambda i, h: tf.reduce_max(h) < 10.0, lambda i, h: (i + 1, h * 2.0), (0, x))
    return h


def by_cond(x):
    return tf.cond(tf.reduce_mean(x) > 0.5, lambda: x * 2.0, lambda: -x)


def by_switch_case(x):
    index = tf.cast(tf.reduce_sum(x) > 5.0, tf.int32)
    return tf.switch_case(index, [lambda: x * 3.0, lambda: x - 3.0])


CONVERSIONS = [
    ("bool", by_bool, X * 2.0, -X, "greater"),
    ("int", by_int, X * 1.1, X * 2.0, "max"),
    ("float", by_float, X + tf.constant([[0.25, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), X + 1.0, "min"),
    ("index", by_index, X * 2.0, X[:, ::-1], "floor_mod"),
    ("range", by_range, X * 0.9, X * 3.0, "sum"),
    ("len", by_len, X * 1.1, X * 3.0, "unique"),
    ("iter", by_iter, X * 1.1, X * 3.0, "unique"),
    ("numpy_scalar", by_numpy_scalar, X + tf.constant([[0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]]), X * 2.0, "max"),
    ("numpy_array", by_numpy_array, X + tf.constant([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), X * 2.0, "min"),
    ("np_asarray", by_asarray, X[::-1], X * 2.0, "mean"),
    (
        "keras_convert_to_numpy",
        by_keras_convert,
        X + tf.constant([[0.25, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
        X * 2.0,
        "max",
    ),
    ("format", by_format, X[::-1], X * 3.0, "sum"),
    ("complex", by_complex, X + tf.constant([[0.25, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), X * 2.0, "max"),
    ("unique_shape", by_unique_shape, X * 1.1, X * 3.0, "unique"),
    ("while_loop", by_while_loop, X * 1.1, X * 0.5, "less"),
    ("cond", by_cond, X * 2.0, -X, "greater"),
    ("switch_case", by_switch_case, X * 1.1, X * 0.5, "select"),
]


@pytest.mark.parametrize(
    ("fn", "same", "changed", "func_name"), [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS]
)
def test_a_value_that_stays_the_same_replays_and_one_that_changes_raises(fn, same, changed, func_name) -> None:
    t = tl.trace(fn, X)
    assert converted(t), "the conversion was not reported"
    own = fn(same)
    assert not close(own, fn(X)) or not close(same, X), "the new inputs change nothing: the check could not tell"
    assert close(t.replay(same), own)
    raises_naming(t, func_name, changed)


def test_without_the_checks_the_changed_inputs_would_have_replayed_wrong() -> None:
    """What the checks stop: on each 'changed' input the recorded graph gives another output than the model."""
    for name, fn, _, changed, _ in CONVERSIONS:
        t = tl.trace(fn, X)
        for op in t.ops:
            op.meta.pop("to_python", None)  # the trace a backend without the reports would leave
        try:
            replayed = t.replay(changed)
        except tl.GraphDoesNotHold as caught:  # a shape that changed: the core's own safety net caught it
            assert "has shape" in str(caught), name
            continue
        assert not close(replayed, fn(changed)), name


def test_an_input_converted_directly_is_checked_too() -> None:
    def fn(x, flag):
        return x * 2.0 if flag else x - 1.0  # the input node's own value decides

    t = tl.trace(fn, X, tf.constant(True))
    assert converted(t) == [(t["input_2"].label, "bool")]
    assert close(t.replay(X * 3.0, tf.constant(True)), fn(X * 3.0, tf.constant(True)))
    with pytest.raises(tl.GraphDoesNotHold, match="input_2's value"):
        t.replay(X, tf.constant(False))


def test_values_too_large_or_not_convertible_refuse_new_inputs() -> None:
    big = tf.reshape(tf.range(5000, dtype=tf.float32), (50, 100)) / 5000.0

    def reads_everything(x):
        return x * float(x.numpy().max())

    def reads_complex(x):
        return x * float(np.abs(tf.complex(x, x).numpy()).max())

    def reads_text(x):
        return x * len(tf.strings.as_string(x).numpy()[0, 0])

    for fn, x in ((reads_everything, big), (reads_complex, X), (reads_text, X)):
        t = tl.trace(fn, x)
        assert close(t.replay(), fn(x))  # on the recorded inputs there is nothing to check
        with pytest.raises(UnsupportedError, match="too large to keep"):
            t.replay(x * 0.5)


# -- real models ------------------------------------------------------------------------------------
class GatedNet(keras.Model):
    """A Keras model with a Python branch and a Python loop on values; ``hand_edit`` edits ``embed``'s output."""

    def __init__(self) -> None:
        super().__init__(name="gated")
        self.embed = keras.layers.Dense(8, name="embed")
        self.wide = keras.layers.Dense(8, activation="relu", name="wide")
        self.narrow = keras.layers.Dense(8, activation="tanh", name="narrow")
        self.head = keras.layers.Dense(3, name="head")
        self.hand_edit: Callable[[Any], Any] = _same

    def call(self, x: Any) -> Any:
        h = self.hand_edit(self.embed(x))
        if tf.reduce_mean(h) > 0.0:  # data-dependent branch
            h = self.wide(h)
        else:
            h = self.narrow(h)
        steps = 0
        while tf.norm(h) < 8.0 and steps < 4:  # data-dependent loop count
            h = h * 2.0
            steps += 1
        return self.head(h)


def gated_net() -> tuple[GatedNet, Any]:
    keras.utils.set_random_seed(3)
    model = GatedNet()
    x = tf.random.stateless_normal((2, 5), seed=(4, 5))
    model(x)  # build
    return model, x


def steps_and_branch(model: GatedNet, x: Any) -> tuple[bool, int]:
    """Which branch and how many loop steps the model takes on ``x``, worked out without TorchLens."""
    h = model.hand_edit(model.embed(x))
    wide = bool(tf.reduce_mean(h) > 0.0)
    h = model.wide(h) if wide else model.narrow(h)
    steps = 0
    while tf.norm(h) < 8.0 and steps < 4:
        h, steps = h * 2.0, steps + 1
    return wide, steps


def test_a_keras_model_with_python_control_flow_replays_where_it_holds_and_raises_where_not() -> None:
    model, x = gated_net()
    t = tl.trace(model, x)
    wide, steps = steps_and_branch(model, x)
    assert 0 < steps < 4
    assert [how for _, how in converted(t)] == ["bool"] * (1 + steps + 1)  # the branch, each loop test
    # the same branch and count: the graph holds
    same = x * 1.01
    assert steps_and_branch(model, same) == (wide, steps)
    own = model(same)
    assert not close(own, t.output)
    assert close(t.replay(same), own)
    assert close(t.replay(same.numpy()), own)  # NumPy arrays and variables are new inputs too
    assert close(t.replay(tf.Variable(same)), own)
    # the loop would run another number of times
    longer = x * 0.1
    assert steps_and_branch(model, longer)[0] == wide and steps_and_branch(model, longer)[1] != steps
    raises_naming(t, "less", longer)
    # the branch would flip: found by a sign flip of the mean
    flipped = next(v for v in (-x, x * -2.0, x + 3.0, x - 3.0) if steps_and_branch(model, v)[0] != wide)
    raises_naming(t, "greater", flipped)


def test_a_branch_tf_code_took_is_checked_though_the_branch_tracker_skips_it() -> None:
    """tf.cond runs its Python ``if`` inside TensorFlow's code: no op is marked as branched, the bool is reported."""
    t = tl.trace(by_cond, X)
    assert not any(op.conditions for op in t.ops)
    assert converted(t) == [(t["greater_1"].label, "bool")]
    fork = t.fork().when(tl.func("mean"), lambda v, site: -v)
    with pytest.raises(tl.GraphDoesNotHold, match=t["greater_1"].label):
        fork.replay()


def test_a_keras_model_without_control_flow_takes_keywords_and_checks_them() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dropout(0.5), keras.layers.Dense(2)]
    )
    x = tf.random.stateless_normal((3, 6), seed=(1, 1))
    t = tl.trace(model, x, training=False)
    assert converted(t) == []
    new = tf.random.stateless_normal((3, 6), seed=(2, 2))
    assert close(t.replay(new, training=False), model(new, training=False))
    with pytest.raises(ArgumentTypeError, match="training"):
        t.replay(new, training=True)


# -- edits that change a decided value ------------------------------------------------------------------
def test_a_fork_edit_that_flips_a_branch_raises_on_replay_and_reruns_live() -> None:
    model, x = gated_net()
    t = tl.trace(model, x)
    wide, _ = steps_and_branch(model, x)
    fork = t.fork().when(tl.module("embed"), lambda v, site: v * -1.0)
    with pytest.raises(tl.GraphDoesNotHold, match=t["greater_1"].label):
        fork.replay()
    live = fork.rerun(model, x)
    model.hand_edit = lambda v: v * -1.0
    try:
        assert steps_and_branch(model, x)[0] != wide
        expected = model(x)
    finally:
        model.hand_edit = _same
    assert close(live.output, expected)
    assert not close(live.output, t.output)


def test_a_fork_edit_that_keeps_the_branch_and_count_replays_as_the_live_edit() -> None:
    model, x = gated_net()
    t = tl.trace(model, x)
    before = steps_and_branch(model, x)
    fork = t.fork().when(tl.module("embed"), lambda v, site: v * 1.01)
    model.hand_edit = lambda v: v * 1.01
    try:
        assert steps_and_branch(model, x) == before
        expected = model(x)
    finally:
        model.hand_edit = _same
    assert close(fork.replay(), expected)
    assert close(fork.rerun(model, x).output, expected)


def test_a_fork_edit_that_changes_a_loop_count_raises() -> None:
    t = tl.trace(by_while_loop, X)
    fork = t.fork().when(tl.label(t["mul_1"].label), lambda v, site: v * 4.0)  # the first doubling, made x8
    with pytest.raises(tl.GraphDoesNotHold, match="less"):
        fork.replay()


def test_a_capture_with_edits_checks_its_edited_values_on_new_inputs() -> None:
    edited = tl.trace(by_bool, X, intervene=tl.when(tl.func("sum"), lambda v, site: v - 100.0))
    assert close(edited.output, X - 1.0)  # the edit flipped the branch live
    assert close(edited.replay(X * 2.0), X * 2.0 - 1.0)  # the edit keeps it flipped on these inputs
    with pytest.raises(tl.GraphDoesNotHold, match=edited["greater_1"].label):
        edited.replay(X + 100.0)


# -- saving, threads, cleanup -----------------------------------------------------------------------
def test_a_loaded_trace_keeps_its_checks(tmp_path) -> None:
    t = tl.trace(by_numpy_array, X)
    loaded = tl.load(tl.save(t, tmp_path / "trace"))
    assert converted(loaded) == converted(t)
    same = X + tf.constant([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert close(loaded.replay(same), by_numpy_array(same))
    raises_naming(loaded, "min", X * 2.0)


def test_conversions_in_other_threads_or_edit_helpers_are_not_the_forwards() -> None:
    seen: dict[str, Any] = {}

    def fn(x):
        total = tf.reduce_sum(x)  # recorded; converted only by the worker thread
        worker = threading.Thread(
            target=lambda: seen.update(total=float(total), array=np.asarray(total).item(), shape=tuple(total.shape))
        )
        worker.start()
        worker.join()
        return x * 2.0

    def helper(v, site):  # converts a recorded value inside an edit helper
        return v if float(tf.reduce_max(v)) > -1e9 else -v

    t = tl.trace(fn, X, intervene=tl.when(tl.func("mul"), helper))
    assert seen == {"total": float(tf.reduce_sum(X)), "array": float(tf.reduce_sum(X)), "shape": ()}
    assert converted(t) == []
    assert close(t.replay(-X), fn(-X))


def _interception_state() -> tuple[Any, ...]:
    from tensorflow.python.framework import ops

    names = (
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__len__",
        "__iter__",
        "numpy",
        "__array__",
        "__reduce__",
        "__complex__",
        "__format__",
        "shape",
    )
    numpy_functions = tuple(
        getattr(np, n) for n in ("array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray")
    )
    return tuple(vars(ops._EagerTensorBase).get(n) for n in names), numpy_functions


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_nothing_stays_replaced_after_a_capture_or_an_error_in_the_model(error) -> None:
    before = _interception_state()

    def fn(x):
        if float(tf.reduce_sum(x)) > 0 and len(x.numpy()) == 2:
            raise error("inside the model")
        return x

    with pytest.raises(error, match="inside the model"):
        tl.trace(fn, X)
    assert _interception_state() == before
    tl.trace(by_iter, X)
    assert _interception_state() == before
    assert np.asarray(X).shape == (2, 4) and len(list(X)) == 2  # plain behaviour after the capture


# -- inputs that do not fit the recorded graph -------------------------------------------------------
# (another shape, dtype or count of TensorFlow tensors: the conformance suite's replay checks, on every backend)
@pytest.mark.parametrize(
    ("new", "why"),
    [
        (np.ones((2, 4), dtype=np.float64), "float64"),
        ([[1.0] * 4] * 2, "not an array"),
    ],
)
def test_new_inputs_of_another_shape_or_dtype_are_refused(new, why) -> None:
    t = tl.trace(by_bool, X)
    with pytest.raises(ArgumentTypeError, match=why) as caught:
        t.replay(new)
    assert isinstance(caught.value, TorchLensError)
