"""The tf backend: Keras layer paths and passes, variables, tf.function, replay, refusals and cleanup."""

from __future__ import annotations

import gc
import os
import weakref

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.backend import ParamRef  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")


def _normal(*shape: int, seed: int = 0) -> tf.Tensor:
    return tf.random.stateless_normal(shape, seed=(seed, 1))


@pytest.fixture(scope="module")
def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, activation="relu", name="fc1"), keras.layers.Dense(2, name="fc2")],
        name="mlp",
    )


class Recurrent(keras.Model):
    """The seed's recurrent example: one Dense layer applied four times."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = keras.layers.Dense(5, name="fc")

    def call(self, x):
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


# -- what a trace holds ------------------------------------------------------------------
def test_seed_example_works_as_written(mlp: keras.Model) -> None:
    x = _normal(2, 4)
    log = tl.trace(mlp, x, backend="tf")
    assert log.backend == "tf" and repr(log) == "<Trace of Sequential (tf): 9 ops, 2 modules, 4 params>"
    assert [op.func_name for op in log.ops] == [
        "input",
        "read_variable",
        "matmul",
        "read_variable",
        "bias_add",
        "relu",
        "read_variable",
        "matmul",
        "read_variable",
        "bias_add",
        "output",
    ]
    assert [op.label for op in log.ops][:4] == ["input_1", "read_variable_1_1", "matmul_1_2", "read_variable_2_3"]
    np.testing.assert_array_equal(log.output, mlp(x))
    assert log.audit()


def test_lookup_by_label_and_layer_path(mlp: keras.Model) -> None:
    x = _normal(2, 4)
    trace = tl.trace(mlp, x, backend="tensorflow")  # the alias
    assert trace["fc1"] is trace["relu_1"] is trace["relu_1_5"] is trace[5]
    assert trace["fc1"].module_outputs == ["fc1:1"] and trace["matmul_2"].module == "fc2"
    assert trace["matmul_1"].parents == ["input_1", "read_variable_1_1"]
    np.testing.assert_array_equal(trace["fc1"].out, mlp.get_layer("fc1")(x))
    with pytest.raises(KeyError, match="did you mean"):
        trace["fc3"]


def test_variable_reads_are_parameter_sources(mlp: keras.Model) -> None:
    trace = tl.trace(mlp, _normal(2, 4), backend="tf")
    read = trace["read_variable_1"]
    assert read.source == "parameter" and read.params == ("fc1.kernel",) and read.parents == []
    assert read.args == (ParamRef("fc1.kernel"),)
    assert list(trace.params) == ["fc1.kernel", "fc1.bias", "fc2.kernel", "fc2.bias"]
    kernel = trace.params["fc1.kernel"]
    assert kernel.shape == (4, 3) and kernel.trainable and kernel.module == "fc1" and not kernel.is_buffer
    np.testing.assert_array_equal(kernel.value, mlp.get_layer("fc1").kernel.numpy())
    assert trace.modules["fc1"].params == ["fc1.kernel", "fc1.bias"]


def test_summary_counts_parameters_like_keras(mlp: keras.Model) -> None:
    text = tl.trace(mlp, _normal(1, 4), backend="tf").summary()
    assert "| fc1 (Dense) | [1,3]" in text and "| 15 " in text
    assert f"Params: {mlp.count_params()} unique; trainable: {mlp.count_params()}" in text
    assert "Ops: 9 total" in text


def test_reused_layer_has_passes_like_the_torch_seed() -> None:
    keras.utils.set_random_seed(0)
    model = Recurrent()
    seq = _normal(6, 5)
    model(seq)
    trace = tl.trace(model, seq, backend="tf")
    assert trace.modules["fc"].num_passes == 4
    second = trace["matmul_1:2"]
    assert second.label == "matmul_1_2:2" and second.num_passes == 4 and second.modules == ["fc:2"]
    assert trace["fc:3"] is trace["bias_add_1:3"]
    first = trace["fc:1"].out
    np.testing.assert_allclose(trace["fc:2"].out, model.fc((first + 1) * 2), rtol=1e-6)
    assert trace.audit()


def test_functional_paths_shared_layer_and_nested_model() -> None:
    keras.utils.set_random_seed(0)
    inner_in = keras.Input((6,))
    inner = keras.Model(inner_in, keras.layers.Dense(6, name="proj")(inner_in), name="encoder")
    x_in = keras.Input((6,))
    shared = keras.layers.Dense(6, activation="tanh", name="shared")
    a = shared(inner(x_in))
    b = shared(a)
    model = keras.Model(x_in, keras.layers.Add(name="sum")([a, b]))
    x = _normal(3, 6)
    trace = tl.trace(model, x, backend="tf")
    assert list(trace.modules) == ["encoder", "encoder.proj", "shared", "sum"]
    assert trace.modules["shared"].num_passes == 2 and trace.modules["encoder.proj"].num_passes == 1
    assert trace["tanh_1:1"].modules == ["shared:1"] and trace["tanh_1:2"].modules == ["shared:2"]
    assert trace["encoder"] is trace["encoder.proj"]  # the inner model returns what its Dense computed
    assert trace["encoder.proj"].modules == ["encoder:1", "encoder.proj:1"]
    np.testing.assert_allclose(trace.output, model(x), rtol=1e-6)
    assert trace.audit()


def test_subclassed_paths_use_layer_names_and_attributes_for_clashes() -> None:
    class Twin(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.first = keras.layers.Dense(3, name="fc")
            self.second = keras.layers.Dense(3, name="fc")  # the same name: told apart by attribute
            self.blocks = [keras.layers.Dense(3, name="block_a"), keras.layers.Dense(3, name="block_b")]

        def call(self, x):
            for block in self.blocks:
                x = block(x)
            return self.second(self.first(x))

    x = _normal(2, 3)
    trace = tl.trace(Twin(), x, backend="tf")  # unbuilt: built by one plain call first
    assert list(trace.modules) == ["fc", "second", "block_a", "block_b"]
    assert "built_before_capture" in trace.notes
    assert trace.audit()


def test_layer_returning_its_input_gets_an_identity_op() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dropout(0.5, name="drop"),
            keras.layers.Identity(name="same"),
            keras.layers.Dense(2, name="fc"),
        ]
    )
    trace = tl.trace(model, _normal(2, 4), backend="tf")
    drop = trace["drop"]
    assert drop.func_name == "identity" and drop.parents == ["input_1"] and drop.modules == ["drop:1"]
    assert trace["same"].parents == [drop.label]
    assert trace["matmul_1"].parents[0] == trace["same"].label
    assert trace.audit()


def test_lstm_cell_runs_once_per_step_and_more() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 3)), keras.layers.LSTM(5, name="lstm")])
    trace = tl.trace(model, _normal(2, 4, 3), backend="tf")
    # Keras runs the cell once on the first step to learn output shapes, then once per step.
    assert trace.modules["lstm.lstm_cell"].num_passes == 5
    assert trace["lstm"].modules[-1] == "lstm:1"
    assert trace.audit()


def test_python_control_flow_is_recorded_as_it_ran() -> None:
    def fn(x):
        return tf.exp(x) if float(tf.reduce_sum(x)) > 0 else tf.abs(-x)

    pos = tl.trace(fn, tf.ones(3))
    neg = tl.trace(fn, -tf.ones(3))
    assert pos.backend == "tf"  # routed by its tensor inputs
    assert [op.func_name for op in pos.ops if op.kind == "op"] == ["sum", "exp"]
    assert [op.func_name for op in neg.ops if op.kind == "op"] == ["sum", "neg", "abs"]


class Gate(keras.Model):
    def __init__(self, weight: float, bias: float) -> None:
        super().__init__()
        self.a = keras.layers.Dense(
            4,
            kernel_initializer=keras.initializers.Constant(weight),
            bias_initializer=keras.initializers.Constant(bias),
        )
        self.b = keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(0.01))

    def call(self, x):
        h = self.a(x)
        if tf.reduce_sum(h) > 0:
            h = tf.nn.relu(h) * 2
        else:
            h = self.b(h)
        n = 0
        while tf.reduce_max(tf.abs(h)).numpy() > 0.5 and n < 2:
            h = h / 2
            n += 1
        return h + 1


def test_ops_inside_data_dependent_branches_name_their_condition() -> None:
    trace = tl.trace(Gate(0.5, 1.0), tf.ones((1, 4)))
    greater = trace["greater_1"].label
    assert trace["relu_1"].conditions == [greater] and trace["mul_1"].conditions == [greater]
    maxes = [op.label for op in trace.find(tl.func("max"))]
    assert [d.conditions for d in trace.find(tl.func("div"))] == [maxes[:1], maxes[1:2]]
    for label in ("matmul_1", "bias_add_1", "sum_1", "greater_1", "abs_1", "max_1", "add_1"):
        assert not trace[label].in_branch, label

    trace = tl.trace(Gate(-0.5, -1.0), tf.ones((1, 4)))  # the else branch; the loop body never runs
    assert trace["matmul_2"].conditions == trace["bias_add_2"].conditions == [trace["greater_1"].label]
    assert not trace["matmul_1"].in_branch and "div" not in {op.func_name for op in trace}

    def fn(x):  # a conditional expression tested through float()
        return tf.exp(x) if float(tf.reduce_sum(x)) > 0 else tf.abs(x)

    trace = tl.trace(fn, tf.ones(3))
    assert trace["exp_1"].conditions == [trace["sum_1"].label]


def test_keyword_tuple_and_dict_inputs_and_numpy_inputs() -> None:
    received = {}

    def fn(pair, batch, *, scale):
        received.update(pair=type(pair), batch=type(batch), scale=scale)
        a, b = pair
        return {"sum": (a + b) * scale, "prod": batch["u"] * batch["v"]}

    x, y = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])
    trace = tl.trace(fn, (x, y), {"u": x, "v": y}, scale=2.0)
    assert received == {"pair": tuple, "batch": dict, "scale": 2.0}
    assert trace.input_labels == ["input_1", "input_2"] and set(trace.output) == {"sum", "prod"}
    np.testing.assert_array_equal(trace.output["sum"], [8.0, 12.0])
    assert trace.audit()

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    as_numpy = tl.trace(model, np.ones((1, 3), np.float32), backend="tf")  # Keras converts NumPy: so do we
    assert as_numpy.input_labels == ["input_1"] and as_numpy["matmul_1"].parents[0] == "input_1"


# -- tf.function, variables, randomness -------------------------------------------------
def test_tf_function_runs_eagerly_for_the_capture_and_says_so() -> None:
    w = tf.Variable([[1.0, -1.0], [0.5, 2.0]], name="w")

    @tf.function
    def inner(h):
        return tf.nn.relu(h)

    @tf.function
    def fn(x):
        return inner(tf.matmul(x, w)) * 2.0

    x = tf.constant([[1.0, 2.0]])
    fn(x)  # traced and cached as a graph before the capture
    eager_before = tf.config.functions_run_eagerly()
    trace = tl.trace(fn, x)
    assert tf.config.functions_run_eagerly() == eager_before
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["read_variable", "matmul", "relu", "mul"]
    assert trace.notes["tf_functions_run_eagerly"] == ["fn", "inner"]
    assert "run eagerly" in trace.notes["tf_function"]
    assert list(trace.params) == ["w"] and trace["read_variable_1"].params == ("w",)
    np.testing.assert_array_equal(trace.output, fn(x))
    assert trace.audit()


def test_model_predict_is_traced_as_one_eager_call(mlp: keras.Model) -> None:
    x = _normal(3, 4)
    trace = tl.trace(mlp.predict, x, backend="tf")
    assert "redirected" in trace.notes and trace.modules["fc1"].num_passes == 1
    np.testing.assert_allclose(trace.output, mlp.predict(x, verbose=0), rtol=1e-6)


def test_variable_writes_are_ops_and_replay_from_the_state_before() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(name="bn")])
    x = _normal(5, 3)
    before = model.get_layer("bn").moving_mean.numpy()
    trace = tl.trace(model, x, training=True)
    after = model.get_layer("bn").moving_mean.numpy()
    assert not np.array_equal(before, after)  # the forward moved the statistics ...
    np.testing.assert_array_equal(trace.params["bn.moving_mean"].value, before)  # ... the trace kept them as they were
    assign = trace["assign_1"]
    assert assign.in_place and assign.params == ("bn.moving_mean",) and assign.meta["op_type"] == "AssignVariableOp"
    np.testing.assert_array_equal(assign.out, after)
    assert trace.audit()
    np.testing.assert_array_equal(model.get_layer("bn").moving_mean.numpy(), after)  # replay left the model alone


def test_counter_variable_read_after_write_reads_the_write() -> None:
    class Counter(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = tf.Variable(0.0)

        def __call__(self, x):
            self.calls.assign_add(1.0)
            return x * self.calls

    counter = Counter()
    trace = tl.trace(counter, tf.constant([2.0]))
    add, mul = trace["assign_add_1"], trace["mul_1"]
    assert add.params == ("calls",) and add.parents == []
    # `x * variable` reads the variable inside TensorFlow's C++ fast path, where no
    # callback runs: the read is recognised by its buffer, and it is the write's value.
    assert mul.parents == ["input_1", add.label] and mul.meta["implicit_variable_reads"] == ["calls"]
    assert float(trace.params["calls"].value) == 0.0 and float(counter.calls) == 1.0
    assert trace.audit()


def test_returned_variables_inputs_and_constants_get_identity_ops() -> None:
    class Returns(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable([1.0, 2.0])

        def __call__(self, x):
            return x, self.w, tf.constant([5.0, 6.0]), x * 2

    trace = tl.trace(Returns(), tf.ones(2))
    assert [trace[label].parents for label in trace.output_labels][0] == ["input_1"]
    sources = [(op.source, op.params) for op in trace.ops if op.func_name == "identity"]
    assert sources == [("parameter", ("w",)), ("constant", ())]
    np.testing.assert_array_equal(trace.output[1], [1.0, 2.0])
    assert trace.audit()


def test_embeddings_random_generators_and_legacy_random_ops_replay() -> None:
    table = tf.Variable(tf.reshape(tf.range(12.0), (4, 3)), name="table")
    gen = tf.random.Generator.from_seed(7)

    def fn(ids):
        rows = tf.nn.embedding_lookup(table, ids)  # ResourceGather on the variable itself
        noise = gen.normal(rows.shape)  # a tf.random.Generator: state in a variable
        legacy = tf.random.uniform(rows.shape)  # kernel-held state: replayed from the record
        return rows + noise + legacy

    trace = tl.trace(fn, tf.constant([0, 3, 3]))
    gather = next(op for op in trace.ops if op.meta.get("op_type") == "ResourceGather")
    assert gather.params == ("table",)
    draws = [op for op in trace.ops if op.meta.get("random")]
    assert {op.meta["op_type"] for op in draws} == {"RngReadAndSkip", "StatelessRandomNormalV2", "RandomUniform"}
    skip = trace["rng_read_and_skip_1"]  # draws from the generator and moves its state on: both are its value
    assert skip.params == ("gen.state",) and skip.in_place and len(skip.out) == 2
    assert next(op for op in draws if op.meta["op_type"] == "RandomUniform").meta["replayed_from_record"]
    assert trace.audit()
    part = tl.trace(fn, tf.constant([0, 3, 3]), save=tl.label(trace.ops[-2].label))
    legacy = next(op for op in part.ops if op.meta.get("op_type") == "RandomUniform")
    assert legacy.out is None and "recorded_value" in legacy.meta  # dropped, but replay still has its value
    assert part.audit()


def test_train_mode_dropout_replays_exactly() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dropout(0.5, name="drop")])
    trace = tl.trace(model, tf.ones((4, 8)), training=True)
    assert any(op.func_name == "stateless_random_uniform" for op in trace.ops)
    assert np.count_nonzero(trace.output) not in (0, 32)
    np.testing.assert_array_equal(trace.replay(), trace.output)
    assert trace.audit()


# -- refusals and cleanup ---------------------------------------------------------------
def _interception_state() -> tuple:
    from tensorflow.python.eager import context, execute
    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    from tensorflow.python.framework import ops

    value_reads = tuple(vars(ops._EagerTensorBase).get(name) for name in ("__bool__", "__float__", "numpy"))
    return (
        tuple(context.context().op_callbacks),
        execute.execute,
        keras.layers.Layer.__dict__["__call__"],
        polymorphic_function.Function.__dict__["__call__"],
        tf.config.functions_run_eagerly(),
        value_reads,
    )


class Boom(keras.Model):
    def __init__(self, error: type[BaseException]) -> None:
        super().__init__()
        self.fc = keras.layers.Dense(3)
        self.error = error
        self.armed = False

    def call(self, x):
        x = self.fc(x)
        if self.armed:
            raise self.error("inside the model")
        return x


def test_an_exception_inside_a_branch_leaves_nothing_installed() -> None:
    def fn(x):
        if tf.reduce_sum(x + 1) > 0:
            raise ValueError("inside the branch")
        return x

    before = _interception_state()
    with pytest.raises(ValueError, match="inside the branch"):
        tl.trace(fn, tf.ones(3))
    assert _interception_state() == before


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_exception_inside_the_model_leaves_nothing_installed(error: type[BaseException]) -> None:
    model = Boom(error)
    model(tf.ones((1, 3)))
    model.armed = True
    before = _interception_state()
    with pytest.raises(error, match="inside the model"):
        tl.trace(model, tf.ones((1, 3)), backend="tf")
    assert _interception_state() == before
    assert tl.trace(lambda x: x * 2, tf.ones(2)).audit()  # and the next capture works


def test_a_layer_call_that_raises_and_is_caught_closes_its_pass() -> None:
    class Fragile(keras.layers.Layer):
        def call(self, x):
            y = tf.nn.relu(x)
            if float(tf.reduce_sum(y)) > 0:
                raise NotImplementedError("no fast path")
            return y

    class Fallback(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.fast = Fragile(name="fast")

        def call(self, x):
            try:
                return self.fast(x)
            except NotImplementedError:
                return tf.tanh(x)

    model = Fallback()
    x = tf.ones((1, 2))
    model(x)
    trace = tl.trace(model, x)
    assert trace.modules["fast"].num_passes == 1 and trace.modules["fast"].passes[0].out is None
    assert trace["tanh_1"].modules == []  # after the failed call, outside it
    assert trace.audit()
    from torchlens_tf.observe import observe_module_outputs

    assert observe_module_outputs(model, (x,), {}) == {"fast:1": None}


def test_savedmodel_signatures_and_concrete_functions_are_refused(tmp_path) -> None:
    class Scale(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return x * self.w

    tf.saved_model.save(Scale(), str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    x = tf.ones(3)
    before = _interception_state()
    with pytest.raises(tl.UnsupportedError, match="traces Keras 3 models"):
        tl.trace(loaded.signatures["serving_default"], x=x)
    with pytest.raises(tl.UnsupportedError, match="Python code"):
        tl.trace(loaded, x, backend="tf")
    concrete = tf.function(lambda v: v * 3).get_concrete_function(tf.TensorSpec([None], tf.float32))
    with pytest.raises(tl.UnsupportedError, match="concrete"):
        tl.trace(concrete, x, backend="tf")
    with pytest.raises(tl.UnsupportedError, match="opaque"):  # met inside the forward
        tl.trace(lambda v: concrete(v) + 1, x, backend="tf")
    assert _interception_state() == before


def test_keras_on_another_backend_and_symbolic_inputs_are_refused(
    monkeypatch: pytest.MonkeyPatch, mlp: keras.Model
) -> None:
    from torchlens_tf.plugin import backend

    with pytest.raises(tl.UnsupportedError, match="concrete"):
        tl.trace(mlp, keras.Input((4,)), backend="tf")
    with pytest.raises(tl.UnsupportedError, match="eagerly"):
        tf.function(lambda v: tl.trace(mlp, v, backend="tf").output, autograph=False)(tf.ones((1, 4)))
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    assert not backend.claim(mlp, (), {})
    before = _interception_state()
    with pytest.raises(tl.UnsupportedError, match="KERAS_BACKEND=tensorflow"):
        tl.trace(mlp, tf.ones((1, 4)), backend="tf")
    assert _interception_state() == before


def test_auto_routing_claims_keras_tf_modules_functions_and_tensors(mlp: keras.Model) -> None:
    from torchlens_tf.plugin import backend

    assert tl.trace(mlp, tf.ones((1, 4))).backend == "tf"
    assert backend.claim(mlp, (), {}) and backend.claim(tf.Module(), (), {})
    assert backend.claim(tf.function(lambda v: v), (), {})
    assert backend.claim(lambda v: v, (tf.ones(1),), {}) and backend.claim(lambda v: v, ([tf.Variable(1.0)],), {})
    assert not backend.claim(lambda v: v, (np.ones(2),), {})
    info = {b["name"]: b for b in tl.backends()}["tf"]
    assert info["aliases"] == ["tensorflow"] and info["available"]
    assert {"modules", "functions", "control_flow", "random"} <= set(info["capabilities"])


# -- save= and halt= ---------------------------------------------------------------------
class Probe(keras.layers.Layer):
    """relu(x) * 2; each call leaves a weakref to what it returned."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls: list[weakref.ref] = []

    def call(self, x):
        y = tf.nn.relu(x) * 2.0
        self.calls.append(weakref.ref(y))
        return y


def _probed() -> tuple[keras.Model, tf.Tensor]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, name="fc1"), Probe(name="probe"), keras.layers.Dense(4, name="fc2")],
        name="probed",
    )
    x = _normal(2, 8)
    model(x)
    return model, x


def _saved(trace: tl.Trace) -> list[str]:
    return [op.label for op in trace.ops if op.kind == "op" and op.out is not None]


def test_save_keeps_only_the_selected_values_and_every_record() -> None:
    model, x = _probed()
    probe = model.get_layer("probe")
    full = tl.trace(model, x)
    probe.calls.clear()
    part = tl.trace(model, x, save=tl.module("fc1"))
    assert [op.label for op in part.ops] == [op.label for op in full.ops]
    assert [op.parents for op in part.ops] == [op.parents for op in full.ops]
    assert _saved(part) == [full["fc1"].label]
    np.testing.assert_array_equal(part["fc1"].out, full["fc1"].out)
    dropped = part["probe"]
    assert dropped.out is None and not dropped.saved and dropped.shape == full["probe"].shape
    assert probe.calls[0]() is None  # nothing of TorchLens held the dropped value: it was freed
    np.testing.assert_array_equal(part.output, model(x))
    assert part.audit()
    relus = tl.trace(model, x, save=tl.func("relu"))
    assert [relus[label].func_name for label in _saved(relus)] == ["relu"]
    info = {b["name"]: b for b in tl.backends()}["tf"]
    assert {"save", "halt"} <= set(info["capabilities"])


class Overwrite(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.v = tf.Variable(tf.zeros((32, 32)))

    def __call__(self, x):
        y = x
        for k in range(10):
            self.v.assign(x * float(k))  # the variable takes a new buffer; the one before is freed
            c = tf.constant([[float(k)] * 32] * 32)  # not an op's output: may land on that freed buffer
            y = y * c + y * self.v  # the read happens in the C++ fast path: recognised by its buffer
        return y


def _loop(x):
    for _ in range(30):
        x = tf.nn.relu(x * 1.5 - 0.1)  # every intermediate is freed as soon as the next exists
    return x


@pytest.mark.parametrize(
    "make",
    [lambda: (_loop, _normal(64, 64)), lambda: (Overwrite(), _normal(32, 32))],
    ids=["temporaries", "variable_buffers"],
)
def test_freed_values_are_never_taken_for_new_ones(make) -> None:
    # With save=, dropped values are freed during the forward: a new tensor can get a freed tensor's
    # id, or a freed variable buffer's address. Neither may be mistaken for the value that had it.
    fn, x = make()
    full = tl.trace(fn, x)
    part = tl.trace(fn, x, save=tl.label(full.ops[-2].label))
    assert [op.parents for op in part.ops] == [op.parents for op in full.ops]
    assert [op.params for op in part.ops] == [op.params for op in full.ops]
    assert _saved(part) == [full.ops[-2].label]
    if isinstance(fn, Overwrite):
        assert sum("implicit_variable_reads" in op.meta for op in part.ops) == 10
    assert part.audit()


def test_halt_stops_before_later_layers_run() -> None:
    model, x = _probed()
    probe = model.get_layer("probe")
    full = tl.trace(model, x)
    probe.calls.clear()
    trace = tl.trace(model, x, save=tl.module("fc1"), halt=tl.module("fc1"))
    assert trace.halted and trace.output is None and "halted" in trace.notes
    assert probe.calls == [] and trace.modules["probe"].num_passes == 0  # nothing after fc1 ran
    assert trace.ops[-1].label == full["fc1"].label and _saved(trace) == [full["fc1"].label]
    np.testing.assert_array_equal(trace["fc1"].out, full["fc1"].out)
    assert trace.audit()
    # halted from the op callback, inside a layer: the rest of that layer's call never ran either
    first = tl.trace(model, x, halt=tl.func("relu"))
    assert first.halted and first.ops[-1].func_name == "relu" and probe.calls == []
    assert first.modules["probe"].num_passes == 1 and first.audit()
    np.testing.assert_array_equal(tl.pluck(model, x, "fc1"), full["fc1"].out)
    probe.calls.clear()
    last = tl.trace(model, x, save=tl.module("fc2"), halt=tl.module("fc2"))
    assert last.halted and _saved(last) == [full["fc2"].label] and last["probe"].out is None
    gc.collect()  # the halt's traceback (pluggy keeps it in a cycle) held the forward's frames until now
    assert probe.calls[0]() is None  # and nothing of the tf backend holds the dropped value


@tf.function
def _scaled_relu(h):
    return tf.nn.relu(h) * 3.0


class Block(keras.layers.Layer):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(4, name="inner")

    def call(self, x):
        return _scaled_relu(self.inner(x))


class Nest(keras.Model):
    def __init__(self, swallow: bool = False) -> None:
        super().__init__()
        self.block = Block(name="block")
        self.head = keras.layers.Dense(2, name="head")
        self.swallow = swallow

    def call(self, x):
        if not self.swallow:
            return self.head(self.block(x))
        try:
            h = self.block(x)
        except BaseException:  # noqa: BLE001 - a model that swallows everything, halts included
            h = x[:, :4]
        return self.head(tf.nn.relu(h))


@pytest.mark.parametrize("swallow", [False, True], ids=["propagated", "swallowed"])
@pytest.mark.parametrize("halt", ["relu", "block.inner", "block"])
def test_halt_leaves_nothing_installed(halt: str, swallow: bool) -> None:
    # HaltCapture is raised from the op callback (relu, inside a tf.function running eagerly inside a
    # layer) or from the Layer.__call__ wrapper (when a layer's call returns).
    keras.utils.set_random_seed(0)
    model = Nest(swallow)
    x = _normal(2, 6)
    model(x)
    before = _interception_state()
    selector = tl.func(halt) if halt == "relu" else tl.module(halt)
    trace = tl.trace(model, x, halt=selector)
    assert _interception_state() == before
    assert trace.halted and trace.output is None
    assert trace.modules["head"].num_passes == 0  # nothing recorded after the halt, swallowed or not
    assert sum(op.func_name == "relu" for op in trace.ops) == 1 - (halt == "block.inner")
    ran = [] if halt == "block.inner" else ["_scaled_relu"]  # a halted trace has its notes too
    assert trace.notes.get("tf_functions_run_eagerly", []) == ran
    assert trace.audit()
    assert tl.trace(model, x).audit()  # and the next capture works
