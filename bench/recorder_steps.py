"""The recorder's work counted, not timed: the Python bytecodes and calls a capture runs beyond the model's own.

    python bench/recorder_steps.py --backend torch --case vit_tiny
    python bench/recorder_steps.py --backend paddle --case resnet18 --top 30

A shared machine's timings move by a tenth from one minute to the next, more than most changes to the
recorder save; the steps a capture executes do not move at all (given ``PYTHONHASHSEED``). One capture and
one plain call run under ``sys.settrace`` with opcode events on (after warm-up: the caches a repeat capture
finds are filled); the difference is the Python the capture adds, printed per op and module pass, and the
functions it is spent in. Work done in C (the framework's kernels, ``dict`` and ``set`` calls) counts one
step a call, so the figures weigh Python work only: read them beside ``bench/recorder_parts.py``'s times.
docs/performance.md, "What the per-op cost consists of", has the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from backend_table import build_models  # noqa: E402 - after the thread settings
from capture_floor import units  # noqa: E402
from capture_overhead import _block  # noqa: E402


class Steps:
    """Bytecodes and calls executed by one call of ``run``, in all and per function (``file:function``)."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.opcodes: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        names: dict[Any, str] = {}

        def where(frame: FrameType) -> str:
            code = frame.f_code
            name = names.get(code)
            if name is None:
                name = names[code] = f"{os.path.basename(code.co_filename)}:{code.co_name}"
            return name

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                self.opcodes[where(frame)] += 1
            return local

        def start(frame: FrameType, event: str, arg: Any) -> Any:
            frame.f_trace_opcodes = True
            self.calls[where(frame)] += 1
            return local

        sys.settrace(start)
        try:
            run()
        finally:
            sys.settrace(None)

    def __sub__(self, other: Steps) -> tuple[Counter[str], Counter[str]]:
        opcodes, calls = Counter(self.opcodes), Counter(self.calls)
        opcodes.subtract(other.opcodes)
        calls.subtract(other.calls)
        return opcodes, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", required=True, choices=["torch", "tf", "paddle", "tinygrad", "jax"])
    parser.add_argument("--case", required=True, help="a model of bench/backend_table.py (or of the backend's zoo)")
    parser.add_argument("--top", type=int, default=20, help="functions to list, most steps first")
    options = parser.parse_args()
    if options.backend == "torch":
        import torch

        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
    import torchlens as tl

    model, args, kwargs = build_models(options.backend, [options.case])[options.case]()

    def plain() -> None:
        _block(model(*args, **kwargs))

    def capture() -> Any:
        return tl.trace(model, *args, backend=options.backend, **kwargs)

    for _ in range(3):  # warm-up: what a repeat capture finds cached (call sites, function tables)
        plain()
        trace = capture()
    ops, passes = units(trace)
    opcodes, calls = Steps(capture) - Steps(plain)
    total, called = sum(opcodes.values()), sum(calls.values())
    print(
        f"{options.backend} {options.case}: {ops} ops, {passes} module passes; the capture runs {total:,} Python "
        f"bytecodes and {called:,} Python calls beyond the plain call's: {total / (ops + passes):,.0f} bytecodes "
        f"and {called / (ops + passes):.1f} calls per op or pass"
    )
    for name, n in opcodes.most_common(options.top):
        print(f"  {name:60s} {n:9,d}  {n / total:6.1%}  {calls[name]:7,d} calls")


if __name__ == "__main__":
    main()
