"""What every side shares: the output folder's layout, JSON files, and the "do two outputs agree" rule.

Layout of ``--out DIR`` for a framework pair ``P`` and an architecture ``A``::

    DIR/P/A/config.json          the architecture's config as side a built it (and side a's full config)
    DIR/P/A/inputs.npz           the inputs, drawn once by side a
    DIR/P/A/weights.npz          side a's state (parameters and buffers), by name
    DIR/P/A/a/meta.json          side a: status, ops, untraced output names, module call order
    DIR/P/A/a/output.npz         side a's untraced output (every array field)
    DIR/P/A/a/trace/             side a's saved trace
    DIR/P/A/b/<variant>/meta.json, trace/   side b: "correct", then one folder per injected bug
"""

from __future__ import annotations

import json
import pathlib
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

# The untraced outputs agree when max |a - b| <= REL_TOL * max |a| (over every output field both sides return).
REL_TOL = 1e-4


def write_json(path: pathlib.Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def read_json(path: pathlib.Path) -> Any:
    return json.loads(path.read_text())


def arch_dir(out: pathlib.Path, pair: str, arch: str) -> pathlib.Path:
    return out / pair / arch


def gap(reference: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> dict[str, Any]:
    """How far ``other``'s output is from ``reference``'s, over the fields both have (the first field of the
    reference is the main one: its shape must match).

    ``rel`` is max |diff| over max |reference| across the shared fields; a shape difference makes it infinite.
    """
    shared = [k for k in reference if k in other]
    if not shared:
        return {
            "rel": float("inf"),
            "max_abs": None,
            "fields": [],
            "why": f"no output field in common: {sorted(reference)} vs {sorted(other)}",
        }
    worst, scale, shapes = 0.0, 0.0, []
    for k in shared:
        a, b = np.asarray(reference[k], np.float64), np.asarray(other[k], np.float64)
        if a.shape != b.shape:
            shapes.append(f"{k}: {a.shape} vs {b.shape}")
            continue
        worst = max(worst, float(np.max(np.abs(a - b))) if a.size else 0.0)
        scale = max(scale, float(np.max(np.abs(a))) if a.size else 0.0)
    if shapes:
        return {"rel": float("inf"), "max_abs": None, "fields": shared, "why": "shapes differ: " + "; ".join(shapes)}
    return {"rel": worst / max(scale, 1e-30), "max_abs": worst, "scale": scale, "fields": shared}


def failure(stage: str, exc: BaseException) -> dict[str, Any]:
    """A failed stage as a record: the first line of the error, and the end of the traceback for the log."""
    text = str(exc).strip().splitlines()
    return {
        "status": "failed",
        "stage": stage,
        "error": f"{type(exc).__name__}: {text[0] if text else ''}"[:400],
        "traceback": traceback.format_exc()[-2500:],
    }


def build_variants(
    folder: pathlib.Path, bugs: Any, inject: Callable[[str, pathlib.Path], dict[str, Any]]
) -> dict[str, Any]:
    """Each bug built on its own, ``inject(bug, folder/b/bug)`` writing its trace; a failure is recorded as the
    bug's record and the others still run. Returns each bug's status."""
    found: dict[str, Any] = {}
    for bug in bugs:
        bug_dir = folder / "b" / bug
        try:
            record = inject(bug, bug_dir)
        except Exception as exc:  # noqa: BLE001 - one bug's failure is recorded, the others still run
            record = {"variant": bug, **failure("inject", exc)}
        write_json(bug_dir / "meta.json", record)
        found[bug] = record.get("status")
    return found
