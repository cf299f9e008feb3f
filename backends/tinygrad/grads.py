"""Gradients on tinygrad: the recorded graph replayed lazily, a zero added at each wanted op, one backward.

``trace.log_backward(loss)`` replays the trace without realizing anything
(:data:`torchlens_tinygrad.replay.AUTOGRAD`; a realized tensor is a buffer,
which no gradient goes back through), from copies of the inputs and of the
parameters (the user's tensors are never written, and never get a
``.grad``). Each wanted op's floating-point output gets a zero added as the
replay computes it, a buffer of its own: tinygrad shares identical graph
nodes, so two ops computing the same expression are one node, and only a
distinct zero at each tells their gradients apart. The gradient with respect
to that zero is the gradient at the op's output. One gradient computation
over the lazy graph then gives every op's, input's and parameter's, and one
schedule computes them all.

tinygrad writes in place by replacing the written Tensor's graph
(``assign``), so a zero added after an op is read by the later ops, in-place
writes included, just as the op's own output would be; a view taken before
a write keeps the value it had, as in a plain lazy run.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.dtype import _to_np_dtype
from tinygrad.mixin.gradient import compute_gradient

from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import EditRecord, OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import replay_values
from torchlens_tinygrad.arrays import is_weak, snapshot
from torchlens_tinygrad.replay import AUTOGRAD


def _differentiable(t: Any) -> bool:
    return isinstance(t, Tensor) and not is_weak(t) and dtypes.is_float(t.dtype)


def _zero(t: Tensor) -> Tensor:
    """Zeros shaped like ``t``, in a buffer of their own (a graph node no other tensor shares)."""
    np_dtype = _to_np_dtype(t.dtype) if t.dtype != dtypes.bfloat16 else None
    if np_dtype is None:  # NumPy has no bfloat16: made in float32, then cast (still a node of its own)
        return Tensor(np.zeros(t.shape, np.float32), device=t.device).cast(t.dtype)
    return Tensor(np.zeros(t.shape, np_dtype), device=t.device)


@attrs.frozen(eq=False)
class _ZeroAdded:
    """The ``where`` of a replay edit: a fresh zero added to a floating-point output, kept for the backward."""

    index: int
    path: tuple[Any, ...]
    zeros: dict[tuple[int, tuple[Any, ...]], Tensor]

    def run(self, helpers: tuple[Any, ...], value: Any) -> Any:
        if not _differentiable(value):  # an integer output of an op of several (topk's indices)
            return value
        zero = self.zeros[self.index, self.path] = _zero(value)
        return value + zero


def _with_zeros(trace: Trace, wanted: set[int], zeros: dict[tuple[int, tuple[Any, ...]], Tensor]) -> list[OpRecord]:
    """``trace``'s ops, each wanted one given an edit adding a zero to every floating-point leaf of its output.

    Added after the op's own edits (intervene=): the gradient is at the value
    later ops read. Each output's dtype is checked when it is computed, not
    read from the record: an op of several outputs records one dtype for all.
    """
    ops = list(trace.ops)
    for op in trace.ops:
        if op.kind != "op" or op.index not in wanted or not _float_record(op):
            continue
        paths = (
            [()]
            if op.shape is None or all(isinstance(d, (int, str)) for d in op.shape)
            else [(i,) for i, s in enumerate(op.shape) if isinstance(s, tuple)]
        )
        edits = tuple(EditRecord("gradient", "op", path, (), _ZeroAdded(op.index, path, zeros)) for path in paths)
        ops[op.index] = attrs.evolve(op, edits=(*op.edits, *edits))
    return ops


def _float_record(op: OpRecord) -> bool:
    # an op of several outputs records its first output's dtype: any of them may be floating-point
    return op.dtype is not None and (op.dtype.startswith(("float", "bfloat", "half")) or _several(op))


def _several(op: OpRecord) -> bool:
    return op.shape is not None and any(isinstance(s, tuple) or s is None for s in op.shape)


def backward(trace: Trace, loss: Any, wanted: list[int]) -> dict[str, Any]:
    """Gradients of ``loss`` (a function of the output) at the ``wanted`` ops and at the trainable parameters."""
    if isinstance(loss, Tensor) or not callable(loss):
        raise UnsupportedError(
            "the tinygrad backend computes gradients by replaying the recorded graph, so the "
            "loss must be a function of the model's output: "
            "trace.log_backward(lambda out: out.sum())"
        )
    wanted_set = set(wanted)
    zeros: dict[tuple[int, tuple[Any, ...]], Tensor] = {}
    ops = _with_zeros(trace, wanted_set, zeros)
    targets: dict[Any, Tensor] = {}  # ("input", index) / ("param", name) -> the copy differentiated by
    for op in trace.ops:
        if op.kind == "input" and isinstance(op.out, Tensor):
            copy = snapshot(op.out)  # a buffer of its own: replay may not write it (it is protected), nor the user
            ops[op.index] = attrs.evolve(op, out=copy)
            if op.index in wanted_set and _differentiable(copy):
                targets["input", op.index] = copy
    params = {}
    for name, record in trace.params.items():
        if isinstance(record.value, Tensor):  # buffers too: what a replay writes is its own
            params[name] = attrs.evolve(record, value=snapshot(record.value))
            if record.trainable and not record.is_buffer and _differentiable(params[name].value):
                targets["param", name] = params[name].value
    graph = Trace(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=ops,
        modules=dict(trace.modules),
        params={**trace.params, **params},
        output_template=trace.output_template,
        notes=dict(trace.notes),
    )
    token = AUTOGRAD.set(True)
    try:
        values = replay_values(graph)
    finally:
        AUTOGRAD.reset(token)
    output = tree.map_leaves(
        lambda r: tree.get(values[r.index], r.path) if isinstance(r, Ref) else r, graph.output_template
    )
    target = loss(output)
    if not isinstance(target, Tensor) or target.numel() != 1:
        shape = f" of shape {target.shape}" if isinstance(target, Tensor) else ""
        raise UnsupportedError(
            f"the loss must give one number (a tensor of one element), not {type(target).__name__}{shape}"
        )
    if not _differentiable(target):
        raise UnsupportedError(f"the loss is of dtype {target.dtype}: only a floating-point loss has gradients")
    targets.update({("zero", index, path): z for (index, path), z in zeros.items()})
    found = _gradients(target.reshape(()), targets)
    ops_found: dict[int, Any] = {}
    by_op: dict[int, dict[tuple[Any, ...], Tensor]] = {}
    for key, grad in found.items():
        if key[0] == "input":
            ops_found[key[1]] = grad
        elif key[0] == "zero":
            by_op.setdefault(key[1], {})[key[2]] = grad
    for index, at in by_op.items():
        ops_found[index] = at[()] if () in at else tree.leaves_from(values[index], at)
    return {"ops": ops_found, "params": {key[1]: g for key, g in found.items() if key[0] == "param"}}


def _gradients(target: Tensor, at: dict[Any, Tensor]) -> dict[Any, Tensor]:
    """The gradient of scalar ``target`` at each tensor of ``at`` it depends on, computed in one schedule.

    ``compute_gradient`` (what ``Tensor.gradient`` calls) says which targets
    the backward reached; ``Tensor.gradient`` gives zeros for the others,
    where "no dependence" is the truth.
    """
    if not at:
        return {}
    try:
        grads = compute_gradient(target.uop, target.const_like(1.0).uop, {t.uop for t in at.values()})
    except RuntimeError as exc:  # an op with no gradient rule: tinygrad's "failed to compute gradient for ..."
        raise UnsupportedError(f"tinygrad cannot differentiate this computation: {exc}") from exc
    found = {}
    for key, t in at.items():
        grad = grads.get(t.uop)
        if grad is not None:
            g = Tensor(grad)
            found[key] = g if g.device is not None else g.clone(device=t.device)
    if found:
        Tensor.realize(*found.values())
    return found


def reference_grads(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Any, Any]:
    """The input gradients of the summed float outputs, by tinygrad alone (the conformance reference)."""
    leaves = [
        (path, leaf)
        for path, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor))
        if _differentiable(leaf)
    ]
    copies = {path: snapshot(leaf) for path, leaf in leaves}
    if not copies:
        return {}
    new_args, new_kwargs = tree.replace_at((args, kwargs), copies)
    out = target(*new_args, **new_kwargs)
    parts = [t.sum() for _, t in tree.leaves(out, lambda v: isinstance(v, Tensor)) if _differentiable(t)]
    if not parts:
        return {}
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return _gradients(total, copies)
