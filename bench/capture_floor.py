"""What any full capture must pay before TorchLens records anything: the framework's own interception, and
keeping every value, as ratios to a plain forward.

    python bench/capture_floor.py --backend torch        # ResNet-18, GPT-2 small, ViT-tiny
    python bench/capture_floor.py --backend tf           # the TensorFlow rows of bench/backend_table.py

Interleaved in one process, one thread, medians:

- ``plain``: the model's own call.
- ``bare``: the interception a capture uses, doing nothing (torch: a ``TorchFunctionMode``; TensorFlow: an op
  callback, installed with ``op_callbacks.add_op_callback`` so that every eager path calls it).
- ``hold``: the same, keeping every op's output until the forward ends, as a full trace keeps its values
  (torch also copies the tensor an in-place op is about to overwrite, as the capture does).
- ``trace``: ``tl.trace``.

``trace`` minus ``hold`` is TorchLens's own cost; ``us/unit`` divides it by the units a recorder handles (ops
and module passes), the recorder's own cost per op; ``hold`` is the floor a capture that keeps every value cannot
go under (on a CPU, mostly the first touch of fresh memory: a plain forward reuses its allocator's blocks). The
``faults`` columns are the minor page faults of ``hold`` and ``trace`` (medians): each is a page of fresh memory
the kernel maps and zeroes. glibc gives freed memory back to the system (large blocks at once, the top of the heap
once it passes a threshold), so a capture repeated in a loop faults its values in again every time; run with
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967295`` in the environment to see the floor when
the process keeps what it freed (docs/performance.md).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from backend_table import MODELS, build_models


def torch_modes(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    import torch
    from torch.overrides import TorchFunctionMode

    class Bare(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
            return func(*a, **(k or {}))

    class Hold(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.kept: list[Any] = []

        def __torch_function__(self, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
            name = getattr(func, "__name__", "")
            # F.relu(x, inplace=True) reaches the mode as `relu` with the keyword (torchvision's ResNets)
            in_place = ((name.endswith("_") and not name.endswith("__")) or name in ("__iadd__", "__imul__")
                        or bool(k and k.get("inplace")))
            if in_place and a and isinstance(a[0], torch.Tensor):
                with torch._C.DisableTorchFunction():
                    self.kept.append(a[0].clone())
            out = func(*a, **(k or {}))
            self.kept.append(out)
            return out

    def under(mode: type) -> Callable[[], Any]:
        def run() -> Any:
            with mode() as active:
                model(*args, **kwargs)
            return active
        return run

    return {"bare": under(Bare), "hold": under(Hold)}


def tf_modes(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    from tensorflow.python.framework import op_callbacks

    def under(keep: bool) -> Callable[[], Any]:
        def run() -> Any:
            kept: list[Any] = []

            def callback(op_type: Any, inputs: Any, attrs: Any, outputs: Any, op_name: Any = None,
                         graph: Any = None) -> None:
                if keep:
                    kept.append(outputs)

            op_callbacks.add_op_callback(callback)
            try:
                model(*args, **kwargs)
            finally:
                op_callbacks.remove_op_callback(callback)
            return kept
        return run

    return {"bare": under(False), "hold": under(True)}


MODES = {"torch": torch_modes, "tf": tf_modes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", required=True, choices=sorted(MODES))
    parser.add_argument("--cases", nargs="*", help="models to measure instead of the backend's table rows")
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()
    names = options.cases or (["resnet18", "gpt2", "vit_tiny"] if options.backend == "torch"
                              else list(MODELS[options.backend]))
    if options.backend == "torch":
        import torch

        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
    print(f"{'model':24s} {'plain ms':>9s} {'bare':>6s} {'hold':>6s} {'trace':>6s} {'trace/hold':>10s} "
          f"{'units':>6s} {'us/unit':>8s} {'faults hold':>12s} {'faults trace':>12s}")
    for name, build in build_models(options.backend, names).items():
        built = build()
        plain, ratios, faults = measure(options.backend, *built, options.repeats)
        units = recorded_units(options.backend, *built)
        own = (ratios["trace"] - ratios["hold"]) * plain / units * 1e6
        print(f"{name:24s} {plain * 1e3:9.1f} " + " ".join(f"{ratios[m]:5.2f}x" for m in ("bare", "hold", "trace"))
              + f" {ratios['trace'] / ratios['hold']:9.2f}x {units:6d} {own:8.1f}"
              + f" {faults['hold']:12.0f} {faults['trace']:12.0f}", flush=True)


def recorded_units(backend: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """What the recorder handles in one capture: its ops and its module passes."""
    import torchlens as tl

    trace = tl.trace(model, *args, backend=backend, **kwargs)
    return sum(op.kind == "op" for op in trace.ops) + sum(len(m.passes) for m in trace.modules.values())


def measure(backend: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], repeats: int
            ) -> tuple[float, dict[str, float], dict[str, float]]:
    """The plain call's median seconds, each mode's median over it, and each mode's median minor page faults."""
    import torchlens as tl

    runs = {"plain": lambda: model(*args, **kwargs), **MODES[backend](model, args, kwargs),
            "trace": lambda: tl.trace(model, *args, backend=backend, **kwargs)}
    times: dict[str, list[float]] = {mode: [] for mode in runs}
    faults: dict[str, list[int]] = {mode: [] for mode in runs}
    for round_ in range(repeats + 3):  # three warm-up rounds
        for mode, run in runs.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            kept = run()
            elapsed = time.perf_counter() - start
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            del kept
            if round_ >= 3:
                times[mode].append(elapsed)
                faults[mode].append(faulted)
    plain = statistics.median(times["plain"])
    return (plain, {mode: statistics.median(t) / plain for mode, t in times.items()},
            {mode: statistics.median(f) for mode, f in faults.items()})

if __name__ == "__main__":
    main()
