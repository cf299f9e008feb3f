"""Full-capture time as a ratio to a plain forward (median of interleaved repeats, one thread)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def resnet18() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    import torch
    import torchvision

    return torchvision.models.resnet18(weights=None).eval(), (torch.rand(1, 3, 224, 224),), {}


def gpt2() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    import torch
    import transformers

    config = transformers.GPT2Config()  # GPT-2 small: 12 layers, 768 wide, random weights
    model = transformers.GPT2Model(config).eval()
    return model, (), {"input_ids": torch.randint(0, config.vocab_size, (1, 64))}


MODELS: dict[str, Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]] = {
    "resnet18": resnet18, "gpt2": gpt2}


def measure(name: str, repeats: int) -> dict[str, float]:
    import torch

    import torchlens as tl

    model, args, kwargs = MODELS[name]()
    plain: list[float] = []
    traced: list[float] = []
    with torch.no_grad():
        for _ in range(3):  # warm-up: allocator, kernels, TorchLens caches
            model(*args, **kwargs)
            tl.trace(model, *args, **kwargs)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(*args, **kwargs)
            t1 = time.perf_counter()
            trace = tl.trace(model, *args, **kwargs)
            t2 = time.perf_counter()
            plain.append(t1 - t0)
            traced.append(t2 - t1)
            del trace
    p, t = statistics.median(plain), statistics.median(traced)
    return {"plain_ms": p * 1e3, "trace_ms": t * 1e3, "ratio": t / p}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {options.repeats} interleaved runs")
    print(f"{'model':<10} {'plain ms':>10} {'trace ms':>10} {'ratio':>7}")
    for name in options.models:
        r = measure(name, options.repeats)
        print(f"{name:<10} {r['plain_ms']:>10.1f} {r['trace_ms']:>10.1f} {r['ratio']:>6.2f}x")


if __name__ == "__main__":
    main()
