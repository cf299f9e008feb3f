"""tinygrad: one capture at a time (Tensor's methods and layer classes' ``__call__`` are wrapped process-wide),
refused with a typed error; plain forwards in other threads, of the same model too, run untouched and unrecorded."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

tinygrad = pytest.importorskip("tinygrad")
if shutil.which("clang") is None and not os.environ.get("DEV"):
    pytest.skip("tinygrad's CPU device compiles its kernels with clang, not installed", allow_module_level=True)
from thread_checks import ROUNDS, raised, run_together, same_trace, same_value, whole_or_refused  # noqa: E402
from tinygrad import Tensor, TinyJit, nn  # noqa: E402
from tinygrad.engine.jit import _TinyJit  # noqa: E402
from tinygrad.helpers import Context  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_tinygrad.capture import metadata_cell  # noqa: E402


def _numpy(v):
    return v.numpy()


@pytest.fixture(autouse=True)
def _no_disk_cache():
    """tinygrad's kernel cache holds one sqlite connection, usable only by the thread that opened it: a kernel
    compiled in another thread fails, with or without TorchLens. These tests compile in several threads."""
    with Context(CACHELEVEL=0):
        yield


class Deep:
    def __init__(self) -> None:
        self.layers = [nn.Linear(8, 8) for _ in range(6)]
        self.norm = nn.LayerNorm(8)

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x).relu() + x
        return self.norm(x)


class Other:
    def __init__(self) -> None:
        self.fc = nn.Linear(5, 4)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc(x).tanh().sum(axis=1)


@pytest.fixture(scope="module")
def models():
    Tensor.manual_seed(0)
    deep, other = Deep(), Other()
    x, y = Tensor.randn(4, 8).realize(), Tensor.randn(3, 5).realize()
    plain = {"deep": deep(x).realize(), "other": other(y).realize()}
    return deep, other, x, y, plain, {"deep": tl.trace(deep, x), "other": tl.trace(other, y)}


def _state() -> tuple:
    attributes = {f"{k.__name__}.{n}": raw for k in Tensor.__mro__[:-1] for n, raw in vars(k).items()}
    cells = {name: cell.cell_contents for name, raw in vars(Tensor).items() if (cell := metadata_cell(raw))}
    return attributes, cells, vars(nn.Linear)["__call__"], vars(nn.LayerNorm)["__call__"], vars(_TinyJit)["__call__"]


def _assert_same_state(before: tuple) -> None:
    after = _state()
    for a, b in zip(after[:2], before[:2]):
        assert a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    assert all(a is b for a, b in zip(after[2:], before[2:]))


@pytest.mark.parametrize("pair", ["same", "different"])
def test_concurrent_captures_are_whole_or_refused(models, pair: str) -> None:
    deep, other, x, y, _, ref = models
    second, inp, key = (deep, x, "deep") if pair == "same" else (other, y, "other")
    before = _state()
    for r in range(ROUNDS):
        a, b = run_together(lambda: tl.trace(deep, x), lambda: tl.trace(second, inp))
        whole = [
            whole_or_refused(a, ref["deep"], _numpy, f"round {r}, first"),
            whole_or_refused(b, ref[key], _numpy, f"round {r}, second"),
        ]
        assert any(whole)
    _assert_same_state(before)


def test_a_capture_in_another_thread_is_refused_while_one_runs(models) -> None:
    """Deterministic overlap: the first capture waits inside its forward until the second thread is done."""
    deep, other, x, y, plain, ref = models
    inside, tried = threading.Event(), threading.Event()
    jitted = TinyJit(lambda v: (v * 2).realize())
    before = _state()

    class Waits:
        def __init__(self) -> None:
            self.deep = deep

        def __call__(self, v: Tensor) -> Tensor:
            out = self.deep(v)
            inside.set()
            assert tried.wait(60)
            return out

    def second():
        assert inside.wait(60)
        try:
            with pytest.raises(tl.UnsupportedError, match="another thread") as refused:
                tl.trace(other, y)
            # plain forwards of both models, and a TinyJit function, run as without a capture
            return refused.value, other(y).realize(), deep(x).realize(), [jitted(y).numpy() for _ in range(3)]
        finally:
            tried.set()

    results = run_together(lambda: tl.trace(Waits(), x), second)
    raised(results)
    trace, (refusal, other_out, deep_out, jitted_outs) = results
    assert "hold a lock" in str(refusal)
    same_value(other_out, plain["other"], _numpy, "plain forward of another model")
    same_value(deep_out, plain["deep"], _numpy, "plain forward of the traced model")
    for out in jitted_outs:
        same_value(out, y.numpy() * 2, lambda v: v, "TinyJit call in another thread")
    assert [op.func_name for op in trace.ops] == [op.func_name for op in ref["deep"].ops]
    assert trace.modules["deep.layers.0"].num_passes == 1
    _assert_same_state(before)


class Pausing:
    """Deep, pausing after each layer while another thread runs a plain forward of ``deep`` (its calls go
    through the wrappers then: they must pass straight through, unrecorded). tinygrad itself is not
    thread-safe, so the two threads take turns instead of overlapping."""

    def __init__(self, deep: Deep, plain_forward) -> None:
        self.deep, self.plain_forward = deep, plain_forward

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.deep.layers:
            x = layer(x).relu() + x
            self.plain_forward()
        return self.deep.norm(x)


def _take_turns(deep: Deep, x: Tensor) -> tuple[tl.Trace, list[Tensor]]:
    """Trace Pausing(deep) in one thread; at each pause, a plain forward of ``deep`` in another."""
    turn, done, outs = threading.Event(), threading.Event(), []

    def plain_forward() -> None:  # in the capturing thread: hand over, wait
        done.clear()
        turn.set()
        assert done.wait(30)

    def plain_thread() -> None:
        while len(outs) < len(deep.layers):
            assert turn.wait(30)
            turn.clear()
            try:
                outs.append(deep(x).realize())
            finally:
                done.set()

    results = run_together(lambda: tl.trace(Pausing(deep, plain_forward), x), plain_thread)
    raised(results)
    return results[0], outs


def test_plain_forwards_in_another_thread_during_a_capture(models) -> None:
    deep, _, x, _, plain, _ = models
    reference = tl.trace(Pausing(deep, lambda: None), x)
    before = _state()
    for r in range(ROUNDS // 4):
        trace, outs = _take_turns(deep, x)
        same_trace(trace, reference, _numpy, f"round {r}")
        assert len(outs) == len(deep.layers)
        for out in outs:
            same_value(out, plain["deep"], _numpy, f"round {r}, plain forward")
    _assert_same_state(before)


def test_another_thread_inside_a_layer_hides_nothing(models) -> None:
    """The other thread is inside a layer's __call__ when the capture calls the same layer: the capture
    still records that call as a pass of the layer."""
    _, _, x, _, _, _ = models
    installed, entered, release = threading.Event(), threading.Event(), threading.Event()

    class Gate:
        def __init__(self) -> None:
            self.fc = nn.Linear(8, 8)

        def __call__(self, v: Tensor, wait: bool = False) -> Tensor:
            if wait:  # the plain thread parks here, inside the call, doing no tinygrad work
                entered.set()
                assert release.wait(30)
                return v
            return self.fc(v).relu()

    class Net:
        def __init__(self) -> None:
            self.gate = Gate()

        def __call__(self, v: Tensor) -> Tensor:
            installed.set()  # the wrappers are in: the other thread's call goes through them
            assert entered.wait(30)
            return self.gate(self.gate(v))

    net = Net()

    def parked():
        try:
            assert installed.wait(30)
            return net.gate(x, wait=True)
        finally:
            entered.set()

    def capture():
        try:
            return tl.trace(net, x)
        finally:
            release.set()

    results = run_together(capture, parked)
    raised(results)
    trace = results[0]
    assert trace.modules["gate"].num_passes == 2
    assert trace.modules["gate.fc"].num_passes == 2
