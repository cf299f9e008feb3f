"""The torch backend: lookups, passes, faithfulness, replay, errors and cleanup."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn, relu  # noqa: E402  (bound before capture on purpose)

import torchlens as tl  # noqa: E402


class SimpleRecurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features=5, out_features=5)

    def forward(self, x):
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.lin(x)
        h = self.act(h)
        h += x  # residual add, in place: not a module output
        return relu(h)  # bound before capture


@pytest.fixture
def recurrent() -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(SimpleRecurrent(), torch.randn(6, 5))


def test_seed_recurrent_passes(recurrent: tl.Trace) -> None:
    second = recurrent["linear_1:2"]
    assert second.pass_num == 2 and second.num_passes == 4
    assert second.label == "linear_1_1:2" and second.layer_label == "linear_1_1"
    assert recurrent["fc:3"] is recurrent["linear_1:3"]
    assert recurrent.modules["fc"].num_passes == 4
    # the recorded value is what the module returned on its second call
    model_fc_outputs = []
    model = SimpleRecurrent()
    model.load_state_dict({k: p.value for k, p in recurrent.params.items()})
    model.fc.register_forward_hook(lambda m, a, out: model_fc_outputs.append(out.detach().clone()))
    model(recurrent["input_1"].out)
    assert torch.equal(second.out, model_fc_outputs[1])


def test_lookup_by_label_short_label_position_and_module() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU())
    trace = tl.trace(model, torch.randn(1, 3, 8, 8))
    assert [op.label for op in trace.ops] == ["input_1", "conv2d_1_1", "relu_1_2", "conv2d_2_3", "relu_2_4", "output_1"]
    assert trace["relu_1_2"] is trace["relu_1"] is trace["relu_1:1"] is trace[2] is trace["1"] is trace[-4]
    assert trace[-1].layer_label == "output_1"
    assert trace["conv2d_2"].parents == ["relu_1_2"] and trace["conv2d_2"].children == ["relu_2_4"]
    assert trace["2"].module == "2" and trace["2"].modules == ["2:1"]
    assert torch.equal(trace.output, model(trace["input_1"].out))
    with pytest.raises(KeyError, match="did you mean 'relu_1"):
        trace["relu_11"]
    with pytest.raises(KeyError, match="out of range"):
        trace[99]


def test_functional_ops_residual_adds_and_prebound_functions() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    block = Block()
    expected = block(x.clone())
    trace = tl.trace(block, x)
    names = [op.func_name for op in trace.ops]
    assert names == ["input", "linear", "relu", "add_", "relu", "output"]
    add = trace["add__1"]
    assert add.in_place and add.module_outputs == [] and add.parents == ["relu_1_2", "input_1"]
    assert trace["act"].func_name == "relu" and trace["act"].module_outputs == ["act:1"]
    assert torch.equal(trace.output, expected)


def test_saved_values_survive_in_place_mutation() -> None:
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 4)
    seen = {}
    block.lin.register_forward_hook(lambda m, a, out: seen.update(lin=out.detach().clone()))
    block.act.register_forward_hook(lambda m, a, out: seen.update(act=out.detach().clone()))
    trace = tl.trace(block, x)
    # lin's output was overwritten by ReLU(inplace) and act's by `h += x`: both saved as they ran
    assert torch.equal(trace["lin"].out, seen["lin"])
    assert torch.equal(trace["act"].out, seen["act"])
    assert not torch.equal(trace["lin"].out, trace["act"].out)
    assert trace.audit()


def test_keyword_tuple_and_dict_inputs_reach_the_model_as_given() -> None:
    received = {}

    def fn(pair, batch, *, scale):
        received.update(pair=type(pair), batch=type(batch), scale=scale)
        a, b = pair
        return {"sum": (a + b) * scale, "prod": batch["u"] * batch["v"]}

    x, y = torch.randn(3), torch.randn(3)
    trace = tl.trace(fn, (x, y), {"u": x, "v": y}, scale=2.0)
    assert received == {"pair": tuple, "batch": dict, "scale": 2.0}
    assert trace.input_labels == ["input_1", "input_2"]
    assert set(trace.output) == {"sum", "prod"} and trace.output_labels == ["output_1", "output_2"]
    assert torch.equal(trace.output["sum"], (x + y) * 2.0)
    assert trace.audit()


def test_module_with_structured_output_gives_back_the_structure() -> None:
    class Two(nn.Module):
        def forward(self, x):
            return {"a": x.relu(), "b": (x.sigmoid(), x.tanh())}

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.two = Two()

        def forward(self, x):
            out = self.two(x)
            return out["a"] + out["b"][0]

    x = torch.randn(3)
    trace = tl.trace(Outer(), x)
    out = trace["two"].out
    assert isinstance(trace["two"], tl.ModulePass)
    assert set(out) == {"a", "b"} and isinstance(out["b"], tuple)
    assert torch.equal(out["b"][1], x.tanh())


def test_data_dependent_branch_records_what_ran() -> None:
    def fn(x):
        return x.exp() if x.sum() > 0 else x.neg().abs()

    pos = tl.trace(fn, torch.ones(3))
    neg = tl.trace(fn, -torch.ones(3))
    assert [op.func_name for op in pos.ops if op.kind == "op"] == ["sum", "gt", "exp"]
    assert [op.func_name for op in neg.ops if op.kind == "op"] == ["sum", "gt", "neg", "abs"]


def test_dropout_replays_exactly_in_train_mode() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)).train()
    trace = tl.trace(model, torch.randn(4, 8))
    assert trace["dropout_1"].source is None and "rng_state" in trace["dropout_1"].meta
    assert torch.equal(trace.replay(), trace.output)


def test_dropout_in_eval_mode_draws_nothing_and_keeps_no_generator_state() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)).eval()
    x = torch.randn(4, 8)
    state = torch.get_rng_state()

    def functional(x):  # the flag by keyword, and torch.dropout (a builtin without a signature) by position
        return torch.dropout(F.dropout(x, 0.3, training=False), 0.3, False) * 2

    for target in (model, functional):
        trace = tl.trace(target, x)
        dropouts = [op for op in trace.ops if op.func_name == "dropout"]
        assert dropouts and all("rng_state" not in op.meta for op in dropouts)
        assert torch.equal(trace.replay(), target(x))
    assert torch.equal(torch.get_rng_state(), state)  # nothing drew from the generator
    trained = tl.trace(lambda x: torch.dropout(x, 0.5, True), x)
    assert "rng_state" in trained["dropout_1"].meta and torch.equal(trained.replay(), trained.output)


def test_sources_are_declared() -> None:
    class Maker(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x + torch.arange(3.0) + self.w * 2 + torch.rand(3) * 0

    trace = tl.trace(Maker(), torch.zeros(3))
    sources = {op.func_name: op.source for op in trace.ops if op.is_source}
    assert sources == {"arange": "constant", "mul": "parameter", "rand": "random"}
    assert trace.audit()


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        x = self.fc(x)
        raise ValueError("inside the model")


def _interception_state() -> tuple:
    from torch.nn.modules import module as nn_module
    from torch.overrides import _get_current_function_mode_stack

    return (
        len(_get_current_function_mode_stack()),
        dict(nn_module._global_forward_pre_hooks),
        dict(nn_module._global_forward_hooks),
        torch.relu,
        F.relu,
        torch.Tensor.__add__,
        torch.Tensor.add_,
        torch.nn.Linear.forward,
        torch.nn.Module.__call__,
    )


def test_exception_inside_model_leaves_nothing_installed() -> None:
    before = _interception_state()
    with pytest.raises(ValueError, match="inside the model"):
        tl.trace(Boom(), torch.randn(2, 3))
    assert _interception_state() == before
    # and the next trace works as usual
    assert tl.trace(SimpleRecurrent(), torch.randn(2, 5)).audit()


def test_keyboard_interrupt_leaves_nothing_installed() -> None:
    class Interrupt(nn.Module):
        def forward(self, x):
            raise KeyboardInterrupt

    before = _interception_state()
    with pytest.raises(KeyboardInterrupt):
        tl.trace(Interrupt(), torch.randn(2))
    assert _interception_state() == before


def test_torchscript_is_refused_with_a_typed_error() -> None:
    scripted = torch.jit.script(nn.Linear(2, 2))
    with pytest.raises(tl.UnsupportedError, match="eager"):
        tl.trace(scripted, torch.randn(1, 2))


def test_auto_routing_and_non_callable() -> None:
    assert tl.trace(lambda x: x * 2, torch.ones(2)).backend == "torch"
    with pytest.raises(tl.UnsupportedError, match="model or function"):
        tl.trace(42, torch.ones(2))
    with pytest.raises(tl.UnsupportedError, match="pass backend="):
        tl.trace(lambda x: x, "not an array")


def test_summary_lists_modules_and_totals() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    text = tl.trace(model, torch.randn(1, 4)).summary()
    assert "| 0 (Linear)" in text and "| [1,8]" in text and "| 40 " in text
    assert "Params: 58 unique; trainable: 58" in text
    assert "Ops: 3 total" in text and "Edges: 4 total" in text
    # linear 4->8 (32 MACs + 8 bias adds), relu (8), linear 8->2 (16 MACs + 2 bias adds)
    assert "Forward FLOPs: 114 FLOPs  MACs: 48" in text


def test_batchnorm_in_training_mode_replays_and_leaves_buffers_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    x = torch.randn(2, 3, 6, 6)
    trace = tl.trace(model, x)
    # the forward wrote the buffers in place: the trace keeps their values from before it
    assert trace.params["1.num_batches_tracked"].value.item() == 0
    assert model[1].num_batches_tracked.item() == 1
    counter = next(op for op in trace.ops if op.func_name == "add_")
    assert counter.source == "parameter" and counter.params == ("1.num_batches_tracked",)
    stats = model[1].running_mean.clone(), model[1].num_batches_tracked.clone()
    report = trace.audit()
    assert report, str(report)
    assert torch.equal(model[1].running_mean, stats[0]) and torch.equal(model[1].num_batches_tracked, stats[1])


def test_iterating_over_a_tensor_is_one_multi_output_op() -> None:
    def fn(x):
        return torch.stack([row * i for i, row in enumerate(x)])

    x = torch.randn(3, 2)
    trace = tl.trace(fn, x)
    rows = trace["unbind_1"]
    assert len(rows.out) == 3 and rows.parents == ["input_1"] and rows.shape == ((2,), (2,), (2,))
    # one line run on each row: three passes of one layer
    assert all(trace[f"mul_1:{i}"].parents == ["unbind_1_1"] for i in (1, 2, 3))
    assert trace.audit()


def test_returned_parameters_inputs_and_outside_tensors_get_output_nodes() -> None:
    outside = torch.ones(2)

    class Returns(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))

        def forward(self, x):
            return x, self.w, outside, x * 2

    trace = tl.trace(Returns(), torch.randn(2))
    assert len(trace.output_labels) == 4
    assert [trace[label].parents for label in trace.output_labels][:1] == [["input_1"]]
    sources = [op.source for op in trace.ops if op.func_name == "identity"]
    assert sources == ["parameter", "constant"]
    assert trace.audit()


def test_uninitialized_factories_replay_the_bytes_they_held() -> None:
    def fn(x):
        buffer = torch.empty(3, 4)
        return torch.cat([x, buffer.mul_(0).add_(x)])  # garbage that is then overwritten

    trace = tl.trace(fn, torch.randn(3, 4))
    assert "uninitialized" in trace["empty_1"].meta and trace["empty_1"].source == "constant"
    assert trace.audit()


def test_values_survive_later_changes_to_inputs_buffers_and_the_next_forward() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    x = torch.randn(2, 3, 6, 6)
    trace = tl.trace(model, x)
    counter = next(op for op in trace.ops if op.func_name == "add_")
    before = {op.label: op.out.clone() for op in trace.ops}
    model(x)  # bumps num_batches_tracked and the running stats in place
    x.mul_(0)  # the user reuses their input buffer
    assert all(torch.equal(op.out, before[op.label]) for op in trace.ops)
    assert counter.out.item() == 1
    assert trace.audit()


def test_a_module_returning_a_tensor_from_an_earlier_call_adds_no_ops_of_its_own() -> None:
    # the output is no op of this forward: the capture keeps a copy of it, and that copy is not the model's op
    class Cache(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cached: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.cached is None:
                self.cached = torch.ones(2, 3)
            return self.cached

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cache, self.fc = Cache(), nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.cache(x)

    model, x = Model(), torch.randn(2, 3)
    model(x)  # fills the cache before the capture
    trace = tl.trace(model, x)
    assert [op.func_name for op in trace.ops] == ["input", "linear", "identity", "add", "output"]
    assert trace.audit()
    assert torch.equal(trace.modules["cache"].passes[0].out, torch.ones(2, 3))


def test_equal_constants_computed_from_constants_alone_are_not_lost_edges() -> None:
    # torchvision's anchor generator keeps one constant cell-anchor tensor per level; with equal sizes per level
    # the second level's constant equals the first level's converted copy, an op computed from constants alone
    pytest.importorskip("torchvision")
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.image_list import ImageList

    class Anchors(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchors = AnchorGenerator(((32, 64),) * 3, ((0.5, 1.0),) * 3)

        def forward(self, image: torch.Tensor, *features: torch.Tensor) -> list[torch.Tensor]:
            return self.anchors(ImageList(image, [(64, 64)]), list(features))

    x = (torch.randn(1, 3, 64, 64), torch.randn(1, 4, 8, 8), torch.randn(1, 4, 4, 4), torch.randn(1, 4, 2, 2))
    model = Anchors()
    trace = tl.trace(model, *x)
    report = trace.audit()
    assert report, str(report)
    assert all(torch.equal(a, b) for a, b in zip(trace.output, model(*x)))
