"""Helpers shared by the tests/test_saving*.py files (the zoo-wide round trip is in conformance/)."""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

import torchlens as tl
from torchlens_core.backend.arrays import max_error


def views(t: tl.Trace) -> list[object]:
    """What a loaded trace must reproduce: lookups, summary, tables (without pandas too), drawing, hash."""
    ops = [
        (
            o.label,
            o.kind,
            o.func_name,
            o.shape,
            o.dtype,
            o.device,
            o.parents,
            o.children,
            o.module_passes,
            o.module_outputs,
            o.params,
            o.source,
            o.in_place,
            o.saved,
            o.code_context,
            o.elapsed,
            o.flops,
            o.macs,
            repr(o.config),
            o.conditions,
            o.pass_num,
            o.num_passes,
        )
        for o in t.ops
    ]
    return [
        ops,
        t.summary(),
        t.to_dot(),
        tl.hash(t),
        t.keys_of(t.ops[-1]),
        t.output_labels,
        t.halted,
        t.model_name,
        [m.path for m in t.modules.values()],
        list(t.params),
    ]


def same_values(backend: str, a: Any, b: Any) -> bool:
    """The same structure of the backend's arrays, equal exactly (through its array_error hook)."""
    return max_error(backend, a, b) == 0.0


def rehash(path: pathlib.Path) -> None:
    """Make the manifest agree with the files again, as a deliberate tamperer would."""
    manifest = json.loads((path / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (path / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))
