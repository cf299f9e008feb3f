"""Per-op gradients on Paddle, checked against Paddle's own: hooks on a hand-run forward's values, paddle.grad."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.records import GRAD_SAVED  # noqa: E402

nn = paddle.nn
F = paddle.nn.functional


def _within(got: np.ndarray, expected: np.ndarray, atol: float) -> bool:
    # float32 sums of large terms: the error scales with the largest gradient, not with each element
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    return got.shape == expected.shape and bool(np.all(np.abs(got - expected) <= atol * (1.0 + scale)))


def _close(got: Any, expected: Any, atol: float = 1e-5) -> bool:
    return got is not None and _within(np.asarray(got), np.asarray(expected), atol)


class Net(nn.Layer):
    """Linear, relu, a batch norm in training mode, a Python loop reusing tanh, split and topk, an in-place add."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.bn = nn.Linear(4, 6), nn.Linear(6, 3), nn.BatchNorm1D(6)

    def forward(self, x: Any, seen: dict[str, list[Any]] | None = None) -> Any:
        def keep(name: str, t: Any) -> Any:
            if seen is not None:  # the reference: a hook on the intermediate, placed by hand
                slot = len(seen.setdefault(name, []))
                seen[name].append(None)
                t.register_hook(lambda g: seen[name].__setitem__(slot, g.numpy()))
            return t

        h = keep("relu", F.relu(keep("linear", self.a(x))))
        h = keep("bn", self.bn(h))
        for _ in range(3):  # the loop the capture unrolls: each pass is its own op with its own gradient
            h = keep("mul", keep("tanh", paddle.tanh(h)) * 2.0)
        h = keep("scaled", h * 1.5)
        h.add_(paddle.ones_like(h))  # an in-place write after the hook: the hook saw the value before it
        keep("added", h)
        h.scale_(0.5)  # another: the add_ before it keeps the gradient of the value it wrote, twice this one's
        keep("halved", h)
        p, q = paddle.split(h, 2, axis=1)
        keep("split0", p)
        keep("split1", q)
        top, _ = paddle.topk(h, 2, axis=1)
        keep("topk", top)
        return keep("out", self.b(h) + (p * q).sum() + top.sum())


def _reference(model: Net, x: Any, loss: Any) -> tuple[dict[str, list[Any]], Any, dict[str, Any]]:
    seen: dict[str, list[Any]] = {}
    leaf = paddle.to_tensor(x.numpy(), stop_gradient=False)
    target = loss(model(leaf, seen))
    params = dict(model.named_parameters())
    grads = paddle.grad([target], [leaf, *params.values()], allow_unused=True)
    return seen, grads[0].numpy(), {name: g.numpy() for name, g in zip(params, grads[1:]) if g is not None}


def _only(log: Any, func_name: str) -> Any:
    (op,) = [op for op in log.ops if op.func_name == func_name]
    return op


def _loss(out: Any) -> Any:
    return (out * out).sum()


@pytest.fixture
def net() -> Net:
    paddle.seed(0)
    model = Net()
    model.train()
    return model


def test_every_op_s_gradient_matches_hooks_on_a_hand_run_forward(net: Net) -> None:
    x = paddle.randn([5, 4])
    log = tl.trace(net, x, save_grads=True)
    mean_before = net.bn._mean.numpy().copy()  # after the capture, which ran the model (in training mode)
    log.log_backward(_loss)
    assert np.array_equal(net.bn._mean.numpy(), mean_before)
    seen, x_grad, param_grads = _reference(net, x, _loss)

    assert _close(log["input_1"].grad, x_grad)
    assert _close(log["a"].grad, seen["linear"][0])  # a module's output gradient
    assert _close(_only(log, "relu").grad, seen["relu"][0])
    bn = _only(log, "batch_norm")
    assert _close(bn.grad[0], seen["bn"][0]) and bn.grad[1] is None  # its statistics feed no loss
    tanhs = [op for op in log.ops if op.func_name == "tanh"]
    muls = [op for op in log.ops if op.func_name == "mul"]
    assert len(tanhs) == 3
    for op, expected in zip(tanhs, seen["tanh"]):
        assert _close(op.grad, expected), op.label
    for op, expected in zip(muls, [*seen["mul"], *seen["scaled"]]):
        assert _close(op.grad, expected), op.label
    added, halved = _only(log, "add_"), _only(log, "scale_")
    assert _close(added.grad, seen["added"][0]) and _close(halved.grad, seen["halved"][0])
    assert _close(added.grad, 0.5 * np.asarray(halved.grad))
    split, topk = _only(log, "split"), _only(log, "topk")  # several outputs: the gradient has their structure
    assert _close(split.grad[0], seen["split0"][0]) and _close(split.grad[1], seen["split1"][0])
    assert _close(topk.grad[0], seen["topk"][0]) and topk.grad[1] is None  # integer indices have none
    assert _close(log.ops[log[log.output_layers[0]].index - 1].grad, seen["out"][0])
    for name, expected in param_grads.items():
        assert _close(log.params[name].grad, expected), name
    # the capture's model is untouched: no .grad, and the replay's batch norm updated copies of the statistics
    assert all(p.grad is None for p in net.parameters())
    assert log.params["bn._mean"].grad is None


def test_ones_like_made_outside_autograd_still_gets_its_gradient(net: Net) -> None:
    # paddle.ones_like gives a tensor with stop_gradient=True: the loss depends on it through add_ all the same
    x = paddle.randn([5, 4])
    log = tl.trace(net, x, save_grads=True)
    log.log_backward(_loss)
    ones = _only(log, "full_like")
    assert ones.grad_status == GRAD_SAVED
    assert _close(ones.grad, _only(log, "add_").grad)  # d(h + ones)/d(ones) is the identity


def test_a_write_through_a_view_warns_and_matches_paddle_s_own_gradient() -> None:
    # Paddle's autograd does not follow v[1:3].add_(y) into g: y gets no gradient from Paddle either. The replay
    # gives Paddle's answer, and warns, naming the write, rather than passing it off silently.
    def f(x: Any, y: Any) -> Any:
        g = x * 2
        v = g.reshape([8])
        v[1:3].add_(y[0])
        return g * x

    x = paddle.to_tensor(np.arange(8, dtype="float32").reshape([4, 2]) / 7)
    y = paddle.to_tensor(np.arange(8, dtype="float32").reshape([4, 2]) / 3 + 1)
    log = tl.trace(f, x, y, save_grads=True)
    with pytest.warns(UserWarning, match="does not follow a write through a view"):
        log.log_backward(lambda out: out.sum())
    xs, ys = paddle.to_tensor(x.numpy(), stop_gradient=False), paddle.to_tensor(y.numpy(), stop_gradient=False)
    x_grad, y_grad = paddle.grad([f(xs, ys).sum()], [xs, ys], allow_unused=True)
    assert y_grad is None and log["input_2"].grad is None
    assert _close(log["input_1"].grad, x_grad)


def test_no_warning_without_a_write_through_a_view(net: Net) -> None:
    log = tl.trace(net, paddle.randn([5, 4]), save_grads=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*write through a view")
        log.log_backward(_loss)
