"""What the page knows about a trace: one plain record per op and per module pass, as JSON-ready dicts.

Everything ``print(op)`` shows is here (shape, dtype, device, module pass,
parameters, FLOPs, time, code context, parents and children), plus a picture
of the saved value (:mod:`torchlens_core.viewer.pictures`). Nothing here
needs a framework beyond the backend's ``torchlens_to_numpy`` hook.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from torchlens_core.viewer.pictures import converter, first_array, pictures
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
    memo: dict[str, dict[Any, Any]] = {"json": {}, "bytes": {}}
    records = [_record(trace, op, distances[op.index], memo) for op in trace.ops]
    if not with_values:
        return records, {}
    convert = converter(trace.backend)
    found = ((str(op.index), *first_array(op.out, trace.backend, convert)) for op in trace.ops if op.out is not None)
    return records, pictures(((key, path, array) for key, path, array in found if array is not None), HEATMAP_BUDGET)


def table(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records as one block: the keys once, then one row of values per record, and the code context's file
    names once each (``code`` entries hold a position in ``files``): a third of the bytes of a list of dicts,
    which the page reads back as dicts (a key a record lacks reads as null)."""
    keys = list(dict.fromkeys(itertools.chain.from_iterable(records)))
    every = tuple(keys)
    files: dict[str, int] = {}
    rows = []
    at = keys.index("code") if "code" in keys else -1
    for record in records:
        # (most records have every key, in this order: their values are the row as they are)
        row = list(record.values()) if tuple(record) == every else [record.get(key) for key in keys]
        if at >= 0 and row[at]:
            row[at] = [[files.setdefault(file, len(files)), line, func] for file, line, func in row[at]]
        rows.append(row)
    return {"keys": keys, "files": list(files), "rows": rows}


def _record(trace: Trace, op: OpRecord, distance: Any, memo: dict[str, dict[Any, Any]] | None = None) -> dict[str, Any]:
    """The panel's record of one op; ``memo`` remembers the shape's JSON form and ``num_bytes`` (by shape and
    dtype) across ops: ops of one shape share them (parsing the dtype's name was a tenth of a large export)."""
    params = [trace.params[name] for name in op.params if name in trace.params]
    record: dict[str, Any] = {
        "index": op.index,
        "label": op.label,
        "kind": op.kind,
        "func": op.func_name,
        "shape": _jsonable(op.shape) if memo is None else _cached(memo["json"], op.shape, _jsonable),
        "dtype": op.dtype,
        "device": op.device,
        "bytes": op.num_bytes if memo is None else _cached(memo["bytes"], (op.shape, op.dtype), lambda _: op.num_bytes),
        "module_outputs": list(op.module_outputs),
        "params": [
            {"name": p.name, "shape": list(p.shape), "numel": p.numel, "buffer": p.is_buffer, "trainable": p.trainable}
            for p in params
        ],
        "parents": list(op.parents),
        "children": list(op.children),
        "saved": op.saved,
        "code": [[loc.file, loc.line_number, loc.func_name] for loc in op.code_context[:3]],
        "distance": [distance.min_from_input, distance.max_from_input, distance.min_to_output, distance.max_to_output],
    }
    if op.kind == "op":
        record.update(
            {
                "flops": op.flops,
                "macs": op.macs,
                "elapsed": op.elapsed,
                "source": op.source,
                "in_place": op.in_place,
                "conditions": list(op.conditions),
                "config": {str(k): _short(v) for k, v in op.config.items()},
            }
        )
    if op.edits:
        record["edits"] = [{"site": e.site, "helpers": [_short(h) for h in e.helpers]} for e in op.edits]
    return record


def module_passes(trace: Trace) -> list[dict[str, Any]]:
    """One record per module pass, in order of first op: ``key`` (``path:pass``), type, depth (1 = top level),
    ``parent`` (the position of the enclosing pass in this list, -1 at the top level), ``ops`` (how many)."""
    passes: dict[tuple[str, int], dict[str, Any]] = {}
    for op in trace.ops:
        parent = -1
        for depth, (path, n) in enumerate(op.module_passes, start=1):
            found = passes.get((path, n))
            if found is None:
                module = trace.modules[path]
                found = passes[(path, n)] = {
                    "key": f"{path}:{n}",
                    "path": path,
                    "pass": n,
                    "num_passes": module.num_passes,
                    "type": module.type_name,
                    "depth": depth,
                    "params": module.num_params,
                    "parent": parent,
                    "ops": 0,
                    "at": len(passes),
                }
            found["ops"] += 1
            parent = found["at"]
    for found in passes.values():
        del found["at"]
    return list(passes.values())


def op_graph(trace: Trace, modules: list[dict[str, Any]], colors: dict[str, str] | None) -> dict[str, Any]:
    """What the page needs of every op before any is clicked, as parallel lists (one entry per op, compact):
    label, function, kind, the innermost module pass (its position in ``modules``, -1 at the top level),
    parent op indices, shape text, whether a module returned it and whether it has parameters; the fill colour
    of a comparison by op index; the edited ops. Layout, folding and search read only these."""
    at = {(m["path"], m["pass"]): i for i, m in enumerate(modules)}
    graph: dict[str, Any] = {
        "label": [],
        "func": [],
        "kind": [],
        "module": [],
        "parents": [],
        "shape": [],
        "out": [],
        "params": [],
        "fill": {},
        "edited": [],
    }
    shapes: dict[Any, str] = {}
    for op in trace.ops:
        graph["label"].append(op.label)
        graph["func"].append(op.func_name if op.kind == "op" else "")
        graph["kind"].append(op.kind)
        inner = op.module_passes[-1] if op.module_passes else None
        graph["module"].append(at[(inner[0], inner[1])] if inner else -1)
        graph["parents"].append(list(op.parent_indices))
        graph["shape"].append(_cached(shapes, op.shape, shape_text))
        graph["out"].append(1 if op.module_outputs else 0)
        graph["params"].append(1 if op.params else 0)
        if colors and op.label in colors:
            graph["fill"][str(op.index)] = colors[op.label]
        if op.edits:
            graph["edited"].append(op.index)
    return graph


def _cached(memo: dict[Any, Any], key: Any, make: Any) -> Any:
    """``make(key)``, remembered in ``memo`` (ops of one shape share their text: it is worked out once)."""
    try:
        return memo[key]
    except KeyError:
        found = memo[key] = make(key)
        return found
    except TypeError:  # not hashable
        return make(key)


def _jsonable(shape: Any) -> Any:
    if shape is None:
        return None
    return [_jsonable(s) if isinstance(s, tuple) else (s if isinstance(s, int) else str(s)) for s in shape]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
