"""The details of the user's examples (shared/seeds, issue 39) that ran otherwise on torch: each checked
against torch's own answer (a forward hook, the model's modules run directly, the module's attributes)."""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from saving_checks import rehash  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError  # noqa: E402


@pytest.fixture(scope="module")
def resnet() -> Any:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


@pytest.fixture(scope="module")
def alexnet() -> tuple[Any, Any, tl.Trace]:
    torch.manual_seed(0)
    model = torchvision.models.alexnet(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    return model, x, tl.trace(model, x)


def _hooked(model: Any, x: Any, edits: dict[str, Any] | None = None) -> tuple[Any, dict[str, list[Any]]]:
    """The model's output and every call's output of every module, as forward hooks see them (each hook's value
    copied when the call returns, as a trace keeps it); ``edits``: hooks that replace a module's output."""
    seen: dict[str, list[Any]] = {}
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(module: Any, args: Any, out: Any, name: str = name) -> Any:
            if edits and name in edits:
                out = edits[name](out)
            seen.setdefault(name, []).append(out.clone())
            return out if edits and name in edits else None

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            output = model(x)
    finally:
        for handle in handles:
            handle.remove()
    return output, seen


# -- 1. trace.rerun(model, x) (seed 002, section 5) ---------------------------------------------------------------
def test_rerun_is_a_fresh_trace_with_the_capture_options(resnet: Any) -> None:
    x, x2 = torch.rand(1, 3, 64, 64), torch.rand(1, 3, 64, 64)
    options = dict(save=tl.func("relu") | tl.module("layer3"), intervene=tl.when(tl.module("layer2"), tl.scale(0.5)))
    log = tl.trace(resnet, x, intervention_ready=True, **options)
    rerun = log.rerun(resnet, x2)
    # torch's answer: the same edit made by a forward hook that returns the scaled output
    expected, seen = _hooked(resnet, x2, {"layer2": lambda out: out * 0.5})
    assert torch.equal(rerun.output, expected)
    assert not torch.equal(rerun.output, resnet(x2))  # the edit was repeated, not dropped
    assert torch.equal(rerun["layer3"].out, seen["layer3"][-1])
    assert [e.site for e in rerun.interventions] == ["layer2:1"]
    assert rerun.notes.get("intervention_ready") is True
    fresh = tl.trace(resnet, x2, **options)  # save= repeated: the same values kept, and only those
    assert [op.label for op in rerun.ops if op.out is not None] == [op.label for op in fresh.ops if op.out is not None]
    assert all(op.func_name == "relu" or op.module_outputs for op in rerun.ops if op.kind == "op" and op.saved)
    # the original is left as it was
    assert torch.equal(log.output, _hooked(resnet, x, {"layer2": lambda out: out * 0.5})[0])


def test_rerun_of_a_plain_trace_equals_the_model(resnet: Any) -> None:
    x, x2 = torch.rand(1, 3, 64, 64), torch.rand(2, 3, 64, 64)
    log = tl.trace(resnet, x)
    rerun = log.rerun(resnet, x2)
    expected, seen = _hooked(resnet, x2)
    assert torch.equal(rerun.output, expected) and rerun.output.shape[0] == 2
    assert torch.equal(rerun["layer3"].out, seen["layer3"][-1])
    assert [op.label for op in rerun.ops] == [op.label for op in log.ops]


def test_rerun_of_a_loaded_trace_cannot_repeat_its_edits(resnet: Any, tmp_path: Any) -> None:
    x = torch.rand(1, 3, 64, 64)
    log = tl.trace(resnet, x, intervene=tl.when(tl.module("layer2"), tl.scale(0.5)))
    tl.save(log, tmp_path / "t")
    with pytest.raises(tl.UnsupportedError, match="cannot repeat them"):
        tl.load(tmp_path / "t").rerun(resnet, x)


# -- 2. every name of model.named_modules() is a key (seed 000, "Vary it") ------------------------------------------
def test_every_named_module_of_resnet18_resolves_to_what_a_hook_sees(resnet: Any) -> None:
    x = torch.rand(1, 3, 64, 64)
    trace = tl.trace(resnet, x)
    _, seen = _hooked(resnet, x)
    names = [name for name, _ in resnet.named_modules() if name]
    assert len(names) == 67
    reused = [name for name in names if len(seen[name]) > 1]
    assert reused == [f"layer{i}.{j}.relu" for i in range(1, 5) for j in range(2)]  # each BasicBlock's relu
    for name in names:
        node = trace[name]  # the seed's check, for every name: the value a forward hook holds after the forward
        assert torch.equal(node.out, seen[name][-1]), name
        assert name in trace
    for name in reused:
        assert trace[name] is trace[f"{name}:2"]  # the last call; each call by its pass
        assert torch.equal(trace[f"{name}:1"].out, seen[name][0])
        assert name in trace.keys_of(trace[name])


# -- 3. op.dtype == torch.float32 ---------------------------------------------------------------------------------
def test_dtype_equals_the_framework_dtype_and_its_name(resnet: Any, tmp_path: Any) -> None:
    x = torch.rand(1, 3, 32, 32)
    trace = tl.trace(resnet, x)
    op = trace["layer1"]
    assert op.dtype == torch.float32 and torch.float32 == op.dtype and op.dtype == op.out.dtype
    assert op.dtype != torch.float64 and not (op.dtype == torch.int64)
    assert op.dtype == "float32" and op.dtype != "torch.float32" and {"float32": 1}[op.dtype] == 1
    assert op.dtype == np.float32 and op.dtype == np.dtype("float32") and op.dtype != np.float16
    assert op.dtype != x and op.dtype != 32  # an array, a number: no dtype
    assert trace.params["conv1.weight"].dtype == resnet.conv1.weight.dtype
    assert type(pickle.loads(pickle.dumps(op.dtype))) is str
    wide = tl.trace(resnet.double(), x.double())
    try:
        assert all(o.dtype == torch.float64 and o.dtype != torch.float32 for o in wide.ops if o.kind == "op")
    finally:
        resnet.float()
    # saving keeps a plain str; the loaded trace compares the same way
    tl.save(trace, tmp_path / "t")
    records = json.loads(next(p for p in (tmp_path / "t").rglob("trace.json")).read_text())
    assert "float32" in json.dumps(records)
    loaded = tl.load(tmp_path / "t")
    assert loaded["layer1"].dtype == torch.float32 and loaded["layer1"].dtype == "float32"
    assert [o.dtype for o in loaded.ops] == [o.dtype for o in trace.ops]


# -- 4. the seed's spelling maxpool2d_2_6 (seed 002, section 3) ----------------------------------------------------
def test_label_with_the_function_name_squashed(alexnet: tuple[Any, Any, tl.Trace]) -> None:
    model, x, log = alexnet
    with torch.no_grad():
        expected = model.features[:6](x)  # torch's own answer: the features up to the second max pool
    assert log["maxpool2d_2_6"] is log["max_pool2d_2_6"]
    assert torch.equal(log["maxpool2d_2_6"].out, expected)
    assert log["maxpool2d_2"] is log["maxpool2d_2_6:1"] is log["max_pool2d_2_6"]
    assert "maxpool2d_2_6" in log and "maxpool2d_2_7" not in log
    with pytest.raises(tl.LabelNotFoundError, match="did you mean"):
        log["maxpool2d_2_7"]
    for key in ("relu_1_2", "features.6", "conv2d_3", "max_pool2d_2_6", "adaptive_avg_pool2d_1"):
        assert key in log  # the labels as they are still find what they found


# -- 5. Config in print(op) is the module's configuration (seed 002, section 3) -------------------------------------
def test_print_op_shows_the_module_configuration(alexnet: tuple[Any, Any, tl.Trace]) -> None:
    model, _, log = alexnet
    text = str(log["conv2d_3_7"])
    assert "    Config: out_channels=384, in_channels=192, kernel_size=(3, 3), padding=(1, 1)\n" in text  # the seed's
    conv = model.features[6]
    assert log.modules["features.6"].config == {
        "out_channels": conv.out_channels,
        "in_channels": conv.in_channels,
        "kernel_size": conv.kernel_size,
        "padding": conv.padding,
    }
    pool = model.features[5]
    assert log.modules["features.5"].config == {"kernel_size": pool.kernel_size, "stride": pool.stride}
    fc = model.classifier[1]
    assert log.modules["classifier.1"].config == {"out_features": fc.out_features, "in_features": fc.in_features}
    # an op no module returned (torch.flatten in AlexNet.forward) still shows its call's arguments
    flatten = next(op for op in log.ops if op.func_name == "flatten")
    assert not flatten.module_outputs and flatten.config
    assert "    Config: " + ", ".join(f"{k}={v!r}" for k, v in flatten.config.items()) in str(flatten)


def test_module_configuration_is_read_when_first_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading every module's configuration costs microseconds a module: a capture leaves it to print(op)."""
    from torchlens_torch import capture

    read: list[Any] = []
    real = capture.module_config
    monkeypatch.setattr(capture, "module_config", lambda module: read.append(module) or real(module))
    log = tl.trace(torchvision.models.alexnet(weights=None).eval(), torch.randn(1, 3, 64, 64))  # no model kept
    assert not read
    printed = str(log["conv2d_3_7"])
    assert "    Config: out_channels=384, in_channels=192, kernel_size=(3, 3), padding=(1, 1)\n" in printed
    assert [type(m).__name__ for m in read] == ["Conv2d"]  # the one module asked for, once
    str(log["conv2d_3_7"])
    assert len(read) == 1


def test_the_module_configuration_is_saved_and_loaded(alexnet: tuple[Any, Any, tl.Trace], tmp_path: Any) -> None:
    """A loaded trace prints the Config line the live one did, its tuples tuples again (format version 6)."""
    model, _, log = alexnet
    loaded = tl.load(tl.save(log, tmp_path / "alexnet"))
    conv = model.features[6]
    assert loaded.modules["features.6"].config == {
        "out_channels": conv.out_channels,
        "in_channels": conv.in_channels,
        "kernel_size": conv.kernel_size,
        "padding": conv.padding,
    }
    assert type(loaded.modules["features.6"].config["kernel_size"]) is tuple
    assert "    Config: out_channels=384, in_channels=192, kernel_size=(3, 3), padding=(1, 1)\n" in str(
        loaded["conv2d_3_7"]
    )
    assert {path: m.config for path, m in loaded.modules.items()} == {path: m.config for path, m in log.modules.items()}


@pytest.mark.parametrize(
    "config",
    [["kernel_size"], {"kernel_size": {"nested": 1}}, {"k": list(range(100))}, {"k" * 2000: 1}, {"k": "x" * 2000}],
)
def test_a_hostile_module_configuration_is_refused(alexnet: tuple[Any, Any, tl.Trace], tmp_path: Any, config) -> None:
    _, _, log = alexnet
    folder = tl.save(log, tmp_path / "alexnet")
    records = json.loads((folder / "trace.json").read_text())
    records["modules"][1]["config"] = config
    (folder / "trace.json").write_text(json.dumps(records))
    rehash(folder)  # the manifest agrees with the edited file: what is refused is the configuration itself
    with pytest.raises(tl.TraceFileError, match="module 1: config"):
        tl.load(folder)


# -- 6. draw(vis_nesting_depth=) is collapse= (seed 002, section 4) -------------------------------------------------
def test_vis_nesting_depth_is_collapse(alexnet: tuple[Any, Any, tl.Trace]) -> None:
    _, _, log = alexnet
    assert log.to_dot(vis_nesting_depth=1) == log.to_dot(collapse=1) != log.to_dot()
    assert log.to_dot(vis_nesting_depth=2, collapse=2) == log.to_dot(collapse=2)
    with pytest.raises(ArgumentTypeError, match="other name"):
        log.to_dot(vis_nesting_depth=1, collapse=2)
    with pytest.raises(ArgumentTypeError, match="other name"):
        log.draw(vis_nesting_depth=1, collapse="auto")
