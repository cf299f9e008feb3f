"""Interventions on the tf backend, each checked against the same edit written by hand into the model's code.

Keras has no forward hooks, so the reference is the model's own code: the
models below take, as plain Python attributes, edits to apply at the same
places (after each ReLU of a block, to a sublayer's output, a layer called in
place of another), and are run without TorchLens. Edited values are checked
against those runs only; a plain trace serves to name sites and to show that
values recorded before an edit are untouched, and audit() replays each trace
with its edits.

What every backend with the ``intervene`` capability must do (each built-in
helper at an op and at a module call, splices, refused and failing edits, the
array operations, gradients through an edit) is checked on each backend's zoo
by the conformance suite (torchlens/conformance/edit_checks.py); these are
TensorFlow's own: Keras layers, variables, tf.function control flow, masks,
TF's two execution paths.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Callable
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

import torchlens as tl  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")

WIDTH = 16  # channels of every block: the steering vector and the directions have this many entries


def _same(v: Any) -> Any:
    return v


class Block(keras.layers.Layer):
    """A residual block; ``hand_edit`` is applied to the output of each of its two ReLUs (the reference)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conv1 = keras.layers.Conv2D(WIDTH, 3, padding="same", use_bias=False, name="conv1")
        self.bn1 = keras.layers.BatchNormalization(name="bn1")
        self.conv2 = keras.layers.Conv2D(WIDTH, 3, padding="same", use_bias=False, name="conv2")
        self.bn2 = keras.layers.BatchNormalization(name="bn2")
        self.hand_edit: Callable[[Any], Any] = _same

    def call(self, x: Any) -> Any:
        h = self.hand_edit(tf.nn.relu(self.bn1(self.conv1(x))))
        h = self.bn2(self.conv2(h))
        return self.hand_edit(tf.nn.relu(h + x))


class Hand:
    """Edits written into a model's code, by layer name (a plain object: Keras does not track what it holds)."""

    def __init__(self) -> None:
        self.edits: dict[str, Callable[[Any], Any]] = {}
        self.splices: dict[str, Callable[..., Any]] = {}


class Net(keras.Model):
    """stem -> block1 -> block2 -> pool -> head. ``hand.edits[name]`` edits that layer's output, and
    ``hand.splices[name]`` runs in its place (the references)."""

    def __init__(self) -> None:
        super().__init__(name="net")
        self.stem = keras.layers.Conv2D(WIDTH, 3, padding="same", name="stem")
        self.stem_relu = keras.layers.ReLU(name="stem_relu")
        self.block1 = Block(name="block1")
        self.block2 = Block(name="block2")
        self.pool = keras.layers.GlobalAveragePooling2D(name="pool")
        self.head = keras.layers.Dense(10, name="head")
        self.hand = Hand()

    def _run(self, name: str, x: Any) -> Any:
        layer = self.hand.splices.get(name, getattr(self, name))
        return self.hand.edits.get(name, _same)(layer(x))

    def call(self, x: Any) -> Any:
        h = self._run("stem_relu", self._run("stem", x))
        h = self._run("block2", self._run("block1", h))
        return self._run("head", self._run("pool", h))


@pytest.fixture(scope="module")
def net() -> Net:
    keras.utils.set_random_seed(0)
    model = Net()
    model(tf.zeros((1, 8, 8, 3)))
    # moving statistics away from 0 and 1, so that the batch norms do something in inference
    for layer in (model.block1.bn1, model.block1.bn2, model.block2.bn1, model.block2.bn2):
        layer.moving_mean.assign(tf.random.stateless_uniform((WIDTH,), seed=(1, 2), minval=-0.2, maxval=0.2))
        layer.moving_variance.assign(tf.random.stateless_uniform((WIDTH,), seed=(3, 4), minval=0.5, maxval=1.5))
    return model


@pytest.fixture(scope="module")
def inputs() -> tuple[Any, Any]:
    return (
        tf.random.stateless_normal((2, 8, 8, 3), seed=(1, 0)),
        tf.random.stateless_normal((2, 8, 8, 3), seed=(2, 0)),
    )


def _by_hand(
    net: Net,
    x: Any,
    block_edit: Callable[[Any], Any] = _same,
    edits: dict[str, Callable[[Any], Any]] | None = None,
    splices: dict[str, Callable[..., Any]] | None = None,
) -> Any:
    """The model's output with the edits written into its code (no TorchLens)."""
    net.block1.hand_edit = block_edit
    net.hand.edits, net.hand.splices = edits or {}, splices or {}
    try:
        return net(x)
    finally:
        net.block1.hand_edit = _same
        net.hand.edits, net.hand.splices = {}, {}


def _close(a: Any, b: Any) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


VECTOR = np.linspace(-1, 1, WIDTH)


def _hand_made(name: str, reference: Any, site_value: Callable[[Any], Any]) -> tuple[Any, Callable[[Any], Any]]:
    """(helper, the same edit written by hand in TensorFlow); ``site_value(v)`` is the reference's value there."""
    if name == "steer":  # a TensorFlow tensor as the vector
        return tl.steer(tf.constant(VECTOR, tf.float32), scale=2.5), lambda v: v + 2.5 * VECTOR.astype(np.float32)
    if name == "swap_with":  # another trace's value at the same site
        return tl.swap_with(reference), site_value
    raise AssertionError(name)


# Every built-in helper's arithmetic, at an op and at a module call of each zoo case, is the conformance suite's
# (torchlens/conformance/edit_checks.py, against NumPy); these two are checked here against the edit written into
# the model.
HELPERS = ["steer", "swap_with"]
RELUS_IN_BLOCK1 = tl.func("relu") & tl.in_module("block1")


@pytest.mark.parametrize("name", HELPERS)
def test_every_helper_at_op_sites_equals_the_edit_written_into_the_model(net: Net, inputs: Any, name: str) -> None:
    x, other = inputs
    reference = tl.trace(net, other)
    # the reference's value at the k-th ReLU of block1, taken from a plain run on `other`
    seen: list[Any] = []
    _by_hand(net, other, block_edit=lambda v: seen.append(v) or v)
    calls: list[int] = []

    def site_value(v: Any) -> Any:
        return seen[len(calls) - 1]

    helper, by_hand = _hand_made(name, reference, site_value)
    traced = tl.trace(net, x, intervene=tl.when(RELUS_IN_BLOCK1, helper))
    edited_by_hand: list[Any] = []

    def block_edit(v: Any) -> Any:
        calls.append(1)
        edited_by_hand.append(by_hand(v))
        return edited_by_hand[-1]

    expected = _by_hand(net, x, block_edit=block_edit)

    assert len(calls) == 2
    _close(traced.output, expected)
    assert not np.allclose(expected, net(x), atol=1e-4)  # the edit changes the output
    sites = traced.find(RELUS_IN_BLOCK1)
    assert len(sites) == 2 and all(op.edited for op in sites)
    for op, value in zip(sites, edited_by_hand):  # the recorded values are the edited ones
        _close(op.out, value)
    first = sites[0]  # upstream of every edit: its value before the edit is the plain run's
    np.testing.assert_array_equal(first.pre_edit, tl.trace(net, x)[first.label].out)
    assert [e.site for e in traced.interventions] == [f"{op.layer_label}:{op.pass_num}" for op in sites]
    report = traced.audit()
    assert report, str(report)


@pytest.mark.parametrize("name", HELPERS)
def test_every_helper_at_a_module_site_equals_the_edit_written_into_the_model(net: Net, inputs: Any, name: str) -> None:
    x, other = inputs
    reference = tl.trace(net, other)
    kept: list[Any] = []  # block1's output in a plain run on `other`
    _by_hand(net, other, edits={"block1": lambda v: kept.append(v) or v})
    helper, by_hand = _hand_made(name, reference, lambda v: kept[0])
    traced = tl.trace(net, x, intervene=tl.when(tl.module("block1"), helper))
    expected = _by_hand(net, x, edits={"block1": by_hand})
    _close(traced.output, expected)
    assert not np.allclose(expected, net(x), atol=1e-4)
    (edit,) = traced.interventions
    assert (edit.site, edit.kind) == ("block1:1", "module")
    assert traced["block1"].edited
    report = traced.audit()
    assert report, str(report)


# -- variables written in place ---------------------------------------------------------------
class Accumulator(tf.Module):
    """Adds the batch's column sums to a running total (a variable written in place), then reads it."""

    def __init__(self) -> None:
        super().__init__(name="accumulator")
        self.total = tf.Variable(tf.ones((4,)), name="total")

    def __call__(self, x: Any, hand_edit: Callable[[Any], Any] | None = None) -> Any:
        before = self.total * 1.0
        self.total.assign_add(tf.reduce_sum(x, 0))
        if hand_edit is not None:  # the reference: the edit written into the code, on the new state
            self.total.assign(hand_edit(self.total.read_value()))
        return x * self.total + before


def test_an_edited_variable_write_reaches_later_reads_and_leaves_every_other_value_intact() -> None:
    x = tf.random.stateless_normal((3, 4), seed=(4, 0))
    plain = tl.trace(Accumulator(), x)
    model = Accumulator()
    traced = tl.trace(model, x, intervene=tl.when(tl.func("assign_add"), tl.scale(-2.0)))
    reference = Accumulator()
    expected = reference(x, hand_edit=lambda v: v * -2.0)

    _close(traced.output, expected)
    np.testing.assert_array_equal(model.total.numpy(), reference.total.numpy())  # the variable holds the edit
    (write,) = traced.find(tl.func("assign_add"))
    assert write.in_place and write.edited
    np.testing.assert_array_equal(write.pre_edit, plain[write.label].out)
    _close(write.out, -2.0 * plain[write.label].out)
    # every value recorded before the write is the plain run's (the read of the variable included)
    for op in traced.ops[: write.index]:
        np.testing.assert_array_equal(op.out, plain[op.label].out, err_msg=op.label)
    np.testing.assert_array_equal(traced.params["total"].value, np.ones(4))  # the state before the forward
    # the op after it reads the variable (inside TensorFlow's fast path), which now holds the edit
    (later,) = [op for op in traced.ops[write.index + 1 :] if op.kind == "op" and write.label in op.parents]
    assert later.func_name == "mul"
    report = traced.audit()
    assert report, str(report)


# -- control flow ------------------------------------------------------------------------------
def looped(x: Any, hand_edit: Callable[[Any], Any] | None = None, at: int | None = None) -> Any:
    """tanh three times in a tf.while_loop, then a tf.cond on the sign of the sum."""

    def body(i: Any, h: Any) -> Any:
        t = tf.tanh(h)
        if hand_edit is not None and (at is None or int(i) == at):
            t = hand_edit(t)
        return i + 1, t * 1.5

    _, y = tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), x))
    return tf.cond(tf.reduce_sum(y) > 0, lambda: y * 2.0, lambda: y - 1.0)


looped_function = tf.function(looped)


def test_edits_inside_a_tf_function_while_loop_and_cond() -> None:
    x = tf.random.stateless_normal((2, 4), seed=(1, 2))
    plain = tl.trace(looped_function, x)
    assert plain.notes["tf_functions_run_eagerly"] == ["looped"]
    tanh = plain.find(tl.func("tanh"))
    assert len(tanh) == 3 and float(tf.reduce_sum(plain.output)) > 0  # the cond's first branch ran

    # the second iteration only: zeros from there on, so the cond takes its other branch
    second = tl.trace(looped_function, x, intervene=tl.when(tl.label(tanh[1].label), tl.zero_ablate()))
    expected = looped(x, hand_edit=tf.zeros_like, at=1)
    _close(second.output, expected)
    np.testing.assert_array_equal(second.output, -np.ones((2, 4)))
    assert [op.func_name for op in second.ops][-3:] == ["greater", "sub", "output"]
    assert [e.site for e in second.interventions] == [f"{tanh[1].label}:1"]
    report = second.audit()
    assert report, str(report)

    # every iteration
    every = tl.trace(looped_function, x, intervene=tl.when(tl.func("tanh"), tl.scale(0.5)))
    _close(every.output, looped(x, hand_edit=lambda t: t * 0.5))
    assert len(every.interventions) == 3
    report = every.audit()
    assert report, str(report)


def gate(x: Any, hand_edit: Callable[[Any], Any] = _same) -> Any:
    h = hand_edit(tf.nn.relu(x))
    if tf.reduce_sum(h) > 0:  # a Python branch on the (edited) value
        out = h * 3.0
    else:
        out = h - 1.0
    return out


def test_a_python_branch_follows_the_edited_value_and_names_it() -> None:
    x = tf.constant([[0.5, -1.0, 2.0]])
    traced = tl.trace(gate, x, intervene=tl.when(tl.func("relu"), tl.zero_ablate()))
    _close(traced.output, gate(x, hand_edit=tf.zeros_like))
    (branch,) = traced.find(tl.func("sub"))
    (test,) = traced.find(tl.func("greater"))
    assert branch.conditions == [test.label]
    assert "mul" not in [op.func_name for op in traced.ops]
    assert traced.audit()


class Recurrent(keras.Model):
    """One Dense layer applied four times; ``hand_at``/``hand_edit`` edit the output of one of its calls."""

    def __init__(self) -> None:
        super().__init__(name="recurrent")
        self.fc = keras.layers.Dense(5, name="fc")
        self.hand_at: int | None = None
        self.hand_edit: Callable[[Any], Any] = _same

    def call(self, x: Any) -> Any:
        for k in range(1, 5):
            x = self.fc(x)
            if k == self.hand_at:
                x = self.hand_edit(x)
            x = (x + 1) * 2
        return x


def test_a_module_site_with_a_pass_edits_that_call_only() -> None:
    keras.utils.set_random_seed(1)
    model = Recurrent()
    x = tf.random.stateless_normal((2, 5), seed=(5, 0)) * 0.1
    model(x)
    traced = tl.trace(model, x, intervene=tl.when(tl.module("fc:3"), tl.steer(np.arange(5.0), scale=-0.5)))
    model.hand_at, model.hand_edit = 3, lambda v: v - 0.5 * np.arange(5.0, dtype=np.float32)
    try:
        expected = model(x)
    finally:
        model.hand_at, model.hand_edit = None, _same
    _close(traced.output, expected)
    assert [e.site for e in traced.interventions] == ["fc:3"]
    assert [traced[f"fc:{n}"].edited for n in range(1, 5)] == [False, False, True, False]
    assert traced.audit()


class TwoOutputs(keras.layers.Layer):
    """Returns a dict; its first value is also read inside it (by ``b``). ``hand_edit`` edits what it returns."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.a = keras.layers.Dense(4, name="a")
        self.b = keras.layers.Dense(4, name="b")
        self.hand_edit: Callable[[Any], Any] = _same

    def call(self, x: Any) -> Any:
        a = self.a(x)
        b = self.b(a)
        return {"a": self.hand_edit(a), "b": self.hand_edit(b)}


class UsesTwo(keras.Model):
    def __init__(self) -> None:
        super().__init__(name="uses_two")
        self.two = TwoOutputs(name="two")

    def call(self, x: Any) -> Any:
        out = self.two(x)
        return out["a"] * 2.0 + out["b"]


def test_every_leaf_of_a_dict_output_is_edited_and_ops_inside_see_the_unedited_value() -> None:
    keras.utils.set_random_seed(2)
    model = UsesTwo()
    x = tf.random.stateless_normal((3, 4), seed=(6, 0))
    model(x)
    traced = tl.trace(model, x, intervene=tl.when(tl.module("two"), tl.scale(-3.0)))
    model.two.hand_edit = lambda v: v * -3.0
    try:
        expected = model(x)
    finally:
        model.two.hand_edit = _same
    _close(traced.output, expected)
    assert sorted(e.where.path for e in traced.interventions) == [("a",), ("b",)]  # the leaves of the output
    plain = tl.trace(model, x)
    # b's matmul read `a` inside the layer: it saw the value before the edit, as by hand
    (matmul_b,) = [op for op in traced.ops if op.func_name == "matmul" and op.module == "two.b"]
    np.testing.assert_array_equal(matmul_b.out, plain[matmul_b.label].out)
    assert traced.audit()


class Masked(keras.Model):
    """An embedding that masks padding, read by an LSTM: the mask travels on the tensor (``_keras_mask``)."""

    def __init__(self) -> None:
        super().__init__(name="masked")
        self.embed = keras.layers.Embedding(20, 6, mask_zero=True, name="embed")
        self.lstm = keras.layers.LSTM(5, name="lstm")

    def call(self, tokens: Any) -> Any:
        return self.lstm(self.embed(tokens))


def test_a_layers_keras_mask_is_kept_on_its_edited_output() -> None:
    keras.utils.set_random_seed(3)
    model = Masked()
    tokens = tf.constant([[3, 7, 0, 0, 0, 0], [5, 1, 9, 2, 0, 0]], tf.int32)
    model(tokens)
    embed, lstm = model.embed, model.lstm

    class DoubledEmbedding(keras.layers.Embedding):  # the reference: the layer itself returns the edit
        def call(self, inputs: Any) -> Any:
            return super().call(inputs) * 2.0

    doubled = DoubledEmbedding(20, 6, mask_zero=True)
    doubled.build((None, 6))
    doubled.set_weights(embed.get_weights())
    expected = lstm(doubled(tokens))  # Keras sets the mask on what call returned: the LSTM skips the padding
    traced = tl.trace(model, tokens, intervene=tl.when(tl.module("embed"), tl.scale(2.0)))
    _close(traced.output, expected)
    assert not np.allclose(expected, lstm(doubled(tokens) * 1.0), atol=1e-4)  # without the mask: another output
    assert traced.audit()


# -- save=, halt= and gradients --------------------------------------------------------------
def test_save_and_halt_keep_working_with_edits(net: Net, inputs: Any) -> None:
    x, _ = inputs
    traced = tl.trace(net, x, save=tl.func("matmul"), intervene=tl.when(tl.module("block2"), tl.scale(2.0)))
    block2 = traced["block2"]
    assert block2.out is None and block2.pre_edit is None and block2.edited  # not saved, still edited
    _close(traced.output, _by_hand(net, x, edits={"block2": lambda v: v * 2.0}))
    report = traced.audit()
    assert report, str(report)

    steer = tl.steer(np.ones(WIDTH))
    halted = tl.trace(net, x, halt=tl.module("block2"), intervene=tl.when(tl.module("block1"), steer))
    assert halted.halted and halted["block1"].edited
    seen: dict[str, Any] = {}
    _by_hand(net, x, edits={"block1": lambda v: v + 1.0, "block2": lambda v: seen.setdefault("out", v)})
    _close(halted["block2"].out, seen["out"])


@pytest.mark.parametrize("where", ["fast path op", "fallback path op", "module"])
def test_gradients_flow_through_an_edit_as_through_one_written_by_hand(
    net: Net, inputs: Any, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorflow.python.eager import execute

    x, _ = inputs
    vector = np.linspace(-1, 1, 10).astype(np.float32)
    if where == "fast path op":
        selector, edits = tl.func("relu") & tl.in_module("stem_relu"), {"stem_relu": lambda v: v * 0.5}
        helper = [tl.scale(0.5)]
    elif where == "fallback path op":  # Dense's bias_add runs through Python's execute(), not the fast path
        selector, edits = tl.func("bias_add") & tl.in_module("head"), {"head": lambda v: (v + vector) * 0.5}
        helper = [tl.steer(vector), tl.scale(0.5)]  # the scale: a gradient that skipped the edit would differ
        ran: list[Any] = []
        with_callbacks = execute.execute_with_callbacks  # what the capture installs as execute.execute

        def spy(op_name: Any, *args: Any, **kwargs: Any) -> Any:
            ran.append(op_name)
            return with_callbacks(op_name, *args, **kwargs)

        monkeypatch.setattr(execute, "execute_with_callbacks", spy)
    else:
        selector, edits = tl.module("block1"), {"block1": lambda v: v * 0.5}
        helper = [tl.scale(0.5)]
    with tf.GradientTape() as tape:
        tape.watch(x)
        traced = tl.trace(net, x, intervene=tl.when(selector, *helper))
        loss = tf.reduce_sum(traced.output**2)
    grad = tape.gradient(loss, x)
    if where == "fallback path op":
        assert b"BiasAdd" in ran
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss_by_hand = tf.reduce_sum(_by_hand(net, x, edits=edits) ** 2)
    expected = tape.gradient(loss_by_hand, x)
    _close(loss, loss_by_hand)
    assert grad is not None
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


# -- refusals and cleanup -----------------------------------------------------------------------
class ReturnsItsInput(keras.layers.Layer):
    """Returns the tensor it was given: its output is an explicit identity op."""

    def call(self, x: Any) -> Any:
        return x


class PassesThrough(keras.Model):
    def __init__(self) -> None:
        super().__init__(name="passes")
        self.fc = keras.layers.Dense(4, name="fc")
        self.same = ReturnsItsInput(name="same")

    def call(self, x: Any) -> Any:
        h = self.fc(x)
        return self.same(h) + h  # h read again by the model, unedited


def test_a_module_site_on_a_pass_through_layer_leaves_the_callers_tensor_unedited() -> None:
    keras.utils.set_random_seed(9)
    model, x = PassesThrough(), tf.random.stateless_normal((3, 4), seed=(9, 0))
    model(x)
    traced = tl.trace(model, x, save=tl.module("same"), intervene=tl.when(tl.module("same"), tl.scale(-2.0)))
    report = traced.audit()
    assert report, str(report)
    h = model.fc(x).numpy()
    np.testing.assert_allclose(traced.output.numpy(), h * -2.0 + h, rtol=1e-6)  # the model's own h, unedited
    np.testing.assert_allclose(traced["same"].out.numpy(), h * -2.0, rtol=1e-6)
    (add,) = [op for op in traced.ops if op.func_name == "add"]
    edit, passed = (traced[label] for label in add.parents)
    assert [op.label for op in traced.ops] == [op.label for op in tl.trace(model, x).ops]  # no op added
    assert edit.func_name == "identity" and edit.edited and not passed.edited  # h: its own op, unedited
    fork = tl.trace(model, x).fork().when(tl.module("same"), tl.scale(-2.0))
    with pytest.raises(tl.UnsupportedError, match="pass-through"):
        fork.replay()  # the caller's reads and the module's are one in this graph: only a rerun tells them apart
    np.testing.assert_allclose(fork.rerun(model, x).output.numpy(), h * -2.0 + h, rtol=1e-6)


class Keeps(keras.layers.Layer):
    """Keeps what it returns where the model reads it again (``self.last = y; return y``)."""

    def __init__(self, store: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fc = keras.layers.Dense(4, name="fc")
        self.store = store

    def call(self, x: Any) -> Any:
        y = tf.nn.relu(self.fc(x))
        self.store.last = y
        return y


class KeepsItsOutput(keras.Model):
    def __init__(self) -> None:
        super().__init__(name="keeps")
        self.store = types.SimpleNamespace()
        self.block = Keeps(self.store, name="block")
        self.reread = True

    def call(self, x: Any) -> Any:
        out = self.block(x) * 3.0
        return out + self.store.last if self.reread else out + 1.0  # else only what the block returned


def test_an_edited_module_output_read_again_where_the_model_kept_it_is_refused() -> None:
    """A hook hands the caller the edit while the kept tensor stays unedited: one recorded value cannot be both."""
    keras.utils.set_random_seed(9)
    model, x = KeepsItsOutput(), tf.random.stateless_normal((3, 4), seed=(9, 0))
    model(x)
    with pytest.raises(tl.InterventionError, match=r"block:1 handed .* itself \(tl.label\('\w+:1'\)\)") as raised:
        tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))
    (label,) = re.search(r"tl.label\('(\w+:1)'\)", str(raised.value)).groups()
    y = tf.nn.relu(model.block.fc(x)).numpy()
    traced = tl.trace(model, x, intervene=tl.when(tl.label(label), tl.scale(-2.0)))
    assert traced.audit()
    np.testing.assert_allclose(traced.output.numpy(), -8.0 * y, rtol=1e-6)
    model.reread = False
    traced = tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))
    assert traced.audit()
    np.testing.assert_allclose(traced.output.numpy(), -6.0 * y + 1.0, rtol=1e-6)


def test_an_edit_returning_a_numpy_array_is_refused_naming_the_site(net: Net, inputs: Any) -> None:
    # (another shape or dtype, refused naming the site: the conformance suite's, on every backend)
    x, _ = inputs
    relu = tl.trace(net, x).find(RELUS_IN_BLOCK1)[0].label
    with pytest.raises(tl.InterventionError, match="not a TensorFlow tensor"):
        tl.trace(net, x, intervene=tl.when(tl.label(relu), lambda v, site: v.numpy()))


def _interception_state() -> tuple[Any, ...]:
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context, execute
    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    from tensorflow.python.framework import ops

    value_reads = tuple(vars(ops._EagerTensorBase).get(name) for name in ("__bool__", "__float__", "numpy"))
    return (
        tuple(context.context().op_callbacks),
        execute.execute,
        execute.record_gradient,
        pywrap_tfe.TFE_Py_FastPathExecute,
        keras.layers.Layer.__dict__["__call__"],
        polymorphic_function.Function.__dict__["__call__"],
        tf.config.functions_run_eagerly(),
        value_reads,
    )


class Forgiving(keras.Model):
    """Catches what its layer raises and goes on: the capture must fail all the same."""

    def __init__(self) -> None:
        super().__init__(name="forgiving")
        self.fc = keras.layers.Dense(3, name="fc")

    def call(self, x: Any) -> Any:
        try:
            return self.fc(x)
        except RuntimeError:
            return x[:, :3]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_error_in_a_helper_leaves_nothing_installed(net: Net, inputs: Any, error: type[BaseException]) -> None:
    x, _ = inputs

    def broken(value: Any, site: Any) -> Any:
        raise error("helper failed")

    before = _interception_state()
    for selector in (tl.func("relu"), tl.module("block2")):
        with tf.GradientTape(), pytest.raises(error, match="helper failed"):
            tl.trace(net, x, intervene=tl.when(selector, broken))
        assert _interception_state() == before
    np.testing.assert_array_equal(net(x), tl.trace(net, x).output)

    model = Forgiving()
    model(tf.ones((2, 4)))
    for selector in (tl.func("matmul"), tl.module("fc")):
        with pytest.raises(error, match="helper failed"):
            tl.trace(model, tf.ones((2, 4)), intervene=tl.when(selector, broken))
        assert _interception_state() == before


@pytest.mark.parametrize("given", [tuple, list])
def test_a_tensorflow_that_would_not_return_the_edit_is_refused_not_misrecorded(
    net: Net, inputs: Any, given: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edit reaches the model through the output list the op callback is given (torchlens_tf.edits).

    Here the callback is handed a copy of it instead, as another TensorFlow
    might: a tuple cannot take the edit (refused at once); a list copy takes
    it without the model seeing it, and the first later use of the unedited
    value fails the capture.
    """
    x, _ = inputs
    context_type = type(context.context())
    add, remove = context_type.add_op_callback, context_type.remove_op_callback
    wrappers: dict[int, Any] = {}

    def add_copying(self: Any, callback: Any) -> None:
        def copying(op_type: Any, inputs: Any, attrs: Any, outputs: Any, *args: Any) -> Any:
            return callback(op_type, inputs, attrs, given(outputs) if outputs else outputs, *args)

        wrappers[id(callback)] = copying
        add(self, copying)

    monkeypatch.setattr(context_type, "add_op_callback", add_copying)
    monkeypatch.setattr(context_type, "remove_op_callback", lambda self, cb: remove(self, wrappers.pop(id(cb))))
    error = tl.UnsupportedError if given is tuple else tl.CaptureError
    match = "cannot be changed" if given is tuple else "from before its edit"
    before = _interception_state()
    with pytest.raises(error, match=match):
        tl.trace(net, x, intervene=tl.when(RELUS_IN_BLOCK1, tl.scale(0.5)))
    assert _interception_state() == before
    assert tl.trace(net, x).audit()  # without edits, a copy of the list changes nothing


def test_array_operations_agree_with_the_numpy_reference() -> None:
    from torchlens_core.backend.array_ops import NumpyArrayOps
    from torchlens_tf.arrays import ARRAY_OPS

    reference = NumpyArrayOps()
    rng = np.random.default_rng(0)
    # the zoo's float and integer arrays: the conformance suite's; here the dtypes its models do not make
    arrays = [rng.integers(0, 255, (3, 4, 5)).astype(np.uint8), rng.standard_normal((3, 4, 5)) > 0.3]
    for a in arrays:
        t = tf.constant(a)
        cases: list[tuple[str, Callable[[Any, Any], Any]]] = [
            ("zeros_like", lambda ops, x: ops.zeros_like(x)),
            ("mean", lambda ops, x: ops.mean(x, (0, 2))),
            ("sum", lambda ops, x: ops.sum(x, 1)),
            ("take", lambda ops, x: ops.take(x, [2, 0, 2], 0)),
            ("from_numpy", lambda ops, x: ops.from_numpy(np.linspace(-3, 300, 60).reshape(3, 4, 5), x)),
            ("copy", lambda ops, x: ops.copy(x)),
        ]
        if a.dtype != bool:
            cases += [
                ("clip", lambda ops, x: ops.clip(x, -1.5, 2.5)),
                ("clip low", lambda ops, x: ops.clip(x, 0.5, None)),
                ("clip high", lambda ops, x: ops.clip(x, None, 2.0)),
            ]
        for name, run in cases:
            got, want = run(ARRAY_OPS, t), run(reference, a)
            assert isinstance(got, tf.Tensor) and got.dtype.as_numpy_dtype == want.dtype, (name, a.dtype)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=f"{name} on {a.dtype}")
    variable = tf.Variable(tf.ones(3))
    kept = ARRAY_OPS.copy(variable)
    variable.assign_add(tf.ones(3))
    np.testing.assert_array_equal(kept, np.ones(3))  # a copy of a variable is its value then
