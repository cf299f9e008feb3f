"""save= and halt= against a full trace and a plain forward: time ratio and bytes the trace holds.

python bench/selective_capture.py            # ResNet-18, 1x3x224x224, torch, one thread
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def held_bytes(trace: Any) -> int:
    """Bytes of the op values a trace keeps (inputs and outputs included)."""
    import torch

    seen: dict[int, int] = {}
    for op in trace.ops:
        leaves = op.out if isinstance(op.out, (tuple, list)) else [op.out]
        for t in leaves:
            if isinstance(t, torch.Tensor):
                seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def main(repeats: int = 15) -> None:
    import torch
    import torchvision

    import torchlens as tl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 224, 224)
    runs = {
        "plain forward": lambda: model(x),
        "full trace": lambda: tl.trace(model, x),
        "save=module('layer3')": lambda: tl.trace(model, x, save=tl.module("layer3")),
        "save=func('relu')": lambda: tl.trace(model, x, save=tl.func("relu")),
        "halt at layer1 (1/4)": lambda: tl.trace(model, x, save=tl.module("layer1"), halt=tl.module("layer1")),
        "pluck('layer1')": lambda: tl.pluck(model, x, "layer1"),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for run in runs.values():  # warm-up
            run()
        for _ in range(repeats):
            for name, run in runs.items():
                t0 = time.perf_counter()
                result = run()
                times[name].append(time.perf_counter() - t0)
                del result
        held = {
            name: held_bytes(run()) if name.startswith(("full", "save", "halt")) else None for name, run in runs.items()
        }
    plain = statistics.median(times["plain forward"])
    print(f"ResNet-18 1x3x224x224, torch {torch.__version__}, 1 thread, median of {repeats} interleaved runs")
    print(f"{'run':<24} {'ms':>8} {'vs plain':>9} {'values held':>12}")
    for name, ts in times.items():
        t = statistics.median(ts)
        mb = "" if held[name] is None else f"{held[name] / 2**20:.1f} MiB"
        print(f"{name:<24} {t * 1e3:>8.1f} {t / plain:>8.2f}x {mb:>12}")


if __name__ == "__main__":
    main()
