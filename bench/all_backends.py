"""One table for every backend: capture, halt and memory ratios and the cost per op, as Markdown.

    python bench/all_backends.py                               # table printed, and written to a scratch file
    python bench/all_backends.py --out docs/performance-table.md --repeats 11

Each backend runs ``bench/backend_table.py`` in its own nox virtualenv (``.nox/<name>/bin/python``: TensorFlow
and Paddle cannot share a process); a backend whose virtualenv is missing, or whose run fails, gets a row
saying so. ``nox -s bench`` runs this after the torch scripts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
BACKENDS = ("torch", "jax", "tf", "paddle", "tinygrad")
# The goals of the capture-cost issue: capture ratio (torch's is stricter), halt at a quarter, memory.
CAPTURE_GOAL = {"torch": 1.2, "jax": 1.2}  # JAX: against the eager call; also <= 2x its jitted call
CAPTURE_GOAL_OTHERS = 1.3
HALT_GOAL = 0.35
MEMORY_GOAL = 1.10
PATCH_GOAL = {("torch", "gpt2"): 1.2}  # activation patching of one GPT-2 block (the steering issue, 14)


def run_backend(name: str, envs: pathlib.Path, repeats: int, timeout: float) -> dict[str, Any]:
    """backend_table.py's JSON for ``name``, or {"backend": name, "error": why there is none}."""
    python = envs / name / "bin" / "python"
    if not python.exists():
        return {"backend": name, "error": f"no virtualenv {python.parent.parent}: run `nox -s {name}` first"}
    command = [str(python), str(ROOT / "bench" / "backend_table.py"), "--backend", name, "--repeats", str(repeats)]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"backend": name, "error": f"backend_table.py ran past {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):  # frameworks print their own lines; the JSON is last
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"backend": name, "error": f"backend_table.py exited {done.returncode}: {tail}"}


def markdown(results: list[dict[str, Any]], repeats: int) -> str:
    when = datetime.date.today().isoformat()
    lines = [f"Measured {when} on {platform.machine()} Linux, {os.cpu_count()} CPU cores (shared), one thread, "
             f"median of {repeats} interleaved runs (`python bench/all_backends.py`).", "",
             "| backend | model | plain ms | trace ms | capture | halt at 1/4 | patch | memory extra/saved "
             "| peak/saved | per op | ops | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    misses: list[str] = []
    for result in results:
        name = result["backend"]
        if "error" in result:
            lines.append(f"| {name} | — | | | | | | | | | | {result['error']} |")
            continue
        for model, r in result["models"].items():
            halt = f"{r['halt_ratio']:.2f}x" if r.get("halt_ratio") is not None else "no halt="
            patch = f"{r['patch_ratio']:.2f}x ({r['patch_site']})" if r.get("patch_ratio") is not None else "—"
            notes = [result["framework"], f"tl.record {r['record_ratio']:.2f}x"]
            if "vs_jit" in r:
                notes.append(f"{r['vs_jit']:.1f}x the jitted call ({r['jit_ms']:.2f} ms); the jitted target's capture "
                             f"{r['jit_trace_vs_jit']:.2f}x it")
            lines.append(f"| {name} | {model} | {r['plain_ms']:.1f} | {r['trace_ms']:.1f} | {r['ratio']:.2f}x | {halt} "
                         f"| {patch} "
                         f"| {_ratio(r['memory_ratio'])} | {_ratio(r['peak_ratio'])} | {r['per_op_us']:.0f} µs "
                         f"| {r['ops']} | {'; '.join(notes)} |")
            misses += _missed(name, model, r)
    methods: dict[str, list[str]] = {}
    for result in results:
        if "error" not in result:
            methods.setdefault(result["memory_method"], []).append(result["backend"])
    lines += ["", "Peak memory: " + "; ".join(f"{', '.join(names)}: {how}" for how, names in methods.items()) + ".",
              ""]
    unmeasured = [r["backend"] for r in results if "error" in r]
    if unmeasured:  # a goal is met only where it was measured
        lines.append(f"Not measured: {', '.join(unmeasured)}.")
    if misses:
        lines.append("Goals missed: " + "; ".join(misses) + ".")
    elif len(unmeasured) < len(results):
        lines.append("Every goal met" + (" where measured." if unmeasured else "."))
    return "\n".join(lines) + "\n"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _missed(backend: str, model: str, r: dict[str, Any]) -> list[str]:
    missed = []
    goal = CAPTURE_GOAL.get(backend, CAPTURE_GOAL_OTHERS)
    if r["ratio"] > goal:
        missed.append(f"{backend} {model} capture {r['ratio']:.2f}x > {goal}x")
    if r.get("jit_trace_vs_jit") is not None and r["jit_trace_vs_jit"] > 2:  # a jitted model, captured
        missed.append(f"{backend} {model} jitted target's capture {r['jit_trace_vs_jit']:.1f}x the jitted call > 2x")
    if r.get("halt_ratio") is not None and r["halt_ratio"] > HALT_GOAL:
        missed.append(f"{backend} {model} halt {r['halt_ratio']:.2f}x > {HALT_GOAL}x")
    patch_goal = PATCH_GOAL.get((backend, model))
    if patch_goal is not None and r.get("patch_ratio") is not None and r["patch_ratio"] > patch_goal:
        missed.append(f"{backend} {model} patch {r['patch_ratio']:.2f}x > {patch_goal}x")
    if r["memory_ratio"] is not None and r["memory_ratio"] > MEMORY_GOAL:
        missed.append(f"{backend} {model} memory {r['memory_ratio']:.2f}x > {MEMORY_GOAL}x")
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(tempfile.gettempdir()) / "torchlens-performance-table.md")
    parser.add_argument("--envs", type=pathlib.Path, default=ROOT / ".nox", help="the nox virtualenvs' folder")
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per backend")
    options = parser.parse_args()
    results = []
    for name in options.backends:
        print(f"measuring {name}...", file=sys.stderr, flush=True)
        results.append(run_backend(name, options.envs, options.repeats, options.timeout))
    table = markdown(results, options.repeats)
    print(table)
    options.out.write_text(table)
    options.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")  # every figure, unrounded
    print(f"written to {options.out} (and {options.out.with_suffix('.json').name} beside it)", file=sys.stderr)


if __name__ == "__main__":
    main()
