"""A gradient computed inside the traced forward (torch.autograd.grad, .backward()) is refused at capture.

Replay runs the recorded ops without autograd, so such a trace used to crash at replay (live, or loaded).
The capture now raises tl.UnsupportedError naming the call, and leaves nothing hooked.
"""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402

import torchlens as tl  # noqa: E402


class InnerStep(nn.Module):
    """One MAML-style inner step: the gradient of an inner loss adapts the weight."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        loss = (self.fc(x) ** 2).sum()
        (g,) = torch.autograd.grad(loss, self.fc.weight, create_graph=True)
        return x @ (self.fc.weight - 0.1 * g).t()


class Backward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        x = x.clone().requires_grad_()
        self.fc(x).pow(2).sum().backward()
        return x.grad * 2


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = InnerStep()

    def forward(self, x):
        return self.inner(x) + 1


def _registries():
    found = {name: getattr(nn_module, name) for name in dir(nn_module) if name.startswith("_global_")}
    return {name: dict(v) if isinstance(v, dict) else v for name, v in found.items()}


@pytest.mark.parametrize(
    "model, call", [(InnerStep(), "torch.autograd.grad"), (Backward(), "backward()"), (Outer(), "torch.autograd.grad")]
)
def test_refused_at_capture_naming_the_call(model, call):
    x = torch.randn(2, 4)
    model(x)  # the model itself runs
    before = _registries()
    with pytest.raises(tl.UnsupportedError, match=r"ran inside the traced forward") as info:
        tl.trace(model, x)
    assert call in str(info.value)
    assert "test_torch_autograd_in_forward.py" in str(info.value)  # the line of the model that made the call
    assert _registries() == before
    assert torch._C._len_torch_function_stack() == 0


def test_module_of_the_call_is_named():
    with pytest.raises(tl.UnsupportedError, match=r"in module 'inner'"):
        tl.trace(Outer(), torch.randn(2, 4))


def test_a_model_that_catches_the_refusal_is_still_refused():
    class Catching(InnerStep):
        def forward(self, x):
            try:
                return super().forward(x)
            except Exception:  # noqa: BLE001 - the model swallows errors: the capture must not
                return x.sum(-1, keepdim=True)

    with pytest.raises(tl.UnsupportedError, match="torch.autograd.grad"):
        tl.trace(Catching(), torch.randn(2, 4))


def test_gradients_outside_the_forward_still_work():
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    trace = tl.trace(model, x)
    assert torch.equal(trace.replay(x), model(x).detach())
