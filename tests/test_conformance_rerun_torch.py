"""The module-outputs fallback: each module run alone on the inputs its pass recorded (torch's recorded inputs).

References are forward hooks on an untraced run, never the trace. The suite's
check is run with the torch observer hidden, as for a backend without module
hooks, and must fail when a module pass's recorded output is wrong.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from saving_checks import rehash  # noqa: E402
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.conformance import checks  # noqa: E402
from torchlens.conformance.rerun import module_at, rerun_module_outputs  # noqa: E402
from torchlens_core.backend.cases import Case  # noqa: E402
from torchlens_core.ir.records import Ref  # noqa: E402


class Scaled(nn.Module):
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
        return x * scale + shift


class KeywordsAndReuse(nn.Module):
    """A submodule called with keyword tensors and a float, another reused, and an in-place ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.scaled = Scaled()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc(x))
        s = torch.sigmoid(h)
        h = self.scaled(h, scale=s, shift=0.5)
        return self.fc(h)  # fc's second pass


class WritesItsKeyword(nn.Module):
    def forward(self, x: torch.Tensor, *, extra: torch.Tensor) -> torch.Tensor:
        extra.mul_(2)  # the keyword tensor no longer holds what the module received
        return x + extra


class HoldsWriter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = WritesItsKeyword()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, extra=x * 1.0)


def _hooked(model: nn.Module, x: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """Every submodule's outputs, per call, as forward hooks see them on an untraced run."""
    seen: dict[str, list[torch.Tensor]] = {}
    handles = [
        m.register_forward_hook(lambda mod, a, out, name=name: seen.setdefault(name, []).append(out.detach().clone()))
        for name, m in model.named_modules()
        if name
    ]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return seen


@pytest.mark.parametrize(
    "build",
    [
        lambda: (torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64)),
        lambda: (KeywordsAndReuse().eval(), torch.randn(3, 6)),
    ],
    ids=["resnet18", "keywords_reuse_inplace"],
)
def test_each_module_alone_gives_what_its_forward_hook_saw(build: Any) -> None:
    torch.manual_seed(0)
    model, x = build()
    hooked = _hooked(model, x)
    with torch.no_grad():
        trace = tl.trace(model, x)
    before = {op.label: op.out.clone() for op in trace.ops if isinstance(op.out, torch.Tensor)}
    with torch.no_grad():
        rerun = rerun_module_outputs("torch", model, trace)
    assert not rerun.not_run, rerun.not_run  # every pass of these models records its inputs
    expected = {f"{name}:{i + 1}": out for name, outs in hooked.items() for i, out in enumerate(outs)}
    assert set(rerun.outputs) == set(expected)
    for label, out in rerun.outputs.items():
        torch.testing.assert_close(out, expected[label], rtol=1e-5, atol=1e-6, msg=label)
    after = {op.label: op.out for op in trace.ops if isinstance(op.out, torch.Tensor)}
    assert all(torch.equal(after[k], v) for k, v in before.items()), "a rerun wrote into the trace's values"


def test_keyword_inputs_are_recorded_and_a_written_one_is_unknown() -> None:
    model = KeywordsAndReuse().eval()
    trace = tl.trace(model, torch.randn(3, 6))
    args, kwargs = trace.modules["scaled"].passes[0].in_template
    assert isinstance(args[0], Ref) and isinstance(kwargs["scale"], Ref) and kwargs["shift"] == 0.5
    assert trace.ops[kwargs["scale"].index].func_name == "sigmoid"
    writer = tl.trace(HoldsWriter(), torch.randn(2, 3))
    assert writer.modules["inner"].passes[0].in_template is None


def test_module_at_walks_attributes_indices_and_keys() -> None:
    model = nn.Sequential(nn.ModuleDict({"a": nn.ModuleList([nn.Linear(1, 1), nn.ReLU()])}))
    assert isinstance(module_at(model, "0.a.1"), nn.ReLU)
    assert module_at(model, "0.a.5") is None and module_at(model, "0.b") is None


class _NoObserver:
    """The backend with its module observer hidden, as for a backend that has none."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        if name == "observe_module_outputs":
            return lambda *args, **kwargs: None
        return getattr(self._real, name)


def _traced(model: nn.Module, x: torch.Tensor) -> checks.Traced:
    case = Case(name="rerun", build=lambda: (model, (x,), {}))
    with torch.no_grad():
        own = model(x)
        return checks.Traced("torch", case, model, (x,), {}, tl.trace(model, x), own)


def test_the_suite_falls_back_to_rerunning_modules_and_catches_a_wrong_module_output(monkeypatch) -> None:
    real = checks.backend_named
    monkeypatch.setattr(checks, "backend_named", lambda name: _NoObserver(real(name)))
    torch.manual_seed(0)
    traced = _traced(torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64))
    with torch.no_grad():
        checks.test_module_outputs(traced)  # passes: every module alone gives its recorded output
    wrong = traced.trace.modules["layer2.0.conv1"].passes[0]
    conv2 = traced.trace.modules["layer2.0.conv2"].passes[0]
    wrong.out_template = conv2.out_template  # a backend that tied the pass to the wrong op (same shape)
    with torch.no_grad(), pytest.raises(AssertionError, match="layer2.0.conv1:1"):
        checks.test_module_outputs(traced)


def test_without_recorded_inputs_or_an_observer_the_check_skips_saying_what_to_implement(monkeypatch) -> None:
    real = checks.backend_named
    monkeypatch.setattr(checks, "backend_named", lambda name: _NoObserver(real(name)))
    traced = _traced(nn.Sequential(nn.Linear(2, 2)), torch.randn(1, 2))
    traced.trace.modules["0"].passes[0].in_template = None
    with pytest.raises(pytest.skip.Exception, match="enter_module"):
        checks.test_module_outputs(traced)


def test_recorded_inputs_survive_saving_and_a_bad_reference_is_refused(tmp_path: pathlib.Path) -> None:
    model = KeywordsAndReuse().eval()
    x = torch.randn(3, 6)
    trace = tl.trace(model, x)
    folder = tl.save(trace, tmp_path / "t")
    loaded = tl.load(folder)
    for path in ("fc", "scaled", "act"):
        for original, again in zip(trace.modules[path].passes, loaded.modules[path].passes):
            assert original.in_template == again.in_template
    with torch.no_grad():
        alone = loaded.modules["scaled"].passes[0]
        args, kwargs = alone.inputs
        torch.testing.assert_close(model.scaled(*args, **kwargs), alone.out)
    records = json.loads((folder / "trace.json").read_text())
    module = next(m for m in records["modules"] if m["path"] == "scaled")
    text = json.dumps(module["inputs"]).replace('{"ref": [', '{"ref": [9999', 1)
    if text == json.dumps(module["inputs"]):
        pytest.fail(f"the test could not find a reference to corrupt in {text[:200]}")
    module["inputs"] = json.loads(text)
    (folder / "trace.json").write_text(json.dumps(records))
    rehash(folder)  # the hashes agree: only the reference is wrong
    with pytest.raises(tl.TraceFileError, match="module pass scaled:1's inputs refers to op 9999"):
        tl.load(folder)


class ValueSetsLength(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.abs().sum() * 1000) % 7 + 1  # a Python int read from the values sets the slice
        return x[:n] * 2


def test_replay_on_other_inputs_skips_when_replay_refuses_a_value_dependent_graph() -> None:
    torch.manual_seed(0)
    traced = _traced(ValueSetsLength(), torch.randn(16))
    with pytest.raises(pytest.skip.Exception, match="does not hold for other inputs"):
        checks.test_replay_on_other_inputs(traced)
    checks.test_replay_on_other_inputs(_traced(nn.Sequential(nn.Linear(3, 2), nn.ReLU()), torch.randn(2, 3)))
