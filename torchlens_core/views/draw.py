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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.ir.errors import GraphvizNotFoundError, TorchLensError, UnsupportedError
from torchlens_core.views.filenames import checked_output, default_name, write_error
from torchlens_core.views.summary import params_and_buffers

if TYPE_CHECKING:
    from torchlens_core.ir.records import ModuleRecord, OpRecord
    from torchlens_core.ir.trace import Trace

AUTO_NODE_BUDGET = 60  # more than this reads badly on one page
FORMATS = ("pdf", "svg", "png")
VIS_MODES = ("unrolled", "rolled")
Collapse = int | str | Callable[["ModuleRecord"], bool] | None




@attrs.define
class Node:
    id: str
    label: str
    kind: str  # "input", "output", "op", "module" (a collapsed module), "external" (outside a focused module)
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
            f"collapse must be None, 'auto', a depth >= 1 or a predicate on modules, not {collapse!r}")
    return _build(trace, vis_mode == "rolled", collapse, module)


def _auto(trace: Trace, vis_mode: str, module: str | None) -> View:
    """The deepest view that stays within the node budget."""
    full = _build(trace, vis_mode == "rolled", None, module)
    if len(full.nodes) <= AUTO_NODE_BUDGET:
        return full
    best = None
    for depth in range(1, _max_depth(trace, module) + 1):
        candidate = _build(trace, vis_mode == "rolled", depth, module)
        if best is not None and len(candidate.nodes) > AUTO_NODE_BUDGET:
            break
        best = candidate
    return best or full


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


def _collapsed_at(chain: tuple[tuple[str, int], ...], collapse: Collapse, trace: Trace,
                  module: str | None) -> int | None:
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


def _build(trace: Trace, rolled: bool, collapse: Collapse, module: str | None) -> View:
    nodes: dict[str, Node] = {}
    node_of: dict[int, str] = {}
    for op in trace.ops:
        chain = _chain_of(op, module)
        if module is not None and not chain:
            continue
        at = _collapsed_at(chain, collapse, trace, module)
        if at is not None:
            path, n = chain[at]
            key = f"module {path}" if rolled else f"module {path}:{n}"
            if key not in nodes:
                nodes[key] = Node(key, _module_label(trace, path, n, rolled), "module",
                                  _cluster_chain(chain[:at], rolled))
            node_of[op.index] = key
            continue
        key = f"layer {op.layer_label}" if rolled and op.kind == "op" else f"op {op.index}"
        if key not in nodes:
            nodes[key] = Node(key, _op_label(op, trace, rolled), op.kind, _cluster_chain(chain, rolled),
                              module_output=bool(op.module_outputs), has_params=bool(op.params))
        node_of[op.index] = key
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
                nodes.setdefault(parent, Node(parent, f"{src.label}\\n{_shape(src.shape)}", "external", ()))
            # An edge inside one collapsed box is not drawn; a rolled layer feeding its
            # own next pass is (a loop edge).
            if parent != child or nodes[child].kind != "module":
                edges[(parent, child)] = None
    return View(nodes, list(edges), {p: m.type_name for p, m in trace.modules.items()}, rolled,
                {p: m.num_passes for p, m in trace.modules.items()})


def _module_label(trace: Trace, path: str, n: int, rolled: bool) -> str:
    """A collapsed module: path (and passes), type, output shape, parameters."""
    record = trace.modules[path]
    passes = f" x{record.num_passes}" if rolled and record.num_passes > 1 else (
        f":{n}" if record.num_passes > 1 else "")
    lines = [f"{path}{passes}", record.type_name]
    shapes = record.passes[n - 1].output_shapes
    if shapes:
        lines.append(" ".join(_shape(shape) for shape in shapes))
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
    lines.append(_shape(op.shape))
    params, buffers = params_and_buffers(trace, op.params)  # counted as the summary counts them
    for kind, records in (("params", params), ("buffers", buffers)):
        if records:
            count = sum(p.numel for p in records)
            lines.append(f"{kind}: {', '.join(_shape(p.shape) for p in records)} ({_count(count)})")
    return "\\n".join(lines)


def _shape(shape: Any) -> str:
    if shape is None:
        return "-"
    if shape and isinstance(shape[0], tuple):
        return " ".join(_shape(s) for s in shape)
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
    "external": 'shape=oval, style="dashed", fontcolor="#555555"',
}


def to_dot(trace: Trace, vis_mode: str = "unrolled", collapse: Collapse = None, module: str | None = None,
           colors: dict[str, str] | None = None) -> str:
    """The DOT source of the drawing (no Graphviz needed).

    ``colors`` maps op labels to fill colours (``"#rrggbb"``), for drawings that
    show something per op (``tl.compare(...).draw()`` colours ops by error).
    """
    v = view(trace, vis_mode, collapse, module)
    title = f"{trace.model_name or 'function'} ({trace.backend})" + (f", module {module}" if module else "")
    out = ["digraph trace {", f'  graph [rankdir=TB, fontname="Helvetica", label="{_esc(title)}", labelloc=t];',
           '  node [fontname="Helvetica", fontsize=10];', '  edge [color="#444444", arrowsize=0.6];']
    tree: dict[Any, Any] = {}
    for node in v.nodes.values():
        level = tree
        for cluster in node.chain:
            level = level.setdefault(cluster, {})
        level.setdefault(None, []).append(node)
    node_colors = {}
    for op in trace.ops:  # op labels -> the drawing's node ids
        if colors and op.label in colors:
            node_colors[f"layer {op.layer_label}" if v.rolled and op.kind == "op" else f"op {op.index}"] = \
                colors[op.label]
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
        lines.append(f'{pad}  label="{_esc(title)}"; '
                     'style="rounded,dashed"; color="#7a869a"; fontsize=10;')
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
def draw(trace: Trace, path: str | os.PathLike[str] | None = None, file_format: str = "pdf",
         vis_mode: str = "unrolled", collapse: Collapse = None, module: str | None = None,
         colors: dict[str, str] | None = None) -> str:
    """Render with Graphviz and return the path written."""
    if file_format not in FORMATS:
        raise UnsupportedError(f"file_format must be one of {FORMATS}, not {file_format!r}")
    source = to_dot(trace, vis_mode, collapse, module, colors)
    if path is None:  # named after the trace, which a loaded file chose: one path component, in the working folder
        path = default_name(trace.model_name or "trace", module, vis_mode, suffix=f".{file_format}")
    path = checked_output(path, "a drawing")
    if not path.endswith("." + file_format):
        path = f"{path}.{file_format}"
    render(source, path, file_format)
    return path


def render(source: str, path: str, file_format: str) -> None:
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizNotFoundError(
            "drawing needs the Graphviz 'dot' program, which is not on PATH: install Graphviz "
            "(apt-get install graphviz, brew install graphviz, conda install graphviz). "
            "trace.to_dot() gives the DOT source without it.")
    try:
        result = subprocess.run([dot, f"-T{file_format}", "-o", path], input=source.encode(), capture_output=True)
    except (OSError, ValueError) as exc:  # the path or the DOT text as the system refuses them
        raise write_error(path, "a drawing", exc) from None
    if result.returncode != 0:
        raise TorchLensError(f"Graphviz failed to render {path}: {result.stderr.decode(errors='replace').strip()}")


def svg(trace: Trace, **options: Any) -> str | None:
    """SVG text of the drawing, or None without Graphviz (for notebooks)."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    result = subprocess.run([dot, "-Tsvg"], input=to_dot(trace, **options).encode(), capture_output=True)
    return result.stdout.decode() if result.returncode == 0 else None
