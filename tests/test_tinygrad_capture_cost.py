"""tinygrad capture cost: recorded outputs are realized in batches, not one schedule per op (issue 17).

Each test checks what the batching must not change, against NumPy on the same weights (never against
TorchLens itself), and counts tinygrad's schedules, which is what the batching saves: no timings here.
"""

from __future__ import annotations

import os
import shutil
import weakref

import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
if shutil.which("clang") is None and not os.environ.get("DEV"):
    pytest.fail(
        "tinygrad's CPU device compiles its kernels with clang, which is not installed: "
        "apt-get install -y clang (or set DEV=PYTHON, 40-50x slower)",
        pytrace=False,
    )
import tinygrad.tensor as tinygrad_tensor  # noqa: E402
from tinygrad import Tensor, nn  # noqa: E402
from tinygrad.helpers import Context  # noqa: E402

import torchlens as tl  # noqa: E402


@pytest.fixture(autouse=True)
def _seed() -> None:
    Tensor.manual_seed(0)


@pytest.fixture
def schedules(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per schedule tinygrad runs (``Tensor.realize`` runs one per call that has work)."""
    runs: list[int] = []
    original = tinygrad_tensor.run_linear

    def counted(*args, **kwargs):
        runs.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tinygrad_tensor, "run_linear", counted)
    return runs


def _np(t: Tensor) -> np.ndarray:
    return t.numpy().copy()


class Stack:
    """Linear, ReLU, a scale and a second Linear: six ops that need computing, no writes."""

    def __init__(self) -> None:
        self.l1 = nn.Linear(4, 8)
        self.l2 = nn.Linear(8, 3)
        Tensor.realize(*nn.state.get_parameters(self))  # else capture realizes them first, a schedule of its own

    def __call__(self, x: Tensor) -> Tensor:
        h = self.l1(x).relu()
        return self.l2(h * 2 - 1).sigmoid()


def _stack_reference(model: Stack, x: Tensor) -> dict[str, np.ndarray]:
    """The Stack's intermediates in NumPy, from the same weights."""
    w1, b1, w2, b2, xs = (_np(t) for t in (model.l1.weight, model.l1.bias, model.l2.weight, model.l2.bias, x))
    linear1 = xs @ w1.T + b1
    relu = np.maximum(linear1, 0)
    linear2 = (relu * 2 - 1) @ w2.T + b2
    return {
        "linear_1": linear1,
        "relu_1": relu,
        "mul_1": relu * 2,
        "sub_1": relu * 2 - 1,
        "linear_2": linear2,
        "sigmoid_1": 1 / (1 + np.exp(-linear2)),
    }


def test_a_forward_without_writes_is_realized_in_one_schedule_with_every_value_right(schedules) -> None:
    model, x = Stack(), Tensor.randn(5, 4).realize()
    expected = _stack_reference(model, x)
    schedules.clear()
    trace = tl.trace(model, x)
    # one per op (six) before batching; parameters and input were realized already
    assert len(schedules) == 1
    for label, value in expected.items():
        assert np.allclose(_np(trace[label].out), value, atol=1e-5), label
    assert trace["l1"].out is trace["linear_1"].out
    assert trace.audit(untraced=True)


def test_values_recorded_before_a_write_are_computed_before_it_and_kept() -> None:
    def fn(x: Tensor) -> tuple[Tensor, Tensor]:
        h = x * 2  # still lazy when the write comes: computed first, then copied before it is written
        s = h.sum(axis=0)
        v = h.reshape(-1)  # a view of h: in a plain (lazy) run it keeps h's value from before the write
        h += 1
        return s + v[0], h * 1

    x = Tensor.randn(3, 4).realize()
    xs = _np(x)
    trace = tl.trace(fn, x)
    assert np.allclose(_np(trace["mul_1"].out), xs * 2, atol=1e-6)  # not the written value
    assert np.allclose(_np(trace["reshape_1"].out), (xs * 2).reshape(-1), atol=1e-6)
    assert np.allclose(_np(trace["add__1"].out), xs * 2 + 1, atol=1e-6)
    assert np.allclose(_np(trace.output[0]), (xs * 2).sum(axis=0) + xs[0, 0] * 2, atol=1e-5)
    assert np.allclose(_np(trace.output[1]), xs * 2 + 1, atol=1e-6)
    assert trace.audit()


def test_a_conversion_mid_forward_sees_the_values_recorded_before_it() -> None:
    def fn(x: Tensor) -> Tensor:
        h = (x * 3).exp()
        if h.sum().item() > 10:  # reads a value still pending: everything recorded is computed first
            return h.log()
        return h.neg()

    x = Tensor([1.0, 2.0]).realize()
    trace = tl.trace(fn, x)
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["mul", "exp", "sum", "log"]
    assert np.allclose(_np(trace["exp_1"].out), np.exp([3.0, 6.0]), rtol=1e-6)
    assert trace["log_1"].conditions == [trace["sum_1"].label]  # the branch it took, on the value that decided it
    assert np.allclose(_np(trace.output), [3.0, 6.0], rtol=1e-6)


def test_a_halt_computes_the_values_up_to_it_in_one_schedule_and_stops_the_forward(schedules) -> None:
    reached: list[str] = []

    class Halting(Stack):
        def __call__(self, x: Tensor) -> Tensor:
            h = self.l1(x).relu()
            reached.append("after relu")
            return self.l2(h * 2 - 1).sigmoid()

    model, x = Halting(), Tensor.randn(5, 4).realize()
    expected = _stack_reference(model, x)
    schedules.clear()
    halted = tl.trace(model, x, halt=tl.func("relu"))
    assert halted.halted and not reached  # the Python after the halted op never ran
    assert len(schedules) == 1
    assert [op.func_name for op in halted.ops if op.kind == "op"] == ["transpose", "linear", "relu"]
    for label in ("linear_1", "relu_1"):
        assert np.allclose(_np(halted[label].out), expected[label], atol=1e-5), label


def test_values_save_drops_are_not_kept_alive_by_the_batch() -> None:
    kept: list[weakref.ref] = []

    def fn(x: Tensor) -> Tensor:
        h = x + 1
        kept.append(weakref.ref(h))
        g = h * 2
        kept.append(weakref.ref(g))
        return g.relu()

    x = Tensor.randn(3, 3).realize()
    trace = tl.trace(fn, x, save=tl.func("relu"))
    assert [op.func_name for op in trace.ops if op.kind == "op" and op.out is not None] == ["relu"]
    assert all(ref() is None for ref in kept)  # dropped by save=: freed once the capture ends
    assert np.allclose(_np(trace.output), np.maximum((_np(x) + 1) * 2, 0), atol=1e-6)


def test_batched_ops_carry_no_elapsed_and_ops_realized_as_they_run_do() -> None:
    def fn(x: Tensor) -> Tensor:
        h = x * 2
        h += 1  # a write is realized as it runs, so its time is its own
        with Context(TRAINING=1):
            return h.dropout(0.5)  # a draw too

    trace = tl.trace(fn, Tensor.randn(4, 4).realize())
    elapsed = {op.func_name: op.elapsed for op in trace.ops if op.kind == "op"}
    assert elapsed["mul"] is None  # computed in a batch with others: no time of its own
    assert elapsed["add_"] is not None and elapsed["add_"] >= 0
    assert elapsed["dropout"] is not None and elapsed["dropout"] >= 0
    assert trace.audit()
