"""trace[selector] lookups, and loops in the forward folded into layers of several passes (seed 002)."""

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import LabelNotFoundError  # noqa: E402


class SimpleRecurrent(torch.nn.Module):  # the seed's recurrent model, as written there
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(in_features=5, out_features=5)

    def forward(self, x):
        for r in range(4):  # noqa: B007 - the seed's model, as written there
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


def test_the_seeds_loop_is_one_layer_per_statement():
    model, seq = SimpleRecurrent(), torch.randn(6, 5)
    log = tl.trace(model, seq)
    layers = {op.layer_label: op.num_passes for op in log.ops if op.kind == "op"}
    assert layers == {"linear_1_1": 4, "add_1_2": 4, "mul_1_3": 4}
    # the second pass of the linear layer is what fc computed on the first iteration's output
    with torch.no_grad():
        expected = model.fc((model.fc(seq) + 1) * 2)
    assert torch.allclose(log["linear_1:2"].out, expected)
    assert log["add_1_2:3"].parents == ["linear_1_1:3"]
    assert log.audit()
    rolled = log.to_dot(vis_mode="rolled")
    assert rolled.count("->") < log.to_dot().count("->")  # passes drawn once: the loop closes on itself


def test_a_self_recurrence_folds_from_its_second_step():
    def doubling(x):
        for _ in range(4):
            x = x * 2
        return x

    trace = tl.trace(doubling, torch.randn(3))
    assert [op.label for op in trace.ops if op.kind == "op"] == ["mul_1_1", "mul_2_2:1", "mul_2_2:2", "mul_2_2:3"]


def test_the_same_line_on_other_inputs_is_another_layer():
    def branches(x, y):
        outs = [torch.relu(v) for v in (x, y)]  # one line, two different inputs
        return outs[0] + outs[1]

    trace = tl.trace(branches, torch.randn(3), torch.randn(3))
    assert [op.num_passes for op in trace.ops if op.func_name == "relu"] == [1, 1]


def test_selectors_as_keys_give_lists():
    torchvision = pytest.importorskip("torchvision")
    trace = tl.trace(torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32))
    convs = trace[tl.func("conv2d")]
    assert isinstance(convs, list) and len(convs) == 20 and all(op.func_name == "conv2d" for op in convs)
    inside = trace[tl.in_module("layer2")]
    assert inside and all(any(p == "layer2" for p, _ in op.module_passes) for op in inside)
    (returned,) = trace[tl.module("layer2")]  # one op: still a list
    assert torch.equal(returned.out, trace["layer2"].out)
    with pytest.raises(LabelNotFoundError, match=r"tl.func\('conv3d'\) picks no op"):
        trace[tl.func("conv3d")]


def test_labels_named_after_the_forward_are_those_named_while_it_runs(monkeypatch):
    """Without a selector reading labels during the capture, ops are named once the forward has run (in one
    loop, docs/performance.md); the labels are the ones a capture that names each op as it arrives gives."""
    from torchlens_core.capture.builder import LayerNamer

    torchvision = pytest.importorskip("torchvision")
    running = []

    class Watched(SimpleRecurrent):
        def forward(self, x):
            running.append(True)
            try:
                return super().forward(torch.relu(x)) + torchvision.ops.misc.Permute([0, 1])(x)
            finally:
                running.pop()

    named_in_forward = []
    real = LayerNamer.name
    monkeypatch.setattr(LayerNamer, "name", lambda self, op: (named_in_forward.append(bool(running)), real(self, op)))
    model, x = Watched(), torch.randn(6, 5)

    def fields(trace):
        return [(op.label, op.layer_label, op.num_passes, op.parents, op.children) for op in trace.ops]

    at_end = tl.trace(model, x)
    assert named_in_forward and not any(named_in_forward)
    named_in_forward.clear()
    as_they_run = tl.trace(model, x, save=tl.func("linear"))  # save= reads each op's label as it arrives
    assert any(named_in_forward)
    assert fields(at_end) == fields(as_they_run)
    assert at_end["add_1_3:4"].num_passes == 4 and at_end.audit()
