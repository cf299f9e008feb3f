"""Text reports: trace.summary() (module table and totals), print(trace) and print(op).

Also the two conventions every report shares: counts print with an SI prefix
(:class:`Count`, ``trace.flops``), and buffers (running statistics...) are
never counted as parameters but shown apart (:func:`params_and_buffers`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.ir.errors import ArgumentTypeError
from torchlens_core.ir.records import ParamRecord, num_bytes, refs_in
from torchlens_core.views.html import Text

if TYPE_CHECKING:
    from torchlens_core.ir.records import ModulePass, OpRecord
    from torchlens_core.ir.trace import Trace


class Count(float):
    """A total such as ``trace.flops``: a float in every way, printed readably.

    ``str(trace.flops)`` and ``f"{trace.flops}"`` give what the summary prints
    (``1.4 GFLOPs``); the REPL shows that and the exact value
    (``1.4 GFLOPs (1,430,190,952)``); a format spec (``f"{trace.flops:.3e}"``)
    and arithmetic treat it as the plain number it is.
    """

    __slots__ = ("unit",)
    unit: str

    def __new__(cls, value: float, unit: str) -> Count:
        count = super().__new__(cls, value)
        count.unit = unit
        return count

    def __str__(self) -> str:
        return _si(float(self), self.unit)

    def __repr__(self) -> str:
        short = str(self)
        exact = f"{int(self):,}" if self.is_integer() else repr(float(self))
        return short if short == f"{exact} {self.unit}" else f"{short} ({exact})"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(float(self), spec)

    def __reduce__(self) -> tuple[Any, ...]:  # float's own reduce would drop the unit
        return (Count, (float(self), self.unit))


def params_and_buffers(trace: Trace, names: Iterable[str]) -> tuple[list[ParamRecord], list[ParamRecord]]:
    """The parameter records ``names`` refer to, split into parameters and buffers.

    Every count of parameters (summary, drawing, ``print(op)``) adds the first
    list only, as the model's own parameter count does; buffers are shown apart.
    """
    records = [trace.params[name] for name in names if name in trace.params]
    return [p for p in records if not p.is_buffer], [p for p in records if p.is_buffer]


@attrs.define(slots=True)
class SummaryRow:
    """One module row of ``trace.summary()``: what it shows, with the exact parameter count."""

    path: str  # "" for the row of the parameters the model holds itself
    type_name: str | None  # None for a parent path that no module record names
    shape: str  # the last pass's output shape(s), "-" for a module that never ran itself
    num_passes: int
    params: list[ParamRecord]  # the parameters counted in this row, and in no other
    expanded: bool  # modules below it have rows of their own


def summary_rows(trace: Trace, depth: int | None = 1) -> list[SummaryRow]:
    """The module rows of ``trace.summary(depth)``, parents before their children.

    Every parameter is counted in exactly one row, the deepest one shown that holds it, so the rows'
    counts add up to the model's. A container that never ran itself (``nn.ModuleList``, ``nnx.List``)
    has a row with no output shape and does not use up a level: the modules in it that ran are shown
    beside their siblings.
    """
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ArgumentTypeError(
            f"summary(depth=) takes a number of module levels >= 1, or None for every level; got {depth!r}"
        )
    tree = _ModuleTree(trace)
    shown = tree.shown(depth)
    visible = set(shown)
    counted = tree.counted(visible)
    rows = [SummaryRow("", None, "-", 0, counted[""], False)] if counted.get("") else []
    for path in shown:
        module = trace.modules.get(path)
        expanded = any(child in visible for child in tree.children[path])
        if module is None:
            rows.append(SummaryRow(path, None, "-", 0, counted.get(path, []), expanded))
            continue
        shape = "-"  # never called itself: a container, or a module this forward did not use
        if module.passes:
            shapes = module.passes[-1].output_shapes
            shape = _shape(shapes[0]) if len(shapes) == 1 else " ".join(_shape(s) for s in shapes)
        rows.append(SummaryRow(path, module.type_name, shape, module.num_passes, counted.get(path, []), expanded))
    return rows


def summary(trace: Trace, depth: int | None = 1) -> str:
    """The module table down to ``depth`` levels (``None``: all), then the totals (see :func:`summary_rows`)."""
    rows = [("Layer", "Output Shape", "Params", "Train")]
    for label in trace.input_labels:
        rows.append(("input" if len(trace.input_labels) == 1 else label, _shape(trace[label].shape), "0", "-"))
    partial = False  # a row with modules shown below it also holds parameters of its own
    for row in summary_rows(trace, depth):
        if not row.path:
            name = "(model's own)"
        else:
            name = "  " * row.path.count(".") + row.path + (f" ({row.type_name})" if row.type_name else "")
        if row.num_passes > 1:
            name += f" x{row.num_passes}"
        partial = partial or (row.expanded and bool(row.params))
        cells = ("-", "-") if row.expanded and not row.params else _params_cells(row.params)
        rows.append((name, row.shape, *cells))
    for label in trace.output_labels:
        rows.append(("output" if len(trace.output_labels) == 1 else label, _shape(trace[label].shape), "-", "-"))

    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(r: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    params, buffers = params_and_buffers(trace, trace.params)
    total = sum(p.numel for p in params)
    trainable = sum(p.numel for p in params if p.trainable)
    in_buffers = sum(p.numel for p in buffers)
    return Text(
        "\n".join(
            [
                f"Model: {trace.model_name or 'function'} ({trace.backend})",
                rule,
                line(rows[0]),
                rule,
                *map(line, rows[1:]),
                rule,
                *(
                    ["(a row with modules shown below it counts only the parameters it holds itself)"]
                    if partial
                    else []
                ),
                f"Params: {total:,} unique; trainable: {trainable:,}"
                + (f"; buffers: {in_buffers:,}" if buffers else ""),
                f"Ops: {trace.num_ops} total",
                f"Edges: {trace.num_edges} total",
                f"Forward FLOPs: {flops_text(trace)}  MACs: {_si(trace.macs, '')}",
            ]
        )
    )


class _ModuleTree:
    """The module paths of a trace as a tree: every recorded module, and each parent path of one."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.children: dict[str, list[str]] = {"": []}
        paths = list(trace.modules)
        paths += [p.module for p in trace.params.values() if p.module and p.module not in trace.modules]
        for path in paths:
            self._add(path)
        self.ran: dict[str, bool] = {}  # the module or one below it ran
        for path in reversed(list(self.children)):
            module = trace.modules.get(path)
            self.ran[path] = bool(module is not None and module.passes) or any(self.ran[c] for c in self.children[path])

    def _add(self, path: str) -> None:
        if path in self.children:
            return
        parent = path.rpartition(".")[0]
        self._add(parent)
        self.children[parent].append(path)
        self.children[path] = []

    def uses_a_level(self, path: str) -> bool:
        """False for a container that never ran while modules in it did: its rows are its modules' rows."""
        module = self.trace.modules.get(path)
        return bool(module is not None and module.passes) or not self.ran[path]

    def shown(self, depth: int | None) -> list[str]:
        """The paths shown down to ``depth`` levels, parents before their children."""
        found: list[str] = []
        stack = [(child, 1) for child in reversed(self.children[""])]
        while stack:
            path, level = stack.pop()
            if depth is not None and level > depth:
                continue
            found.append(path)
            below = level + 1 if self.uses_a_level(path) else level
            stack.extend((child, below) for child in reversed(self.children[path]))
        return found

    def counted(self, visible: set[str]) -> dict[str, list[ParamRecord]]:
        """Each parameter under the deepest shown path holding it ("" for the model's own): counted once."""
        rows: dict[str, list[ParamRecord]] = {}
        for record in self.trace.params.values():
            if record.is_buffer:
                continue
            path = record.module
            while path and path not in visible:
                path = path.rpartition(".")[0]
            rows.setdefault(path, []).append(record)
        return rows


def _params_cells(params: list[ParamRecord]) -> tuple[str, str]:
    """The Params and Train cells of one summary row."""
    train = (
        "-"
        if not params
        else "yes"
        if all(p.trainable for p in params)
        else "no"
        if not any(p.trainable for p in params)
        else "partly"
    )
    return _count(sum(p.numel for p in params)), train


def flops_text(trace: Trace) -> str:
    """Total FLOPs, saying how many ops have no formula (their FLOPs are unknown, not zero)."""
    unknown = len(trace.unknown_flops)
    return str(trace.flops) + (f" (+ {unknown} ops of unknown cost)" if unknown else "")


def overview(trace: Trace, head: int = 40, tail: int = 20) -> str:
    """``print(trace)``: one line per op (label, call, output shape, module), long traces elided."""
    name = trace.model_name or "function"
    params, _ = params_and_buffers(trace, trace.params)
    lines = [
        f"Trace of {name} ({trace.backend}): {trace.num_ops} ops, {trace.num_edges} edges, "
        f"{len(trace.modules)} modules, {_count(sum(p.numel for p in params))} params; "
        f"{flops_text(trace)}" + (" [halted]" if trace.halted else "")
    ]
    ops = trace.ops
    shown = ops if len(ops) <= head + tail + 1 else [*ops[:head], None, *ops[-tail:]]
    rows = []
    for op in shown:
        if op is None:
            rows.append((f"... {len(ops) - head - tail} more ops ...", "", "", ""))
            continue
        call = op.func_name if op.kind == "input" else f"{op.func_name}({', '.join(op.parents)})"
        rows.append(
            (
                op.label,
                call if len(call) <= 60 else call[:57] + "...",
                _shape(op.shape),
                op.modules[-1] if op.module_passes else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + ("  " + r[3] if r[3] else "") for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def describe(op: OpRecord) -> str:
    """``print(trace[label])``: everything recorded about one op."""
    trace = op.trace_ref() if op.trace_ref is not None else None
    if op.kind == "op" and trace is not None:
        # both counted once per trace (Trace.op_number): printing every op of a long trace stays linear
        head = f"Layer {op.label}, operation {trace.op_number(op)}/{trace.op_number(trace.ops[-1])}:"
    else:
        head = f"Layer {op.label} ({op.kind}):"
    size = op.num_bytes
    lines = [
        head,
        f"    Output: shape={_tuple(op.shape)}, dtype={op.dtype}, device={op.device}"
        + (f", size={_bytes(size)}" if size is not None else ""),
    ]
    if op.out is not None:
        preview = str(op.out).splitlines() or [""]  # a value that prints as nothing (an empty string)
        lines.append(
            "        " + (preview[0][:72] + " ..." if len(preview) > 1 or len(preview[0]) > 72 else preview[0])
        )
    elif not op.saved:
        lines.append("        (value not saved: save= left it out)")
    lines += [
        "    Related layers:",
        f"        - parent layers: {', '.join(op.parents) or 'none'}",
        f"        - child layers: {', '.join(op.children) or 'none'}",
    ]
    params, buffers = params_and_buffers(trace, op.params) if trace is not None else ([], [])
    if params:
        trainable = sum(p.numel for p in params if p.trainable)
        lines.append(
            f"    Params: computed from params with shape {', '.join(_tuple(p.shape) for p in params)}; "
            f"{_numel(params):,} params total ({_bytes(_nbytes(params))}), {trainable:,} trainable"
        )
    if buffers:
        lines.append(
            f"    Buffers: reads buffers with shape {', '.join(_tuple(p.shape) for p in buffers)}; "
            f"{_numel(buffers):,} values ({_bytes(_nbytes(buffers))}), not counted as params"
        )
    if op.kind == "op":
        grad_fn = op.meta.get("grad_fn")  # torch's autograd node name; anything else (a loaded file's) is not shown
        grad_fn = grad_fn if isinstance(grad_fn, str) else None
        lines.append(
            f"    Function: {op.func_name}"
            + (f" (grad_fn_handle: {grad_fn})" if grad_fn else "")
            + (f" (source: {op.source})" if op.source else "")
            + (" (in place)" if op.in_place else "")
        )
        lines.append(f"    Computed inside module: {op.modules[-1] if op.module_passes else '(top level)'}")
        if op.module_outputs:
            lines.append(f"    Output of module: {', '.join(op.module_outputs)}")
        config = _module_config(op, trace)
        if config is None:  # no module returned it (a functional call, an op inside a module): its arguments
            config = op.config
        if config:
            lines.append("    Config: " + ", ".join(f"{k}={_short(v)}" for k, v in config.items()))
        if trace is not None:
            macs = op.macs
            lines.append(
                f"    FLOPs: {_si(op.flops, 'FLOPs') if op.flops is not None else 'unknown'}"
                + (f"  MACs: {_si(macs, '')}" if macs else "")
            )
        if op.elapsed is not None:
            lines.append(f"    Time elapsed: {_seconds(op.elapsed)}")
        if any("rng" in key for key in op.meta):
            lines.append("    Random: the RNG state before the call is recorded, so replay draws the same numbers")
        if op.conditions:
            lines.append(f"    Inside a data-dependent branch decided by: {', '.join(op.conditions)}")
    if op.grad_status is not None:
        if op.grad is not None:
            shapes = [list(getattr(g, "shape", ())) for _, g in _array_leaves(op.grad)]
            lines.append(f"    Gradient: shape={shapes[0] if len(shapes) == 1 else shapes} ({op.grad_status})")
        else:
            lines.append(f"    Gradient: none ({op.grad_status})")
    if trace is not None:
        d = op.distances
        lines.append(
            f"    Distance from input: {_range(d.min_from_input, d.max_from_input)}; "
            f"to output: {_range(d.min_to_output, d.max_to_output)}"
        )
    for i, loc in enumerate(op.code_context[:3]):
        lines.append(("    Code: " if i == 0 else "          ") + str(loc))
    if trace is not None:
        position = [str(op.index - len(trace.ops)), str(op.index)]
        lines.append(f"    Lookup keys: {', '.join(position + sorted(trace.keys_of(op)))}")
    return "\n".join(lines)


def describe_pass(module_pass: ModulePass) -> str:
    """``print(trace["layer1.0:1"])``: one call of a module, as :func:`describe` shows an op."""
    trace = module_pass.trace_ref() if module_pass.trace_ref is not None else None
    if trace is None:
        return repr(module_pass)
    module = trace.modules[module_pass.path]
    ops = module_pass.ops
    lines = [
        f"Module pass {module_pass.label} ({module.type_name}), call {module_pass.pass_num} of {module.num_passes}:",
        f"    Ops: {len(ops)}" + (f" ({ops[0]} .. {ops[-1]})" if len(ops) > 1 else f" ({ops[0]})" if ops else ""),
    ]
    if module_pass.in_template is not None:
        read = [trace.ops[ref.index].label + _path(ref.path) for ref in refs_in(module_pass.in_template)]
        lines.append(f"    Inputs: {', '.join(read) or 'none from the trace'}")
    outputs = [trace.ops[ref.index].label + _path(ref.path) for ref in refs_in(module_pass.out_template)]
    shapes = ", ".join(_tuple(s) for s in module_pass.output_shapes)
    lines.append(f"    Output: {', '.join(outputs) or 'none'}" + (f"; shape {shapes}" if shapes else ""))
    params, buffers = params_and_buffers(trace, module.params)
    if params:
        lines.append(f"    Params: {len(params)} tensors, {_numel(params):,} params ({_bytes(_nbytes(params))})")
    if buffers:
        lines.append(f"    Buffers: {len(buffers)} tensors, {_numel(buffers):,} values")
    if module.config:
        lines.append("    Config: " + ", ".join(f"{k}={_short(v)}" for k, v in module.config.items()))
    keys = [k for k in (module_pass.label, module_pass.path) if trace._index().get(k) is module_pass]
    if keys:
        lines.append(f"    Lookup keys: {', '.join(keys)}")
    return "\n".join(lines)


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{k!r}]" for k in path)


def _module_config(op: OpRecord, trace: Trace | None) -> dict[str, Any] | None:
    """The configuration of the innermost module that returned ``op`` (``out_channels=384, kernel_size=...``,
    as the backend recorded it), or None: no module returned it, or the backend records no configuration."""
    if trace is None or not op.module_outputs:
        return None
    innermost = max(op.module_outputs, key=lambda label: label.count("."))  # a block's last layer: the layer
    module = trace.modules.get(innermost.rpartition(":")[0])
    return None if module is None else module.config


def _array_leaves(value: Any) -> list[tuple[Any, Any]]:
    from torchlens_core.ir import tree

    return [(p, v) for p, v in tree.leaves(value, lambda v: v is not None and hasattr(v, "shape"))]


def _numel(records: list[ParamRecord]) -> int:
    return sum(p.numel for p in records)


def _nbytes(records: list[ParamRecord]) -> int:
    return sum(num_bytes(p.shape, p.dtype) or 0 for p in records)


def _si(n: float | None, unit: str) -> str:
    if n is None:
        return "unknown"
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _seconds(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t >= 1e-3 else f"{t * 1e6:.0f} us"


def _range(lo: int | None, hi: int | None) -> str:
    if lo is None:
        return "no path"
    return str(lo) if lo == hi else f"{lo} to {hi}"


def _tuple(shape: Any) -> str:
    return str(tuple(shape)) if shape is not None else "-"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _shape(shape: Any) -> str:
    if shape is None:
        return "-"
    if shape and isinstance(shape[0], tuple):
        return " ".join(_shape(s) for s in shape)
    return "[" + ",".join(str(d) for d in shape) + "]"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)
