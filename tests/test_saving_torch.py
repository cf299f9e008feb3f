"""tl.save / tl.load on the torch backend: bfloat16, refused calls, loading without torch (zoo: conformance/)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from saving_checks import rehash  # noqa: E402

import torchlens as tl  # noqa: E402


def test_dtypes_devices_and_bfloat16_round_trip(tmp_path: pathlib.Path) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.to(torch.bfloat16) * 3
        return y.to(dtype=torch.float32, device=torch.device("cpu")).reshape(torch.Size([2, 2]))

    t = tl.trace(fn, torch.tensor([1.5, -2.0, 3.25, 1e20]))
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert loaded["mul_1"].out.dtype == torch.bfloat16
    assert torch.equal(loaded["mul_1"].out, t["mul_1"].out)
    assert torch.equal(loaded.replay(), t.output)
    assert loaded.audit()


def test_a_call_outside_torch_is_refused(tmp_path: pathlib.Path) -> None:
    t = tl.trace(lambda x: torch.relu(x) + 1, torch.ones(3))
    path = tl.save(t, tmp_path / "t")
    records = json.loads((path / "trace.json").read_text())
    for evil in (
        {"ns": "os", "name": "system"},
        {"ns": "torch", "name": "load"},
        {"ns": "torch", "name": "os"},
        {"ns": "torch.Tensor", "name": "__reduce_ex__"},
        {"ns": "torch", "name": "_load_global_deps"},
        {"ns": "torch", "name": "set_default_dtype"},
        {"ns": "torch", "name": "Generator"},
    ):
        records["ops"][1]["call"] = evil
        (path / "trace.json").write_text(json.dumps(records))
        rehash(path)
        with pytest.raises(tl.TraceFileError):
            tl.load(path)


def test_loads_without_torch_and_refuses_replay(tmp_path: pathlib.Path) -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None).eval()
    t = tl.trace(model, torch.randn(1, 3, 64, 64))
    path = tl.save(t, tmp_path / "resnet")
    expected = {
        "summary": t.summary(),
        "dot": t.to_dot(),
        "hash": tl.hash(t),
        "rows": [[str(v) for v in row] for row in t.to_pandas().drop(columns=["config"]).values.tolist()],
        "layer3": list(t["layer3"].out.shape),
    }
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    code = textwrap.dedent(f"""
        import json, sys
        sys.modules["torch"] = None  # import torch now fails, as if it were not installed
        import numpy as np
        import torchlens as tl
        loaded = tl.load({str(path)!r})
        expected = json.load(open({str(tmp_path / "expected.json")!r}))
        assert loaded.summary() == expected["summary"]
        assert loaded.to_dot() == expected["dot"]
        assert tl.hash(loaded) == expected["hash"]
        try:
            import pandas
        except ImportError:
            pass
        else:
            rows = loaded.to_pandas().drop(columns=["config"]).values.tolist()
            assert [[str(v) for v in row] for row in rows] == expected["rows"]
        out = loaded["layer3"].out
        assert isinstance(out, np.ndarray) and list(out.shape) == expected["layer3"]
        try:
            loaded.replay()
        except tl.UnsupportedError as exc:
            assert "torch is not importable" in str(exc), exc
        else:
            raise AssertionError("replay without torch should raise UnsupportedError")
        assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_seed_save_and_load_lines_run_as_written(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    import torchvision.models as models

    model = models.alexnet(weights=None)
    x = torch.randn(1, 3, 224, 224)
    log = tl.trace(model, x)

    tl.save(log, "my_trace")
    loaded = tl.load("my_trace")

    assert loaded.summary() == log.summary()
    assert loaded["relu_1_2"].out.shape == torch.Size([1, 64, 55, 55])
    assert torch.equal(loaded["features.6"].out, log["features.6"].out)
    assert loaded.audit()  # training mode: the dropouts replay with their saved RNG state
    assert (tmp_path / "my_trace" / "manifest.json").is_file()


def test_torchvision_operators_replay_after_load(tmp_path: pathlib.Path) -> None:
    # detection models call torch.ops.torchvision.nms / roi_align: operators of an allow-listed library whose
    # schemas write none of their arguments
    import torchvision

    def detect(boxes: torch.Tensor, scores: torch.Tensor, x: torch.Tensor, rois: torch.Tensor) -> tuple:
        return torchvision.ops.nms(boxes, scores, 0.5), torchvision.ops.roi_align(x, rois, (2, 2))

    torch.manual_seed(0)
    boxes = torch.rand(8, 4)
    boxes[:, 2:] += boxes[:, :2]
    args = (boxes, torch.rand(8), torch.randn(1, 3, 8, 8), torch.tensor([[0, 0.0, 0.0, 4.0, 4.0]]))
    loaded = tl.load(tl.save(tl.trace(detect, *args), tmp_path / "t"))
    assert not loaded.notes.get("not_replayable")
    for replayed, own in zip(loaded.replay(), detect(*args)):
        assert torch.equal(replayed, own)


@pytest.mark.parametrize("name, overload", [("add_", "Tensor"), ("copy_", "default"), ("no_such_op", "default")])
def test_dispatcher_ops_that_write_or_do_not_exist_are_not_loaded(
    tmp_path: pathlib.Path, name: str, overload: str
) -> None:
    x = torch.randn(3)
    folder = tl.save(tl.trace(lambda v: torch.ops.aten.relu.default(v), x), tmp_path / "t")
    assert torch.equal(tl.load(folder).replay(), torch.relu(x))  # an aten overload replays after loading
    records = json.loads((folder / "trace.json").read_text())
    op = next(o for o in records["ops"] if o.get("call"))
    assert op["call"] == {"ns": "torch.ops.aten", "name": "relu", "overload": "default"}
    op["call"].update(name=name, overload=overload)
    (folder / "trace.json").write_text(json.dumps(records))
    rehash(folder)
    if name == "no_such_op":  # not in this torch: loads, not replayable
        assert tl.load(folder).notes.get("not_replayable")
    else:
        with pytest.raises(tl.TraceFileError, match="writes into its arguments"):
            tl.load(folder)


@pytest.mark.parametrize(
    "forward",
    [
        lambda x: x + torch.zeros(1, dtype=int),  # a Python type where torch takes a dtype
        lambda x: (torch._check_tensor_all(x > -1), x * 2)[1],  # Tensor._is_all_true, an underscore ATen operator
    ],
    ids=["python_type_dtype", "underscore_aten_method"],
)
def test_calls_transformers_models_make_replay_after_load(tmp_path: pathlib.Path, forward) -> None:
    x = torch.ones(2)
    loaded = tl.load(tl.save(tl.trace(forward, x), tmp_path / "t"))
    assert not loaded.notes.get("not_replayable")
    assert torch.equal(loaded.replay(), forward(x))
