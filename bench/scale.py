"""Every step on one model family at about 1k, 10k and 50k ops: seconds per 1k ops, which should stay flat.

    python bench/scale.py                          # 1k, 10k and 50k ops
    python bench/scale.py --sizes 1k 10k --out scale.json
    python bench/scale.py --sizes 1k 10k --calls   # also Python calls per 1k ops: a count load does not move
    python bench/scale.py --sizes 10k --steps summary find --profile --sort tottime  # cProfile of each step

The family is a Llama-style decoder (transformers' LlamaModel from a LlamaConfig: 16 wide, random weights),
as many layers as reach the op count (about 59 ops a layer). Each step is timed on its own, once, on the
same trace: tl.trace, summary(), to_dot(), tl.save, tl.load, audit(), replay(), tl.compare (two traces of
the same model), diverged (tl.compare of two traces that diverge from the first layer: the same input through
the same architecture with other weights, so values pair almost nothing and the structural step aligns nearly
every op), find(), to_pandas(). The last column of the table is the largest size's seconds per 1k ops
over the smallest's: linear time keeps it near 1 (goal: under 2). The table gives this process's CPU time
(wall-clock times are printed per size, and with the CPU times in --out's JSON): on shared cores a wall
clock measures the neighbours too. The machine's load average is printed with the figures. What is left
above 1 at 50k ops (summary, save) is Python's cyclic garbage collector: its full collections walk every
live object, and a 50k-op trace is a large heap (with ``gc.disable()`` both stay within 1.25x).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# One thread, set before torch is imported.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

STEPS = ("trace", "summary", "to_dot", "save", "load", "audit", "replay", "compare", "diverged", "find", "to_pandas")


def _size(text: str) -> int:
    """``"10k"`` -> 10000, ``"497"`` -> 497."""
    text = text.strip().lower()
    return int(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


def decoder(layers: int, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """A Llama-style decoder of ``layers`` layers, small and random (weights from ``seed``), with its input."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaModel(config).eval()
    return model, {"input_ids": torch.randint(0, config.vocab_size, (1, 8))}


def layers_for(target: int, ops_of: Callable[[int], int]) -> int:
    """The number of layers whose trace has about ``target`` ops (op count is linear in layers)."""
    one, two = ops_of(1), ops_of(2)
    per_layer, base = two - one, 2 * one - two
    return max(1, round((target - base) / per_layer))


def ops_of(layers: int) -> int:
    import torch

    import torchlens as tl

    model, kwargs = decoder(layers)
    with torch.no_grad():
        return len(tl.trace(model, **kwargs))


def measure(
    layers: int, steps: tuple[str, ...], profile: bool, sort: str = "cumulative", top: int = 15, calls: bool = False
) -> dict[str, Any]:
    """Each step's seconds on a decoder of ``layers`` layers (``profile``: print each step's cProfile;
    ``calls``: count each step's Python function calls, under cProfile)."""
    import torch

    import torchlens as tl

    t = time.perf_counter()
    model, kwargs = decoder(layers)
    build = time.perf_counter() - t
    seconds: dict[str, float] = {}  # wall clock
    cpu_seconds: dict[str, float] = {}  # this process's CPU time: what the table shows (shared cores inflate walls)
    counted: dict[str, int] = {}  # Python function calls: the same on any machine, whatever its load
    state: dict[str, Any] = {}
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        state["trace"] = tl.trace(model, **kwargs)  # the trace every other step reads (trace itself retimed below)
        path = Path(folder) / "trace"
        if "load" in steps and "save" not in steps:
            tl.save(state["trace"], path)
        if "compare" in steps:
            state["other"] = tl.trace(model, **kwargs)
        if "diverged" in steps:  # other weights, the same input: the values part at the embedding
            state["diverged"] = tl.trace(decoder(layers, seed=1)[0], **kwargs)
        run: dict[str, Callable[[], Any]] = {
            "trace": lambda: tl.trace(model, **kwargs),
            "summary": lambda: state["trace"].summary(),
            "to_dot": lambda: state["trace"].to_dot(),
            "save": lambda: tl.save(state["trace"], path),
            "load": lambda: tl.load(path),
            "audit": lambda: state["trace"].audit(),
            "replay": lambda: state["trace"].replay(),
            "compare": lambda: tl.compare(state["trace"], state["other"]),
            "diverged": lambda: tl.compare(state["trace"], state["diverged"]),
            "find": lambda: state["trace"].find(tl.func("linear") & tl.followed_by(tl.func("silu"))),
            "to_pandas": lambda: state["trace"].to_pandas(),
        }
        for step in STEPS:
            if step not in steps:
                continue
            gc.collect()  # each step pays for the garbage it makes, not for the step before's
            profiler = cProfile.Profile() if profile or calls else None
            t, cpu = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            result = run[step]()
            if profiler is not None:
                profiler.disable()
            seconds[step] = time.perf_counter() - t
            cpu_seconds[step] = time.process_time() - cpu
            if step == "audit" and not result:
                raise SystemExit(f"audit failed at {layers} layers:\n{result}")
            if profiler is not None:
                counted[step] = pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]
            if profile and profiler is not None:
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(top)
                print(f"--- {step} at {len(state['trace'])} ops ---\n{out.getvalue()}")
            del result
    return {
        "layers": layers,
        "ops": len(state["trace"]),
        "build_s": build,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "calls": counted,
    }


def table(rows: list[dict[str, Any]], steps: tuple[str, ...]) -> str:
    """CPU seconds per 1k ops, one line per step, one column per size, and the largest size's over the smallest's."""
    head = f"{'step':<10}" + "".join(f"{str(r['ops']) + ' ops':>14}" for r in rows) + f"{'ratio':>8}"
    lines = [f"CPU seconds per 1k ops (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})", head]
    for step in steps:
        per_k = [r["cpu_seconds"][step] / r["ops"] * 1000 for r in rows]
        ratio = f"{per_k[-1] / per_k[0]:8.2f}" if len(rows) > 1 and per_k[0] > 0 else f"{'-':>8}"
        lines.append(f"{step:<10}" + "".join(f"{v:14.4f}" for v in per_k) + ratio)
    lines.append(f"{'total s':<10}" + "".join(f"{sum(r['cpu_seconds'].values()):14.2f}" for r in rows))
    if all(r["calls"] for r in rows):  # --calls (times above then include cProfile's overhead)
        lines += ["Python function calls per 1k ops (--calls: times above include cProfile's overhead)", head]
        for step in steps:
            per_k = [r["calls"][step] / r["ops"] * 1000 for r in rows]
            lines.append(f"{step:<10}" + "".join(f"{v:14.0f}" for v in per_k) + f"{per_k[-1] / per_k[0]:8.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["1k", "10k", "50k"], help="op counts: 1k, 10k, 50k, 497")
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--profile", action="store_true", help="print each step's cProfile")
    parser.add_argument("--sort", default="cumulative", help="the profile's order: cumulative, tottime...")
    parser.add_argument("--top", type=int, default=15, help="lines of each profile")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="also count each step's Python function calls per 1k ops (a figure load does not move)",
    )
    parser.add_argument("--out", help="also write the figures as JSON here")
    options = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    steps = tuple(s for s in STEPS if s in options.steps)
    measure(1, steps, profile=False)  # warm-up: first calls import pandas, build caches...
    rows = []
    for size in sorted(_size(s) for s in options.sizes):
        row = measure(layers_for(size, ops_of), steps, options.profile, options.sort, options.top, options.calls)
        row["target"] = size
        print(
            f"{row['ops']} ops ({row['layers']} layers, built in {row['build_s']:.1f} s): "
            + ", ".join(f"{k} {v:.2f} s" for k, v in row["seconds"].items())
            + " (wall)",
            flush=True,
        )
        rows.append(row)
    print(table(rows, steps))
    if options.out:
        Path(options.out).write_text(
            json.dumps({"torch": torch.__version__, "load_average": os.getloadavg(), "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
