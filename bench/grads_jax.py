"""Per-op gradients on JAX: ``trace.log_backward`` (one jax.grad over the replayed graph) against jax.grad.

    python bench/grads_jax.py --repeats 15

The zoo's nnx CNN (2x8x8x1) and pre-norm attention block (2x5x16), random
weights, CPU, one thread. Each model is captured once with
``save_grads=True``; then each round, interleaved: ``trace.log_backward``
(every op's gradient, the inputs' and the parameters'); a plain eager
``jax.grad`` of the same function (the model rebuilt from its state, as the
capture runs it) with respect to the parameters and the input; and the same
``jax.jit(jax.grad(...))``, compiled before timing. Medians; ratios to the
eager jax.grad (the target: log_backward within 3x of it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()

    import jax

    from torchlens_jax import zoo

    print(f"jax {jax.__version__}, CPU, 1 thread, median of {options.repeats} interleaved runs")
    for build in (zoo.nnx_cnn, zoo.nnx_attention):
        measure(build, options.repeats)


def measure(build: Callable[[], Any], repeats: int) -> None:
    """Time the three ways to the gradients of one zoo model, interleaved, and print the medians."""
    import jax
    from flax import nnx

    import torchlens as tl

    model, (x,), _ = build()
    graphdef, state = nnx.split(model)

    def loss(state: Any, x: Any) -> Any:
        return (nnx.merge(graphdef, state)(x) ** 2).sum()

    eager = jax.grad(loss, argnums=(0, 1))
    compiled = jax.jit(eager)
    trace = tl.trace(model, x, save_grads=True)

    def replayed() -> None:
        trace.log_backward(lambda out: (out**2).sum())
        jax.block_until_ready([op.grad for op in trace.ops if op.grad is not None])

    runs = {
        "jax.grad": lambda: jax.block_until_ready(eager(state, x)),
        "jax.jit(jax.grad)": lambda: jax.block_until_ready(compiled(state, x)),
        "trace.log_backward": replayed,
    }
    for run in runs.values():  # warm: compile the jitted one, fill JAX's dispatch caches
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["jax.grad"])
    ops = sum(op.kind == "op" for op in trace.ops)
    print(f"{build.__name__} ({ops} ops, every one's gradient kept)")
    for name, values in times.items():
        t = statistics.median(values)
        print(f"  {name:<20} {t * 1e3:8.1f} ms  {t / base:.2f}x")


if __name__ == "__main__":
    main()
