"""trace.summary(): the module table and totals, as plain text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchlens_core.trace import Trace


def summary(trace: Trace) -> str:
    rows = [("Layer", "Output Shape", "Params", "Train")]
    for label in trace.input_labels:
        rows.append(("input" if len(trace.input_labels) == 1 else label, _shape(trace[label].shape), "0", "-"))
    for module in trace.modules.values():
        if "." in module.path or not module.passes:
            continue
        shapes = module.passes[-1].output_shapes
        shape = _shape(shapes[0]) if len(shapes) == 1 else " ".join(_shape(s) for s in shapes)
        params = [p for p in map(trace.params.__getitem__, module.params) if not p.is_buffer]
        count = sum(p.numel for p in params)
        train = "-" if not params else "yes" if all(p.trainable for p in params) else \
            "no" if not any(p.trainable for p in params) else "partly"
        name = f"{module.path} ({module.type_name})"
        if module.num_passes > 1:
            name += f" x{module.num_passes}"
        rows.append((name, shape, _count(count), train))
    for label in trace.output_labels:
        rows.append(("output" if len(trace.output_labels) == 1 else label, _shape(trace[label].shape), "-", "-"))

    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(r: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    total = sum(p.numel for p in trace.params.values() if not p.is_buffer)
    trainable = sum(p.numel for p in trace.params.values() if p.trainable and not p.is_buffer)
    return "\n".join([
        f"Model: {trace.model_name or 'function'} ({trace.backend})",
        rule, line(rows[0]), rule, *map(line, rows[1:]), rule,
        f"Params: {total:,} unique; trainable: {trainable:,}",
        f"Ops: {trace.num_ops} total",
        f"Edges: {trace.num_edges} total",
    ])


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
