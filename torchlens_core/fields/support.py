"""The empirical side of a receptive field: where the gradient of one unit is nonzero at an input.

:func:`unit_gradient` is general: the gradient of one element of any op's
value with respect to an input node, for any backend with the ``gradients``
capability. It replays the recorded graph up to that op (a copy of the trace
whose output is the op) through the backend's ``torchlens_backward`` hook
with the loss ``out[unit]``, so a backend gets it by implementing that hook,
as ``trace.log_backward`` needs anyway; the trace itself is not changed.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.backend.manager import backend_named, resolve_backend
from torchlens_core.ir.errors import FieldError, UnsupportedError
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace


def unit_gradient(trace: Trace, op: OpRecord, unit: tuple[int, ...], wrt: OpRecord) -> Any:
    """d ``op.out[unit]`` / d ``wrt`` (an input node's value), as the backend's array; None if it does not depend.

    Raises :class:`UnsupportedError` on a backend without gradients, and
    :class:`FieldError` for a unit off ``op``'s shape or an input whose value
    the trace did not keep.
    """
    info = resolve_backend(trace.backend)
    if "gradients" not in info.capabilities:
        raise UnsupportedError(
            f"the {trace.backend} backend has no gradients (capability 'gradients'), so a "
            f"field's check cannot measure the gradient support; rf.at() needs none"
        )
    shape = op.shape
    if not (isinstance(shape, tuple) and all(isinstance(d, int) for d in shape)):
        raise FieldError(f"{op.label} has no single array output to take a unit of")
    if len(unit) != len(shape) or any(not 0 <= u < n for u, n in zip(unit, shape)):
        raise FieldError(f"unit {unit} is not an index into {op.label}'s shape {shape}: give one int per dim")
    if wrt.kind != "input" or wrt.out is None:
        raise FieldError(
            f"{wrt.label} is not an input node whose value the trace kept (capture with save= keeping the inputs)"
        )
    cut = Trace(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=list(trace.ops[: op.index + 1]),
        modules=dict(trace.modules),
        params=dict(trace.params),
        output_template=Ref(op.index),
        notes=dict(trace.notes),
    )
    index = tuple(int(u) for u in unit)
    found = backend_named(trace.backend, missing_ok=True).backward(cut, lambda out: out[index], [wrt.index])
    if found is None:
        raise UnsupportedError(f"the {trace.backend} backend cannot compute gradients here")
    return found.get("ops", {}).get(wrt.index)
