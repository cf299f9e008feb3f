"""save= keeps only selected values, halt= stops the forward early, tl.pluck returns one value."""

from __future__ import annotations

import pytest

import torchlens as tl

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def resnet() -> tuple:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval(), torch.rand(1, 3, 64, 64)


def saved(trace: tl.Trace) -> list[str]:
    return [op.label for op in trace.ops if op.kind == "op" and op.out is not None]


def test_save_module_keeps_only_its_output(resnet: tuple) -> None:
    model, x = resnet
    full = tl.trace(model, x)
    part = tl.trace(model, x, save=tl.module("layer3"))
    assert [op.label for op in part.ops] == [op.label for op in full.ops]  # every op's structure
    assert saved(part) == [full["layer3"].label]
    assert torch.equal(part["layer3"].out, full["layer3"].out)
    dropped = part["layer2"]
    assert dropped.out is None and dropped.saved is False and dropped.shape == full["layer2"].shape
    report = part.audit()
    assert report, str(report)
    assert torch.equal(part.output, model(x))


def test_save_func_and_followed_by() -> None:
    model = torchvision.models.alexnet(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    relus = tl.trace(model, x, save=tl.func("relu"))
    assert {relus[label].func_name for label in saved(relus)} == {"relu"} and len(saved(relus)) == 7
    convs = tl.trace(model, x, save=tl.func("conv2d") & tl.followed_by(tl.func("relu")))
    assert [convs[label].func_name for label in saved(convs)] == ["conv2d"] * 5
    assert convs.audit()


def test_saved_values_are_freed_during_capture(resnet: tuple) -> None:
    import weakref

    model, x = resnet
    refs: list = []

    def keep_refs(m, args, out):
        refs.append(weakref.ref(out))

    handle = model.layer1.register_forward_hook(keep_refs)
    try:
        with torch.no_grad():  # with autograd on, the output's graph would keep it alive
            trace = tl.trace(model, x, save=tl.module("layer3"))
    finally:
        handle.remove()
    assert refs and refs[0]() is None  # nothing of TorchLens holds layer1's output
    assert trace["layer1"].out is None


def test_halt_stops_the_forward(resnet: tuple) -> None:
    model, x = resnet
    ran: list[str] = []
    handle = model.fc.register_forward_hook(lambda m, a, o: ran.append("fc"))
    try:
        trace = tl.trace(model, x, save=tl.in_module("layer2"), halt=tl.in_module("layer2"))
    finally:
        handle.remove()
    assert trace.halted and trace.output is None and ran == []
    assert trace.ops[-1].module_passes[0] == ("layer2", 1)  # nothing after layer2 ran
    assert "layer3" not in {p for op in trace.ops for p, _ in op.module_passes}
    full = tl.trace(model, x)
    assert torch.equal(trace["layer2"].out, full["layer2"].out)
    report = trace.audit()
    assert report, str(report)
    assert "halted" in trace.notes


def test_halt_on_labels_and_first_match(resnet: tuple) -> None:
    model, x = resnet
    by_label = tl.trace(model, x, halt=tl.label("relu_1", "conv2d_3"))
    assert by_label.halted and by_label.ops[-1].label == by_label["conv2d_3"].label
    first = tl.trace(model, x, halt=tl.func("max_pool2d"))
    assert first.ops[-1].func_name == "max_pool2d"


def test_pluck(resnet: tuple) -> None:
    model, x = resnet
    full = tl.trace(model, x)
    assert torch.equal(tl.pluck(model, x, "relu_1_3"), full["relu_1_3"].out)
    assert torch.equal(tl.pluck(model, x, "layer2"), full["layer2"].out)
    with pytest.raises(TypeError, match="last positional argument"):
        tl.pluck(model, x)


def test_bad_options_are_typed_and_leave_nothing_behind(resnet: tuple) -> None:
    from torch.nn.modules import module as nn_module
    from torch.overrides import _get_current_function_mode_stack

    model, x = resnet
    with pytest.raises(TypeError, match="save= takes a selector"):
        tl.trace(model, x, save="relu")
    with pytest.raises(tl.UnsupportedError, match="halt= cannot use ~"):
        tl.trace(model, x, halt=~tl.func("relu"))
    tl.trace(model, x, halt=tl.in_module("layer1"))
    assert not _get_current_function_mode_stack()
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks


def test_seed_lookback_call_keeps_the_ops_before_each_pick() -> None:
    model = torchvision.models.alexnet(weights=None)
    x = torch.randn(1, 3, 224, 224)
    conv_before_relu = tl.func("conv2d") & tl.followed_by(tl.func("relu"))
    log = tl.trace(model, x, save=conv_before_relu, lookback=4, lookback_payload_policy="detached_raw")
    convs = [op for op in log.ops if op.func_name == "conv2d"]
    assert all(op.out is not None for op in convs)
    # conv 2 ran right after maxpool 1, relu 1, conv 1, input: those four are kept, detached
    second = convs[1].index
    window = [log.ops[i] for i in range(second - 4, second) if log.ops[i].kind == "op"]
    assert all(op.meta.get("lookback") for op in window)
    assert all(op.out is not None and op.out.grad_fn is None for op in window if op.func_name != "conv2d")
    far = [op for op in log.ops if op.kind == "op" and op.func_name == "linear"]
    assert all(op.out is None for op in far)  # nothing picked near the classifier
    metadata_only = tl.trace(model, x, save=conv_before_relu, lookback=4)
    assert [op.label for op in metadata_only.ops if op.out is not None and op.kind == "op"] == [
        op.label for op in convs
    ]
    assert all(metadata_only[op.label].meta.get("lookback") for op in window)
    with pytest.raises(tl.UnsupportedError, match="give save= too"):
        tl.trace(model, x, lookback=2)


def test_record_defers_naming_until_to_trace(resnet: tuple) -> None:
    model, x = resnet
    recording = tl.record(model, x, save=tl.func("relu"))
    assert isinstance(recording, tl.Recording) and "to_trace" in repr(recording)
    trace = recording.to_trace()
    assert trace is recording.to_trace()
    full = tl.trace(model, x)
    assert [op.label for op in trace.ops] == [op.label for op in full.ops]
    kept = [op for op in trace.ops if op.kind == "op" and op.out is not None]
    assert {op.func_name for op in kept} == {"relu"}
    assert torch.equal(trace["relu_1"].out, full["relu_1"].out)
    assert trace.audit()


def test_a_module_the_forward_never_called_is_named_as_such() -> None:
    """A selector naming a module the model holds but this forward did not call (a fused path, a branch not
    taken) says so, rather than offering the very path it was given as the closest match."""

    class SkipsOne(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.spare = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x).relu()

    model, x = SkipsOne(), torch.rand(2, 3)
    for options in ({"save": tl.module("spare")}, {"intervene": tl.when(tl.module("spare"), tl.zero_ablate())}):
        with pytest.raises(tl.LabelNotFoundError, match="'spare' belongs to the model but was never called") as caught:
            tl.trace(model, x, **options)
        assert "closest" not in str(caught.value)


def test_a_save_selector_that_picks_nothing_names_the_closest(resnet: tuple) -> None:
    model, x = resnet
    with pytest.raises(KeyError, match="rellu.*closest labels and module paths: .*relu"):
        tl.trace(model, x, save=tl.func("rellu"))
    with pytest.raises(KeyError, match="layer33"):
        tl.pluck(model, x, "layer33")
