"""Options that would reach the model, capture= with keywords, deprecated options, escape_detector="shadow"."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.capture import keywords  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError, UnsupportedError  # noqa: E402


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU()
        )

    def forward(self, x):
        return self.features(x)


class TakesAnything(torch.nn.Module):
    def forward(self, x, **extra):
        self.extra = extra
        return x + 1


@pytest.mark.parametrize(
    "typo, option",
    [("sav", "save"), ("hal", "halt"), ("save_grad", "save_grads"), ("intervention_redy", "intervention_ready")],
)
def test_a_misspelt_option_is_named_not_sent_to_the_model(typo, option):
    with pytest.raises(ArgumentTypeError, match=rf"{typo}= is not an option of tl\.trace.*{option}="):
        tl.trace(Small(), torch.randn(2, 4), **{typo: tl.func("relu")})


def test_an_option_of_trace_given_to_record_is_named():
    with pytest.raises(ArgumentTypeError, match=r"tl\.record does not take intervene="):
        tl.record(Small(), torch.randn(2, 4), intervene=tl.when(tl.func("relu"), tl.zero_ablate()))


def test_keywords_a_model_takes_still_reach_it():
    model = TakesAnything()
    tl.trace(model, torch.randn(2), sav=3)  # the model takes **extra: its business
    assert model.extra == {"sav": 3}
    with pytest.raises(TypeError, match="unexpected keyword"):  # far from every option: the model's own error
        tl.trace(Small(), torch.randn(2, 4), colour="red")


def test_capture_options_and_keywords_together():
    model, x = Small(), torch.randn(2, 4)
    both = tl.trace(model, x, capture=tl.options.CaptureOptions(save=tl.func("relu")), halt=tl.label("relu_1"))
    assert both.halted and [op.func_name for op in both.ops if op.saved and op.kind == "op"] == ["relu"]
    with pytest.raises(ArgumentTypeError, match="given twice"):
        tl.trace(model, x, capture=tl.options.CaptureOptions(save=tl.func("relu")), save=tl.func("linear"))
    same = tl.trace(model, x, capture=tl.options.CaptureOptions(save=tl.func("relu")), save=tl.func("relu"))
    assert [op.label for op in same.ops if op.saved] == [
        op.label for op in tl.trace(model, x, save=tl.func("relu")).ops if op.saved
    ]


def test_patch_policy_and_wrap_torch_are_accepted_and_say_so_once(monkeypatch):
    monkeypatch.setattr(keywords, "_warned", set())
    with pytest.warns(DeprecationWarning, match="patch_policy= is accepted and ignored"):
        traced = tl.trace(Small(), torch.randn(2, 4), patch_policy="all")
    assert traced.output.shape == (2, 8)
    from torchlens.backends.torch.wrappers import wrap_torch

    with pytest.warns(DeprecationWarning, match="does nothing"):
        wrap_torch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrap_torch()  # once
        tl.trace(Small(), torch.randn(2, 4), patch_policy="all")


class Escapes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4))

    def forward(self, x):
        y = self.lin(x)
        with torch._C.DisableTorchFunction():  # compute the function mode cannot see
            y = y * 2
        return torch.relu(self.inner(y))


def test_the_shadow_detector_reports_compute_outside_recorded_ops():
    model, x = Escapes(), torch.randn(2, 4)
    with pytest.warns(RuntimeWarning, match="1 kernel call"):
        traced = tl.trace(model, x, escape_detector="shadow")
    assert traced.notes["escapes"] == [
        {"kernel": "aten.mul.Tensor", "count": 1, "module": None, "after": traced["lin"].label}
    ]
    with torch.no_grad():
        assert torch.equal(traced.output, model(x))  # watching changes nothing


def test_the_shadow_detector_is_quiet_on_a_clean_model_with_in_place_ops_and_edits():
    torchvision = pytest.importorskip("torchvision")
    model, x = torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        traced = tl.trace(
            model,
            x,
            escape_detector="shadow",
            save=tl.module("layer1"),
            intervene=tl.when(tl.module("layer1"), tl.scale(0.5)),
        )
    assert traced.notes["escapes"] == []


def test_bad_escape_detector_values_are_refused():
    with pytest.raises(UnsupportedError, match="escape_detector"):
        tl.trace(Small(), torch.randn(2, 4), escape_detector="loud")
