"""``trace.log_backward(loss)``: the loss's gradient at every op ``save_grads=`` picked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import (
    GRAD_NO_DEPENDENCE,
    GRAD_NOT_DIFFERENTIABLE,
    GRAD_SAVED,
    GRAD_WAITING,
    EditRecord,
    OpRecord,
)
from torchlens_core.ir.trace import Trace

if TYPE_CHECKING:
    from collections.abc import Callable

    from torchlens_core.backend.base import Backend

_FLOATING = ("float", "bfloat", "half", "double", "complex")


def log_backward(trace: Trace, loss: Any) -> Trace:
    """Run the backward of ``loss`` (a scalar, or a function of the trace's output) and keep the gradients."""
    if trace.halted:
        raise UnsupportedError("a halted trace stopped before the model's output: it has no loss to go back from")
    wanted = [op for op in trace.ops if op.grad_status in (GRAD_WAITING, GRAD_SAVED, GRAD_NO_DEPENDENCE)]
    if not wanted:
        raise UnsupportedError(
            "this trace keeps no gradients: capture it with tl.trace(..., save_grads=True) or "
            "save_grads=<selector> first"
        )
    found = backend_named(trace.backend, missing_ok=True).backward(trace, loss, [op.index for op in wanted])
    if found is None:
        raise UnsupportedError(f"the {trace.backend} backend cannot compute gradients here")
    grads, params = found.get("ops", {}), found.get("params", {})
    for op in wanted:
        grad = grads.get(op.index)
        if grad is None:
            op.grad, op.grad_status = None, _why_none(op)
        else:
            op.grad, op.grad_status = grad, GRAD_SAVED
    for name, record in trace.params.items():
        record.grad = params.get(name)
    return trace


def _why_none(op: OpRecord) -> str:
    return GRAD_NO_DEPENDENCE if op.dtype and op.dtype.startswith(_FLOATING) else GRAD_NOT_DIFFERENTIABLE


@attrs.frozen
class _Perturbation:
    """An op's output plus a zero of the same shape: differentiating by the zero gives the op's gradient."""

    delta: Any

    def run(self, helpers: tuple[Any, ...], value: Any) -> Any:
        return value + self.delta


def perturbed(trace: Trace, deltas: dict[tuple[int, tuple[Any, ...]], Any]) -> Trace:
    """``trace`` with ``delta`` added to the output (leaf ``path``) of each op ``(index, path)`` of ``deltas``.

    Replayed under a framework's autodiff, the gradient of a loss with
    respect to each delta (all zeros) is the gradient at that op's output:
    one backward pass gives every selected op's gradient. The records are
    shared but for the ops given a delta; the trace itself is not changed.
    """
    extra: dict[int, list[EditRecord]] = {}
    for (index, path), delta in deltas.items():
        extra.setdefault(index, []).append(EditRecord("gradient", "op", path, (), _Perturbation(delta)))
    ops = [attrs.evolve(op, edits=(*op.edits, *extra[op.index])) if op.index in extra else op for op in trace.ops]
    copy = Trace(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=ops,
        modules=dict(trace.modules),
        params=dict(trace.params),
        output_template=trace.output_template,
        notes=dict(trace.notes),
    )
    copy.call = trace.call
    return copy


def float_leaves(trace: Trace, index: int) -> list[tuple[Any, ...]]:
    """The paths of the floating-point arrays in op ``index``'s output (``[()]`` for one array)."""
    op = trace.ops[index]
    if op.dtype is None or not op.dtype.startswith(_FLOATING):
        return []
    if op.shape is None or all(isinstance(d, int) for d in op.shape):
        return [()]
    return [(i,) for i, s in enumerate(op.shape) if isinstance(s, tuple)]


def total(backend: str) -> Callable[[Any], Any]:
    """A loss for checks: the sum of every element of every floating-point array in an output."""
    from torchlens_core.ir import tree

    h = backend_named(backend, missing_ok=True)

    def loss(output: Any) -> Any:
        ops = h.array_ops()
        if ops is None:
            raise UnsupportedError(f"the {backend} backend has no array operations (array_ops) to take a loss with")
        parts = [ops.total(leaf) for _, leaf in tree.leaves(output, lambda v: _is_float(h, backend, v))]
        if not parts:
            raise UnsupportedError("the output holds no floating-point array to take a loss of")
        result = parts[0]
        for part in parts[1:]:
            result = result + part
        return result

    return loss


def _is_float(h: Backend, backend: str, value: Any) -> bool:
    info = h.array_info(value)
    return info is not None and info[1].startswith(_FLOATING)
