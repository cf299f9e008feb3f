"""Per-op gradients on torch: forward + backward with save_grads=True, as a ratio to a plain forward + backward.

    python bench/grads_torch.py --repeats 15

ResNet-18 (1x3x224x224, random weights, eval mode), one thread. Each round,
interleaved: a plain forward and ``loss.backward()``; the same with
``tl.trace(..., save_grads=True)`` and ``trace.log_backward(loss)`` (every
op's gradient kept); and with ``save_grads=tl.func("relu")``. Medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()

    import torch
    import torchvision

    import torchlens as tl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 224, 224)

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    def traced(save_grads: object) -> None:
        model.zero_grad(set_to_none=True)
        trace = tl.trace(model, x, save_grads=save_grads)
        trace.log_backward(trace.output.sum())

    runs = {
        "plain": plain,
        "save_grads=True": lambda: traced(True),
        "save_grads=func('relu')": lambda: traced(tl.func("relu")),
    }
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(options.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["plain"])
    print(
        f"torch {torch.__version__}, ResNet-18 forward + backward, 1 thread, median of {options.repeats} "
        f"interleaved runs"
    )
    for name, values in times.items():
        t = statistics.median(values)
        print(f"{name:<26} {t * 1e3:8.1f} ms  {t / base:.2f}x")


if __name__ == "__main__":
    main()
