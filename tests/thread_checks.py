"""Two threads at once: the harness every backend's thread tests share (tests/test_threads_<backend>.py).

A capture must record only the thread that started it: the other thread's
forward, traced or plain, runs untouched and unrecorded, and both traces equal
the trace the same call gives when it runs alone. ``threading.Barrier``
releases both threads together, so the two forwards really overlap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import torchlens as tl

ROUNDS = 20
_TIMEOUT = 120.0  # seconds: a deadlock fails the test instead of hanging the session


def run_together(*tasks: Callable[[], Any]) -> list[Any]:
    """Run each task in a thread of its own, released together; their results, or the exceptions they raised."""
    barrier = threading.Barrier(len(tasks))
    results: list[Any] = [None] * len(tasks)

    def runner(i: int) -> None:
        try:
            barrier.wait(timeout=_TIMEOUT)
            results[i] = tasks[i]()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test, which decides
            results[i] = exc

    threads = [threading.Thread(target=runner, args=(i,), daemon=True) for i in range(len(tasks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread did not finish: deadlock?"
    return results


def raised(results: list[Any]) -> None:
    """Raise the first exception a task raised."""
    for r in results:
        if isinstance(r, BaseException):
            raise r


def beside_plain_calls(trace_task: Callable[[], Any], plain_task: Callable[[], Any]) -> tuple[Any, list[Any]]:
    """Run ``trace_task`` in one thread while another runs ``plain_task`` over and over until it is done.

    Returns what ``trace_task`` returned and every ``plain_task`` result; an
    exception in either thread is raised.
    """
    done = threading.Event()

    def tracer() -> Any:
        try:
            return trace_task()
        finally:
            done.set()

    def plain() -> list[Any]:
        outs = [plain_task()]
        while not done.is_set():
            outs.append(plain_task())
        return outs

    results = run_together(tracer, plain)
    raised(results)
    return results[0], results[1]


def signature(trace: tl.Trace) -> tuple[Any, ...]:
    """Everything about a trace's graph that another thread must not change."""
    ops = [
        (
            op.label,
            op.func_name,
            tuple(op.parents),
            tuple(op.module_passes),
            tuple(op.params),
            op.shape,
            op.in_place,
            tuple(op.conditions),
        )
        for op in trace.ops
    ]
    modules = {path: [(p.pass_num, tuple(p.ops)) for p in m.passes] for path, m in trace.modules.items()}
    return len(trace.ops), ops, modules, sorted(trace.params)


def same_trace(trace: Any, reference: tl.Trace, to_numpy: Callable[[Any], np.ndarray], what: str) -> None:
    """``trace`` is a Trace with ``reference``'s graph and output (tight tolerance: the kernels run in other
    threads' company, which may split a reduction differently)."""
    if isinstance(trace, BaseException):
        raise trace
    assert isinstance(trace, tl.Trace), f"{what}: got {trace!r}"
    got, want = signature(trace), signature(reference)
    if got != want:
        extra = [op for op in got[1] if op not in want[1]]
        missing = [op for op in want[1] if op not in got[1]]
        raise AssertionError(f"{what}: {got[0]} ops instead of {want[0]}; extra {extra[:5]}, missing {missing[:5]}")
    same_value(trace.output, reference.output, to_numpy, what)


def same_value(got: Any, want: Any, to_numpy: Callable[[Any], np.ndarray], what: str) -> None:
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-5, atol=1e-6, err_msg=what)


def whole_or_refused(result: Any, reference: tl.Trace, to_numpy: Callable[[Any], np.ndarray], what: str) -> bool:
    """A trace equal to the reference (True), or the typed refusal (False); never a partial trace."""
    if isinstance(result, tl.UnsupportedError):
        assert "another thread" in str(result), result
        return False
    same_trace(result, reference, to_numpy, what)
    return True
