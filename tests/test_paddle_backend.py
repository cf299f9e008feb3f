"""The paddle backend: op names, lookups, passes, faithfulness, replay, refusals and cleanup."""

from __future__ import annotations

import sys
import types

import pytest

paddle = pytest.importorskip("paddle")
import numpy as np  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from paddle import nn  # noqa: E402
from paddle.tensor import matmul as bound_matmul  # noqa: E402  (the raw C op, bound before capture on purpose)

import torchlens as tl  # noqa: E402


def np_(t):
    return np.array(t.numpy())


def equal(a, b) -> bool:
    return list(a.shape) == list(b.shape) and np.array_equal(np_(a), np_(b))


class SimpleRecurrent(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


class Block(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.lin(x)
        h = self.act(h)
        h.add_(x)  # residual add, in place: not a layer output
        return bound_matmul(F.relu(h), paddle.ones([4, 4]))  # bound before capture


@pytest.fixture
def recurrent() -> tl.Trace:
    paddle.seed(0)
    return tl.trace(SimpleRecurrent(), paddle.randn([6, 5]), backend="paddle")


# -- the seeds, as written -------------------------------------------------------------


def test_seed_trace_with_backend_paddle_and_auto_routing() -> None:
    paddle.seed(0)
    paddle_model = nn.Sequential(nn.Conv2D(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    paddle_model.eval()
    x = paddle.randn([1, 3, 8, 8])

    log = tl.trace(paddle_model, x, backend="paddle")
    assert log.backend == "paddle"
    assert [op.func_name for op in log.ops] == [
        "input",
        "conv2d",
        "reshape",
        "add",
        "relu",
        "flatten",
        "linear",
        "output",
    ]
    assert log["relu_1_4"].out.shape == [1, 4, 6, 6]
    assert log["1"].out.shape == [1, 4, 6, 6]  # by layer path
    assert log[1].func_name == "conv2d"
    assert log[-1].layer_label == "output_1"
    assert "Model: Sequential (paddle)" in log.summary()
    assert log.audit()
    assert equal(log.output, paddle_model(x))
    assert tl.trace(paddle_model, x).backend == "paddle"  # auto-routed by the model's type
    assert tl.trace(lambda t: t * 2, x).backend == "paddle"  # ... or by the inputs


def test_seed_recurrent_passes(recurrent: tl.Trace) -> None:
    second = recurrent["linear_1:2"]
    assert second.pass_num == 2 and second.num_passes == 4
    assert second.label == "linear_1_1:2" and second.layer_label == "linear_1_1"
    assert recurrent["fc:3"] is recurrent["linear_1:3"]
    assert recurrent.modules["fc"].num_passes == 4
    # the recorded value is what the layer returned on its second call
    model = SimpleRecurrent()
    model.set_state_dict({k: p.value for k, p in recurrent.params.items()})
    seen = []
    model.fc.register_forward_post_hook(lambda layer, inputs, out: seen.append(out.clone()))
    model(recurrent["input_1"].out)
    assert equal(second.out, seen[1])
    assert equal(recurrent["linear_1:2"].out, model.fc((recurrent["linear_1:1"].out + 1) * 2))


# -- what counts as an op, and what it is called ------------------------------------------


def test_op_names_read_like_what_was_written_and_nothing_is_counted_twice() -> None:
    def fn(x, w):
        a = paddle.matmul(x, w)  # a Python wrapper around _C_ops.matmul
        b = bound_matmul(x, w)  # the raw C op, bound here before capture
        c = x.matmul(w)  # a Tensor method
        d = F.relu(a) + b * c  # functional, __add__, __mul__
        e = d[:, 1:3]  # __getitem__: Python code over several C ops, one op
        f = -e.abs()  # __neg__ and a Tensor method
        g = paddle.concat([e, f], axis=1).mean()
        return x.sum(axis=0) @ w, g

    x, w = paddle.randn([2, 3]), paddle.randn([3, 4])
    trace = tl.trace(fn, x, w, backend="paddle")
    assert [op.func_name for op in trace.ops if op.kind == "op"] == [
        "matmul",
        "matmul",
        "matmul",
        "relu",
        "mul",
        "add",
        "getitem",
        "abs",
        "neg",
        "concat",
        "mean",
        "sum",
        "matmul",
    ]
    assert trace["getitem_1"].parents == ["add_1_7"]
    assert trace["concat_1"].parents == ["getitem_1_8", "neg_1_10"]
    assert trace.audit()


def test_functional_ops_in_place_residuals_and_prebound_functions() -> None:
    paddle.seed(0)
    x = paddle.randn([2, 4])
    block = Block()
    expected = block(x.clone())
    trace = tl.trace(block, x)
    assert [op.func_name for op in trace.ops] == ["input", "linear", "relu", "add_", "relu", "full", "matmul", "output"]
    add = trace["add__1"]
    assert add.in_place and add.module_outputs == [] and add.parents == ["relu_1_2", "input_1"]
    assert trace["act"].func_name == "relu" and trace["act"].module_outputs == ["act:1"]
    assert trace["full_1"].source == "constant"
    assert equal(trace.output, expected)
    assert trace["linear_1"].code_site.file == __file__


def test_lookup_by_label_short_label_position_and_layer_path() -> None:
    paddle.seed(0)
    model = nn.Sequential(
        nn.Conv2D(3, 4, 3, bias_attr=False), nn.ReLU(), nn.Conv2D(4, 4, 3, bias_attr=False), nn.ReLU()
    )
    trace = tl.trace(model, paddle.randn([1, 3, 8, 8]))
    assert [op.label for op in trace.ops] == ["input_1", "conv2d_1_1", "relu_1_2", "conv2d_2_3", "relu_2_4", "output_1"]
    assert trace["relu_1_2"] is trace["relu_1"] is trace["relu_1:1"] is trace[2] is trace["1"] is trace[-4]
    assert trace["conv2d_2"].parents == ["relu_1_2"] and trace["conv2d_2"].children == ["relu_2_4"]
    assert trace["2"].module == "2" and trace["2"].modules == ["2:1"]
    assert trace.modules["0"].params == ["0.weight"] and trace["conv2d_1"].params == ("0.weight",)
    with pytest.raises(KeyError, match="did you mean 'relu_1"):
        trace["relu_11"]
    with pytest.raises(KeyError, match="out of range"):
        trace[99]


def test_legacy_c_ops_are_seen() -> None:
    """``paddle.nn.BatchNorm(act="relu")`` applies its activation through ``_legacy_C_ops``."""
    paddle.seed(0)
    model = nn.Sequential(nn.Conv2D(3, 4, 3, bias_attr=False), nn.BatchNorm(4, act="relu"))
    model.eval()
    trace = tl.trace(model, paddle.randn([1, 3, 6, 6]))
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["conv2d", "batch_norm", "relu"]
    assert trace["relu_1"].parents == ["batch_norm_1_2"] and trace["1"] is trace["relu_1"]
    assert trace.audit()


def test_structured_layer_outputs_keep_their_structure() -> None:
    class Two(nn.Layer):
        def forward(self, x):
            return {"a": F.relu(x), "b": (F.sigmoid(x), paddle.tanh(x))}

    class Outer(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.two = Two()

        def forward(self, x):
            out = self.two(x)
            return out["a"] + out["b"][0]

    x = paddle.randn([3])
    trace = tl.trace(Outer(), x)
    out = trace["two"].out
    assert isinstance(trace["two"], tl.ModulePass)
    assert set(out) == {"a", "b"} and isinstance(out["b"], tuple)
    assert equal(out["b"][1], paddle.tanh(x))


def test_keyword_tuple_and_dict_inputs_reach_the_function_as_given() -> None:
    received = {}

    def fn(pair, batch, *, scale):
        received.update(pair=type(pair), batch=type(batch), scale=scale)
        a, b = pair
        return {"sum": (a + b) * scale, "prod": batch["u"] * batch["v"]}

    x, y = paddle.randn([3]), paddle.randn([3])
    trace = tl.trace(fn, (x, y), {"u": x, "v": y}, scale=2.0)
    assert received == {"pair": tuple, "batch": dict, "scale": 2.0}
    assert trace.input_labels == ["input_1", "input_2"]
    assert set(trace.output) == {"sum", "prod"} and trace.output_labels == ["output_1", "output_2"]
    assert trace.audit()


def test_data_dependent_branch_records_what_ran() -> None:
    def fn(x):
        return x.exp() if x.sum() > 0 else x.abs()

    pos = tl.trace(fn, paddle.ones([3]))
    neg = tl.trace(fn, -paddle.ones([3]))
    assert [op.func_name for op in pos.ops if op.kind == "op"] == ["sum", "gt", "exp"]
    assert [op.func_name for op in neg.ops if op.kind == "op"] == ["sum", "gt", "abs"]


class Gate(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = F.relu(h) * 2
        else:
            h = self.b(h)
        n = 0
        while h.abs().max().item() > 0.5 and n < 2:
            h = h / 2
            n += 1
        return h + 1


def fill(layer: nn.Linear, weight: float, bias: float) -> None:
    layer.weight.set_value(paddle.full(layer.weight.shape, weight))
    layer.bias.set_value(paddle.full(layer.bias.shape, bias))


def test_ops_inside_data_dependent_branches_name_their_condition() -> None:
    model = Gate()
    fill(model.a, 0.5, 1.0)
    trace = tl.trace(model, paddle.ones([1, 4]))
    gt = trace["gt_1"].label
    assert trace["relu_1"].conditions == [gt] and trace["mul_1"].conditions == [gt]
    maxes = [op.label for op in trace.find(tl.func("max"))]
    assert [d.conditions for d in trace.find(tl.func("div"))] == [maxes[:1], maxes[1:2]]
    for label in ("linear_1", "sum_1", "gt_1", "abs_1", "max_1", "add_1"):
        assert not trace[label].in_branch, label

    fill(model.a, -0.5, -1.0)  # the else branch, and the loop body never runs
    fill(model.b, 0.01, 0.0)
    trace = tl.trace(model, paddle.ones([1, 4]))
    assert trace["linear_2"].conditions == [trace["gt_1"].label]
    assert not trace["linear_1"].in_branch and "div" not in {op.func_name for op in trace}

    def fn(x):  # a conditional expression tested through numpy()
        return x.exp() if x.sum().numpy() > 0 else x.abs()

    trace = tl.trace(fn, paddle.ones([3]))
    assert trace["exp_1"].conditions == [trace["sum_1"].label]


def test_multi_output_ops_and_sources() -> None:
    class Maker(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.w = self.create_parameter([3], default_initializer=nn.initializer.Constant(1.0))

        def forward(self, x):
            a, b, c = paddle.split(x, 3)
            return a + b * c + self.w * 2 + paddle.full([1], 3.0) + paddle.rand([1]) * 0

    trace = tl.trace(Maker(), paddle.randn([9]))
    split = trace["split_1"]
    assert split.shape == ((3,), (3,), (3,)) and len(trace["mul_1"].parents) == 1
    assert trace["mul_1"].parents == ["split_1_1"]
    sources = {op.func_name: op.source for op in trace.ops if op.is_source}
    assert sources == {"mul": "parameter", "full": "constant", "uniform": "random"}
    assert trace.audit()


# -- faithfulness ----------------------------------------------------------------------


def test_saved_values_survive_in_place_writes_and_views() -> None:
    class Writes(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.act = nn.ReLU()

        def forward(self, x):
            h = self.act(self.lin(x))
            v = h.reshape([-1])  # a view of h
            v[:3] = 0.0  # written through the view: h changes too
            h.scale_(2.0)
            x[0] = 5.0  # the caller's input, written in place
            return h + x

    paddle.seed(0)
    model = Writes()
    seen = {}
    model.lin.register_forward_post_hook(lambda layer, a, out: seen.update(lin=out.clone()))
    model.act.register_forward_post_hook(lambda layer, a, out: seen.update(act=out.clone()))
    x = paddle.randn([2, 4])
    x0 = x.clone()
    trace = tl.trace(model, x)
    assert equal(trace["lin"].out, seen["lin"]) and equal(trace["act"].out, seen["act"])
    assert equal(trace["input_1"].out, x0)  # the input as it was given, not as the model left it
    assert equal(trace["reshape_1"].out, seen["act"].reshape([-1]))
    assert equal(trace["setitem_1"].out, trace["reshape_1"].out * paddle.to_tensor([0, 0, 0, 1, 1, 1, 1, 1.0]))
    assert trace["setitem_1"].in_place and trace["scale__1"].in_place
    report = trace.audit()
    assert report, str(report)
    out = trace.replay()
    assert equal(out, trace.output)


def test_in_place_tensor_methods_copies_and_uninitialized_memory() -> None:
    def fn(x, y):
        h = x * 1
        h.zero_()
        r1 = h + 1
        h.clip_(0, 1)
        h.copy_(y, False)  # a C method writing into h
        r2 = h.exp()
        h.set_value(np.ones([2, 3], dtype="float32"))  # written from NumPy, not through _C_ops
        g = y.clone()
        g[x > 0] = 0.0
        u = paddle.empty([2, 3])  # whatever memory it got ...
        u.uniform_()  # ... then random numbers
        return r1, r2, h + y, g, x.detach() + x.cpu(), u * 1

    x, y = paddle.randn([2, 3]), paddle.randn([2, 3])
    trace = tl.trace(fn, x, y)
    names = [op.func_name for op in trace.ops if op.kind == "op"]
    for name in (
        "fill_",
        "clip_",
        "copy_",
        "set_value",
        "clone",
        "setitem",
        "empty",
        "uniform_inplace_",
        "detach",
        "cpu",
    ):
        assert name in names
    assert all(
        op.in_place for op in trace.ops if op.func_name.endswith("_") or op.func_name in ("setitem", "set_value")
    )
    assert trace["copy__1"].parents == ["clip__1_5", "input_2"]
    assert equal(trace["exp_1"].out, y.exp()) and equal(trace["add_2"].out, y + 1)
    report = trace.audit()
    assert report, str(report)


def test_parameters_written_during_the_forward_keep_their_value_from_before() -> None:
    outside = paddle.to_tensor([1.0, 2.0, 3.0])

    class Counter(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.register_buffer("steps", paddle.zeros([1]))
            self.offset = paddle.zeros([3])  # Paddle makes a tensor attribute a (non-persistable) buffer

        def forward(self, x):
            self.steps.add_(paddle.ones([1]))
            self.offset.add_(paddle.ones([3]))
            outside.scale_(2.0)  # a tensor from outside the model: read as a constant, as it was
            return self.fc(x) * self.steps + self.offset + outside

    model = Counter()
    trace = tl.trace(model, paddle.randn([2, 3]))
    assert trace.params["steps"].value.item() == 0.0 and model.steps.item() == 1.0
    assert trace["add__1"].params == ("steps",)
    assert trace["add__2"].params == ("offset",) and trace.params["offset"].is_buffer
    assert trace["scale__1"].source == "constant" and trace["scale__1"].args[0].numpy().tolist() == [1, 2, 3]
    report = trace.audit()
    assert report, str(report)
    trace.replay()
    assert model.steps.item() == 1.0 and trace.params["steps"].value.item() == 0.0  # replay writes into a copy


def test_batch_norm_in_training_mode_replays_and_leaves_buffers_alone() -> None:
    paddle.seed(0)
    model = nn.Sequential(nn.Conv2D(3, 4, 3), nn.BatchNorm2D(4), nn.ReLU())
    model.train()
    before = model[1]._mean.clone()
    trace = tl.trace(model, paddle.randn([2, 3, 6, 6]))
    # the forward updated the running statistics in place: the trace keeps them from before
    assert equal(trace.params["1._mean"].value, before) and not equal(model[1]._mean, before)
    after = model[1]._mean.clone()
    report = trace.audit()
    assert report, str(report)
    assert equal(model[1]._mean, after) and equal(trace.params["1._mean"].value, before)


def test_dropout_replays_exactly_in_train_mode() -> None:
    paddle.seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    model.train()
    trace = tl.trace(model, paddle.randn([4, 8]))
    drop = trace["dropout_1"]
    assert "rng_state" in drop.meta and drop.module == "1"
    assert equal(trace.replay(), trace.output)
    assert trace.audit()


def test_layer_outputs_equal_what_post_hooks_see_for_reused_layers() -> None:
    from torchlens_paddle.observe import observe_module_outputs

    paddle.seed(0)
    model = SimpleRecurrent()
    x = paddle.randn([2, 5])
    trace = tl.trace(model, x)
    seen = observe_module_outputs(model, (x,), {})
    assert sorted(seen) == ["fc:1", "fc:2", "fc:3", "fc:4"]
    for label, value in seen.items():
        assert equal(trace[label].out, value)


def test_returned_parameters_inputs_and_outside_tensors_get_output_nodes() -> None:
    outside = paddle.ones([2])

    class Returns(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.w = self.create_parameter([2], default_initializer=nn.initializer.Constant(0.0))
            self.ident = nn.Identity()

        def forward(self, x):
            return self.ident(x), self.w, outside, x * 2

    trace = tl.trace(Returns(), paddle.randn([2]))
    assert len(trace.output_labels) == 4
    assert trace["ident"].func_name == "identity" and trace["ident"].parents == ["input_1"]
    sources = [op.source for op in trace.ops if op.func_name == "identity"]
    assert sources == [None, "parameter", "constant"]
    assert trace.audit()


def test_summary_lists_layers_and_totals() -> None:
    paddle.seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    text = tl.trace(model, paddle.randn([1, 4])).summary()
    assert "| 0 (Linear)" in text and "| [1,8]" in text and "| 40 " in text
    assert "Params: 58 unique; trainable: 58" in text
    assert "Ops: 3 total" in text and "Edges: 4 total" in text


def test_draw_unrolled_and_rolled(recurrent: tl.Trace, tmp_path) -> None:
    import shutil

    unrolled = recurrent.to_dot()
    rolled = recurrent.to_dot(vis_mode="rolled")
    assert "linear_1_1:2" in unrolled and "SimpleRecurrent (paddle)" in unrolled
    assert "linear_1_1:2" not in rolled
    if shutil.which("dot"):
        assert recurrent.draw(str(tmp_path / "recurrent"), file_format="svg").endswith(".svg")


# -- refusals --------------------------------------------------------------------------


def test_static_graph_mode_is_refused() -> None:
    paddle.enable_static()
    try:
        with pytest.raises(tl.UnsupportedError, match="static-graph mode.*disable_static"):
            tl.trace(lambda x: x, paddle.ones([2]), backend="paddle")
    finally:
        paddle.disable_static()
    assert_nothing_installed()


def test_to_static_layers_and_functions_are_refused() -> None:
    model = paddle.jit.to_static(nn.Linear(2, 2))
    with pytest.raises(tl.UnsupportedError, match="to_static"):
        tl.trace(model, paddle.ones([1, 2]))

    @paddle.jit.to_static
    def compiled(x):
        return F.relu(x) + 1

    with pytest.raises(tl.UnsupportedError, match="to_static"):
        tl.trace(compiled, paddle.ones([2]))  # auto-routed to paddle by its type, then refused

    class CallsCompiled(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return compiled(self.fc(x))

    before = interception_state()
    with pytest.raises(tl.UnsupportedError, match="compiled.*enable_to_static"):
        tl.trace(CallsCompiled(), paddle.ones([1, 2]))
    assert interception_state() == before
    # with to_static switched off, the decorated function runs as Python and is recorded
    paddle.jit.enable_to_static(False)
    try:
        trace = tl.trace(CallsCompiled(), paddle.ones([1, 2]))
    finally:
        paddle.jit.enable_to_static(True)
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["linear", "relu", "add"]


def test_nested_capture_and_non_callables_are_refused() -> None:
    def outer(x):
        return tl.trace(lambda y: y + 1, x, backend="paddle")

    with pytest.raises(tl.UnsupportedError, match="already running"):
        tl.trace(outer, paddle.ones([2]), backend="paddle")
    with pytest.raises(tl.UnsupportedError, match="model or function"):
        tl.trace(42, paddle.ones([2]))
    assert_nothing_installed()


# -- cleanup ---------------------------------------------------------------------------


def interception_state() -> dict[tuple[str, str], int]:
    """id of every attribute capture may replace: C ops, their aliases, Tensor methods, StaticFunction."""
    from paddle.jit.dy2static.program_translator import StaticFunction

    state = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("paddle") and module is not None:
            for attr, value in list(vars(module).items()):
                if callable(value):
                    state[(name, attr)] = id(value)
    for attr, value in vars(paddle.Tensor).items():
        state[("Tensor", attr)] = id(value)
    state[("StaticFunction", "__call__")] = id(StaticFunction.__dict__["__call__"])
    return state


def is_wrapper(value) -> bool:
    return isinstance(value, types.FunctionType) and value.__dict__.get("_torchlens_wrapper") is True


def assert_nothing_installed(layers=()) -> None:
    from torchlens_paddle.intercept import STATE

    assert STATE.recorder is None
    assert paddle._C_ops.relu.__class__.__name__ == "builtin_function_or_method"
    assert paddle.Tensor.__add__.__class__.__name__ == "method_descriptor"
    for name, module in list(sys.modules.items()):
        if name.startswith("paddle") and module is not None:
            assert not any(is_wrapper(v) for v in list(vars(module).values())), name
    assert not any(is_wrapper(v) for v in vars(paddle.Tensor).values())
    for layer in layers:
        for sub in layer.sublayers(include_self=True):
            assert not sub._forward_pre_hooks and not sub._forward_post_hooks


class Boom(nn.Layer):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.exc = exc

    def forward(self, x):
        x = self.fc(x) + 1
        raise self.exc


def test_a_normal_trace_leaves_every_patched_attribute_as_it_was() -> None:
    before = interception_state()
    model = Block()
    tl.trace(model, paddle.randn([2, 4]))
    assert interception_state() == before
    assert_nothing_installed([model])


@pytest.mark.parametrize("exc", [ValueError("inside the model"), KeyboardInterrupt()], ids=["exception", "interrupt"])
def test_an_exception_inside_the_model_leaves_nothing_installed(exc: BaseException) -> None:
    before = interception_state()
    model = Boom(exc)
    with pytest.raises(type(exc)):
        tl.trace(model, paddle.randn([2, 3]))
    assert interception_state() == before
    assert_nothing_installed([model])
    # and the next trace works as usual
    assert tl.trace(SimpleRecurrent(), paddle.randn([2, 5])).audit()


def test_an_exception_inside_a_branch_leaves_nothing_installed() -> None:
    deciding = {name: paddle.Tensor.__dict__.get(name) for name in ("__bool__", "item", "numpy", "tolist")}
    before = interception_state()

    def fn(x):
        if (x + 1).sum() > 0:
            raise ValueError("inside the branch")
        return x

    with pytest.raises(ValueError):
        tl.trace(fn, paddle.ones([3]))
    assert interception_state() == before
    assert_nothing_installed()
    assert {name: paddle.Tensor.__dict__.get(name) for name in deciding} == deciding


def test_replay_changes_neither_the_model_nor_the_trace() -> None:
    paddle.seed(0)
    model = Block()
    x = paddle.randn([2, 4])
    trace = tl.trace(model, x)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    recorded = [op.out.clone() for op in trace.ops]
    for _ in range(2):
        assert equal(trace.replay(), trace.output)
    assert all(equal(v, model.state_dict()[k]) for k, v in weights.items())
    assert all(equal(op.out, r) for op, r in zip(trace.ops, recorded))


# -- save= and halt= ---------------------------------------------------------------------


class Stages(nn.Layer):
    """Three stages; values are written in place after they were recorded (through a view, and in a
    multi-output op's output), and a layer returns what it did not compute."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.mid = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.skip = nn.Identity()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = self.stem(x)
        v = h.reshape([-1])  # a view of stem's output
        v[:3] = 0.0  # written through the view
        h.scale_(2.0)
        a, b = paddle.split(self.mid(h), 2, axis=1)
        a.add_(paddle.ones([1]))  # written: one element of split's output
        return self.head(paddle.concat([a, b], axis=1) + self.skip(h))


def saved(trace: tl.Trace) -> list[str]:
    return [op.label for op in trace.ops if op.kind == "op" and op.out is not None]


def same_value(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return equal(a, b)


def test_save_keeps_only_the_selected_values_and_every_op() -> None:
    paddle.seed(0)
    model = Stages()
    x = paddle.randn([3, 4])
    full = tl.trace(model, x)
    inside_mid = [op.label for op in full.ops if ("mid", 1) in op.module_passes]
    for selector, expected in [
        (tl.module("stem"), [full["stem"].label]),
        (tl.func("split"), [full["split_1"].label]),
        (tl.in_module("mid"), inside_mid),
        (tl.func("reshape|setitem"), None),
    ]:
        part = tl.trace(model, x, save=selector)
        assert [(op.label, op.shape, op.parents) for op in part.ops] == [
            (op.label, op.shape, op.parents) for op in full.ops
        ]  # every op's structure
        if expected is not None:
            assert saved(part) == expected
        for op in part.ops:
            assert (op.out is None) is (not op.saved), op.label  # nothing dropped comes back
            if op.out is not None:
                assert same_value(op.out, full[op.label].out), op.label  # the value that ran
        report = part.audit()
        assert report, str(report)
        assert equal(part.output, full.output)
    assert equal(full["stem"].out, model.stem(x))  # saved before the writes through the view


def test_values_save_drops_are_freed_during_the_capture() -> None:
    import weakref

    paddle.seed(0)
    model = Stages()
    x = paddle.randn([3, 4])
    refs = []
    model.mid.register_forward_post_hook(lambda layer, inputs, out: refs.append(weakref.ref(out)))
    with paddle.no_grad():  # with autograd on, the backward graph would keep the values alive
        trace = tl.trace(model, x, save=tl.module("stem"))
        assert refs and refs[0]() is None  # nothing of TorchLens holds mid's output
        assert trace["mid"].out is None and trace["stem"].out is not None
        kept = tl.trace(model, x)
        assert refs[1]() is not None and refs[1]() is kept["mid"].out


def test_halt_stops_before_later_layers_run() -> None:
    paddle.seed(0)
    model = Stages()
    x = paddle.randn([3, 4])
    full = tl.trace(model, x)
    ran = []
    model.head.register_forward_pre_hook(lambda layer, inputs: ran.append("head"))
    trace = tl.trace(model, x, save=tl.in_module("mid"), halt=tl.in_module("mid"))
    assert trace.halted and trace.output is None and ran == [] and "halted" in trace.notes
    assert trace.ops[-1].module_passes[0] == ("mid", 1)  # nothing after mid ran
    assert "head" not in {p for op in trace.ops for p, _ in op.module_passes}
    assert equal(trace["mid"].out, full["mid"].out)
    report = trace.audit()
    assert report, str(report)
    by_op = tl.trace(model, x, halt=tl.func("split"))
    assert by_op.halted and by_op.ops[-1].label == full["split_1"].label and ran == []
    assert equal(tl.pluck(model, x, "stem"), full["stem"].out) and ran == []


@pytest.mark.parametrize(
    "halt",
    [tl.module("mid"), tl.func("linear"), tl.func("setitem"), tl.func("identity")],
    ids=["layer hook", "C op", "Tensor operator", "identity op in a layer hook"],
)
def test_a_halt_leaves_nothing_installed(halt) -> None:
    before = interception_state()
    model = Stages()
    x = paddle.randn([3, 4])
    trace = tl.trace(model, x, halt=halt, save=halt)
    assert trace.halted and trace.output is None and len(saved(trace)) == 1
    assert interception_state() == before
    assert_nothing_installed([model])
    assert tl.trace(model, x).audit()  # and the next trace works as usual


def test_lookback_keeps_the_ops_before_each_pick_detached() -> None:
    paddle.seed(0)
    model = Stages()
    x = paddle.randn([3, 4])
    full = tl.trace(model, x)
    trace = tl.trace(model, x, save=tl.func("split"), lookback=2, lookback_payload_policy="detached_raw")
    split = full["split_1"].index
    window = [full.ops[split - 2].label, full.ops[split - 1].label]  # mid's linear and relu
    assert saved(trace) == [*window, full["split_1"].label]
    for label in window:
        op = trace[label]
        assert op.meta.get("lookback") and op.out.stop_gradient and equal(op.out, full[label].out)
    assert trace.audit()


def test_saved_traces_replay_uninitialized_values_they_dropped() -> None:
    def fn(x):
        u = paddle.empty([2, 3])  # whatever memory it got: replay needs the recorded value
        v = u * 0 + x
        u.uniform_()
        return u * 1 + v

    trace = tl.trace(fn, paddle.randn([2, 3]), save=tl.func("add"))
    assert trace["empty_1"].out is None
    report = trace.audit()
    assert report, str(report)
