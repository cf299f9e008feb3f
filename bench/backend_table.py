"""One backend's row of the all-backends table: capture, halt and memory ratios and the cost per op.

    python bench/backend_table.py --backend tf                 # its conv net and transformer-style block
    python bench/backend_table.py --backend torch --cases resnet18 --repeats 5

Run in that backend's own environment (``bench/all_backends.py`` runs it in each nox virtualenv); prints one
JSON line. For each model, plain call and captures run interleaved on one thread, median of ``--repeats``:

- capture ratio: a full ``tl.trace`` (every value kept) over the plain call;
- halt ratio: ``tl.trace(..., halt=tl.label(L))`` over the plain call, where ``L`` is the op a quarter of the
  way through a full trace's op list (input and output nodes left out); everything before it is kept;
- per-op cost: (capture time - plain time) / ops recorded;
- floor: the cheapest way the framework offers to keep every op's value without recording anything
  (``bench/capture_floor.py``'s ``hold``, interleaved with the rest), over the plain call; the recorder's own
  cost per unit is (capture time - floor time) / (ops + module passes);
- record ratio: ``tl.record`` (naming and linking deferred until the recording is read) over the plain call;
- patch ratio (backends that intervene): activation patching over the plain call, ``save=`` and
  ``intervene=tl.when(site, tl.swap_with(clean))`` on one module site, the module with the most ops among
  those ending in the middle half of the trace (a GPT-2 block; the row's ``patch_site`` names it);
- JAX also: the jitted call, and the capture of the jitted target (``nnx.jit``/``jax.jit``/``eqx.filter_jit``,
  answered by the capture cache on a repeat) over it;
- memory: peak memory a capture adds over the moment before it, minus the plain call's own peak measured the
  same way, over the bytes of the values the trace keeps (``extra/saved``, the goal's figure); ``peak/saved``
  is the capture's peak alone over the same bytes. How the peak is read depends on the framework: see
  ``MEMORY`` and docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# One thread everywhere, set before any framework is imported (capture_overhead sets the same on import).
for _var in (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
):
    os.environ.setdefault(_var, "1")

from capture_overhead import REFERENCE, Built, _block, _jitted, builders, jitted_target  # noqa: E402 - after the thread settings

# backend -> its models: a conv net and a transformer-style block at least. torch measures the reference models
# of capture_overhead.py (ResNet-18 at 224x224, GPT-2 small at 64 tokens, ViT-tiny at 224x224); the others, cases
# of their conformance zoo. JAX also measures the small models its jitted-target goal names (no batch repeat).
MODELS: dict[str, tuple[str, ...]] = {
    "torch": ("resnet18", "gpt2", "vit_tiny"),
    "jax": ("nnx_cnn", "nnx_attention", "linen_mlp", "eqx_cnn", "eqx_mlp"),
    "tf": ("resnet50", "multi_head_attention"),
    "paddle": ("resnet18", "transformer_encoder_layer"),
    "tinygrad": ("cnn_batchnorm", "transformer_block"),
}

# How each backend's peak memory is read on CPU (the only device this script measures).
MEMORY = {
    "paddle": "Paddle's host allocator statistics (host_memory_stat 'Allocated': peak reset before each run)",
    "rss": "process peak RSS (VmHWM, reset through /proc/self/clear_refs before each run) over the RSS just "
    "before; glibc set to give large blocks back (mmap threshold 64 KiB, malloc_trim before each run)",
}


# The zoo's inputs are a batch of two or so, which leaves kilobytes of values: too little for a page-granular
# memory figure, and a time dominated by the fixed cost per call. Those models run on their input repeated
# along the batch axis this many times.
BATCH_REPEAT: dict[str, int] = {
    "nnx_cnn": 256,
    "nnx_attention": 128,
    "cnn_batchnorm": 512,
    "transformer_block": 256,
    "transformer_encoder_layer": 512,
    "multi_head_attention": 128,
}


def build_models(backend: str, names: list[str]) -> dict[str, Callable[[], Built]]:
    reference = {n: REFERENCE[n] for n in names if backend == "torch" and n in REFERENCE}
    rest = [n for n in names if n not in reference]
    zoo = builders(backend, rest) if rest else {}
    return {**reference, **{n: _repeated(build, BATCH_REPEAT.get(n, 1)) for n, build in zoo.items()}}


def _repeated(build: Callable[[], Built], times: int) -> Callable[[], Built]:
    def built() -> Built:
        model, args, kwargs = build()
        return model, tuple(_repeat(a, times) for a in args), {k: _repeat(v, times) for k, v in kwargs.items()}

    return built if times > 1 else build


def _repeat(value: Any, times: int) -> Any:
    """``value`` repeated ``times`` times along its first axis, in its own framework; anything else as is."""
    if isinstance(value, (list, tuple)):  # a model called on a list of inputs (Keras's functional models)
        return type(value)(_repeat(v, times) for v in value)
    package = type(value).__module__.split(".")[0]
    if not hasattr(value, "shape") or not len(value.shape):
        return value
    if package in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp.concatenate([value] * times)
    if package in ("tensorflow", "keras"):
        import tensorflow as tf

        return tf.concat([value] * times, axis=0)
    if package == "paddle":
        import paddle

        return paddle.concat([value] * times)
    if package == "tinygrad":
        return value.cat(*[value] * (times - 1)).realize()
    if package == "numpy":
        import numpy as np

        return np.concatenate([value] * times)
    if package == "torch":
        import torch

        return torch.cat([value] * times)
    return value


def saved_bytes(trace: Any, backend: str) -> int:
    """Bytes of the values the trace keeps, each buffer once: torch by storage (a view costs nothing),
    elsewhere by array object, sized from the op's shape and dtype (a view another op's value shares memory
    with counts in full there, which lowers the ratios: see docs/performance.md)."""
    if backend == "torch":
        import torch

        storages: dict[int, int] = {}
        for op in trace.ops:
            for leaf in _leaves(op.out):
                if isinstance(leaf, torch.Tensor):
                    storage = leaf.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())
    seen: dict[int, int] = {}
    for op in trace.ops:
        if backend == "tf" and op.func_name == "read_variable":
            continue  # the variable's own buffer (TensorFlow shares it until the variable is assigned): no cost
        if op.saved and op.out is not None and op.num_bytes is not None:
            seen[id(op.out)] = op.num_bytes
    return sum(seen.values())


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


class PeakMeter:
    """Peak bytes a call adds over the moment before it: Paddle's allocator counter, else peak RSS."""

    def __init__(self, backend: str) -> None:
        self.paddle = None
        if backend == "paddle":
            from paddle.base import core

            self.paddle = core
            self.method = MEMORY["paddle"]
            return
        if not os.path.exists("/proc/self/clear_refs"):
            raise SystemExit("peak RSS is read from Linux's /proc/self (VmHWM); run the memory figures on Linux")
        self.method = MEMORY["rss"]
        self.libc = ctypes.CDLL("libc.so.6")
        # M_MMAP_THRESHOLD (-3): blocks over 64 KiB get their own mapping, unmapped on free, so RSS follows what
        # is alive instead of glibc's heap keeping freed activations for reuse (setting it stops the threshold
        # from growing with the largest block freed so far).
        self.libc.mallopt(-3, 64 * 1024)

    def measure(self, run: Callable[[], Any]) -> tuple[int, Any]:
        gc.collect()
        if self.paddle is not None:
            self.paddle.host_memory_stat_reset_peak_value("Allocated", 0)
            before = self.paddle.host_memory_stat_current_value("Allocated", 0)
            result = run()
            return self.paddle.host_memory_stat_peak_value("Allocated", 0) - before, result
        self.libc.malloc_trim(0)
        _free_tinygrad_cache()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = _status_kib("VmRSS")
        result = run()
        return (_status_kib("VmHWM") - before) * 1024, result


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _free_tinygrad_cache() -> None:
    """tinygrad's allocator keeps freed buffers for reuse; give them back so a run's peak is its own."""
    if "tinygrad" in sys.modules:
        from tinygrad import Device

        allocator = getattr(Device[Device.DEFAULT], "allocator", None)
        if hasattr(allocator, "free_cache"):
            allocator.free_cache()


def quarter_label(trace: Any) -> tuple[str, int]:
    """The op a quarter of the way through the trace's operations, and how many operations there are."""
    ops = [op for op in trace.ops if op.kind not in ("input", "output")]
    return ops[len(ops) // 4].label, len(ops)


def patch_site(trace: Any) -> str | None:
    """The module an activation-patching run patches: of the module calls ending in the middle half of the
    trace, the one with the most ops (the one ending nearest the middle among equals). None: no such call."""
    n = len(trace.ops)
    best: tuple[int, float, str] | None = None
    for path, module in trace.modules.items():
        if len(module.passes) != 1 or not module.passes[0].ops:
            continue
        ops = module.passes[0].ops
        end = max(trace[label].index for label in ops)
        if n / 4 <= end <= 3 * n / 4:
            key = (-len(ops), abs(end - n / 2), path)
            best = key if best is None or key < best else best
    return None if best is None else best[2]


# How a run is timed: wall time, as a user sees it; or the process's CPU time (every thread's, user and system),
# for a loaded machine, where time the process waits for a core is most of the wall time and moves every run.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def measure(
    backend: str, halts: bool, build: Callable[[], Built], repeats: int, patches: bool = False, clock: str = "wall"
) -> tuple[dict[str, Any], dict]:
    from capture_floor import MODES as FLOORS
    from capture_floor import in_turn, units

    import torchlens as tl

    model, args, kwargs = build()
    full = tl.trace(model, *args, backend=backend, **kwargs)
    at, num_ops = quarter_label(full)
    ops, passes = units(full)
    site = patch_site(full) if patches else None
    del full
    runs: dict[str, Callable[[], Any]] = {
        "plain": lambda: _block(model(*args, **kwargs)),
        "trace": lambda: tl.trace(model, *args, backend=backend, **kwargs),
    }
    if halts:
        runs["halt"] = lambda: tl.trace(model, *args, backend=backend, halt=tl.label(at), **kwargs)
    floors = FLOORS[backend](model, args, kwargs)  # every value kept, nothing recorded
    runs["hold"] = floors["hold"]
    if "least" in floors:  # torch, tf, paddle: the least any recorder of the graph does, one small record per op
        runs["least"] = floors["least"]
    # tl.record: the same capture with naming and linking deferred until the recording is read
    runs["record"] = lambda: tl.record(model, *args, backend=backend, **kwargs)
    if site is not None:  # activation patching: one module's output swapped for a clean run's
        selector = tl.module(site)
        clean = tl.trace(model, *args, backend=backend, save=selector, **kwargs)
        runs["patch"] = lambda: tl.trace(
            model, *args, backend=backend, save=selector, intervene=tl.when(selector, tl.swap_with(clean)), **kwargs
        )
    if backend == "jax":
        jitted = _jitted(model)
        runs["jit"] = lambda: _block(jitted(*args, **kwargs))
        # the capture of the jitted target a JAX user calls: repeat captures come from the capture cache
        target, targs = jitted_target(model, args)
        runs["jit_trace"] = lambda: tl.trace(target, *targs, backend=backend, **kwargs)
        runs["hold_jit"] = floors["hold_jit"]  # one executable returning every value: the jitted target's floor
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(3):  # warm-up: allocators, kernels, compilation caches (JAX's capture executable)
        for run in runs.values():
            run()
    now = CLOCKS[clock]
    for round_ in range(repeats):
        for name in in_turn(list(runs), round_):  # the plain call first, the others in turn
            run = runs[name]
            t0 = now()
            result = run()
            times[name].append(now() - t0)
            del result
    ms = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    row: dict[str, Any] = {
        "plain_ms": ms["plain"],
        "trace_ms": ms["trace"],
        "ratio": ms["trace"] / ms["plain"],
        "ops": num_ops,
        "per_op_us": (ms["trace"] - ms["plain"]) * 1e3 / num_ops,
        "halt_at": at if halts else None,
        "record_ms": ms["record"],
        "record_ratio": ms["record"] / ms["plain"],
        "floor_ms": ms["hold"],
        "floor_ratio": ms["hold"] / ms["plain"],
        "vs_floor": ms["trace"] / ms["hold"],
        "units": ops + passes,
        "unit_ops": ops,
        "passes": passes,
        "recorder_us": (ms["trace"] - ms["hold"]) * 1e3 / (ops + passes),
        "least_vs_floor": ms["least"] / ms["hold"] if "least" in ms else None,
        "least_ratio": ms["least"] / ms["plain"] if "least" in ms else None,
    }
    if site is not None:
        row.update(patch_site=site, patch_ms=ms["patch"], patch_ratio=ms["patch"] / ms["plain"])
    if halts:
        halted = runs["halt"]()
        kept = [op for op in halted.ops if op.kind not in ("input", "output")]
        if kept[-1].label != at:  # the figure would time some other cut
            raise SystemExit(f"halt=tl.label({at!r}) stopped at {kept[-1].label}")
        row.update(halt_ms=ms["halt"], halt_ratio=ms["halt"] / ms["plain"], halt_ops=len(kept))
    if backend == "jax":
        row.update(
            jit_ms=ms["jit"],
            vs_jit=ms["trace"] / ms["jit"],
            jit_trace_ms=ms["jit_trace"],
            jit_trace_vs_jit=ms["jit_trace"] / ms["jit"],
            jit_floor_ms=ms["hold_jit"],
            jit_floor_ratio=ms["hold_jit"] / ms["jit"],
        )
    return row, runs  # the memory figures come after every model's times (main)


def memory(backend: str, runs: dict[str, Callable[[], Any]], meter: PeakMeter, rounds: int = 3) -> dict[str, Any]:
    """Median over ``rounds`` of the plain call's peak and a full capture's peak (each over the moment before)."""
    plain: list[int] = []
    traced: list[int] = []
    saved = 0
    for _ in range(rounds):
        peak, _ = meter.measure(runs["plain"])
        plain.append(peak)
        peak, trace = meter.measure(runs["trace"])
        traced.append(peak)
        saved = saved_bytes(trace, backend)
        del trace
    p, t = statistics.median(plain), statistics.median(traced)
    return {
        "saved_mib": saved / 2**20,
        "plain_peak_mib": p / 2**20,
        "trace_peak_mib": t / 2**20,
        "memory_ratio": (t - p) / saved if saved else None,
        "peak_ratio": t / saved if saved else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", required=True, choices=sorted(MODELS))
    parser.add_argument("--cases", nargs="*", help="models to measure instead of MODELS[backend]")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time (default), or the process's CPU time on a loaded machine",
    )
    options = parser.parse_args()
    from torchlens_core.backend.manager import resolve_backend

    info = resolve_backend(options.backend)
    if info.name == "torch":
        import torch

        torch.set_num_threads(1)
    halts = "halt" in info.capabilities
    patches = "intervene" in info.capabilities
    grad_off = contextlib.nullcontext
    if info.name == "torch":
        import torch

        grad_off = torch.no_grad
    rows, runs = {}, {}
    with grad_off():
        for name, build in build_models(info.name, options.cases or list(MODELS[info.name])).items():
            rows[name], runs[name] = measure(info.name, halts, build, options.repeats, patches, options.clock)
        # Memory last: the peak meter tunes glibc's malloc for the whole process (mallopt cannot be undone), and
        # the times must be those of the process a user runs, where freed blocks are reused as glibc decides.
        meter = PeakMeter(info.name)
        for name in rows:
            rows[name].update(memory(info.name, runs[name], meter))
    print(
        json.dumps(
            {
                "backend": info.name,
                "framework": f"{info.framework} {info.framework_version}",
                "repeats": options.repeats,
                "clock": options.clock,
                "memory_method": meter.method,
                "halt": halts,
                "models": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
