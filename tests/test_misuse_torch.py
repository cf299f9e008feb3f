"""The commonest wrong calls of tl.trace get typed errors that say what to do, not a framework error 20 frames deep.

The references are the framework's own behaviour: the untraced call raises (so does the traced one, with the
framework's error as its cause), and a model that converts its input itself still traces.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import torchlens as tl  # noqa: E402


def test_a_model_class_instead_of_a_model_is_refused_before_anything_runs() -> None:
    built: list[object] = []

    class Counted(torch.nn.Linear):
        def __init__(self, *args: object, **kwargs: object) -> None:
            built.append(self)
            super().__init__(*args, **kwargs)

    for cls in (Counted, torchvision.models.ResNet):
        with pytest.raises(
            tl.ArgumentTypeError,
            match=rf"got the class .*{cls.__qualname__}, not a model: build "
            rf"the model first and pass it, tl.trace\({cls.__qualname__}",
        ):
            tl.trace(cls, torch.randn(1, 4))
    assert not built  # the class was never called


def test_a_numpy_input_to_a_torch_model_names_the_input_and_the_fix() -> None:
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), np.random.rand(1, 3, 32, 32).astype(np.float32)
    with pytest.raises(TypeError) as untraced:
        model(x)
    with pytest.raises(
        tl.ArgumentTypeError,
        match=r"with input 0 a numpy.ndarray of shape \(1, 3, 32, 32\), which "
        r"is not a torch array.*torch.as_tensor\(x\)",
    ) as traced:
        tl.trace(model, x)
    assert type(traced.value.__cause__) is type(untraced.value)  # the framework's own error, kept as the cause
    assert str(untraced.value).splitlines()[0][:80] in str(traced.value)
    with pytest.raises(tl.ArgumentTypeError, match="with keyword input 'x' a numpy.ndarray"):
        tl.trace(model, x=x)
    # nothing is left installed: the same model traces on a tensor, and equals its own call
    tensor = torch.as_tensor(x)
    with torch.no_grad():
        assert torch.equal(tl.trace(model, tensor).output, model(tensor))
    assert not threading.current_thread().name.startswith("torchlens")


def test_a_model_that_converts_its_input_itself_traces_and_its_own_errors_stay_its_own() -> None:
    class Converts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x: object) -> torch.Tensor:
            return self.fc(torch.as_tensor(x, dtype=torch.float32))

    model, x = Converts(), np.ones((2, 3), dtype=np.float32)
    with torch.no_grad():
        assert torch.equal(tl.trace(model, x).output, model(x))

    class Raises(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("the model's own complaint")

    with pytest.raises(ValueError, match="the model's own complaint") as raised:
        tl.trace(Raises(), torch.ones(2))  # its inputs are torch's: its error is passed on as it is
    assert not isinstance(raised.value, tl.ArgumentTypeError)
