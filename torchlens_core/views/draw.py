"""Drawing a trace with Graphviz, from the IR alone (no framework).

``view()`` decides what to draw: one node per op (unrolled) or per layer
(rolled: the passes of a reused module or a loop body become one node, with
loop edges drawn back), module passes as nested clusters, some modules
collapsed into single boxes, optionally only one module's subgraph. ``to_dot``
writes the DOT source; ``draw`` runs Graphviz's ``dot`` on it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.ir.errors import (
    ArgumentTypeError,
    DrawingTooLargeError,
    GraphvizNotFoundError,
    LargeDrawingWarning,
    TorchLensError,
    UnsupportedError,
)
from torchlens_core.ir.trace import DRAW_MAX_NODES
from torchlens_core.views.filenames import checked_output, default_name, write_error
from torchlens_core.views.summary import params_and_buffers

if TYPE_CHECKING:
    from torchlens_core.ir.records import ModuleRecord, OpRecord
    from torchlens_core.ir.trace import Trace

# collapse="auto" never draws more nodes than this, whatever the model's size (docs/drawing.md): more reads
# badly on one page, and Graphviz's layout time grows faster than the node count.
AUTO_NODE_BUDGET = 60
# draw() refuses a drawing of more nodes than DRAW_MAX_NODES (defined beside Trace.draw, whose default it is)
# unless asked (max_nodes=None).
# Graphviz's work is its layout graph: the nodes plus a bend point for every rank an edge crosses. Over this
# size it gets fewer rounds to straighten edges and untangle crossings (a 64-block decoder drawn as 72 boxes, each
# fed by the rotary embedding: 4 s in full rounds, 0.6 s in these; 136 boxes of 128 blocks: over 200 s, 2 s).
QUICK_LAYOUT_SIZE = 1_000
QUICK_LAYOUT = ("-Gnslimit=1", "-Gmclimit=0.3")
# The estimate a large drawing's warning gives: seconds per unit of layout size, plus seconds per node squared
# (ranking and crossing removal), fitted with QUICK_LAYOUT and Graphviz 2.43 on one CPU core to within 30% on
# unrolled Llama-style decoders of 500 to 3,800 nodes (layout sizes 7,700 to 470,000) and chains of 2,000 to
# 10,000 nodes (1 s to 23 s).
SECONDS_PER_LAYOUT_UNIT = 4e-5
SECONDS_PER_NODE_SQUARED = 2.3e-7
WARN_SECONDS = 10.0  # draw() warns (LargeDrawingWarning) when the estimate is over this
FORMATS = ("pdf", "svg", "png")
VIS_MODES = ("unrolled", "rolled")
Collapse = int | str | Callable[["ModuleRecord"], bool] | None


@attrs.define
class Node:
    id: str
    label: str
    # "input", "output", "op", "module" (a collapsed module, or a run of same-type sibling modules),
    # "segment" (consecutive top-level ops and modules, only where collapse="auto" must bound a flat graph),
    # "external" (outside a focused module)
    kind: str
    chain: tuple[tuple[str, int | None], ...]  # the clusters it sits in, outermost first
    module_output: bool = False
    has_params: bool = False


@attrs.define
class View:
    nodes: dict[str, Node]
    edges: list[tuple[str, str]]
    types: dict[str, str]  # module path -> type name, for cluster titles
    rolled: bool
    passes: dict[str, int]  # module path -> number of passes, for rolled cluster titles
    node_of: dict[int, str] = attrs.Factory(dict)  # op index -> the node drawing it


def view(trace: Trace, vis_mode: str = "unrolled", collapse: Collapse = None, module: str | None = None) -> View:
    """What to draw, before any DOT is written."""
    if vis_mode not in VIS_MODES:
        raise UnsupportedError(f"vis_mode must be one of {VIS_MODES}, not {vis_mode!r}")
    if module is not None and module not in trace.modules:
        from torchlens_core.ir.errors import LabelNotFoundError, closest

        near = closest(module, trace.modules)
        raise LabelNotFoundError(f"no module {module!r} in this trace" + (f"; did you mean {near}?" if near else ""))
    if collapse == "auto":
        return _auto(trace, vis_mode, module)
    if isinstance(collapse, str) or (isinstance(collapse, int) and collapse < 1) or isinstance(collapse, bool):
        raise UnsupportedError(
            f"collapse must be None, 'auto', a depth >= 1 or a predicate on modules, not {collapse!r}"
        )
    return _build(trace, vis_mode == "rolled", collapse, module)


def _auto(trace: Trace, vis_mode: str, module: str | None) -> View:
    """The deepest view within AUTO_NODE_BUDGET nodes, whatever the model's size.

    Collapsing one level deeper never draws fewer nodes, so depths are tried from the top down and the
    search stops at the first that does not fit. A depth over the budget is tried again with each run of
    same-type sibling modules (a decoder's blocks) drawn as one box; a model too wide for even that at the
    top level is drawn as consecutive segments of its top-level ops and modules.
    """
    rolled = vis_mode == "rolled"
    deepest = _max_depth(trace, module)
    runs: dict[tuple[str, int], Run] | None = None
    best: tuple[Collapse, dict[tuple[str, int], Run] | None] | None = None
    for depth in range(1, deepest + 2):
        # one deeper than the deepest module: nothing collapsed
        collapse: Collapse = depth if depth <= deepest else None
        merged = None
        if _node_count(trace, rolled, collapse, module) > AUTO_NODE_BUDGET:
            merged = runs = _runs(trace) if runs is None else runs
            if _node_count(trace, rolled, collapse, module, runs) > AUTO_NODE_BUDGET:
                break
        best = (collapse, merged)  # counted only: the labels are written for the one view drawn
    if best is not None:
        collapse, merged = best
        return _build(trace, rolled, collapse, module, merged)
    top = _build(trace, rolled, 1 if deepest else None, module, runs)
    return _segments(trace, top, module, AUTO_NODE_BUDGET)


@attrs.define
class Run:
    """Consecutive calls of same-type sibling modules, nothing of their parent between (``layers.0..127``)."""

    key: str
    members: list[tuple[str, int]]


def _runs(trace: Trace) -> dict[tuple[str, int], Run]:
    """Each module pass that belongs to a run of two or more, by (path, pass)."""
    # What each module pass (None: the top level) holds, in the order it ran: child passes and its own ops.
    children: dict[Any, list[Any]] = {}
    for op in trace.ops:
        parent: Any = None
        for item in (*op.module_passes, ("op", op.index)):
            seq = children.setdefault(parent, [])
            if not seq or seq[-1] != item:
                seq.append(item)
            parent = item
    found: dict[tuple[str, int], Run] = {}
    for seq in children.values():
        i = 0
        while i < len(seq):
            j = i + 1
            kind = _run_type(trace, seq[i])
            while kind is not None and j < len(seq) and _run_type(trace, seq[j]) == kind:
                j += 1
            if j - i > 1:
                path, n = seq[i]
                run = Run(f"run {path}:{n}", seq[i:j])
                found.update((member, run) for member in run.members)
            i = j
    return found


def _run_type(trace: Trace, item: Any) -> str | None:
    """The type a module pass runs as, or None for an op or a one-op module (drawn as its op, never a box)."""
    path, n = item
    if path == "op" or path not in trace.modules:
        return None
    record = trace.modules[path]
    return record.type_name if len(record.passes[n - 1].ops) > 1 else None


def _segments(trace: Trace, v: View, module: str | None, budget: int) -> View:
    """``v`` with its top-level nodes merged into at most ``budget`` nodes, consecutive ones together.

    Inputs and outputs keep their own ovals, and sources outside a focused module their own nodes, while
    they take at most a quarter of the budget each.
    """
    start = 0 if module is None else 1  # a focused module's pass heads every chain: its children are the top
    ids = list(v.nodes)
    io = [i for i in ids if v.nodes[i].kind in ("input", "output") and len(v.nodes[i].chain) <= start]
    io = io if len(io) <= budget // 4 else []
    external = [i for i in ids if v.nodes[i].kind == "external"]
    merge_external = len(external) > budget // 4
    kept = set(io)
    rest = [i for i in ids if i not in kept and v.nodes[i].kind != "external"]
    units: dict[Any, list[str]] = {}  # each top-level op or module pass -> its nodes, in the order they ran
    for i in rest:
        chain = v.nodes[i].chain
        units.setdefault(chain[start] if len(chain) > start else i, []).append(i)
    slots = max(budget - len(io) - (1 if merge_external else len(external)), 1)
    size = max(-(-len(units) // slots), 1)  # ceil: units per segment
    rename: dict[str, str] = {}
    nodes: dict[str, Node] = {i: v.nodes[i] for i in io}
    groups = list(units.values())
    ops_of: dict[str, list[int]] = {}
    for op_index, node_id in v.node_of.items():
        ops_of.setdefault(node_id, []).append(op_index)
    for k in range(0, len(groups), size):
        members = [i for group in groups[k : k + size] for i in group]
        key = f"segment {k // size + 1}"
        indices = sorted(index for i in members for index in ops_of.get(i, ()))
        first, last = trace.ops[indices[0]], trace.ops[indices[-1]]
        label = f"{first.label} .. {last.label}\\n{len(indices):,} ops"
        nodes[key] = Node(key, label, "segment", v.nodes[members[0]].chain[:start])
        rename.update((i, key) for i in members)
    if merge_external:
        nodes["external"] = Node("external", f"{len(external):,} values from outside {module}", "external", ())
        rename.update((i, "external") for i in external)
    else:
        nodes.update((i, v.nodes[i]) for i in external)
    edges: dict[tuple[str, str], None] = {}
    for a, b in v.edges:
        a, b = rename.get(a, a), rename.get(b, b)
        if a != b:
            edges[(a, b)] = None
    node_of = {index: rename.get(node_id, node_id) for index, node_id in v.node_of.items()}
    return View(nodes, list(edges), v.types, v.rolled, v.passes, node_of)


def _max_depth(trace: Trace, module: str | None) -> int:
    return max((len(_chain_of(op, module)) for op in trace.ops), default=0)


def _chain_of(op: OpRecord, module: str | None) -> tuple[tuple[str, int], ...]:
    """The module passes an op ran inside, starting at the focused module (if any)."""
    stack = op.module_passes
    if module is None:
        return stack
    for i, (path, _) in enumerate(stack):
        if path == module:
            return stack[i:]
    return ()


def _collapsed_at(
    chain: tuple[tuple[str, int], ...], collapse: Collapse, trace: Trace, module: str | None
) -> int | None:
    """Position in ``chain`` of the module pass drawn as one box, if any."""
    start = 1 if module is not None else 0  # the focused module itself is never a box
    for i in range(start, len(chain)):
        path, n = chain[i]
        if len(trace.modules[path].passes[n - 1].ops) == 1:
            continue  # a module that is one op is drawn as that op, named after the module
        depth = i + 1 - start
        if isinstance(collapse, int) and depth >= collapse:
            return i
        if callable(collapse) and collapse(trace.modules[path]):
            return i
    return None


def _placed(
    trace: Trace, rolled: bool, collapse: Collapse, module: str | None, runs: dict[tuple[str, int], Run] | None
) -> Iterator[tuple[OpRecord, str, tuple[Any, ...], int | None]]:
    """Each op drawn, with the key of the node that draws it, its module chain and where that is collapsed."""
    for op in trace.ops:
        chain = _chain_of(op, module)
        if module is not None and not chain:
            continue
        at = _collapsed_at(chain, collapse, trace, module)
        if at is not None:
            path, n = chain[at]
            run = runs.get((path, n)) if runs else None
            key = run.key if run is not None else f"module {path}" if rolled else f"module {path}:{n}"
        else:
            key = f"layer {op.layer_label}" if rolled and op.kind == "op" else f"op {op.index}"
        yield op, key, chain, at


def _node_count(
    trace: Trace, rolled: bool, collapse: Collapse, module: str | None, runs: dict[tuple[str, int], Run] | None = None
) -> int:
    """How many nodes ``_build`` would draw, without writing their labels."""
    keys: set[str] = set()
    inside: set[int] = set()
    for op, key, _, _ in _placed(trace, rolled, collapse, module, runs):
        keys.add(key)
        inside.add(op.index)
    outside = {p for i in inside for p in trace.ops[i].parent_indices if p not in inside} if module else set()
    return len(keys) + len(outside)


def _build(
    trace: Trace, rolled: bool, collapse: Collapse, module: str | None, runs: dict[tuple[str, int], Run] | None = None
) -> View:
    """The view at one collapse; with ``runs``, each run of collapsed sibling modules is one box."""
    nodes: dict[str, Node] = {}
    node_of: dict[int, str] = {}
    for op, key, chain, at in _placed(trace, rolled, collapse, module, runs):
        node_of[op.index] = key
        if key in nodes:
            continue
        if at is not None:
            path, n = chain[at]
            run = runs.get((path, n)) if runs else None
            label = _run_label(trace, run) if run is not None else _module_label(trace, path, n, rolled)
            nodes[key] = Node(key, label, "module", _cluster_chain(chain[:at], rolled))
        else:
            nodes[key] = Node(
                key,
                _op_label(op, trace, rolled),
                op.kind,
                _cluster_chain(chain, rolled),
                module_output=bool(op.module_outputs),
                has_params=bool(op.params),
            )
    edges: dict[tuple[str, str], None] = {}
    for op in trace.ops:
        child = node_of.get(op.index)
        if child is None:
            continue
        for i in op.parent_indices:
            parent = node_of.get(i)
            if parent is None:  # outside the focused module: drawn as an external source
                src = trace.ops[i]
                parent = f"external {i}"
                nodes.setdefault(parent, Node(parent, f"{src.label}\\n{shape_text(src.shape)}", "external", ()))
            # An edge inside one collapsed box is not drawn; a rolled layer feeding its
            # own next pass is (a loop edge).
            if parent != child or nodes[child].kind != "module":
                edges[(parent, child)] = None
    return View(
        nodes,
        list(edges),
        {p: m.type_name for p, m in trace.modules.items()},
        rolled,
        {p: m.num_passes for p, m in trace.modules.items()},
        node_of,
    )


def _run_label(trace: Trace, run: Run) -> str:
    """A run of modules as one box: first and last path, how many of which type, output shape, parameters."""
    (first, m), (last, n) = run.members[0], run.members[-1]
    record = trace.modules[last]
    if first == last:  # the passes of one module, called again and again
        first, last = f"{first}:{m}", f"{last}:{n}"
    lines = [f"{first} .. {last}", f"{len(run.members)} x {record.type_name}"]
    shapes = record.passes[n - 1].output_shapes
    if shapes:
        lines.append(" ".join(shape_text(shape) for shape in shapes))
    names = dict.fromkeys(
        name for path in dict.fromkeys(p for p, _ in run.members) for name in trace.modules[path].params
    )
    params, buffers = params_and_buffers(trace, names)
    if params:
        lines.append(f"params: {_count(sum(p.numel for p in params))}")
    if buffers:
        lines.append(f"buffers: {_count(sum(p.numel for p in buffers))}")
    return "\\n".join(lines)


def _module_label(trace: Trace, path: str, n: int, rolled: bool) -> str:
    """A collapsed module: path (and passes), type, output shape, parameters."""
    record = trace.modules[path]
    passes = (
        f" x{record.num_passes}" if rolled and record.num_passes > 1 else (f":{n}" if record.num_passes > 1 else "")
    )
    lines = [f"{path}{passes}", record.type_name]
    shapes = record.passes[n - 1].output_shapes
    if shapes:
        lines.append(" ".join(shape_text(shape) for shape in shapes))
    params, buffers = params_and_buffers(trace, record.params)  # counted as the summary counts them
    if params:
        lines.append(f"params: {_count(sum(p.numel for p in params))}")
    if buffers:
        lines.append(f"buffers: {_count(sum(p.numel for p in buffers))}")
    return "\\n".join(lines)


def _cluster_chain(chain: tuple[tuple[str, int], ...], rolled: bool) -> tuple[tuple[str, int | None], ...]:
    return tuple((path, None if rolled else n) for path, n in chain)


def _op_label(op: OpRecord, trace: Trace, rolled: bool) -> str:
    title = op.layer_label if rolled else op.label
    lines = [title]
    if op.kind == "op":
        lines.append(op.func_name + (f" x{op.num_passes}" if rolled and op.num_passes > 1 else ""))
    lines.append(shape_text(op.shape))
    params, buffers = params_and_buffers(trace, op.params)  # counted as the summary counts them
    for kind, records in (("params", params), ("buffers", buffers)):
        if records:
            count = sum(p.numel for p in records)
            lines.append(f"{kind}: {', '.join(shape_text(p.shape) for p in records)} ({_count(count)})")
    return "\\n".join(lines)


def shape_text(shape: Any) -> str:
    """A shape as drawings write it: ``2x16``, ``scalar``, ``-`` when unknown; several outputs space-separated."""
    if shape is None:
        return "-"
    if shape and isinstance(shape[0], tuple):
        return " ".join(shape_text(s) for s in shape)
    return "x".join(str(d) for d in shape) if shape else "scalar"


def _count(n: int) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


# -- DOT ---------------------------------------------------------------------------------
_STYLE = {
    "input": 'shape=oval, style=filled, fillcolor="#b7e4c7"',
    "output": 'shape=oval, style=filled, fillcolor="#f4acb7"',
    "op": 'shape=box, style="rounded,filled", fillcolor="#ffffff"',
    "module": 'shape=box3d, style=filled, fillcolor="#dde5f6"',
    "segment": 'shape=box3d, style="filled,dashed", fillcolor="#eeeeee"',
    "external": 'shape=oval, style="dashed", fontcolor="#555555"',
}


def nesting(collapse: Collapse, vis_nesting_depth: int | None) -> Collapse:
    """``collapse=``, given under its other name too: ``vis_nesting_depth=d`` (the README's, and older
    releases') is ``collapse=d``, modules ``d`` levels deep drawn as single boxes. Both, unequal: an error."""
    if vis_nesting_depth is None:
        return collapse
    if collapse is not None and collapse != vis_nesting_depth:
        raise ArgumentTypeError(
            f"vis_nesting_depth= is collapse='s other name: give one of them, not "
            f"collapse={collapse!r} and vis_nesting_depth={vis_nesting_depth!r}"
        )
    return vis_nesting_depth


def to_dot(
    trace: Trace,
    vis_mode: str = "unrolled",
    collapse: Collapse = None,
    module: str | None = None,
    colors: dict[str, str] | None = None,
    *,
    vis_nesting_depth: int | None = None,
) -> str:
    """The DOT source of the drawing (no Graphviz needed).

    ``colors`` maps op labels to fill colours (``"#rrggbb"``), for drawings that
    show something per op (``tl.compare(...).draw()`` colours ops by error).
    ``vis_nesting_depth``: ``collapse``'s other name (:func:`nesting`).
    """
    collapse = nesting(collapse, vis_nesting_depth)
    return _dot(trace, view(trace, vis_mode, collapse, module), module, colors)


def _dot(trace: Trace, v: View, module: str | None, colors: dict[str, str] | None) -> str:
    title = f"{trace.model_name or 'function'} ({trace.backend})" + (f", module {module}" if module else "")
    out = [
        "digraph trace {",
        f'  graph [rankdir=TB, fontname="Helvetica", label="{_esc(title)}", labelloc=t];',
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [color="#444444", arrowsize=0.6];',
    ]
    tree: dict[Any, Any] = {}
    for node in v.nodes.values():
        level = tree
        for cluster in node.chain:
            level = level.setdefault(cluster, {})
        level.setdefault(None, []).append(node)
    node_colors = {}
    for op in trace.ops:  # op labels -> the drawing's node ids
        if colors and op.label in colors:
            node_colors[f"layer {op.layer_label}" if v.rolled and op.kind == "op" else f"op {op.index}"] = colors[
                op.label
            ]
    out += _emit(tree, v, 1, node_colors)
    out += [f'  "{_esc(a)}" -> "{_esc(b)}";' for a, b in v.edges]
    out.append("}")
    return "\n".join(out) + "\n"


def _emit(level: dict[Any, Any], v: View, indent: int, colors: dict[str, str]) -> list[str]:
    pad = "  " * indent
    lines = []
    for node in level.get(None, []):
        style = _STYLE[node.kind]
        if node.module_output:  # returned by a module: drawn with a double border
            style += ", peripheries=2"
        if node.has_params:
            style = style.replace('fillcolor="#ffffff"', 'fillcolor="#eeeeee"')
        if node.id in colors:
            style = re.sub(r'fillcolor="[^"]*"', f'fillcolor="{colors[node.id]}"', style)
            style = style if "filled" in style else style + ", style=filled"
        lines.append(f'{pad}"{_esc(node.id)}" [label="{_esc_label(node.label)}", {style}];')
    for cluster, inner in level.items():
        if cluster is None:
            continue
        path, n = cluster
        passes = v.passes.get(path, 1)
        suffix = (f" x{passes}" if v.rolled else f":{n}") if passes > 1 else ""
        title = f"{path}{suffix} ({v.types.get(path, '?')})"
        only = inner.get(None, [])
        if len(inner) == 1 and len(only) == 1 and only[0].module_output:
            # A module that is one op (Conv2d, ReLU...): the op's box names it, no cluster.
            node = only[0]
            lines += _emit({None: [attrs.evolve(node, label=f"{title}\\n{node.label}")]}, v, indent, colors)
            continue
        name = f"cluster {path}" + ("" if n is None else f":{n}")
        lines.append(f'{pad}subgraph "{_esc(name)}" {{')
        lines.append(f'{pad}  label="{_esc(title)}"; style="rounded,dashed"; color="#7a869a"; fontsize=10;')
        lines += _emit(inner, v, indent + 1, colors)
        lines.append(f"{pad}}}")
    return lines


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _esc(text: str) -> str:
    # Control characters (a NUL in a loaded trace's names) end or break DOT strings: shown as \xNN instead.
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _esc_label(text: str) -> str:
    # Labels keep their "\n" line breaks; everything else is escaped.
    return "\\n".join(_esc(part) for part in text.split("\\n"))


# -- rendering -----------------------------------------------------------------------------
def draw(
    trace: Trace,
    path: str | os.PathLike[str] | None = None,
    file_format: str = "pdf",
    vis_mode: str = "unrolled",
    collapse: Collapse = None,
    module: str | None = None,
    colors: dict[str, str] | None = None,
    max_nodes: int | None = DRAW_MAX_NODES,
    *,
    vis_nesting_depth: int | None = None,
) -> str:
    """Render with Graphviz and return the path written (``vis_nesting_depth``: ``collapse``'s other name).

    A drawing of more than ``max_nodes`` nodes is refused (DrawingTooLargeError) before Graphviz starts,
    unless ``max_nodes=None``; one whose layout is estimated to take over WARN_SECONDS warns
    (LargeDrawingWarning). Both say how long it would take and what to draw instead.
    """
    if file_format not in FORMATS:
        raise UnsupportedError(f"file_format must be one of {FORMATS}, not {file_format!r}")
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
        raise UnsupportedError(f"max_nodes must be a count >= 1 or None (no limit), not {max_nodes!r}")
    v = view(trace, vis_mode, nesting(collapse, vis_nesting_depth), module)
    size = layout_size(v)
    seconds = layout_seconds(len(v.nodes), size)
    if max_nodes is not None and len(v.nodes) > max_nodes:
        raise DrawingTooLargeError(
            f"this drawing has {len(v.nodes):,} nodes, over max_nodes={max_nodes:,}: Graphviz would take "
            f"{_duration(seconds)} or more to lay it out. {_instead(trace, vis_mode, module)}, or pass "
            "max_nodes=None to draw it all the same."
        )
    if seconds > WARN_SECONDS:
        warnings.warn(
            LargeDrawingWarning(
                f"drawing {len(v.nodes):,} nodes: Graphviz will take {_duration(seconds)} to lay them out. "
                f"{_instead(trace, vis_mode, module)}."
            ),
            stacklevel=3,
        )
    source = _dot(trace, v, module, colors)
    if path is None:  # named after the trace, which a loaded file chose: one path component, in the working folder
        path = default_name(trace.model_name or "trace", module, vis_mode, suffix=f".{file_format}")
    path = checked_output(path, "a drawing")
    if not path.endswith("." + file_format):
        path = f"{path}.{file_format}"
    render(source, path, file_format, quick=size > QUICK_LAYOUT_SIZE)
    return path


def layout_size(v: View) -> int:
    """The size of the graph Graphviz lays out: the nodes plus one bend point per rank an edge crosses.

    Ranks are longest paths from the sources in the order the ops ran (edges back to an earlier node, a
    rolled loop, count their length too): what ``dot`` ranks a trace as, or a little more.
    """
    order = {node_id: i for i, node_id in enumerate(v.nodes)}
    for node_id, node in v.nodes.items():
        if node.kind == "external":  # values from outside a focused module came before it
            order[node_id] = -1
    into: dict[str, list[str]] = {}
    for a, b in v.edges:
        into.setdefault(b, []).append(a)
    rank: dict[str, int] = {}
    for node_id in sorted(v.nodes, key=order.__getitem__):
        rank[node_id] = max((rank[a] + 1 for a in into.get(node_id, ()) if order[a] < order[node_id]), default=0)
    return len(v.nodes) + sum(max(abs(rank[b] - rank[a]) - 1, 0) for a, b in v.edges)


def layout_seconds(nodes: int, size: int) -> float:
    """About how long Graphviz takes to lay out ``nodes`` nodes of layout size ``size`` (QUICK_LAYOUT)."""
    return size * SECONDS_PER_LAYOUT_UNIT + nodes * nodes * SECONDS_PER_NODE_SQUARED


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"about {max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.0f} h"


def _instead(trace: Trace, vis_mode: str, module: str | None) -> str:
    """What to draw instead of a huge graph, with the auto drawing's node count."""
    auto = len(view(trace, vis_mode, "auto", module).nodes)
    return (
        f'collapse="auto" draws it as {auto} nodes (modules as boxes as deep as fits), collapse=N draws '
        'modules N levels deep as boxes, module="path" draws one module\'s subgraph'
    )


def render(source: str, path: str, file_format: str, quick: bool = False) -> None:
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizNotFoundError(
            "drawing needs the Graphviz 'dot' program, which is not on PATH: install Graphviz "
            "(apt-get install graphviz, brew install graphviz, conda install graphviz). "
            "trace.to_dot() gives the DOT source without it."
        )
    try:
        result = subprocess.run(
            [dot, f"-T{file_format}", *(QUICK_LAYOUT if quick else ()), "-o", path],
            input=source.encode(),
            capture_output=True,
        )
    except (OSError, ValueError) as exc:  # the path or the DOT text as the system refuses them
        raise write_error(path, "a drawing", exc) from None
    if result.returncode != 0:
        raise TorchLensError(f"Graphviz failed to render {path}: {result.stderr.decode(errors='replace').strip()}")


def svg(
    trace: Trace,
    vis_mode: str = "unrolled",
    collapse: Collapse = None,
    module: str | None = None,
    colors: dict[str, str] | None = None,
) -> str | None:
    """SVG text of the drawing, or None without Graphviz (for notebooks)."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    v = view(trace, vis_mode, collapse, module)
    quick = QUICK_LAYOUT if layout_size(v) > QUICK_LAYOUT_SIZE else ()
    result = subprocess.run([dot, "-Tsvg", *quick], input=_dot(trace, v, module, colors).encode(), capture_output=True)
    return result.stdout.decode() if result.returncode == 0 else None
