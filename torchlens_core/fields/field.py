"""``op.receptive_field`` and ``op.projective_field``: what a position reads, and what it reaches."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from torchlens_core.backend.manager import backend_named
from torchlens_core.fields.compose import Graph, Span, backward, forward
from torchlens_core.fields.records import AxisBox, Box, FieldCheck
from torchlens_core.fields.support import unit_gradient
from torchlens_core.ir.errors import FieldError
from torchlens_core.ir.records import ModulePass, OpRecord

if TYPE_CHECKING:
    from pathlib import Path

    from torchlens_core.ir.trace import Trace


def as_op(trace: Trace, target: OpRecord | ModulePass | str | int) -> OpRecord:
    """An op from an op, a module pass with one output, a label, a module path or a position."""
    found = trace[target] if isinstance(target, (str, int)) else target
    if isinstance(found, ModulePass):
        outs = found.output_ops
        if len(outs) != 1:
            raise FieldError(
                f"module pass {found.label} returns {len(outs)} ops; pick one: {', '.join(o.label for o in outs)}"
            )
        found = outs[0]
    if not isinstance(found, OpRecord):
        raise FieldError(f"a field needs an op of the trace, got {type(found).__name__}")
    shape = found.shape
    if not (isinstance(shape, tuple) and all(isinstance(d, int) for d in shape)):
        raise FieldError(f"{found.label} has no single array output (its shape is {shape}); a field needs one")
    return found


def _shape(op: OpRecord) -> tuple[int, ...]:
    """``op``'s shape: a field reads ops with one array output (:func:`as_op` checks the ones it is given)."""
    if op.shape is None:
        raise FieldError(f"{op.label} has no single array output; a field needs one")
    return op.shape


def _ancestors(trace: Trace, op: OpRecord) -> set[int]:
    seen, todo = set(), [op.index]
    while todo:
        for parent in trace.ops[todo.pop()].parent_indices:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


class _Field:
    """What both directions share: an op, its spatial dims, and positions in its grid."""

    __slots__ = ("_graph", "axes", "op", "trace")

    def __init__(self, op: OpRecord) -> None:
        self.trace = op.trace
        self.op = as_op(self.trace, op)
        self._graph = Graph(self.trace)
        self.axes: tuple[int, ...] = tuple(self._graph.spatial((self.op.index, ())))

    def _spans(self, position: Any) -> tuple[tuple[int, ...], tuple[Span | None, ...]]:
        """``position`` (one int per spatial dim) checked, and the start region it makes."""
        if isinstance(position, (int, np.integer)) and not isinstance(position, bool):
            position = (position,)
        try:
            position = tuple(operator.index(p) for p in position)
        except TypeError:
            raise FieldError(
                f"a position is one int per spatial dim of {self.op.label} {self.axes}, got {position!r}"
            ) from None
        shape = _shape(self.op)
        if len(position) != len(self.axes) or any(not 0 <= p < shape[d] for p, d in zip(position, self.axes)):
            sizes = tuple(shape[d] for d in self.axes)
            raise FieldError(
                f"position {position} is not in {self.op.label}'s spatial grid {sizes} (dims "
                f"{self.axes} of shape {shape}); give one int per spatial dim, each in range"
            )
        at = dict(zip(self.axes, position))
        spans = tuple(Span(at[d], at[d], at[d], at[d]) if d in at else None for d in range(len(shape)))
        return position, spans

    def center_unit(self, batch_index: int = 0) -> tuple[int, ...]:
        """The unit at the spatial centre (``size // 2`` per spatial dim) of channel 0 in sample ``batch_index``.

        Channel 0, not the most active channel: the geometry is the same for
        every channel, and a fixed choice makes the unit independent of the
        values. Dim 0 is the batch unless it is spatial.
        """
        shape = _shape(self.op)
        unit = [shape[d] // 2 if d in self.axes else 0 for d in range(len(shape))]
        if shape and 0 not in self.axes:
            if not 0 <= operator.index(batch_index) < shape[0]:
                raise FieldError(f"batch_index {batch_index} is out of range for {self.op.label}'s batch of {shape[0]}")
            unit[0] = operator.index(batch_index)
        return tuple(unit)


class ReceptiveField(_Field):
    """The positions of an input node each position of ``op`` reads, over every executed path.

    ``input``: which input node (default: the first one ``op`` depends on
    that has spatial dims).
    """

    __slots__ = ("input", "input_axes")

    def __init__(self, op: OpRecord, input: OpRecord | str | int | None = None) -> None:
        super().__init__(op)
        upstream = _ancestors(self.trace, self.op)
        inputs = [o for o in self.trace.ops if o.kind == "input" and o.index in upstream]
        if input is None:
            if not inputs:
                raise FieldError(f"{self.op.label} depends on no input node: it has no receptive field")
            spatial = [o for o in inputs if self._graph.spatial((o.index, ()))]
            self.input = (spatial or inputs)[0]
        else:
            self.input = as_op(self.trace, input)
            if self.input.kind != "input" or self.input.index not in upstream:
                raise FieldError(
                    f"{self.input.label} is not an input node {self.op.label} depends on; those are "
                    f"{[o.label for o in inputs]}"
                )
        self.input_axes = tuple(self._graph.spatial((self.input.index, ())))
        if not self.input_axes and self.axes:  # an op with no rule hides the input's layout: every dim but the batch
            self.input_axes = tuple(range(1, len(_shape(self.input))))

    def at(self, position: Any) -> Box:
        """The box of input positions that ``position`` (of ``op``'s spatial grid) reads."""
        position, spans = self._spans(position)
        regions = backward(self._graph, (self.op.index, ()), spans)
        region = regions.get((self.input.index, ()))
        shape = _shape(self.input)
        if region is None:
            return Box(
                self.input.label,
                position,
                tuple(AxisBox(d, 0, 0) for d in self.input_axes),
                regions[(self.op.index, ())].status,
            )
        axes = []
        for d in self.input_axes:
            span = region.spans[d]
            if span is None:
                axes.append(AxisBox(d, 0, shape[d]))
            else:
                axes.append(
                    AxisBox(d, span.lo, span.hi + 1, max(0, -span.raw_lo), max(0, span.raw_hi - (shape[d] - 1)))
                )
        return Box(self.input.label, position, tuple(axes), region.status)

    def check(self, unit: Any) -> FieldCheck:
        """Compare ``at(unit's position)`` with where d ``op.out[unit]`` / d input is nonzero (needs gradients)."""
        try:
            unit = tuple(operator.index(u) for u in unit)
        except TypeError:
            raise FieldError(
                f"a unit is one int per dim of {self.op.label}'s shape {self.op.shape}, got {unit!r}"
            ) from None
        if len(unit) != len(_shape(self.op)):
            raise FieldError(f"a unit is one int per dim of {self.op.label}'s shape {self.op.shape}, got {unit}")
        box = self.at(tuple(unit[d] for d in self.axes))
        grad = unit_gradient(self.trace, self.op, unit, self.input)
        support = None
        if grad is not None:
            values = np.asarray(backend_named(self.trace.backend, missing_ok=True).to_numpy(grad))
            where = np.nonzero(values != 0)
            if where[0].size:
                support = tuple((int(where[d].min()), int(where[d].max()) + 1) for d in self.input_axes)
        if support is None:
            return FieldCheck(unit, box, None, True, tuple(0.0 for _ in box.axes), False)
        contains = all(a.start <= lo and hi <= a.stop for (lo, hi), a in zip(support, box.axes))
        tightness = tuple((hi - lo) / a.size if a.size else 0.0 for (lo, hi), a in zip(support, box.axes))
        return FieldCheck(unit, box, support, contains, tightness, support == box.extent)

    def draw(self, position: Any, path: str | Path, *, batch_index: int = 0) -> Path:
        """Write a PNG of the input (sample ``batch_index``) with ``at(position)``'s box drawn on it."""
        from torchlens_core.fields.plot import overlay

        if self.input.out is None:
            raise FieldError(f"the trace did not keep {self.input.label}'s value to draw")
        image = np.asarray(backend_named(self.trace.backend, missing_ok=True).to_numpy(self.input.out))
        return overlay(image, self.at(position), path, batch_index=batch_index)

    def __repr__(self) -> str:
        return f"ReceptiveField({self.op.label} <- {self.input.label}, spatial dims {self.axes} <- {self.input_axes})"


class ProjectiveField(_Field):
    """The positions of a later op that each position of ``op`` reaches, over every executed path."""

    __slots__ = ()

    def at(self, position: Any, target: OpRecord | ModulePass | str | int | None = None) -> Box:
        """The box of ``target``'s positions (default: the trace's last op) that ``position`` of ``op`` reaches.

        A dense head ends the windowed path: aim ``target`` at a later
        windowed op (``target=trace["features.8"]``) for a useful box.
        """
        target_op = self.trace.ops[-1] if target is None else as_op(self.trace, target)
        if target_op.index != self.op.index and self.op.index not in _ancestors(self.trace, target_op):
            raise FieldError(f"{target_op.label} does not depend on {self.op.label}: no projective field to it")
        position, spans = self._spans(position)
        regions = forward(self._graph, (self.op.index, ()), spans, target_op.index)
        key = (target_op.index, ())
        target_axes = self._graph.spatial(key)
        region = regions.get(key)
        if region is None:  # this position reaches none of target's positions (a crop left it out)
            return Box(
                target_op.label,
                position,
                tuple(AxisBox(d, 0, 0) for d in target_axes),
                regions[(self.op.index, ())].status,
            )
        shape = _shape(target_op)
        reached = [region.spans[d] for d in target_axes]
        axes = tuple(
            AxisBox(d, 0, shape[d]) if span is None else AxisBox(d, span.lo, span.hi + 1)
            for d, span in zip(target_axes, reached)
        )
        return Box(target_op.label, position, axes, region.status)

    def __repr__(self) -> str:
        return f"ProjectiveField({self.op.label}, spatial dims {self.axes})"


def receptive_field(op: OpRecord | ModulePass, input: OpRecord | str | int | None = None) -> ReceptiveField:
    """``op``'s receptive field toward ``input`` (default: the first spatial input node it depends on)."""
    return ReceptiveField(op if isinstance(op, OpRecord) else as_op(op.trace, op), input)


def projective_field(op: OpRecord | ModulePass) -> ProjectiveField:
    """``op``'s projective field."""
    return ProjectiveField(op if isinstance(op, OpRecord) else as_op(op.trace, op))
