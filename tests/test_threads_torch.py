"""torch: a capture records only its own thread (the global module hooks see every thread's forward)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from thread_checks import ROUNDS, beside_plain_calls, raised, run_together, same_trace, same_value  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402

import torchlens as tl  # noqa: E402


def _numpy(v):
    return v.detach().numpy()


class Deep(nn.Module):
    """Many small modules, nn.Identity among them (an output not computed inside: an identity op)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Identity()) for _ in range(10))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) + x
        return x


class Other(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3)
        self.bn = nn.BatchNorm1d(3)
        self.head = nn.Linear(3 * 6, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.bn(self.conv(x))).flatten(1))


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    deep, other = Deep().eval(), Other().eval()
    x, y = torch.randn(4, 8), torch.randn(4, 2, 8)
    with torch.no_grad():
        plain = {"deep": deep(x), "other": other(y)}
    return deep, other, x, y, plain, {"deep": tl.trace(deep, x), "other": tl.trace(other, y)}


def _hooks_state() -> tuple:
    return (
        dict(nn_module._global_forward_pre_hooks),
        dict(nn_module._global_forward_hooks),
        torch._C._len_torch_function_stack(),
    )


def test_two_threads_tracing_the_same_model(models) -> None:
    deep, _, x, _, _, ref = models
    before = _hooks_state()
    for r in range(ROUNDS):
        for trace in run_together(lambda: tl.trace(deep, x), lambda: tl.trace(deep, x)):
            same_trace(trace, ref["deep"], _numpy, f"round {r}")
    assert _hooks_state() == before


def test_two_threads_tracing_different_models(models) -> None:
    deep, other, x, y, _, ref = models
    for r in range(ROUNDS):
        a, b = run_together(lambda: tl.trace(deep, x), lambda: tl.trace(other, y))
        same_trace(a, ref["deep"], _numpy, f"round {r}, deep")
        same_trace(b, ref["other"], _numpy, f"round {r}, other")


@pytest.mark.parametrize("plain_model", ["same", "other"])
def test_trace_beside_plain_forwards(models, plain_model: str) -> None:
    deep, other, x, y, plain, ref = models
    model, inp, key = (deep, x, "deep") if plain_model == "same" else (other, y, "other")
    before = _hooks_state()
    for r in range(ROUNDS):
        trace, outs = beside_plain_calls(lambda: tl.trace(deep, x), lambda: model(inp))
        same_trace(trace, ref["deep"], _numpy, f"round {r}")
        for out in outs:  # never raised (CaptureError from another thread's hooks), never changed
            same_value(out, plain[key], _numpy, f"round {r}, plain forward")
    assert _hooks_state() == before


def test_audit_of_a_trace_taken_beside_other_threads(models) -> None:
    deep, other, x, y, _, _ = models
    results = run_together(lambda: tl.trace(deep, x), lambda: tl.trace(other, y), lambda: deep(x))
    raised(results)
    assert results[0].audit() and results[1].audit()


def test_an_error_in_one_thread_leaves_the_other_capture_whole(models) -> None:
    deep, _, x, _, _, ref = models

    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            raise RuntimeError("boom")

    before = _hooks_state()
    for r in range(5):
        trace, failed = run_together(lambda: tl.trace(deep, x), lambda: tl.trace(Boom(), x))
        assert isinstance(failed, RuntimeError)
        same_trace(trace, ref["deep"], _numpy, f"round {r}")
    assert _hooks_state() == before
