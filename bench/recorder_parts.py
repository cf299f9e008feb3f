"""Where the recorder's own time goes, part by part: a capture's CPU time in each recorder function, per op.

    python bench/recorder_parts.py --backend torch --case vit_tiny
    python bench/recorder_parts.py --backend paddle --case resnet18

Each function below is wrapped, for this process only, by a timer of the thread's CPU time (``time.thread_time``:
the machine's other jobs do not count) that keeps its time exclusive of the wrapped functions it calls; the GC's
passes are timed by ``gc.callbacks``. Captures are interleaved with the plain call, the bare interception and the
floor (``bench/capture_floor.py``), medians of ``--repeats``. A timer costs about two microseconds a call, which
is measured and taken out of the total (part of it still lands in parts with many calls). The parts are the
framework-neutral recorder's (``torchlens_core.capture``) and, for torch and Paddle, the backend's own record
step and module-pass hooks; what is left is the interception's own Python and glue no timer covers.
docs/performance.md, "What the per-op cost consists of", has the figures.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
from collections import defaultdict
from collections.abc import Callable
from time import thread_time
from typing import Any

for _var in (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
):
    os.environ.setdefault(_var, "1")

from backend_table import build_models  # noqa: E402 - after the thread settings
from capture_floor import MODES, units  # noqa: E402
from capture_overhead import _block  # noqa: E402


class Timers:
    """Exclusive thread CPU time per part, for functions wrapped with :meth:`wrap`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[float] = []

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        stack, spent, calls = self.stack, self.spent, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            stack.append(0.0)
            start = thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                took = thread_time() - start
                inner = stack.pop()
                spent[part] += took - inner
                calls[part] += 1
                if stack:
                    stack[-1] += took

        timed.__name__ = getattr(fn, "__name__", part)
        return timed

    def patch(self, owner: Any, attr: str, part: str) -> None:
        setattr(owner, attr, self.wrap(part, getattr(owner, attr)))

    def clear(self) -> None:
        self.spent.clear()
        self.calls.clear()


PASSES = "module passes"


def instrument(backend: str, timers: Timers) -> None:
    from torchlens_core.capture import builder, passes, policy, recorder, sites

    timers.patch(recorder.Recorder, "template", "template of the arguments")
    timers.patch(recorder.Recorder, "constant", "template of the arguments")
    timers.patch(recorder.Recorder, "record", "the base recorder's record")
    timers.patch(recorder.Recorder, "produced", "producers, memory and version entries")
    timers.patch(recorder.Recorder, "protect", "copy-before-write (protect)")
    timers.patch(builder.TraceBuilder, "add_op", "the op record (add_op)")
    timers.patch(builder.TraceBuilder, "_check", "schema check (op_problem)")
    timers.patch(builder.LayerNamer, "name", "naming")
    timers.patch(policy.Policy, "recorded", "save=/halt= policy")
    timers.patch(sites.PassSites, "stack", "code context (call sites)")
    timers.patch(sites.CallSites, "stack", "code context (call sites)")
    timers.patch(passes.ModulePasses, "enter_pass", PASSES)
    timers.patch(passes.ModulePasses, "exit_pass", PASSES)
    timers.patch(builder.TraceBuilder, "finish", "finishing the trace (once)")
    if backend == "torch":
        from torchlens_torch import capture

        timers.patch(capture._Recorder, "_record", "describing the op + the backend's _record")
        timers.patch(capture._Recorder, "recorded", "recorded() (grad_fn name, save_grads)")
        timers.patch(capture._Recorder, "module_inputs", PASSES)
        timers.patch(capture, "_declare", "declaring the model (once)")
        pre, post = capture._Recorder.module_pre_hook, capture._Recorder.module_post_hook
        capture._Recorder.module_pre_hook = lambda self, paths: timers.wrap(PASSES, pre(self, paths))
        capture._Recorder.module_post_hook = lambda self, paths: timers.wrap(PASSES, post(self, paths))
    elif backend == "paddle":
        from torchlens_paddle import capture

        timers.patch(capture.Recorder, "_record", "describing the op + the backend's _record")
        timers.patch(capture, "_declare", "declaring the model (once)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", required=True, choices=sorted(MODES))
    parser.add_argument("--case", required=True, help="a model of bench/backend_table.py (or of the backend's zoo)")
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()
    if options.backend == "torch":
        import torch

        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
    import torchlens as tl

    model, args, kwargs = build_models(options.backend, [options.case])[options.case]()
    timers = Timers()
    instrument(options.backend, timers)
    in_gc = [0.0, 0.0]

    def gc_timer(phase: str, info: Any) -> None:
        if phase == "start":
            in_gc[1] = thread_time()
        else:
            in_gc[0] += thread_time() - in_gc[1]

    floor = MODES[options.backend](model, args, kwargs)
    others = {"plain": lambda: _block(model(*args, **kwargs)), "bare": floor["bare"], "hold": floor["hold"]}
    times: dict[str, list[float]] = defaultdict(list)
    parts: list[dict[str, float]] = []
    gc.callbacks.append(gc_timer)
    for round_ in range(options.repeats + 3):  # three warm-up rounds
        for name, run in others.items():
            start = thread_time()
            run()
            times[name].append(thread_time() - start)
        timers.clear()
        in_gc[0] = 0.0
        start = thread_time()
        trace = tl.trace(model, *args, backend=options.backend, **kwargs)
        times["trace"].append(thread_time() - start)
        parts.append({**timers.spent, "the GC's passes": in_gc[0]})
        if round_ < 3:
            for name in times:
                times[name].pop()
            parts.pop()
    gc.callbacks.remove(gc_timer)
    ops, passes = units(trace)
    calls = sum(timers.calls.values())
    overhead = _timer_cost(timers)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    capture = ms["trace"] - calls * overhead * 1e3
    print(
        f"{options.backend} {options.case}: {ops} ops, {passes} module passes; thread CPU ms, medians of "
        f"{options.repeats}: plain {ms['plain']:.1f}, bare interception {ms['bare']:.1f}, floor {ms['hold']:.1f}, "
        f"capture {capture:.1f} (timers taken out: {calls} calls x {overhead * 1e6:.2f} µs)"
    )
    print(
        f"recorder (capture - floor): {capture - ms['hold']:.1f} ms, "
        f"{(capture - ms['hold']) * 1e3 / (ops + passes):.0f} µs per op or pass"
    )
    rows = sorted(
        (
            (statistics.median(p.get(part, 0.0) for p in parts) * 1e3, part)
            for part in {part for p in parts for part in p}
        ),
        reverse=True,
    )
    for spent, part in rows:
        per, unit = (passes, "pass") if part == PASSES else (ops, "op")
        print(f"  {part:48s} {spent:7.2f} ms  {spent * 1e3 / per:6.1f} µs per {unit}")
    rest = capture - ms["hold"] - sum(spent for spent, _ in rows)
    print(f"  {'the rest (interception, glue no timer covers)':48s} {rest:7.2f} ms")


def _timer_cost(timers: Timers, n: int = 100_000) -> float:
    """Seconds of thread CPU time one timer adds to a call."""

    def nothing() -> None:
        pass

    wrapped = Timers().wrap("calibration", nothing)
    start = thread_time()
    for _ in range(n):
        nothing()
    middle = thread_time()
    for _ in range(n):
        wrapped()
    return max(0.0, ((thread_time() - middle) - (middle - start)) / n)


if __name__ == "__main__":
    main()
