"""Per-op gradients on tinygrad, checked against tinygrad's own: Tensor.gradient at zeros added by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")

from tinygrad import Tensor, nn  # noqa: E402
from tinygrad.helpers import Context  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.records import (  # noqa: E402
    GRAD_NOT_DIFFERENTIABLE,
)


def _within(got: np.ndarray, expected: np.ndarray, atol: float) -> bool:
    # float32 sums of large terms: the error scales with the largest gradient, not with each element
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    return got.shape == expected.shape and bool(np.all(np.abs(got - expected) <= atol * (1.0 + scale)))


def _close(got: Any, expected: Any, atol: float = 1e-5) -> bool:
    if got is None:
        return False
    got = got.numpy() if isinstance(got, Tensor) else np.asarray(got)
    return _within(got, np.asarray(expected), atol)


class Net:
    """Linear, relu, batch norm in training mode, a Python loop reusing tanh, chunk and topk, an in-place add."""

    def __init__(self) -> None:
        self.a, self.b, self.bn = nn.Linear(4, 6), nn.Linear(6, 3), nn.BatchNorm(6)

    def __call__(self, x: Tensor, at: Any = None) -> Tensor:
        keep = at or (lambda name, t: t)
        h = keep("relu", keep("linear", self.a(x)).relu())
        h = keep("bn", self.bn(h))
        for _ in range(3):  # the loop the capture unrolls: each pass is its own op with its own gradient
            h = keep("mul", keep("tanh", h.tanh()) * 2)
        h = keep("scaled", h * 1.5)
        h += 1  # an in-place write: the op before it keeps the gradient of the value it produced
        h = keep("added", h)
        p, q = h.chunk(2, dim=1)
        p, q = keep("chunk0", p), keep("chunk1", q)
        top, _ = h.topk(2, dim=1)
        top = keep("topk", top)
        return keep("out", self.b(h) + (p * q).sum() + top.sum())


class _Zeros:
    """A zero buffer added by hand at each intermediate of a plain forward: its gradient is the one at that value."""

    def __init__(self) -> None:
        self.zeros: list[tuple[str, Tensor]] = []

    def __call__(self, name: str, t: Tensor) -> Tensor:
        zero = Tensor(np.zeros(t.shape, np.float32))
        self.zeros.append((name, zero))
        return t + zero


def _reference(model: Net, x: Tensor, loss: Any) -> tuple[dict[str, list[np.ndarray]], np.ndarray, dict[str, Any]]:
    zeros = _Zeros()
    leaf = Tensor(x.numpy())
    params = {
        "a.weight": model.a.weight,
        "a.bias": model.a.bias,
        "b.weight": model.b.weight,
        "b.bias": model.b.bias,
        "bn.weight": model.bn.weight,
        "bn.bias": model.bn.bias,
    }
    with Context(TRAINING=1):
        target = loss(model(leaf, zeros))
        grads = target.gradient(leaf, *params.values(), *(z for _, z in zeros.zeros))
    seen: dict[str, list[np.ndarray]] = {}
    for (name, _), grad in zip(zeros.zeros, grads[1 + len(params) :]):
        seen.setdefault(name, []).append(grad.numpy())
    return seen, grads[0].numpy(), {name: g.numpy() for name, g in zip(params, grads[1:])}


def _only(log: Any, func_name: str) -> Any:
    (op,) = [op for op in log.ops if op.func_name == func_name]
    return op


def _loss(out: Tensor) -> Tensor:
    return (out * out).sum()


@pytest.fixture
def net() -> Net:
    Tensor.manual_seed(0)
    return Net()


def test_every_op_s_gradient_matches_tinygrad_at_hand_cut_leaves(net: Net) -> None:
    x = Tensor.randn(5, 4).realize()
    x_before = x.numpy().copy()
    with Context(TRAINING=1):
        log = tl.trace(net, x, save_grads=True)
        mean_before = net.bn.running_mean.numpy().copy()  # after the capture, which ran the model
        log.log_backward(_loss)
    assert np.array_equal(net.bn.running_mean.numpy(), mean_before)  # the replay's statistics are its own
    assert np.array_equal(x.numpy(), x_before) and net.a.weight.grad is None and x.grad is None
    seen, x_grad, param_grads = _reference(net, x, _loss)

    assert _close(log["input_1"].grad, x_grad)
    assert _close(log["a"].grad, seen["linear"][0])  # a module's output gradient
    assert _close(_only(log, "relu").grad, seen["relu"][0])
    assert _close(_only(log, "batchnorm").grad, seen["bn"][0])
    tanhs = [op for op in log.ops if op.func_name == "tanh"]
    assert len(tanhs) == 3
    for op, expected in zip(tanhs, seen["tanh"]):
        assert _close(op.grad, expected), op.label
    scaled = [op for op in log.ops if op.func_name == "mul" and op.module is None and op.shape == (5, 6)]
    for op, expected in zip(scaled, [*seen["mul"], *seen["scaled"]], strict=True):
        assert _close(op.grad, expected), op.label
    float_adds = [op for op in log.ops if op.func_name == "add_" and op.dtype == "float32"]
    assert _close(float_adds[0].grad, seen["added"][0])
    chunk, topk = _only(log, "chunk"), _only(log, "topk")  # several outputs: the gradient has their structure
    assert _close(chunk.grad[0], seen["chunk0"][0]) and _close(chunk.grad[1], seen["chunk1"][0])
    assert _close(topk.grad[0], seen["topk"][0]) and topk.grad[1] is None  # integer indices have none
    assert _close(log.ops[-2].grad, seen["out"][0])
    for name, expected in param_grads.items():
        assert _close(log.params[name].grad, expected, atol=1e-4), name
    # the batch counter is an integer: no gradient; the running statistics feed no loss
    counter = [op for op in log.ops if op.func_name == "add_" and op.dtype != "float32"]
    assert counter and counter[0].grad is None and counter[0].grad_status == GRAD_NOT_DIFFERENTIABLE
    assert log.params["bn.running_mean"].grad is None


def test_a_function_with_shared_subexpressions_keeps_each_op_s_gradient_apart() -> None:
    # tinygrad merges identical graph nodes: the two x * 2 below are one node, but each op has its own gradient
    def f(x: Tensor) -> Tensor:
        a = x * 2
        b = x * 2
        return (a * 3 + b * b).sum()

    x = Tensor([[1.0, -2.0], [0.5, 4.0]]).realize()
    log = tl.trace(f, x, save_grads=True)
    log.log_backward(lambda out: out)
    first, second = [op for op in log.ops if op.func_name == "mul"][:2]
    assert _close(first.grad, np.full((2, 2), 3.0))  # d/da (3a) = 3
    assert _close(second.grad, 2 * 2 * x.numpy())  # d/db b^2 = 2b = 4x
    assert _close(log["input_1"].grad, 6 + 8 * x.numpy())  # closed form: d/dx (6x + 4x^2)
