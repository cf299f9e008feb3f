"""Where a repeat capture of a jitted JAX target spends its time, part by part (µs, medians).

    python bench/jax_capture_parts.py                      # linen_mlp eqx_mlp eqx_cnn nnx_cnn nnx_attention
    python bench/jax_capture_parts.py --cases linen_mlp --rounds 400

The jitted target is the one ``bench/capture_overhead.py`` measures (``nnx.jit`` of a function taking the
model, ``jax.jit(model.apply)``, ``eqx.filter_jit(model)``); from its second capture on, the capture cache
answers ``tl.trace`` of it (``torchlens_jax.capture_cache``). Each part runs on its own, all of them
interleaved round by round in one process, one thread:

- ``jit``: the jitted call itself, waited for;
- ``trace``: ``tl.trace`` of the target, in all;
- ``key``: ``cache_keys.probe``, flattening the arguments into the cache key;
- ``executable``: one call of the cached executable that returns every kept value, waited for;
- ``records``: ``capture_cache.answer`` less the executable: the new trace's records;
- ``remember``: ``rerun.remember``, the call kept for ``audit(untraced=True)``;
- ``rest``: ``trace`` less the parts above (options, plugin dispatch, the cache lookup).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from capture_overhead import builders, jitted_target

CASES = ["linen_mlp", "eqx_mlp", "eqx_cnn", "nnx_cnn", "nnx_attention"]


def parts(name: str, rounds: int) -> dict[str, float]:
    import jax

    import torchlens as tl
    from torchlens_core.capture.policy import CaptureOptions
    from torchlens_core.capture.rerun import remember
    from torchlens_jax import cache_keys, capture_cache

    model, args, kwargs = builders("jax", [name])[name]()
    target, targs = jitted_target(model, args)
    for _ in range(5):  # stored, compiled, answered
        jax.block_until_ready(target(*targs, **kwargs))
        trace = tl.trace(target, *targs, backend="jax", **kwargs)
    probe = cache_keys.probe(target, targs, kwargs, CaptureOptions())
    skeleton = capture_cache.lookup(probe) if probe is not None else None
    if skeleton is None or skeleton.compiled is None:
        raise SystemExit(f"{name}: the capture cache does not answer this target")
    executable_args = capture_cache.executable_args(probe, skeleton)
    runs: dict[str, Callable[[], Any]] = {
        "jit": lambda: jax.block_until_ready(target(*targs, **kwargs)),
        "trace": lambda: tl.trace(target, *targs, backend="jax", **kwargs),
        "key": lambda: cache_keys.probe(target, targs, kwargs, CaptureOptions()),
        "executable": lambda: skeleton.compiled.run(executable_args),
        "answer": lambda: capture_cache.answer(probe, skeleton),
        "remember": lambda: remember(target, targs, kwargs, trace),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for part, run in runs.items():
            start = time.perf_counter()
            run()
            times[part].append(time.perf_counter() - start)
    us = {part: statistics.median(t) * 1e6 for part, t in times.items()}
    us["records"] = us.pop("answer") - us["executable"]
    us["rest"] = us["trace"] - us["key"] - us["executable"] - us["records"] - us["remember"]
    us["ops"] = len(trace.ops)
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=CASES)
    parser.add_argument("--rounds", type=int, default=300)
    options = parser.parse_args()
    import jax

    columns = ["ops", "jit", "trace", "key", "executable", "records", "remember", "rest"]
    print(f"jax {jax.__version__}, 1 thread, medians of {options.rounds} interleaved rounds, µs")
    print(f"{'case':<16}" + "".join(f"{c:>12}" for c in columns))
    for name in options.cases:
        us = parts(name, options.rounds)
        print(f"{name:<16}" + "".join(f"{us[c]:>12.0f}" for c in columns), flush=True)


if __name__ == "__main__":
    main()
