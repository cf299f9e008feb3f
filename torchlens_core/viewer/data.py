"""What the page knows about a trace: one plain record per op and per module pass, as JSON-ready dicts.

Everything ``print(op)`` shows is here (shape, dtype, device, module pass,
parameters, FLOPs, time, code context, parents and children), plus a picture
of the saved value (:mod:`torchlens_core.viewer.pictures`). Nothing here
needs a framework beyond the backend's ``torchlens_to_numpy`` hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchlens_core.viewer.pictures import first_array, picture
from torchlens_core.views.draw import shape_text

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace

# Heatmaps stop once the pictures so far hold this many bytes (histograms go on): a 5,000-op trace stays a few MB.
HEATMAP_BUDGET = 6 * 1024 * 1024


# Ops per block of panel details and of value pictures: the page parses a block only when one of its ops is
# shown in the panel, so a 50,000-op file opens without reading its 50 blocks.
CHUNK = 1000


def op_records(trace: Trace, with_values: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(one record per op, in execution order, for the panel; pictures by op index as a string)."""
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


def table(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records as one block: the keys once, then one row of values per record, and the code context's file
    names once each (``code`` entries hold a position in ``files``): a third of the bytes of a list of dicts,
    which the page reads back as dicts (a key a record lacks reads as null)."""
    keys = list(dict.fromkeys(key for record in records for key in record))
    files: dict[str, int] = {}
    rows = []
    at = keys.index("code") if "code" in keys else -1
    for record in records:
        row = [record.get(key) for key in keys]
        if at >= 0 and row[at]:
            row[at] = [[files.setdefault(file, len(files)), line, func] for file, line, func in row[at]]
        rows.append(row)
    return {"keys": keys, "files": list(files), "rows": rows}


def _record(trace: Trace, op: OpRecord, distance: Any) -> dict[str, Any]:
    params = [trace.params[name] for name in op.params if name in trace.params]
    record: dict[str, Any] = {
        "index": op.index, "label": op.label, "kind": op.kind, "func": op.func_name,
        "shape": _jsonable(op.shape), "dtype": op.dtype, "device": op.device, "bytes": op.num_bytes,
        "module_outputs": list(op.module_outputs),
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
    """One record per module pass, in order of first op: ``key`` (``path:pass``), type, depth (1 = top level),
    ``parent`` (the position of the enclosing pass in this list, -1 at the top level), ``ops`` (how many)."""
    passes: dict[str, dict[str, Any]] = {}
    for op in trace.ops:
        for depth, (path, n) in enumerate(op.module_passes, start=1):
            key = f"{path}:{n}"
            found = passes.get(key)
            if found is None:
                module = trace.modules[path]
                parent = op.module_passes[depth - 2] if depth > 1 else None
                found = passes[key] = {
                    "key": key, "path": path, "pass": n, "num_passes": module.num_passes,
                    "type": module.type_name, "depth": depth, "params": module.num_params,
                    "parent": passes[f"{parent[0]}:{parent[1]}"]["at"] if parent else -1, "ops": 0, "at": len(passes)}
            found["ops"] += 1
    for found in passes.values():
        del found["at"]
    return list(passes.values())


def op_graph(trace: Trace, modules: list[dict[str, Any]], colors: dict[str, str] | None) -> dict[str, Any]:
    """What the page needs of every op before any is clicked, as parallel lists (one entry per op, compact):
    label, function, kind, the innermost module pass (its position in ``modules``, -1 at the top level),
    parent op indices, shape text, whether a module returned it and whether it has parameters; the fill colour
    of a comparison by op index; the edited ops. Layout, folding and search read only these."""
    at = {m["key"]: i for i, m in enumerate(modules)}
    graph: dict[str, Any] = {"label": [], "func": [], "kind": [], "module": [], "parents": [], "shape": [],
                             "out": [], "params": [], "fill": {}, "edited": []}
    for op in trace.ops:
        graph["label"].append(op.label)
        graph["func"].append(op.func_name if op.kind == "op" else "")
        graph["kind"].append(op.kind)
        inner = op.module_passes[-1] if op.module_passes else None
        graph["module"].append(at[f"{inner[0]}:{inner[1]}"] if inner else -1)
        graph["parents"].append(list(op.parent_indices))
        graph["shape"].append(shape_text(op.shape))
        graph["out"].append(1 if op.module_outputs else 0)
        graph["params"].append(1 if op.params else 0)
        if colors and op.label in colors:
            graph["fill"][str(op.index)] = colors[op.label]
        if op.edits:
            graph["edited"].append(op.index)
    return graph


def _jsonable(shape: Any) -> Any:
    if shape is None:
        return None
    return [_jsonable(s) if isinstance(s, tuple) else (s if isinstance(s, int) else str(s)) for s in shape]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
