"""The tinygrad backend: what counts as an op, layers and passes, faithfulness, replay, refusals and cleanup."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
if shutil.which("clang") is None and not os.environ.get("DEV"):
    pytest.fail(
        "tinygrad's CPU device compiles its kernels with clang, which is not installed: "
        "apt-get install -y clang (or set DEV=PYTHON, 40-50x slower)",
        pytrace=False,
    )
from tinygrad import Tensor, nn  # noqa: E402
from tinygrad.engine.jit import TinyJit, _TinyJit  # noqa: E402
from tinygrad.helpers import TRACEMETA, Context  # noqa: E402

import torchlens as tl  # noqa: E402


class MLP:
    def __init__(self) -> None:
        self.l1 = nn.Linear(4, 8)
        self.l2 = nn.Linear(8, 3)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


class SimpleRecurrent:
    def __init__(self) -> None:
        self.fc = nn.Linear(5, 5)

    def __call__(self, x: Tensor) -> Tensor:
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


def _randn(*shape: int) -> Tensor:
    return Tensor.randn(*shape).realize()


def _np(t: Tensor) -> np.ndarray:
    return t.numpy().copy()


def _patchable_state() -> tuple:
    """Everything capture patches, by identity: Tensor's attributes and the functions tinygrad's own
    metadata wrappers call, the mixins' methods, layer classes' __call__, TinyJit's."""
    from torchlens_tinygrad.capture import metadata_cell

    attributes = {f"{klass.__name__}.{name}": raw for klass in Tensor.__mro__[:-1] for name, raw in vars(klass).items()}
    cells = {name: cell.cell_contents for name, raw in vars(Tensor).items() if (cell := metadata_cell(raw))}
    assert len(cells) > 250 or not TRACEMETA  # on by default: nearly every method has one
    attributes.update({f"cell {name}": fn for name, fn in cells.items()})
    return (
        attributes,
        vars(nn.Linear)["__call__"],
        vars(nn.BatchNorm)["__call__"],
        vars(nn.LayerNorm)["__call__"],
        vars(_TinyJit)["__call__"],
        Tensor._seed,
    )


def _same(a: tuple, b: tuple) -> bool:
    if a[0].keys() != b[0].keys() or any(a[0][k] is not b[0][k] for k in a[0]):
        return False
    return all(x is y for x, y in zip(a[1:], b[1:]))


@pytest.fixture(autouse=True)
def _seed() -> None:
    Tensor.manual_seed(0)


def test_ops_are_what_the_user_called_helpers_folded_in() -> None:
    model, x = MLP(), _randn(2, 4)
    trace = tl.trace(model, x)
    assert trace.backend == "tinygrad" and trace.model_name == "MLP"
    assert [op.func_name for op in trace.ops] == [
        "input",
        "transpose",
        "linear",
        "relu",
        "transpose",
        "linear",
        "output",
    ]
    assert trace["l1"].func_name == "linear" and trace["l1"].modules == ["l1:1"]
    assert trace["transpose_1"].params == ("l1.weight",) and trace["linear_1"].params == ("l1.bias",)
    assert trace["relu_1"].parents == ["linear_1_2"] and trace["relu_1"].module is None
    assert set(trace.params) == {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
    assert np.allclose(_np(trace.output), _np(model(x)), atol=1e-6)
    assert trace.audit()


def test_library_methods_built_from_other_methods_are_one_op() -> None:
    def fn(q, k, v):
        return q.scaled_dot_product_attention(k, v, is_causal=True).softmax().layernorm()

    trace = tl.trace(fn, _randn(1, 2, 3, 4), _randn(1, 2, 3, 4), _randn(1, 2, 3, 4))
    assert [op.func_name for op in trace.ops if op.kind == "op"] == [
        "scaled_dot_product_attention",
        "softmax",
        "layernorm",
    ]


def test_operators_and_in_place_dunders_get_plain_names() -> None:
    def fn(x):
        y = 1 + x * 2 - x / 3
        y = -(y @ x.T)
        y += 1
        return y[0], y.sum() ** 2

    trace = tl.trace(fn, _randn(3, 3))
    assert [op.func_name for op in trace.ops if op.kind == "op"] == [
        "mul",
        "add",
        "div",
        "sub",
        "transpose",
        "matmul",
        "neg",
        "add_",
        "getitem",
        "sum",
        "pow",
    ]
    assert trace["add__1"].in_place and not trace["add_1"].in_place
    assert trace.audit()


@pytest.mark.skipif(
    not TRACEMETA,
    reason="references taken before capture are seen through tinygrad's TRACEMETA wrappers, on by default",
)
def test_layer_lists_run_by_sequential_with_tensor_methods_bound_before_capture() -> None:
    class Net:  # tinygrad's own examples' style (beautiful_mnist)
        def __init__(self) -> None:
            self.layers = [
                nn.Conv2d(1, 2, 3),
                Tensor.relu,
                lambda x: x.max_pool2d((2, 2)),
                nn.BatchNorm(2),
                lambda x: x.flatten(1),
                nn.Linear(2 * 3 * 3, 4),
            ]

        def __call__(self, x):
            return x.sequential(self.layers)

    trace = tl.trace(Net(), _randn(2, 1, 8, 8))
    # Tensor.relu was bound before capture: still one op. nn.BatchNorm (eval) runs what its Python code calls.
    assert [op.func_name for op in trace.ops if op.kind == "op"] == [
        "conv2d",
        "relu",
        "max_pool2d",
        "reshape",
        "add",
        "rsqrt",
        "batchnorm",
        "flatten",
        "transpose",
        "linear",
    ]
    assert list(trace.modules) == ["layers.0", "layers.3", "layers.5"]
    assert trace["layers.3"].func_name == "batchnorm" and trace["rsqrt_1"].params == ()
    assert trace["reshape_1"].params == ("layers.3.running_var",)
    assert trace.audit()


def test_seed_recurrent_passes() -> None:
    model, x = SimpleRecurrent(), _randn(6, 5)
    seen = []
    trace = tl.trace(model, x)
    second = trace["linear_1:2"]
    assert second.pass_num == 2 and second.num_passes == 4
    assert second.label == "linear_1_2:2" and second.layer_label == "linear_1_2"
    assert trace["fc:3"] is trace["linear_1:3"]
    assert trace.modules["fc"].num_passes == 4
    first = trace["linear_1:1"].out
    assert np.allclose(_np(second.out), _np(model.fc((first + 1) * 2)), atol=1e-6)
    h = x
    for _ in range(4):
        h = model.fc(h)
        seen.append(_np(h))
        h = (h + 1) * 2
    assert np.allclose(_np(second.out), seen[1], atol=1e-6)


def test_seeds_function_call_as_written_and_auto_routing() -> None:
    def tg_fn(inputs):
        x, w = inputs
        return (x @ w).relu()

    inputs = [_randn(3, 4), _randn(4, 2)]
    trace = tl.trace(tg_fn, inputs, backend="tinygrad")
    assert trace.input_labels == ["input_1", "input_2"] and trace.modules == {}
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["matmul", "relu"]
    assert tl.trace(tg_fn, inputs).backend == "tinygrad"
    assert tl.trace(MLP(), _randn(1, 4)).backend == "tinygrad"
    assert np.array_equal(_np(trace.output), _np(tg_fn(inputs)))
    assert {"tinygrad"} <= {b["name"] for b in tl.backends()}


def test_module_paths_follow_attribute_names_lists_and_dicts() -> None:
    class Block:
        def __init__(self) -> None:
            self.norm = nn.LayerNorm(4)
            self.proj = nn.Linear(4, 4)

        def __call__(self, x):
            return self.proj(self.norm(x)) + x

    class Net:
        def __init__(self) -> None:
            self.blocks = [Block(), Block()]
            self.heads = {"a": nn.Linear(4, 2), "b": nn.Linear(4, 1)}
            self.shared = self.heads["a"]  # the same layer under a second name: one module, first path

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.heads["a"](x), self.shared(x), self.heads["b"](x)

    net = Net()
    net.blocks[0].owner = net  # a reference cycle: walked once
    from tinygrad.nn.state import get_state_dict

    trace = tl.trace(net.forward, _randn(2, 4))  # a bound method: its instance holds the layers
    assert list(trace.modules) == [
        "blocks.0",
        "blocks.0.norm",
        "blocks.0.proj",
        "blocks.1",
        "blocks.1.norm",
        "blocks.1.proj",
        "heads.a",
        "heads.b",
    ]
    assert trace.modules["heads.a"].num_passes == 2
    assert trace.modules["blocks.1"].params == [
        "blocks.1.norm.weight",
        "blocks.1.norm.bias",
        "blocks.1.proj.weight",
        "blocks.1.proj.bias",
    ]
    del net.blocks[0].owner  # (get_state_dict itself would recurse forever)
    assert list(trace.params) == list(dict.fromkeys(get_state_dict(net)))[: len(trace.params)]
    assert trace["blocks.1"].modules == ["blocks.1:1"]
    assert trace["heads.a:2"].module_outputs == ["heads.a:2"]
    assert trace.audit()


def test_layer_returning_its_input_or_a_parameter_gets_identity_ops() -> None:
    class Passthrough:
        def __init__(self) -> None:
            self.scale = Tensor.ones(3).contiguous().realize()

        def __call__(self, x):
            return x, self.scale

    class Net:
        def __init__(self) -> None:
            self.inner = Passthrough()

        def __call__(self, x):
            y, s = self.inner(x)
            return y * s

    trace = tl.trace(Net(), _randn(3))
    identities = [op for op in trace.ops if op.func_name == "identity"]
    assert [op.source for op in identities] == [None, "parameter"]
    assert identities[0].parents == ["input_1"] and identities[0].modules == ["inner:1"]
    assert trace.audit()


def test_saved_values_survive_in_place_writes() -> None:
    class Writes:
        def __init__(self) -> None:
            self.fc = nn.Linear(4, 4)

        def __call__(self, x, y):
            h = self.fc(x)
            t = h.T  # a view sharing h's buffer
            s = t.sum(axis=1)
            h += y
            h[:, 0] = 0.0
            h.assign(h * 3)
            return h + s

    model, x, y = Writes(), _randn(2, 4), _randn(2, 4)
    expected_fc = _np(model.fc(x))
    expected = _np(model(x, y))
    trace = tl.trace(model, x, y)
    assert np.allclose(_np(trace["fc"].out), expected_fc, atol=1e-6)
    assert np.allclose(_np(trace["transpose_2"].out), expected_fc.T, atol=1e-6)
    assert [op.func_name for op in trace.ops if op.in_place] == ["add_", "setitem", "assign"]
    setitem = trace["setitem_1"]
    assert setitem.parents == ["add__1_6"] and np.all(_np(setitem.out)[:, 0] == 0)
    assert np.allclose(_np(trace.output), expected, atol=1e-6)
    assert trace.audit()


def test_plain_call_output_still_lazy_is_not_disturbed_by_a_capture() -> None:
    class Writes:
        def __init__(self) -> None:
            self.fc = nn.Linear(4, 4)

        def __call__(self, x, y):
            h = self.fc(x)
            h += y
            return h * 2

    model, x, y = Writes(), _randn(2, 4), _randn(2, 4)
    lazy = model(x, y)  # not realized: shares graph nodes with what capture computes and writes into
    trace = tl.trace(model, x, y)
    assert np.allclose(_np(lazy), _np(model(x, y)), atol=1e-6)
    assert np.allclose(_np(trace.output), _np(lazy), atol=1e-6)
    assert trace.audit()


def test_batchnorm_training_writes_its_buffers_and_replay_leaves_them_alone() -> None:
    class Net:
        def __init__(self) -> None:
            self.conv = nn.Conv2d(2, 3, 3, bias=False)
            self.bn = nn.BatchNorm(3)

        def __call__(self, x):
            with Context(TRAINING=1):
                return self.bn(self.conv(x)).relu()

    net = Net()
    trace = tl.trace(net, _randn(2, 2, 5, 5))
    # the forward wrote the buffers in place: the trace keeps their values from before it
    assert trace.params["bn.running_mean"].is_buffer and not trace.params["bn.weight"].is_buffer
    assert float(trace.params["bn.num_batches_tracked"].value.item()) == 0
    assert float(net.bn.num_batches_tracked.item()) == 1
    writes = [op for op in trace.ops if op.in_place]
    assert [op.func_name for op in writes] == ["assign", "assign", "add_"]
    assert writes[-1].source == "parameter" and writes[-1].params == ("bn.num_batches_tracked",)
    stats = _np(net.bn.running_mean), _np(net.bn.num_batches_tracked)
    report = trace.audit()
    assert report, str(report)
    assert np.array_equal(_np(net.bn.running_mean), stats[0])
    assert np.array_equal(_np(net.bn.num_batches_tracked), stats[1])


def test_dropout_and_rand_replay_exactly_and_leave_the_rng_alone() -> None:
    def fn(x):
        with Context(TRAINING=1):
            return x.dropout(0.5) + Tensor.rand(*x.shape)

    x = _randn(4, 8)
    trace = tl.trace(fn, x)
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["dropout", "rand", "add"]
    assert trace["rand_1"].source == "random" and "rng" in trace["dropout_1"].meta
    counters = {d: _np(c) for d, c in Tensor._device_rng_counters.items()}
    assert np.array_equal(_np(trace.replay()), _np(trace.output))
    assert trace.audit()
    assert {d: _np(c).tolist() for d, c in Tensor._device_rng_counters.items()} == {
        d: c.tolist() for d, c in counters.items()
    }


def test_data_dependent_branch_records_what_ran() -> None:
    def fn(x):
        return x.exp() if x.sum().item() > 0 else x.neg().abs()

    pos = tl.trace(fn, Tensor.ones(3).contiguous())
    neg = tl.trace(fn, -Tensor.ones(3).contiguous())
    assert [op.func_name for op in pos.ops if op.kind == "op"] == ["sum", "exp"]
    assert [op.func_name for op in neg.ops if op.kind == "op"] == ["sum", "neg", "abs"]


class Gate:
    def __init__(self, weight: float, bias: float) -> None:
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.a.weight, self.a.bias = Tensor.full((4, 4), weight).contiguous(), Tensor.full((4,), bias).contiguous()
        self.b.weight, self.b.bias = Tensor.full((4, 4), 0.01).contiguous(), Tensor.zeros(4).contiguous()

    def __call__(self, x):
        h = self.a(x)
        if (h.sum() > 0).item():  # tinygrad has no Tensor.__bool__
            h = h.relu() * 2
        else:
            h = self.b(h)
        n = 0
        while h.abs().max().numpy() > 0.5 and n < 2:
            h = h / 2
            n += 1
        return h + 1


def test_ops_inside_data_dependent_branches_name_their_condition() -> None:
    trace = tl.trace(Gate(0.5, 1.0), Tensor.ones(1, 4).contiguous())
    gt = trace["gt_1"].label
    assert trace["relu_1"].conditions == [gt] and trace["mul_1"].conditions == [gt]
    maxes = [op.label for op in trace.find(tl.func("max"))]
    assert [d.conditions for d in trace.find(tl.func("div"))] == [maxes[:1], maxes[1:2]]
    for label in ("linear_1", "sum_1", "gt_1", "abs_1", "max_1", "add_1"):
        assert not trace[label].in_branch, label

    trace = tl.trace(Gate(-0.5, -1.0), Tensor.ones(1, 4).contiguous())  # else; the loop body never runs
    assert trace["linear_2"].conditions == [trace["gt_1"].label]
    assert not trace["linear_1"].in_branch and "div" not in {op.func_name for op in trace}


def test_an_exception_inside_a_branch_leaves_nothing_patched() -> None:
    def fn(x):
        if (x + 1).sum().item() > 0:
            raise ValueError("inside the branch")
        return x

    before = _patchable_state()
    with pytest.raises(ValueError, match="inside the branch"):
        tl.trace(fn, _randn(3).abs())
    assert _same(_patchable_state(), before)


def test_a_tensor_method_itself_can_be_the_target() -> None:
    x = _randn(2, 3)
    assert [op.func_name for op in tl.trace(Tensor.relu, x).ops] == ["input", "relu", "output"]
    assert [op.func_name for op in tl.trace(x.sigmoid).ops] == ["sigmoid", "output"]


def test_summary_and_lookups() -> None:
    trace = tl.trace(MLP(), _randn(1, 4))
    text = trace.summary()
    assert "Model: MLP (tinygrad)" in text and "| l1 (Linear)" in text and "| [1,8]" in text
    assert "Params: 67 unique; trainable: 67" in text and "Ops: 5 total" in text
    assert trace["linear_2"] is trace["l2"] is trace[5] is trace[-2]
    assert trace["relu_1"].code_site is not None and trace["relu_1"].code_site.file == __file__
    assert trace["input_1"].dtype == "float32" and trace["input_1"].device == "cpu"
    with pytest.raises(KeyError, match="did you mean"):
        trace["relu_11"]


class Boom:
    def __init__(self) -> None:
        self.fc = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)

    def __call__(self, x):
        self.norm(self.fc(x))
        raise ValueError("inside the model")


def test_exception_inside_model_leaves_nothing_patched() -> None:
    before = _patchable_state()
    with pytest.raises(ValueError, match="inside the model"):
        tl.trace(Boom(), _randn(2, 3))
    assert _same(_patchable_state(), before)
    assert tl.trace(SimpleRecurrent(), _randn(2, 5)).audit()  # and the next trace works as usual


def test_keyboard_interrupt_leaves_nothing_patched() -> None:
    class Interrupt:
        def __init__(self) -> None:
            self.fc = nn.Linear(2, 2)

        def __call__(self, x):
            self.fc(x)
            raise KeyboardInterrupt

    before = _patchable_state()
    with pytest.raises(KeyboardInterrupt):
        tl.trace(Interrupt(), _randn(2))
    assert _same(_patchable_state(), before)


def test_tinyjit_is_refused_with_a_typed_error_and_nothing_patched() -> None:
    @TinyJit
    def jitted(x):
        return (x * 2).realize()

    class UsesJit:
        def __init__(self) -> None:
            self.fc = nn.Linear(2, 2)

        def __call__(self, x):
            return jitted(self.fc(x))

    before = _patchable_state()
    with pytest.raises(tl.UnsupportedError, match="TinyJit.*fxn"):
        tl.trace(jitted, _randn(2))
    with pytest.raises(tl.UnsupportedError, match="inside the traced model"):
        tl.trace(UsesJit(), _randn(2))
    assert _same(_patchable_state(), before)
    assert jitted.cnt == 0  # the jit never ran
    assert [op.func_name for op in tl.trace(jitted.fxn, _randn(2)).ops] == ["input", "mul", "output"]


def test_nested_captures_are_refused() -> None:
    def outer(x):
        tl.trace(lambda y: y + 1, x)
        return x

    before = _patchable_state()
    with pytest.raises(tl.UnsupportedError, match="do not nest"):
        tl.trace(outer, _randn(2))
    assert _same(_patchable_state(), before)


def test_observer_sees_the_same_calls() -> None:
    from torchlens_core.backend.manager import backend_named

    model, x = SimpleRecurrent(), _randn(2, 5)
    seen = backend_named("tinygrad").observe_module_outputs(model, (x,), {})
    trace = tl.trace(model, x)
    assert sorted(seen) == ["fc:1", "fc:2", "fc:3", "fc:4"]
    assert np.allclose(_np(seen["fc:3"]), _np(trace["fc:3"].out), atol=1e-6)
    assert backend_named("tinygrad").observe_module_outputs(lambda t: t, (x,), {}) == {}


def test_empty_replays_the_bytes_it_held() -> None:
    def fn(x):
        buf = Tensor.empty(2, 3)
        buf.assign(x * 2)
        return buf + Tensor.empty(2, 3) * 0

    trace = tl.trace(fn, _randn(2, 3))
    assert "uninitialized" in trace["empty_1"].meta and trace["empty_1"].source == "constant"
    assert trace.audit()


def test_draw_gives_module_clusters(tmp_path) -> None:
    import shutil

    trace = tl.trace(SimpleRecurrent(), _randn(2, 5))
    dot = trace.to_dot(vis_mode="rolled")
    assert "fc" in dot and "linear_1_2" in dot
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed")
    path = trace.draw(tmp_path / "recurrent", file_format="svg")
    assert path.endswith(".svg") and "<svg" in open(path).read()


def test_save_and_halt_selectors() -> None:
    model, x = MLP(), _randn(2, 4)
    trace = tl.trace(model, x, save=tl.func("relu"))
    assert [op.func_name for op in trace.ops if op.kind == "op" and op.out is not None] == ["relu"]
    assert trace.num_ops == 5 and trace.audit()
    before = _patchable_state()
    halted = tl.trace(model, x, halt=tl.module("l1"))
    assert _same(_patchable_state(), before)
    assert halted.halted and [op.func_name for op in halted.ops] == ["input", "transpose", "linear"]
    assert np.allclose(_np(halted["l1"].out), _np(model.l1(x)), atol=1e-6)
    assert np.allclose(_np(tl.pluck(model, x, "relu_1")), _np(model.l1(x).relu()), atol=1e-6)
    recording = tl.record(model, x, save=tl.func("relu"))
    assert [op.label for op in recording.to_trace().ops if op.kind == "op" and op.out is not None] == ["relu_1_3"]


def test_a_view_taken_before_a_write_keeps_its_value_as_in_a_plain_run() -> None:
    def fn(x):
        h = x * 1
        v = h.reshape(-1)  # in a plain (lazy) run, v keeps h's value from before the write
        h += 1
        w = h[0]
        h.assign(h * 3)
        return v * 1, w + 0, h

    x = Tensor.ones(2, 2).contiguous().realize()
    plain = [_np(o) for o in fn(x)]
    trace = tl.trace(fn, x)
    assert all(np.array_equal(_np(a), b) for a, b in zip(trace.output, plain))
    assert trace["add__1"].meta["isolate"] and trace["assign_1"].meta["isolate"]
    assert trace.audit()


def test_stack_batches_samples() -> None:
    from torchlens_tinygrad.plugin import backend

    samples = [_randn(2, 3) for _ in range(4)]
    batch = backend.stack(samples)
    assert batch.shape == (4, 2, 3) and np.array_equal(_np(batch)[2], _np(samples[2]))


def test_a_write_whose_target_is_passed_by_keyword_keeps_the_value_it_overwrote():
    """`Tensor.assign(self=buf, x=...)`: the written tensor arrives by keyword; the value recorded before the
    write stays what it was (closed form: 2x), and the trace replays to the plain function's output."""

    def f(x):
        buf = (x * 2).contiguous()
        Tensor.assign(self=buf, x=x + 1)
        return buf * 3

    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    trace = tl.trace(f, Tensor(data), backend="tinygrad")
    written = [op for op in trace.ops if op.func_name == "assign"]
    assert len(written) == 1 and written[0].in_place
    before = next(op for op in trace.ops if op.func_name == "contiguous")
    np.testing.assert_array_equal(before.out.numpy(), data * 2)
    np.testing.assert_array_equal(trace.replay(Tensor(data)).numpy(), f(Tensor(data)).numpy())
    assert trace.audit()
