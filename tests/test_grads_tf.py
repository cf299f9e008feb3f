"""Per-op gradients on the tf backend, checked against TensorFlow's own: a GradientTape over hand-written forwards.

The references never go through TorchLens: each model's forward is written
out again with TensorFlow ops on the model's own weights, run under a
``tf.GradientTape``, and the tape asked for the gradient at the intermediate
tensors (which it gives for any tensor computed under it), at the inputs it
watches and at the model's variables.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.records import GRAD_NO_DEPENDENCE, GRAD_NOT_DIFFERENTIABLE, GRAD_NOT_SELECTED  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")


def _normal(*shape: int, seed: int = 0) -> Any:
    return tf.random.stateless_normal(shape, seed=(seed, 1))


def _close(got: Any, expected: Any, atol: float = 1e-5) -> bool:
    assert got is not None and expected is not None
    return bool(np.allclose(np.asarray(got), np.asarray(tf.convert_to_tensor(expected)), atol=atol, rtol=1e-5))


def _op(trace: tl.Trace, func: str, module: str | None = None, k: int = 0) -> Any:
    """The k-th op of function ``func`` (inside ``module``)."""
    found = [op for op in trace.ops if op.func_name == func and (module is None or op.module == module)]
    return found[k]


def _mlp() -> Any:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(6, activation="relu", name="fc1"),
            keras.layers.Dense(4, activation="tanh", name="fc2"),
            keras.layers.Dense(3, name="head"),
        ],
        name="mlp",
    )


def _square_loss(out: Any) -> Any:
    return tf.reduce_sum(out * out)


def _mlp_by_hand(model: Any, x: Any, edit: Any = None) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """The MLP's forward written out, under a tape: the gradients at its intermediates and variables; its output."""
    fc1, fc2, head = (model.get_layer(name) for name in ("fc1", "fc2", "head"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        seen = {"input": x}
        seen["matmul1"] = tf.matmul(x, fc1.kernel)
        seen["bias1"] = tf.nn.bias_add(seen["matmul1"], fc1.bias)
        seen["relu"] = tf.nn.relu(seen["bias1"])
        if edit is not None:
            seen["relu_edited"] = edit(seen["relu"])
        h = seen.get("relu_edited", seen["relu"])
        seen["matmul2"] = tf.matmul(h, fc2.kernel)
        seen["tanh"] = tf.tanh(tf.nn.bias_add(seen["matmul2"], fc2.bias))
        seen["out"] = tf.nn.bias_add(tf.matmul(seen["tanh"], head.kernel), head.bias)
        loss = _square_loss(seen["out"])
    grads = tape.gradient(loss, seen)
    params = tape.gradient(
        loss, {f"{layer.name}.{v.name}": v for layer in (fc1, fc2, head) for v in layer.trainable_variables}
    )
    del tape
    return grads, params, seen["out"]


def test_every_op_of_a_keras_mlp_gets_the_gradient_a_tape_gives_its_intermediate() -> None:
    model = _mlp()
    x = _normal(3, 5)
    traced = tl.trace(model, x, save_grads=True)
    traced.log_backward(_square_loss)
    expected, params, out = _mlp_by_hand(model, x)
    assert _close(traced.output, model(x)) and _close(out, model(x))
    assert _close(traced["input_1"].grad, expected["input"])
    assert _close(_op(traced, "matmul", "fc1").grad, expected["matmul1"])
    assert _close(_op(traced, "bias_add", "fc1").grad, expected["bias1"])
    assert _close(_op(traced, "relu", "fc1").grad, expected["relu"])
    assert _close(_op(traced, "matmul", "fc2").grad, expected["matmul2"])
    assert _close(_op(traced, "tanh", "fc2").grad, expected["tanh"])
    assert _close(traced["fc2"].grad, expected["tanh"])  # a module's gradient is that of what it returned
    assert _close(_op(traced, "bias_add", "head").grad, expected["out"])
    assert set(traced.params) == set(params)
    for name, grad in params.items():
        assert _close(traced.params[name].grad, grad), name
    # a read of a variable has its own gradient: the kernel's, as the matmul used it
    assert _close(_op(traced, "read_variable", "fc1").grad, params["fc1.kernel"])
    assert all(op.grad_status == "saved" for op in traced.ops if op.kind in ("input", "op"))


class _Loop(keras.Model):
    """A residual block applied while a tensor test says so (a Python loop on a recorded value)."""

    def __init__(self, steps: int) -> None:
        super().__init__(name="loop")
        self.steps = steps
        self.embed = keras.layers.Dense(6, name="embed")
        self.block = keras.layers.Dense(6, activation="tanh", name="block")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x: Any) -> Any:
        h = self.embed(x)
        steps = 0
        while steps < self.steps and tf.norm(h) < 1e6:
            h = self.block(h) * 2.0 + h
            steps += 1
        return self.head(h)


def test_each_pass_of_a_layer_in_a_python_loop_has_its_own_gradient() -> None:
    keras.utils.set_random_seed(1)
    model = _Loop(steps=3)
    x = _normal(2, 4, seed=1)
    model(x)
    traced = tl.trace(model, x, save_grads=True)
    traced.log_backward(lambda out: tf.reduce_sum(tf.sin(out)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        h = tf.nn.bias_add(tf.matmul(x, model.embed.kernel), model.embed.bias)
        passes = []
        for _ in range(3):
            passes.append(tf.tanh(tf.nn.bias_add(tf.matmul(h, model.block.kernel), model.block.bias)))
            h = passes[-1] * 2.0 + h
        loss = tf.reduce_sum(tf.sin(tf.nn.bias_add(tf.matmul(h, model.head.kernel), model.head.bias)))
    expected = tape.gradient(loss, [x, *passes])
    assert _close(traced["input_1"].grad, expected[0])
    for k, grad in enumerate(expected[1:], start=1):
        assert _close(traced[f"block:{k}"].grad, grad), f"block:{k}"
    assert not _close(expected[1], expected[3])  # the passes' gradients differ: each is its own
    norms = [op for op in traced.ops if op.func_name == "sqrt"]  # tf.norm's: the loop test, not in the loss
    assert norms and all(op.grad_status == GRAD_NO_DEPENDENCE for op in norms)


def test_ops_inside_a_tf_function_branch_run_eagerly_have_gradients() -> None:
    w = tf.Variable(_normal(4, 3, seed=2), name="w")

    @tf.function
    def gated(x: Any) -> Any:
        h = tf.nn.relu(tf.matmul(x, w))
        if tf.reduce_sum(h) > 0:  # autograph would make a tf.cond; captured eagerly, the branch taken is recorded
            h = h * 0.5
        return tf.nn.log_softmax(h)

    x = _normal(5, 4, seed=3)
    traced = tl.trace(gated, x, save_grads=True)
    traced.log_backward(lambda out: tf.reduce_sum(out[:, 0]))
    with tf.GradientTape() as tape:
        tape.watch(x)
        relu = tf.nn.relu(tf.matmul(x, w))
        assert float(tf.reduce_sum(relu)) > 0
        half = relu * 0.5
        loss = tf.reduce_sum(tf.nn.log_softmax(half)[:, 0])
    expected = tape.gradient(loss, [x, relu, half, w])
    assert _close(traced["input_1"].grad, expected[0])
    assert _close(_op(traced, "relu").grad, expected[1])
    assert _close(_op(traced, "mul").grad, expected[2])
    assert _close(traced.params["w"].grad, expected[3])
    assert _op(traced, "greater").grad_status == GRAD_NOT_DIFFERENTIABLE


def _looped(x: Any, v: Any) -> Any:
    """A tf.while_loop and a tf.cond (both run eagerly), scaled by a variable given as an argument."""

    def body(i: Any, h: Any) -> Any:
        return i + 1, tf.tanh(h * v)

    _, h = tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), x))
    return tf.cond(tf.reduce_sum(h) > -100.0, lambda: h * 2.0, lambda: h - 1.0)


def test_each_iteration_of_a_while_loop_and_the_cond_branch_taken_have_their_gradients() -> None:
    x, v = _normal(2, 4, seed=12), tf.Variable(0.7, name="v")
    traced = tl.trace(_looped, x, v, save_grads=True)
    traced.log_backward(lambda out: tf.reduce_sum(out * out))
    with tf.GradientTape() as tape:
        tape.watch(x)
        h, steps = x, []
        for _ in range(3):
            steps.append(tf.tanh(h * v))
            h = steps[-1]
        out = h * 2.0
        loss = tf.reduce_sum(out * out)
    expected = tape.gradient(loss, [x, v, out, *steps])
    tanhs = [op for op in traced.ops if op.func_name == "tanh"]
    assert len(tanhs) == 3 and len({op.label.split(":")[0] for op in tanhs}) == 3  # one op per iteration
    assert _close(traced["input_1"].grad, expected[0])
    assert [name for name in traced.params] == ["args.1"]  # the variable argument is a parameter
    assert _close(traced.params["args.1"].grad, expected[1])
    assert _close(_op(traced, "mul", k=3).grad, expected[2])  # the branch's h * 2.0
    for op, grad in zip(tanhs, expected[3:]):
        assert _close(op.grad, grad), op.label
    assert not _close(tanhs[0].grad, tanhs[2].grad)
    assert [op.grad_status for op in traced.ops if op.func_name == "less"] == [GRAD_NOT_DIFFERENTIABLE] * 4
    assert _op(traced, "sum").grad_status == GRAD_NO_DEPENDENCE  # the cond's test


def test_an_embedding_and_dropped_values_give_the_gradients_of_the_model() -> None:
    keras.utils.set_random_seed(4)
    model = keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(10, 4, name="embed"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    ids = tf.constant([[1, 2, 2], [3, 4, 9]])
    traced = tl.trace(model, ids, save_grads=True, save=tl.func("matmul"))  # most values dropped after capture
    assert _op(traced, "reshape").out is None
    traced.log_backward(lambda out: tf.reduce_sum(out * out))
    with tf.GradientTape(persistent=True) as tape:
        rows = tf.gather(model.get_layer("embed").embeddings, ids)
        flat = tf.reshape(rows, (2, 12))
        loss = tf.reduce_sum(model.get_layer("head")(flat) ** 2)
    expected = tape.gradient(
        loss,
        {
            "flat": flat,
            "embed.embeddings": model.get_layer("embed").embeddings,
            "head.kernel": model.get_layer("head").kernel,
        },
    )
    assert _close(_op(traced, "reshape").grad, expected["flat"])
    for name in ("embed.embeddings", "head.kernel"):
        assert _close(traced.params[name].grad, expected[name]), name
    assert traced["input_1"].grad_status == GRAD_NOT_DIFFERENTIABLE


class _Quantized(tf.Module):
    """Two tf.custom_gradient functions: a straight-through rounding, and a matmul whose gradient is clipped."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(_normal(4, 3, seed=13), name="w")

    def __call__(self, x: Any) -> Any:
        @tf.custom_gradient
        def straight_through(h: Any) -> Any:
            return tf.round(h), lambda dy: dy * 3.0

        @tf.custom_gradient
        def clipped_matmul(h: Any) -> Any:
            def grad(dy: Any, variables: Any = None) -> Any:
                return (
                    tf.clip_by_value(tf.matmul(dy, self.w, transpose_b=True), -0.1, 0.1),
                    [tf.matmul(h, dy, transpose_a=True) * 2.0],
                )

            return tf.matmul(h, self.w), grad

        return tf.tanh(clipped_matmul(straight_through(x * 2.0) * x))


def test_tf_custom_gradient_functions_give_their_own_gradients_not_those_of_their_ops(tmp_path: Any) -> None:
    module = _Quantized()
    x = _normal(2, 4, seed=14)
    traced = tl.trace(module, x, save_grads=True)
    traced.log_backward(lambda out: tf.reduce_sum(out * out))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        out = module(x)
        loss = tf.reduce_sum(out * out)
    assert _close(traced.output, out)
    expected_x, expected_w, expected_out = tape.gradient(loss, [x, module.w, out])
    assert _close(traced["input_1"].grad, expected_x)  # rounding has no gradient: only the custom ones give this
    assert _close(traced.params["w"].grad, expected_w)
    assert _close(_op(traced, "tanh").grad, expected_out)
    identities = [op for op in traced.ops if op.func_name == "identity"]  # where each function's outputs leave it
    assert len(identities) == 2 and all(op.grad is not None for op in identities)
    # the ops inside a custom_gradient function are not on the gradient's path, as with TensorFlow's own tape
    assert _op(traced, "round").grad_status == GRAD_NO_DEPENDENCE
    loaded = tl.load(tl.save(traced, tmp_path / "t"))
    assert _close(loaded.replay(), out)
    # the file keeps what save_grads= picked and the gradients log_backward kept
    assert [op.grad_status for op in loaded.ops] == [op.grad_status for op in traced.ops]
    with pytest.raises(tl.UnsupportedError, match="custom_gradient"):  # the gradient function is not in the file
        loaded.log_backward(lambda out: tf.reduce_sum(out * out))
    edited = tl.trace(module, x, save_grads=True, intervene=tl.when(tl.func("identity"), tl.scale(0.5)))
    with pytest.raises(tl.UnsupportedError, match="intervene= edited identity"):  # its gradient saw the edit
        edited.log_backward(lambda out: tf.reduce_sum(out * out))


def _pieces(x: Any) -> Any:
    a, b, c = tf.split(x, 3, axis=1)  # three outputs; c is never used
    values, indices = tf.math.top_k(a * b, k=2)  # a float output and an integer one
    return tf.reduce_sum(values * 3.0, axis=1) + tf.cast(indices[:, 0], tf.float32) + tf.reduce_sum(b * b, axis=1)


def test_an_op_with_several_outputs_has_a_gradient_for_each_float_one() -> None:
    x = _normal(4, 6, seed=4)
    traced = tl.trace(_pieces, x, save_grads=True)
    traced.log_backward(lambda out: tf.reduce_sum(out * out))
    with tf.GradientTape() as tape:
        tape.watch(x)
        a, b, c = tf.split(x, 3, axis=1)
        values, indices = tf.math.top_k(a * b, k=2)
        out = tf.reduce_sum(values * 3.0, axis=1) + tf.cast(indices[:, 0], tf.float32) + tf.reduce_sum(b * b, axis=1)
        loss = tf.reduce_sum(out * out)
    ga, gb, gc, gv, gx = tape.gradient(loss, [a, b, c, values, x])
    split = _op(traced, "split").grad
    assert isinstance(split, tuple) and len(split) == 3
    assert _close(split[0], ga) and _close(split[1], gb)
    assert gc is None and split[2] is None  # the unused output: no gradient, as the tape says
    top_k = _op(traced, "top_k").grad
    assert isinstance(top_k, tuple) and len(top_k) == 2
    assert _close(top_k[0], gv) and top_k[1] is None  # the indices are integers
    assert _close(traced["input_1"].grad, gx)


class _Stateful(tf.Module):
    """Reads variables three ways: a gather straight from a variable, a matmul, and a read after a write."""

    def __init__(self) -> None:
        super().__init__()
        self.table = tf.Variable(_normal(10, 4, seed=5), name="table")
        self.w = tf.Variable(_normal(4, 3, seed=6), name="w")
        self.shift = tf.Variable(tf.zeros(3), name="shift")

    def __call__(self, ids: Any, x: Any) -> Any:
        e = tf.gather(self.table, ids)  # ResourceGather on the variable itself
        h = tf.matmul(e * x, self.w)
        self.shift.assign(tf.reduce_mean(h, axis=0))  # no gradient flows through an assignment
        return tf.tanh(h - self.shift)  # but this read after it counts for the variable


def _weighted(out: Any) -> Any:
    return tf.reduce_sum(out * tf.range(1.0, 4.0))


def test_variables_get_the_gradients_the_tape_gives_them_and_keep_their_values() -> None:
    module = _Stateful()
    ids, x = tf.constant([1, 3, 3, 7]), _normal(4, 4, seed=7)
    traced = tl.trace(module, ids, x, save_grads=True)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = _weighted(module(ids, x))
    expected = tape.gradient(loss, [x, module.table, module.w, module.shift])
    module.shift.assign([9.0, 9.0, 9.0])  # replay must neither read nor write the model's variables
    before = module.table.numpy().copy()
    traced.log_backward(_weighted)
    assert np.array_equal(module.shift.numpy(), [9.0, 9.0, 9.0]) and np.array_equal(module.table.numpy(), before)
    assert _close(traced["input_2"].grad, expected[0])
    assert traced["input_1"].grad_status == GRAD_NOT_DIFFERENTIABLE  # the integer ids
    for name, grad in zip(("table", "w", "shift"), expected[1:]):
        assert _close(traced.params[name].grad, grad), name
    assert np.count_nonzero(np.abs(traced.params["table"].grad.numpy()).sum(axis=1)) == 3  # rows 1, 3, 7 only
    assert _op(traced, "mean").grad_status == GRAD_NO_DEPENDENCE  # it reached the loss through the assignment only
    assert _close(_op(traced, "assign").grad, expected[3])  # what the read after the write took


def test_training_mode_gradients_leave_batch_norm_statistics_and_dropout_seeds_alone() -> None:
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, name="fc"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Dropout(0.5, name="drop"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    x = _normal(5, 6, seed=8)
    start = [v.numpy().copy() for v in model.variables]
    traced = tl.trace(model, x, training=True, save_grads=True)
    after_capture = [v.numpy().copy() for v in model.variables]
    traced.log_backward(lambda out: tf.reduce_sum(out[:, 1]))
    for v, value in zip(model.variables, after_capture):
        assert np.array_equal(v.numpy(), value), v.path
    for v, value in zip(model.variables, start):  # the reference starts where the capture did: same dropout mask
        v.assign(value)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(model(x, training=True)[:, 1])
    trainable = {f"{layer.name}.{v.name}": v for layer in model.layers for v in layer.trainable_variables}
    expected = tape.gradient(loss, [x, *trainable.values()])
    assert _close(traced["input_1"].grad, expected[0])
    for name, grad in zip(trainable, expected[1:]):
        assert _close(traced.params[name].grad, grad), name
    stats = [p for p in traced.params.values() if not p.trainable]
    assert stats and all(p.grad is None for p in stats)  # moving statistics: the tape does not watch them


def test_statuses_say_why_an_op_has_no_gradient_and_a_selector_keeps_only_its_ops() -> None:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((5,))
    left = keras.layers.Dense(4, activation="relu", name="left")(inputs)
    right = keras.layers.Dense(4, activation="sigmoid", name="right")(inputs)
    model = keras.Model(inputs, [left, right])
    x = _normal(3, 5, seed=9)
    full = tl.trace(model, x, save_grads=True)
    full.log_backward(lambda out: tf.reduce_sum(out[0]))
    assert _op(full, "relu").grad is not None
    sigmoid = _op(full, "sigmoid")
    assert sigmoid.grad is None and sigmoid.grad_status == GRAD_NO_DEPENDENCE
    assert "Gradient: none (the loss does not depend" in str(sigmoid)
    assert full.params["right.kernel"].grad is None and full.params["left.kernel"].grad is not None

    narrow = tl.trace(model, x, save_grads=tl.func("relu"))
    narrow.log_backward(lambda out: tf.reduce_sum(out[0]))
    assert _close(_op(narrow, "relu").grad, _op(full, "relu").grad, atol=0)
    assert _close(narrow["input_1"].grad, full["input_1"].grad, atol=0)  # inputs are always kept
    matmul = _op(narrow, "matmul", "left")
    assert matmul.grad is None and matmul.grad_status == GRAD_NOT_SELECTED
    assert _close(narrow.params["left.kernel"].grad, full.params["left.kernel"].grad, atol=0)


def test_gradients_through_an_intervention_are_those_of_the_edited_forward() -> None:
    model = _mlp()
    x = _normal(3, 5, seed=10)
    traced = tl.trace(model, x, intervene=tl.when(tl.func("relu"), tl.scale(0.5)), save_grads=True)
    traced.log_backward(_square_loss)
    expected, params, out = _mlp_by_hand(model, x, edit=lambda h: h * 0.5)
    assert _close(traced.output, out) and _close(traced.replay(), out) and not _close(out, model(x))
    assert _close(traced["input_1"].grad, expected["input"])
    assert _close(_op(traced, "relu").grad, expected["relu_edited"])  # the gradient at what later ops were given
    assert _close(_op(traced, "matmul", "fc2").grad, expected["matmul2"])
    assert _close(traced.params["fc1.kernel"].grad, params["fc1.kernel"])


def test_gradients_are_refused_where_they_cannot_be_given() -> None:
    model = _mlp()
    x = _normal(2, 5)
    # (save_grads= with halt=, no save_grads=, a loss of several numbers: the conformance suite's, on every backend)
    traced = tl.trace(model, x, save_grads=True)
    with pytest.raises(tl.UnsupportedError, match="function of the trace's output"):
        traced.log_backward(tf.reduce_sum(traced.output))  # an eager tensor: no record of how it was computed
    with pytest.raises(tl.UnsupportedError, match="not a TensorFlow tensor"):
        traced.log_backward(lambda out: np.sum(out.numpy()))
    assert all(op.grad_status == "waiting for trace.log_backward(loss)" for op in traced.ops if op.kind == "op")


def test_an_error_in_the_loss_leaves_replay_as_it_was() -> None:
    from torchlens_tf.replay import DIFFERENTIATING

    model = _mlp()
    x = _normal(2, 5)
    traced = tl.trace(model, x, save_grads=True)

    def broken(out: Any) -> Any:
        raise ValueError("no loss today")

    with pytest.raises(ValueError, match="no loss today"):
        traced.log_backward(broken)
    assert DIFFERENTIATING.get() is None
    with tf.GradientTape() as tape:  # a plain replay is not recorded on a user's tape, as before
        tape.watch(x)
        replayed = traced.replay()
    assert tape.gradient(tf.reduce_sum(replayed), x) is None
    traced.log_backward(_square_loss)  # and the trace still gives its gradients
    assert _close(traced["input_1"].grad, _mlp_by_hand(model, x)[0]["input"])


def _signed(x: Any) -> Any:
    z = tf.nn.relu(x) * -1.0  # -0.0 where x < 0
    return tf.math.atan2(z, -tf.ones_like(z)) * x  # atan2(-0.0, -1) = -pi, atan2(+0.0, -1) = +pi


def test_the_replay_keeps_signed_zeros_as_the_forward_had_them() -> None:
    x = tf.constant([[-2.0, -0.5, 1.5, 3.0]])
    traced = tl.trace(_signed, x, save_grads=True)
    traced.log_backward(lambda out: tf.reduce_sum(out))
    with tf.GradientTape() as tape:
        tape.watch(x)
        z = tf.nn.relu(x) * -1.0
        loss = tf.reduce_sum(tf.math.atan2(z, -tf.ones_like(z)) * x)
    expected_x, expected_z = tape.gradient(loss, [x, z])
    assert np.allclose(expected_x.numpy()[0, :2], -np.pi)  # the -0.0 reached atan2
    assert _close(traced["input_1"].grad, expected_x)
    assert _close(_op(traced, "mul", k=0).grad, expected_z)
