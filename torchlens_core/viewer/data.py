"""What the page knows about a trace: the ops' details as columns, one record per module pass, JSON-ready.

Everything ``print(op)`` shows is here (shape, dtype, device, module pass,
parameters, FLOPs, time, code context, parents and children), plus a picture
of the saved value (:mod:`torchlens_core.viewer.pictures`). Nothing here
needs a framework beyond the backend's ``torchlens_to_numpy`` hook.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from torchlens_core.ir.records import raw_dtype
from torchlens_core.viewer.pictures import numpy_leaves, pictured
from torchlens_core.views.draw import shape_text

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace

# Heatmaps stop once the pictures so far hold this many bytes (histograms go on): a 5,000-op trace stays a few MB.
HEATMAP_BUDGET = 6 * 1024 * 1024


# Ops per block of panel details and of value pictures: the page parses a block only when one of its ops is
# shown in the panel, so a 50,000-op file opens without reading its 50 blocks.
CHUNK = 1000


def op_blocks(trace: Trace) -> list[dict[str, Any]]:
    """The panel's details of every op, as one block per CHUNK ops (:func:`op_block`)."""
    index_of = {op.label: op.index for op in trace.ops}
    memo: dict[str, dict[Any, Any]] = {"bytes": {}}
    return [op_block(trace, trace.ops[k : k + CHUNK], index_of, memo) for k in range(0, len(trace.ops), CHUNK)]


def op_pictures(trace: Trace, with_values: bool = True) -> dict[str, Any]:
    """Pictures of the ops' values by op index as a string (:func:`~torchlens_core.viewer.pictures.pictured`)."""
    if not with_values:
        return {}
    values = ((str(op.index), out) for op in trace.ops if (out := op.out) is not None)
    return pictured(numpy_leaves(values, trace.backend), HEATMAP_BUDGET)


def op_block(
    trace: Trace,
    ops: list[OpRecord],
    index_of: dict[str, int],
    memo: dict[str, dict[Any, Any]],
) -> dict[str, Any]:
    """The panel's details of consecutive ops as columns, one list per field with one entry per op (JSON of
    lists of numbers and short lists is several times faster to write, and to parse, than of a dict per op).

    What the page already has of every op (index, label, kind, function, parents) is not repeated, nor what it
    works out from them (children, and the graph distances ``trace.distances()`` gives). Strings that repeat
    (dtypes, devices, module pass keys, code files and functions, sources) are positions in ``strings``; an
    op's code context (its first three frames, [file, line, function]) is a position in ``contexts``, which
    ops of one line share; conditions are op indices (a label no op has stays a string); shapes are
    positions in ``shapes``.
    Fields most ops leave empty (parameters, configuration, edits) map the op's position in the block to the
    value. The page's ``record()`` reads an op back as the dict it shows.
    """
    strings: dict[Any, int] = {}
    intern = strings.setdefault
    contexts: dict[Any, int] = {}
    shapes: dict[Any, int] = {}
    shape_list: list[Any] = []
    sizes = memo["bytes"]
    ops_of = index_of.get
    columns: dict[str, list[Any]] = {
        key: []
        for key in (
            "shape",
            "dtype",
            "device",
            "bytes",
            "module_outputs",
            "saved",
            "code",
            "flops",
            "macs",
            "elapsed",
            "source",
            "in_place",
            "conditions",
        )
    }
    sparse: dict[str, dict[int, Any]] = {"params": {}, "config": {}, "edits": {}}
    (shape, dtype, device, size, outputs, saved, code, flops, macs, elapsed, source, in_place,
     conditions) = columns.values()  # fmt: skip
    for at, op in enumerate(ops):
        try:
            found = shapes.get(op.shape)
        except TypeError:  # not hashable
            found = None
        if found is None:
            found = len(shape_list)
            shape_list.append(_jsonable(op.shape))
            with contextlib.suppress(TypeError):
                shapes[op.shape] = found
        shape.append(found)
        kind = raw_dtype(op)  # the slot's str: op.dtype makes a DType at each read, compared by a method of its own
        kind = None if kind is None else str(kind)
        dtype.append(None if kind is None else intern(kind, len(strings)))
        device.append(None if op.device is None else intern(op.device, len(strings)))
        try:
            size.append(sizes[op.shape, kind])
        except KeyError:
            size.append(sizes.setdefault((op.shape, kind), op.num_bytes))
        except TypeError:  # not hashable
            size.append(op.num_bytes)
        outputs.append([intern(key, len(strings)) for key in op.module_outputs] if op.module_outputs else ())
        saved.append(1 if op.saved else 0)
        where = contexts.get(op.code_context)
        if where is None:
            where = contexts[op.code_context] = len(contexts)
        code.append(where)
        if op.params:
            read = [trace.params[name] for name in op.params if name in trace.params]
            if read:
                sparse["params"][at] = [
                    {
                        "name": p.name,
                        "shape": list(p.shape),
                        "numel": p.numel,
                        "buffer": p.is_buffer,
                        "trainable": p.trainable,
                    }
                    for p in read
                ]
        if op.kind == "op":
            flops.append(op.flops)
            macs.append(op.macs)
            elapsed.append(op.elapsed)
            source.append(None if op.source is None else intern(op.source, len(strings)))
            in_place.append(1 if op.in_place else 0)
            conditions.append([ops_of(label, label) for label in op.conditions] if op.conditions else ())
            config = op.config
            if config:
                sparse["config"][at] = {str(k): _short(v) for k, v in config.items()}
        else:  # the panel shows these for ops only
            flops.append(None)
            macs.append(None)
            elapsed.append(None)
            source.append(None)
            in_place.append(0)
            conditions.append([])
        if op.edits:
            sparse["edits"][at] = [{"site": e.site, "helpers": [_short(h) for h in e.helpers]} for e in op.edits]
    frames = [
        [[intern(loc.file, len(strings)), loc.line_number, intern(loc.func_name, len(strings))] for loc in found[:3]]
        for found in contexts
    ]
    return {"strings": list(strings), "contexts": frames, "shapes": shape_list, "columns": columns, **sparse}


def pass_chains(trace: Trace) -> dict[tuple[tuple[str, int], ...], int]:
    """Each op's module passes, outermost first (its chain), to the number of ops with that chain, in order of
    first op. Consecutive ops mostly share one: what is worked out per module pass is worked out per chain."""
    chains: dict[tuple[tuple[str, int], ...], int] = {}
    get = chains.get
    for op in trace.ops:
        chain = op.module_passes
        chains[chain] = get(chain, 0) + 1
    return chains


def module_passes(trace: Trace, chains: dict[tuple[tuple[str, int], ...], int] | None = None) -> list[dict[str, Any]]:
    """One record per module pass, in order of first op: ``key`` (``path:pass``), type, depth (1 = top level),
    ``parent`` (the position of the enclosing pass in this list, -1 at the top level), ``ops`` (how many).
    ``chains`` is :func:`pass_chains` (worked out here when not given)."""
    passes: dict[tuple[str, int], dict[str, Any]] = {}
    for chain, count in (pass_chains(trace) if chains is None else chains).items():
        parent = -1
        for depth, (path, n) in enumerate(chain, start=1):
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
            found["ops"] += count
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
    inner: dict[Any, int] = {}  # an op's chain of module passes -> the position of its innermost pass
    label, func, kind, module, parents, shape, out, params = (
        graph[k] for k in ("label", "func", "kind", "module", "parents", "shape", "out", "params")
    )
    for op in trace.ops:
        label.append(op.label)
        func.append(op.func_name if op.kind == "op" else "")
        kind.append(op.kind)
        chain = op.module_passes
        found = inner.get(chain)
        if found is None:
            found = inner[chain] = at[(chain[-1][0], chain[-1][1])] if chain else -1
        module.append(found)
        parents.append(list(op.parent_indices))
        shape.append(_cached(shapes, op.shape, shape_text))
        out.append(1 if op.module_outputs else 0)
        params.append(1 if op.params else 0)
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
