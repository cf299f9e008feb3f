"""What the page knows about a trace: one plain record per op and per module pass, as JSON-ready dicts.

Everything ``print(op)`` shows is here (shape, dtype, device, module pass,
parameters, FLOPs, time, code context, parents and children), plus a picture
of the saved value (:mod:`torchlens_core.viewer.pictures`). Nothing here
needs a framework beyond the backend's ``torchlens_to_numpy`` hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchlens_core.viewer.pictures import first_array, picture

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace

# Heatmaps stop once the pictures so far hold this many bytes (histograms go on): a 5,000-op trace stays a few MB.
HEATMAP_BUDGET = 6 * 1024 * 1024


def op_records(trace: Trace, with_values: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(one record per op, in execution order; pictures by op index as a string)."""
    distances = trace.distances()
    records, pictures = [], {}
    spent = 0
    for op in trace.ops:
        record = _record(trace, op, distances[op.index])
        if with_values and op.out is not None:
            path, array = first_array(op.out, trace.backend)
            if array is not None:
                found = picture(array, with_heatmap=spent < HEATMAP_BUDGET)
                if found is not None:
                    if path:
                        found["path"] = list(map(str, path))
                    spent += sum(len(s["data"]) for s in found.get("heatmaps", {}).get("slices", []))
                    pictures[str(op.index)] = found
        records.append(record)
    return records, pictures


def _record(trace: Trace, op: OpRecord, distance: Any) -> dict[str, Any]:
    params = [trace.params[name] for name in op.params if name in trace.params]
    record: dict[str, Any] = {
        "index": op.index, "label": op.label, "kind": op.kind, "func": op.func_name,
        "shape": _jsonable(op.shape), "dtype": op.dtype, "device": op.device, "bytes": op.num_bytes,
        "modules": op.modules, "module_outputs": list(op.module_outputs),
        "params": [{"name": p.name, "shape": list(p.shape), "numel": p.numel, "buffer": p.is_buffer,
                    "trainable": p.trainable} for p in params],
        "parents": list(op.parents), "children": list(op.children),
        "saved": op.saved,
        "code": [[loc.file, loc.line_number, loc.func_name] for loc in op.code_context[:3]],
        "distance": [distance.min_from_input, distance.max_from_input,
                     distance.min_to_output, distance.max_to_output],
    }
    if op.kind == "op":
        record.update({"flops": op.flops, "macs": op.macs, "elapsed": op.elapsed, "source": op.source,
                       "in_place": op.in_place, "conditions": list(op.conditions),
                       "config": {str(k): _short(v) for k, v in op.config.items()}})
    if op.edits:
        record["edits"] = [{"site": e.site, "helpers": [_short(h) for h in e.helpers]} for e in op.edits]
    return record


def module_passes(trace: Trace) -> list[dict[str, Any]]:
    """One record per module pass: ``key`` (``path:pass``), type, depth (1 = top level), parent key, op indices."""
    passes: dict[str, dict[str, Any]] = {}
    for op in trace.ops:
        for depth, (path, n) in enumerate(op.module_passes, start=1):
            key = f"{path}:{n}"
            if key not in passes:
                module = trace.modules[path]
                parent = op.module_passes[depth - 2] if depth > 1 else None
                passes[key] = {"key": key, "path": path, "pass": n, "num_passes": module.num_passes,
                               "type": module.type_name, "depth": depth, "params": module.num_params,
                               "parent": f"{parent[0]}:{parent[1]}" if parent else None, "ops": []}
            passes[key]["ops"].append(op.index)
    return list(passes.values())


def _jsonable(shape: Any) -> Any:
    if shape is None:
        return None
    return [_jsonable(s) if isinstance(s, tuple) else (s if isinstance(s, int) else str(s)) for s in shape]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
