"""The user's own examples (shared/seeds), run as written."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")


@needs_dot
def test_docs_page_example(capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    import torch
    import torchvision

    import torchlens as tl

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 224, 224)

    trace = tl.trace(model, x)

    drawing = trace.draw(collapse="auto", file_format="svg")
    block = trace["layer3"]
    print(block.out.shape)
    relu = next(op for op in trace.ops if op.func_name.startswith("relu"))
    print(relu.label, relu.func_name, tuple(relu.shape))

    print(trace.summary())
    print(trace.audit())

    seen = {}
    handle = model.layer3.register_forward_hook(lambda module, args, out: seen.update(out=out))
    model(x)
    handle.remove()
    assert torch.equal(trace["layer3"].out, seen["out"])
    assert torch.equal(trace.output, model(x))

    adds = [op.label for op in trace.ops if "add" in op.func_name]
    print(len(adds), "residual adds, none of them a module output:", adds[:2])
    trace.draw(module="layer2")

    out = capsys.readouterr().out
    assert "torch.Size([1, 256, 14, 14])" in out
    assert "relu_1_3 relu (1, 64, 112, 112)" in out
    assert "Audit: PASS" in out
    assert "8 residual adds" in out
    assert all(not trace[label].module_outputs for label in adds)
    assert (tmp_path / drawing).read_text().startswith("<?xml")
    assert len(list(tmp_path.iterdir())) == 2


@needs_dot
def test_readme_quickstart_and_recurrent_example(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    import torch
    import torchvision.models as models

    import torchlens as tl

    model = models.alexnet(weights=None)
    x = torch.randn(1, 3, 224, 224)

    log = tl.trace(model, x)
    text = log.summary()
    assert log["relu_1_2"].out.shape == torch.Size([1, 64, 55, 55])
    assert log["features.6"].out.shape == torch.Size([1, 384, 13, 13])
    assert log[7].func_name == "conv2d"
    assert log["conv2d_3"].out.shape == torch.Size([1, 384, 13, 13])
    assert log[-1].layer_label == "output_1"
    assert "Params: 61,100,840 unique; trainable: 61,100,840" in text
    assert "Ops: 22 total" in text and "Edges: 23 total" in text
    assert log.audit()  # AlexNet is in training mode: its dropouts replay with their RNG state
    log.draw()  # PDF of the computational graph
    log.draw(vis_mode="rolled")  # rolled (compact for recurrent)
    log.draw(vis_mode="unrolled")  # every pass as a distinct node

    class SimpleRecurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(in_features=5, out_features=5)

        def forward(self, x):
            for r in range(4):  # noqa: B007  (the seed, as written)
                x = self.fc(x)
                x = x + 1
                x = x * 2
            return x

    recurrent_model = SimpleRecurrent()
    seq = torch.randn(6, 5)
    recurrent_log = tl.trace(recurrent_model, seq)
    second = recurrent_log["linear_1:2"].out
    first = recurrent_log["linear_1:1"].out
    assert torch.allclose(second, recurrent_model.fc((first + 1) * 2))
    recurrent_log.draw(vis_mode="rolled")
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".pdf"] * 3


def test_readme_feature_extraction_block(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("zarr")
    monkeypatch.chdir(tmp_path)
    import torch
    import torchvision.models as models

    import torchlens as tl

    model = models.alexnet(weights=None)
    x = torch.randn(1, 3, 224, 224)

    # Save only relu activations
    log = tl.trace(model, x, save=tl.func("relu"))
    assert {op.func_name for op in log.ops if op.kind == "op" and op.out is not None} == {"relu"}

    # Save all ops inside the 'classifier' submodule
    log = tl.trace(model, x, save=tl.in_module("classifier"))
    assert all(op.module_passes[0][0] == "classifier" for op in log.ops if op.kind == "op" and op.out is not None)

    # Save conv2d ops that are immediately followed by a relu, keeping a 4-op lookback window
    conv_before_relu = tl.func("conv2d") & tl.followed_by(tl.func("relu"))
    log = tl.trace(model, x, save=conv_before_relu, lookback=4, lookback_payload_policy="detached_raw")
    assert sum(op.out is not None for op in log.ops if op.func_name == "conv2d") == 5

    # Stop capture early (can be faster than a plain forward pass)
    log = tl.trace(model, x, save=tl.in_module("features.6"), halt=tl.in_module("features.6"))
    assert log.halted and log.ops[-1].module == "features.6"

    # Lightweight sparse recording for tight loops -- materialize structure later
    recording = tl.record(model, x, save=tl.func("relu"))
    trace = recording.to_trace()
    assert trace["relu_1_2"].out is not None

    # One-line activation pull
    act = tl.pluck(model, x, "relu_1_2")  # returns tensor directly
    assert act.shape == torch.Size([1, 64, 55, 55])

    # Batch extraction across a dataset (any iterable of unbatched samples works)
    dataset = [torch.randn(3, 224, 224) for _ in range(8)]
    tl.extract_dataset(
        model, dataset, layers=["relu_1_2", "conv2d_3_7"], batch_size=32, output_dir="torchlens-activations/"
    )
    assert (tmp_path / "torchlens-activations").is_dir()


def test_readme_metadata_block(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pandas")
    import torch
    import torchvision.models as models

    import torchlens as tl

    model = models.alexnet(weights=None)
    x = torch.randn(1, 3, 224, 224)
    log = tl.trace(model, x)

    print(log["conv2d_3_7"])

    loc = log["conv2d_3_7"].code_context[0]
    print(loc.file, loc.line_number, loc.func_name)

    df = log.to_pandas()  # one row per op
    params_df = log.params.to_pandas()
    modules_df = log.modules.to_pandas()

    out = capsys.readouterr().out
    assert out.startswith("Layer conv2d_3_7, operation 7/22:\n")
    assert "Lookup keys: -17, 7, conv2d_3, conv2d_3:1, conv2d_3_7, conv2d_3_7:1, features.6, features.6:1" in out
    assert "    Config: out_channels=384, in_channels=192, kernel_size=(3, 3), padding=(1, 1)\n" in out  # as printed
    assert log["maxpool2d_2_6"].label == log["conv2d_3_7"].parents[0]  # the seed's name for the parent
    assert log["conv2d_3_7"].dtype == torch.float32  # the seed prints dtype=torch.float32
    assert loc.file == models.AlexNet.forward.__code__.co_filename and loc.func_name == "forward"
    assert out.splitlines()[-1] == f"{loc.file} {loc.line_number} forward"
    assert len(df) == 24 and len(params_df) == 16 and len(modules_df) == len(log.modules)
    assert "Forward FLOPs: 1.4 GFLOPs" in log.summary()


def test_readme_interventions_block() -> None:
    import torch
    import torchvision.models as models

    import torchlens as tl

    model = models.alexnet(weights=None)
    x = torch.randn(1, 3, 224, 224)

    # Zero-ablate all relu activations inline during capture
    ablated = tl.trace(model, x, save=tl.func("relu"), intervene=tl.when(tl.func("relu"), tl.zero_ablate()))
    assert ablated["relu_1_2"].out.abs().max() == 0  # tensor(0.)

    # Scale relus to 50%
    scaled = tl.trace(model, x, save=tl.func("relu"), intervene=tl.when(tl.func("relu"), tl.scale(0.5)))
    assert len(scaled.interventions) == 7

    # log.fork() + log.replay() / log.rerun(model, x), with intervention_ready=True
    log = tl.trace(model, x, intervention_ready=True)
    fork = log.fork().when(tl.func("relu"), tl.zero_ablate())
    torch.manual_seed(1)
    rerun = log.rerun(model, x)
    torch.manual_seed(1)  # AlexNet is in training mode: its dropouts draw the same masks again
    expected = model(x)
    assert torch.equal(rerun.output, expected) and rerun.notes["intervention_ready"]
    torch.manual_seed(1)
    assert fork.rerun(model, x)["relu_1_2"].out.abs().max() == 0

    clean_log = tl.trace(model, x, save=tl.func("relu"))
    patched_log = tl.trace(model, x, save=tl.func("relu"), intervene=tl.when(tl.func("relu"), tl.zero_ablate()))
    bundle = tl.bundle({"clean": clean_log, "patched": patched_log}, baseline="clean")
    assert "patched" in str(bundle.compare_at("relu_1_2"))  # one site; a multi-site selector must resolve uniquely
