"""paddle: one capture at a time (its wrappers replace process-wide attributes), refused with a typed error;
plain forwards in other threads, of the same model too, run untouched and unrecorded."""

from __future__ import annotations

import sys
import threading
import types

import pytest

paddle = pytest.importorskip("paddle")
from paddle import nn  # noqa: E402
from thread_checks import ROUNDS, beside_plain_calls, raised, run_together, same_trace, same_value, whole_or_refused  # noqa: E402

import torchlens as tl  # noqa: E402


def _numpy(v):
    return v.numpy()


class Deep(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.LayerList([nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Identity()) for _ in range(8)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) + x
        return x


class Other(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.bn = nn.BatchNorm1D(4)

    def forward(self, x):
        return paddle.tanh(self.bn(self.fc(x))).sum(axis=1)


@pytest.fixture(scope="module")
def models():
    paddle.seed(0)
    deep, other = Deep(), Other()
    deep.eval()
    other.eval()
    x, y = paddle.randn([4, 8]), paddle.randn([3, 5])
    plain = {"deep": deep(x), "other": other(y)}
    return deep, other, x, y, plain, {"deep": tl.trace(deep, x), "other": tl.trace(other, y)}


def _is_wrapper(value) -> bool:
    return isinstance(value, types.FunctionType) and value.__dict__.get("_torchlens_wrapper") is True


def _assert_nothing_installed(*layers) -> None:
    from torchlens_paddle.intercept import STATE

    assert STATE.recorder is None
    for name, module in list(sys.modules.items()):
        if name.startswith("paddle") and module is not None:
            assert not any(_is_wrapper(v) for v in list(vars(module).values())), name
    assert not any(_is_wrapper(v) for v in vars(paddle.Tensor).values())
    for layer in layers:
        for sub in layer.sublayers(include_self=True):
            assert not sub._forward_pre_hooks and not sub._forward_post_hooks


@pytest.mark.parametrize("pair", ["same", "different"])
def test_concurrent_captures_are_whole_or_refused(models, pair: str) -> None:
    deep, other, x, y, _, ref = models
    second, inp, key = (deep, x, "deep") if pair == "same" else (other, y, "other")
    for r in range(ROUNDS):
        a, b = run_together(lambda: tl.trace(deep, x), lambda: tl.trace(second, inp))
        whole = [
            whole_or_refused(a, ref["deep"], _numpy, f"round {r}, first"),
            whole_or_refused(b, ref[key], _numpy, f"round {r}, second"),
        ]
        assert any(whole)
    _assert_nothing_installed(deep, other)


def test_a_capture_in_another_thread_is_refused_while_one_runs(models) -> None:
    """Deterministic overlap: the first capture waits inside its forward until the second has been tried."""
    deep, other, x, y, plain, ref = models
    inside, tried = threading.Event(), threading.Event()

    class Waits(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.deep = deep

        def forward(self, v):
            out = self.deep(v)
            inside.set()
            assert tried.wait(60)
            return out

    def second():
        assert inside.wait(60)
        try:
            with pytest.raises(tl.UnsupportedError, match="another thread") as refused:
                tl.trace(other, y)
            return refused.value, other(y), deep(x)  # plain forwards of both models still run
        finally:
            tried.set()

    results = run_together(lambda: tl.trace(Waits(), x), second)
    raised(results)
    trace, (refusal, other_out, deep_out) = results
    assert "hold a lock" in str(refusal)
    same_value(other_out, plain["other"], _numpy, "plain forward of another model")
    same_value(deep_out, plain["deep"], _numpy, "plain forward of the traced model")
    assert [op.func_name for op in trace.ops] == [op.func_name for op in ref["deep"].ops]
    _assert_nothing_installed(deep, other)


@pytest.mark.parametrize("plain_model", ["same", "other"])
def test_trace_beside_plain_forwards(models, plain_model: str) -> None:
    deep, other, x, y, plain, ref = models
    model, inp, key = (deep, x, "deep") if plain_model == "same" else (other, y, "other")
    for r in range(ROUNDS):
        trace, outs = beside_plain_calls(lambda: tl.trace(deep, x), lambda: model(inp))
        same_trace(trace, ref["deep"], _numpy, f"round {r}")
        for out in outs:
            same_value(out, plain[key], _numpy, f"round {r}, plain forward")
    _assert_nothing_installed(deep, other)
