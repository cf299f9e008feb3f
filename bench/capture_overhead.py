"""Full-capture time as a ratio to a plain forward (median of interleaved repeats, one thread).

    python bench/capture_overhead.py                                  # torch: ResNet-18, GPT-2 small, ViT-tiny
    python bench/capture_overhead.py --backend jax --cases nnx_cnn nnx_attention linen_mlp eqx_cnn

For JAX the table also gives the jitted call (``nnx.jit`` of a function taking the model, ``jax.jit`` of
linen's apply or a plain function, equinox's ``filter_jit``), the repeat capture of that jitted target ("jit
trace", answered by the capture cache: torchlens_jax.capture_cache), and the first capture of the model,
which runs its program eagerly; "trace ms" is a repeat capture of the model itself (not jitted: traced each
time, its values from the cached executable).

Without --cases, the torch backend measures the three reference models below;
any backend can measure cases of its own conformance zoo by name.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# One thread everywhere, set before any framework is imported.
for _var in (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

Built = tuple[Any, tuple[Any, ...], dict[str, Any]]


def resnet18() -> Built:
    import torch
    import torchvision

    return torchvision.models.resnet18(weights=None).eval(), (torch.rand(1, 3, 224, 224),), {}


def gpt2() -> Built:
    import torch
    import transformers

    config = transformers.GPT2Config()  # GPT-2 small: 12 layers, 768 wide, random weights
    model = transformers.GPT2Model(config).eval()
    return model, (), {"input_ids": torch.randint(0, config.vocab_size, (1, 64))}


def vit_tiny() -> Built:
    import torch
    from torchvision.models.vision_transformer import VisionTransformer

    # ViT-tiny (vit_b_16 is too big for this machine): 12 layers, 3 heads, 192 wide, random weights
    model = VisionTransformer(
        image_size=224, patch_size=16, num_layers=12, num_heads=3, hidden_dim=192, mlp_dim=768
    ).eval()
    return model, (torch.rand(1, 3, 224, 224),), {}


REFERENCE: dict[str, Callable[[], Built]] = {"resnet18": resnet18, "gpt2": gpt2, "vit_tiny": vit_tiny}


def builders(backend: str, names: list[str]) -> dict[str, Callable[[], Built]]:
    if not names:
        if backend != "torch":
            raise SystemExit(f"name the {backend} zoo cases to measure with --cases")
        return REFERENCE
    from torchlens_core.backend.manager import backend_named

    zoo = {case.name: case.build for case in backend_named(backend).conformance_cases() or []}
    missing = [n for n in names if n not in zoo]
    if missing:
        raise SystemExit(f"no {backend} zoo case {missing}; the zoo has: {', '.join(zoo)}")
    return {n: zoo[n] for n in names}


def measure(backend: str, build: Callable[[], Built], repeats: int) -> dict[str, float]:
    import torchlens as tl

    model, args, kwargs = build()
    plain: list[float] = []
    traced: list[float] = []
    for _ in range(3):  # warm-up: allocators, kernels, compilation caches
        model(*args, **kwargs)
        tl.trace(model, *args, backend=backend, **kwargs)
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(model(*args, **kwargs))
        t1 = time.perf_counter()
        trace = tl.trace(model, *args, backend=backend, **kwargs)
        t2 = time.perf_counter()
        plain.append(t1 - t0)
        traced.append(t2 - t1)
        del trace
    p, t = statistics.median(plain), statistics.median(traced)
    result = {"plain_ms": p * 1e3, "trace_ms": t * 1e3, "ratio": t / p}
    if backend == "jax":
        result.update(measure_jax(model, args, kwargs, repeats))
    return result


def measure_jax(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], repeats: int) -> dict[str, float]:
    """JAX: the jitted call of the same model (the *jitted target*: ``nnx.jit`` of a function taking the model,
    ``jax.jit`` of linen's apply or of a plain function, equinox's ``filter_jit`` of the model), the repeat
    capture of that jitted target (answered by the capture cache), interleaved with it, and the first capture
    of the model (compiled-executable cache empty) against the repeat."""
    import torchlens as tl
    from torchlens_jax import capture_cache, compiled

    target, targs = jitted_target(model, args)
    for _ in range(3):
        _block(target(*targs, **kwargs))
        tl.trace(target, *targs, backend="jax", **kwargs)
    fast: list[float] = []
    cached: list[float] = []
    first: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(target(*targs, **kwargs))
        t1 = time.perf_counter()
        trace = tl.trace(target, *targs, backend="jax", **kwargs)
        t2 = time.perf_counter()
        fast.append(t1 - t0)
        cached.append(t2 - t1)
    hit = trace.notes["capture"] == capture_cache.CAPTURE_NOTE
    del trace
    for _ in range(max(3, repeats // 5)):  # each one compiles: fewer
        compiled.CACHE.clear()
        t0 = time.perf_counter()
        tl.trace(model, *args, backend="jax", **kwargs)
        first.append(time.perf_counter() - t0)
    trace = tl.trace(model, *args, backend="jax", **kwargs)
    return {
        "jit_ms": statistics.median(fast) * 1e3,
        "first_ms": statistics.median(first) * 1e3,
        "cached_ms": statistics.median(cached) * 1e3 if hit else float("nan"),
        "path": "compiled" if "compiled" in trace.notes else "per-equation",
    }


def _jitted(model: Any) -> Callable[..., Any]:
    """``model`` jitted, called as the model is (bench/backend_table.py's jitted call)."""
    from torchlens_jax.modules import framework_of

    if framework_of(getattr(model, "__self__", model)) == "nnx" and not hasattr(model, "__self__"):
        from flax import nnx

        step = nnx.jit(lambda m, *a, **k: m(*a, **k))
        return lambda *a, **k: step(model, *a, **k)
    import equinox as eqx

    return eqx.filter_jit(model)  # arrays traced, everything else (flags, a linen apply's module) static


def jitted_target(model: Any, args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The jitted target a JAX user calls for ``model(*args)``, and its arguments."""
    import jax

    from torchlens_jax.jitted import unjitted
    from torchlens_jax.modules import framework_of

    model = unjitted(model)
    kind = framework_of(getattr(model, "__self__", model))
    if kind == "nnx" and not hasattr(model, "__self__"):
        from flax import nnx

        return nnx.jit(lambda m, *a, **k: m(*a, **k)), (model, *args)  # the model an argument: nnx.jit's way
    if kind == "equinox":
        import equinox as eqx

        return eqx.filter_jit(model), args  # arrays traced, everything else static
    return jax.jit(model), args  # linen's model.apply, a plain function


def _block(value: Any) -> None:
    """Wait for asynchronous (JAX) and lazy (tinygrad) frameworks to finish before the clock stops."""
    ready = getattr(value, "block_until_ready", None) or getattr(value, "realize", None)
    if ready is not None:
        ready()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--cases", nargs="*", default=[])
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()
    from torchlens_core.backend.manager import resolve_backend

    info = resolve_backend(options.backend)
    if info.name == "torch":
        import torch

        torch.set_num_threads(1)
    models = builders(info.name, options.cases)
    print(f"{info.name} {info.framework_version}, 1 thread, median of {options.repeats} interleaved runs")
    print(f"{'model':<24} {'plain ms':>10} {'trace ms':>10} {'ratio':>7}", end="")
    if info.name == "jax":  # against the jitted call too, the jitted target's repeat capture, the first capture
        print(
            f" {'jit ms':>8} {'vs jit':>7} {'jit trace':>10} {'vs jit':>7} {'first ms':>9} {'1st/jit':>8}  path", end=""
        )
    print()
    for name, build in models.items():
        if info.name == "torch":
            import torch

            with torch.no_grad():
                r = measure(info.name, build, options.repeats)
        else:
            r = measure(info.name, build, options.repeats)
        print(f"{name:<24} {r['plain_ms']:>10.1f} {r['trace_ms']:>10.1f} {r['ratio']:>6.2f}x", end="")
        if info.name == "jax":
            print(
                f" {r['jit_ms']:>8.2f} {r['trace_ms'] / r['jit_ms']:>6.1f}x {r['cached_ms']:>10.2f} "
                f"{r['cached_ms'] / r['jit_ms']:>6.2f}x {r['first_ms']:>9.1f} {r['first_ms'] / r['jit_ms']:>7.1f}x  "
                f"{r['path']}",
                end="",
            )
        print()


if __name__ == "__main__":
    main()
