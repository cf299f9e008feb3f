"""numpy plugin: a capture records only its own thread (np.random's draws are wrapped process-wide; Tracked
arrays record wherever they are used)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torchlens_numpy")
import numpy as np
from thread_checks import ROUNDS, beside_plain_calls, run_together, same_trace, same_value

import torchlens as tl

W = np.linspace(-1.0, 1.0, 64).reshape(8, 8)


def deep(x):
    for k in range(8):
        x = np.tanh(x @ W) + x * 0.5 + k
    return x.sum(axis=1)


def other(x):
    return np.maximum(x, 0.0).cumsum() / 3.0


def seeded(x):
    return x + np.random.normal(size=x.shape)


def _trace(fn, x):
    return tl.trace(fn, x, backend="numpy")


def _draws() -> tuple:
    return tuple(getattr(np.random, name) for name in ("normal", "rand", "randn", "uniform", "choice"))


X, Y = np.linspace(0.0, 1.0, 32).reshape(4, 8), np.linspace(-2.0, 2.0, 10)
REF = {"deep": _trace(deep, X), "other": _trace(other, Y)}


@pytest.mark.parametrize("pair", [("deep", "deep"), ("deep", "other")], ids=["same", "different"])
def test_two_threads_tracing(pair) -> None:
    fns, inputs = {"deep": deep, "other": other}, {"deep": X, "other": Y}
    before = _draws()
    for r in range(ROUNDS):
        a, b = run_together(
            lambda: _trace(fns[pair[0]], inputs[pair[0]]), lambda: _trace(fns[pair[1]], inputs[pair[1]])
        )
        same_trace(a, REF[pair[0]], np.asarray, f"round {r}")
        same_trace(b, REF[pair[1]], np.asarray, f"round {r}")
    assert _draws() == before


def test_draws_in_another_thread_are_not_recorded() -> None:
    """A capture holds np.random's draws wrapped: another thread's draws run as plain draws, unrecorded; a
    recorded draw replays exactly, or, when another thread's draw slipped in between, the capture is refused."""
    before = _draws()
    reference = _trace(seeded, X)
    for r in range(ROUNDS):
        try:
            trace, outs = beside_plain_calls(lambda: _trace(seeded, X), lambda: np.random.normal(size=3))
        except tl.CaptureError as refused:
            assert "another thread drew" in str(refused)
            continue
        assert [op.func_name for op in trace.ops] == [op.func_name for op in reference.ops], f"round {r}"
        assert trace.audit()  # the draw replays from the state recorded just before it
        assert all(type(out) is np.ndarray and out.shape == (3,) for out in outs)
    assert _draws() == before


def test_trace_beside_plain_calls() -> None:
    plain = deep(X)
    for r in range(ROUNDS):
        trace, outs = beside_plain_calls(lambda: _trace(deep, X), lambda: deep(X))
        same_trace(trace, REF["deep"], np.asarray, f"round {r}")
        for out in outs:
            same_value(out, plain, np.asarray, f"round {r}, plain call")


def test_a_tracked_array_used_in_another_thread_records_nothing() -> None:
    """The traced function hands its input to a worker thread: the worker's NumPy calls are not this capture's
    (they enter the trace as a constant where the function reads their result)."""

    def with_worker(x):
        box = {}
        worker = threading.Thread(target=lambda: box.update(y=np.exp(x) * 2.0))
        worker.start()
        worker.join()
        return x + box["y"]

    trace = _trace(with_worker, X)
    assert [op.func_name for op in trace.ops] == ["input", "add", "output"]
    same_value(trace.output, X + np.exp(X) * 2.0, np.asarray, "output")
    assert type(trace["add_1"].args[1]) is np.ndarray  # the worker's result, a constant
