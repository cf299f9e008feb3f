"""tl.compat.report and tl.validate on real models."""

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import PartialCoverage, UnsupportedError  # noqa: E402


def _statuses(report):
    return {(row.area, row.check): row.status for row in report.rows}


def test_report_agrees_with_what_the_capture_does():
    torchvision = pytest.importorskip("torchvision")
    model, x = torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32)
    clean = tl.compat.report(model, x)
    assert clean.backend == "torch" and not clean.blocking
    assert _statuses(clean)[("framework", "torchvision")] == "pass"
    model.layer1 = torch.compile(model.layer1)
    assert _statuses(tl.compat.report(model, x))[("wrapper", "torch.compile")] == "pass"
    scripted = torch.jit.script(torch.nn.Linear(3, 3))
    report = tl.compat.report(scripted, torch.randn(3))
    (row,) = report.blocking
    with pytest.raises(UnsupportedError) as refused:
        tl.trace(scripted, torch.randn(3))
    assert row.reason == str(refused.value)  # the report says what the capture then says
    markdown = report.to_markdown()
    assert markdown.splitlines()[2] == "| area | check | status | reason |" and "known_broken" in markdown


def test_report_reads_inputs_parameters_and_devices():
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared, torch.nn.LazyLinear(2))
    report = tl.compat.report(model, torch.randn(4, 4).to_sparse())
    statuses = _statuses(report)
    assert statuses[("modules", "lazy modules")] == "scope"
    assert statuses[("inputs", "torch.sparse_coo tensors")] == "pass"
    assert statuses[("device", "cpu")] == "pass"
    meta = _statuses(tl.compat.report(torch.nn.Linear(2, 2), torch.randn(2, device="meta")))
    assert meta[("inputs", "meta tensors")] == "scope"
    tied = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    tied[1].weight = tied[0].weight
    assert _statuses(tl.compat.report(tied, torch.randn(3)))[("parameters", "sharing")] == "pass"
    frame = report.to_pandas()
    assert list(frame.columns) == ["area", "check", "status", "reason"] and len(frame) == len(report.rows)


def test_validate_passes_a_complete_trace_and_raises_for_each_kind_of_partial_one():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(2, 4)
    full = tl.validate(tl.trace(model, x), audit=True)
    assert full.complete and bool(full) is True
    halted = tl.validate(tl.trace(model, x, halt=tl.module("1")))
    assert [kind for kind, _ in halted.reasons] == ["halted"]
    with pytest.raises(PartialCoverage, match="halted"):
        bool(halted)
    saved = tl.validate(tl.trace(model, x, save=tl.func("relu")))
    assert saved.reasons[0][0] == "values" and "3 of 4 ops" not in saved.reasons[0][1]
    with pytest.raises(PartialCoverage):
        assert saved

    class Escapes(torch.nn.Module):
        def forward(self, x):
            with torch._C.DisableTorchFunction():
                x = x * 3
            return torch.relu(x)

    with pytest.warns(RuntimeWarning):
        escaped = tl.trace(Escapes(), x, escape_detector="shadow")
    assert [kind for kind, _ in tl.validate(escaped).reasons] == ["escapes"]
    broken = tl.trace(model, x)
    broken.ops[2].out = broken.ops[2].out + 1  # a value that no longer replays
    assert "audit" in {kind for kind, _ in tl.validate(broken, audit=True).reasons}
