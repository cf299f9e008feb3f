"""Gradients on torch: from the real backward pass, or by replaying the graph under autograd.

During a capture with ``save_grads=``, each wanted op's output gets a tensor
hook as the op is recorded (:func:`hook_grads`). A hook registered before a
later in-place write sees the gradient of the value as the op produced it,
not of the overwritten one; each pass of a reused module is its own op with
its own hook. ``trace.log_backward(loss)`` then runs ``loss.backward()`` (the
model's parameters accumulate ``.grad`` as after any backward), with hooks
on the inputs and parameters for just that call. A trace whose graph is
gone (loaded from a file, captured without gradients, already backed
through) is replayed under autograd instead, with a zero added at each
wanted op: the gradients with respect to those zeros are the ops'.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_torch.replay import AUTOGRAD


def hook_grads(op: OpRecord, out: Any) -> None:
    """Keep the gradient that reaches each tensor of ``out`` (op's output) on ``op``."""
    if isinstance(out, torch.Tensor):
        if out.requires_grad:
            out.register_hook(_storing(op, ()))
        return
    for i, t in enumerate(out):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            t.register_hook(_storing(op, (i,)))


def _storing(op: OpRecord, path: tuple[Any, ...]) -> Any:
    def store(grad: torch.Tensor) -> None:
        op.set_grad(path, grad)

    return store


def backward(trace: Trace, loss: Any, wanted: list[int]) -> dict[str, Any]:
    """Gradients of ``loss`` (a scalar tensor, or a function of the output) at ``wanted`` ops and the parameters."""
    if callable(loss) and not isinstance(loss, torch.Tensor):
        output = trace.output
        # Live only if it gives everything: the graph is there, and every wanted input can be hooked.
        if _has_graph(output) and all(
            _hookable(trace, op.index) for op in trace.ops if op.kind == "input" and op.index in wanted
        ):
            try:
                return _live(trace, loss(output), wanted)
            except _GraphFreed:
                pass  # an earlier backward freed it: replay instead
        return _replayed(trace, loss, wanted)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise UnsupportedError(
            "log_backward takes a scalar tensor computed from the trace's values, or a "
            "function of the output (lambda out: out.sum())"
        )
    if loss.grad_fn is None:
        raise UnsupportedError(
            "the loss has no autograd graph: the forward ran without gradients (torch.no_grad, "
            "inputs and weights that require none); pass lambda out: ... to replay it with them"
        )
    try:
        return _live(trace, loss, wanted)
    except _GraphFreed as exc:
        raise UnsupportedError(
            "the forward's graph was freed by an earlier backward: capture again, or pass "
            "lambda out: ... to replay the graph"
        ) from exc.__cause__


class _GraphFreed(Exception):
    """An earlier backward freed the forward's saved tensors."""


def _hookable(trace: Trace, index: int) -> bool:
    """Is input node ``index``'s array still alive and in the graph (or an integer one, which has no gradient)?"""
    op = trace.ops[index]
    if op.dtype is None or not op.dtype.startswith(("float", "bfloat", "complex")):
        return True
    given = trace.call.given_array(index) if hasattr(trace.call, "given_array") else None
    return isinstance(given, torch.Tensor) and given.requires_grad


def _has_graph(value: Any) -> bool:
    return any(t.grad_fn is not None for _, t in tree.leaves(value, lambda v: isinstance(v, torch.Tensor)))


def _live(trace: Trace, loss: torch.Tensor, wanted: list[int]) -> dict[str, Any]:
    """``loss.backward()`` with the capture's hooks on the ops, and hooks on the inputs and parameters for now."""
    wanted_set = set(wanted)
    for index in wanted:  # hooks set these again; a second backward must not keep the first's
        trace.ops[index].grad = None
    params: dict[str, torch.Tensor] = {}
    handles = []
    for name, record in trace.params.items():
        value = record.value
        if isinstance(value, torch.Tensor) and value.requires_grad:
            handles.append(value.register_hook(lambda g, name=name: params.__setitem__(name, g)))
    call = getattr(trace.call, "given_array", None)
    for op in trace.ops:
        if op.kind == "input" and op.index in wanted_set and call is not None:
            given = call(op.index)
            if isinstance(given, torch.Tensor) and given.requires_grad:
                handles.append(given.register_hook(_storing(op, ())))
    try:
        loss.backward()
    except RuntimeError as exc:
        if "second time" in str(exc):
            raise _GraphFreed() from exc
        raise
    finally:
        for handle in handles:
            handle.remove()
    return {"ops": {i: trace.ops[i].grad for i in wanted if trace.ops[i].grad is not None}, "params": params}


def _replayed(trace: Trace, loss: Any, wanted: list[int]) -> dict[str, Any]:
    """Re-run the recorded graph with autograd on, hooking each wanted op's output as the capture does.

    The inputs and trainable parameters become fresh leaves, and the buffers
    copies (a training-mode batch norm updates its own, not the model's).
    Hooks, not added zeros, keep torch's in-place semantics: a value later
    written in place, or through a view, gets the gradient of the version
    the op produced.
    """
    import attrs

    from torchlens_core.replay.evaluator import replay_values

    wanted_set = set(wanted)
    found: dict[int, Any] = {}
    holder = {index: OpRecord(index=index, kind="op", func_name="") for index in wanted_set}
    ops = list(trace.ops)
    for op in trace.ops:
        value = op.out
        if op.kind == "input" and isinstance(value, torch.Tensor) and value.is_floating_point():
            ops[op.index] = attrs.evolve(op, out=value.detach().clone().requires_grad_(op.index in wanted_set))
    params = {}
    for name, record in trace.params.items():
        value = record.value
        if isinstance(value, torch.Tensor):
            trainable = record.trainable and not record.is_buffer and value.is_floating_point()
            params[name] = attrs.evolve(record, value=value.detach().clone().requires_grad_(trainable))
    graph = Trace(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=ops,
        modules=dict(trace.modules),
        params={**trace.params, **params},
        output_template=trace.output_template,
        notes=dict(trace.notes),
    )

    def observe(op: OpRecord, value: Any) -> None:
        if op.index in wanted_set:
            hook_grads(holder[op.index], value)

    token = AUTOGRAD.set(True)
    try:
        values = replay_values(graph, observe)
    finally:
        AUTOGRAD.reset(token)
    with torch.enable_grad():
        output = tree.map_leaves(lambda r: values[r.index] if isinstance(r, Ref) else r, graph.output_template)
        target = loss(output)
        if not isinstance(target, torch.Tensor) or not target.requires_grad:
            return {"ops": {}, "params": {}}
        try:
            target.backward()
        except RuntimeError as exc:
            raise UnsupportedError(
                f"torch cannot differentiate the recorded graph: {exc}. A forward that ran "
                f"with nothing requiring gradients may have taken kernels without a derivative "
                f"(fused attention); trace it with the inputs requiring grad"
            ) from exc
    for index, held in holder.items():
        if held.grad is not None:
            found[index] = held.grad
    for op in graph.ops:
        leaf = op.out if op.kind == "input" and op.index in wanted_set else None
        if isinstance(leaf, torch.Tensor) and leaf.grad is not None:
            found[op.index] = leaf.grad
    grads = {name: record.value.grad for name, record in params.items() if record.value.grad is not None}
    return {"ops": found, "params": grads}


def reference_grads(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Any, Any]:
    """The input gradients of the summed float outputs, by torch alone (the conformance reference)."""
    leaves = [
        (path, leaf)
        for path, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, torch.Tensor))
        if leaf.is_floating_point()
    ]
    copies = {path: leaf.detach().clone().requires_grad_(True) for path, leaf in leaves}
    if not copies:
        return {}
    new_args, new_kwargs = tree.replace_at((args, kwargs), copies)
    with torch.enable_grad():
        out = target(*new_args, **new_kwargs)
        parts = [t.sum() for _, t in tree.leaves(out, lambda v: isinstance(v, torch.Tensor)) if t.is_floating_point()]
        if not parts:
            return {}
        total = torch.stack(parts).sum() if len(parts) > 1 else parts[0]
        try:
            grads = torch.autograd.grad(total, list(copies.values()), allow_unused=True)
        except RuntimeError as exc:  # e.g. an in-place write over a value its backward needs
            raise UnsupportedError(f"torch itself cannot differentiate this model: {exc}") from exc
    return {path: g for path, g in zip(copies, grads) if g is not None}
