"""Gradients on Paddle: the recorded graph replayed under autograd, a hook on each wanted op's output.

``trace.log_backward(loss)`` replays the trace with gradients on
(:data:`torchlens_paddle.replay.AUTOGRAD`): the inputs and the trainable
parameters become fresh leaves (copies: the user's tensors never get a
``.grad``, and a buffer the replay writes is a copy too), and each wanted
op's output gets a tensor hook the moment the replay computes it. Hooks, not
added zeros (:func:`torchlens_core.grads.backward.perturbed`): Paddle writes
in place and through views (``v = g.reshape(...)``, then ``v[1:3].add_(...)``
changes ``g``), and a zero added to ``v`` would make the replay write into a
copy that ``g`` never sees. A hook registered before a later in-place write
gets the gradient of the version the op produced, not of the overwritten one.

An output Paddle computes outside the autograd graph (``paddle.arange``,
``paddle.zeros``, anything made only from constants and buffers) has no
gradient for a hook to see, though the loss may well depend on it: such an
output, when it is new memory (not a view of an argument), gets a zero
added instead, a leaf of its own, and its gradient is that zero's. One
``paddle.grad`` over the replay, with every leaf of the graph among its
inputs (Paddle runs no hook on a path to none of them), fires every hook.

Paddle's autograd does not follow a write through a view into the memory
another tensor shares: ``v[1:3].add_(y)`` changes ``g`` but not ``g``'s
backward. Paddle's own gradients are then off (``y`` gets none); the replay
gives the same, and warns, naming the write.
"""

from __future__ import annotations

import warnings
from typing import Any

import attrs
import paddle
from paddle import Tensor

from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import replay_values
from torchlens_paddle.arrays import allocation, snapshot
from torchlens_paddle.replay import AUTOGRAD

# What Paddle raises when its backward cannot run (its C++ errors arrive as these, by kind).
_BACKWARD_ERRORS = (RuntimeError, ValueError, NotImplementedError)


def _differentiable(t: Any) -> bool:
    return isinstance(t, Tensor) and (t.is_floating_point() or t.is_complex())


def _leaf(t: Tensor, trainable: bool) -> Tensor:
    """A copy of ``t`` cut from any graph; a leaf gradients reach when ``trainable``."""
    copy = snapshot(t)
    copy.stop_gradient = not trainable
    return copy


def _tensors(value: Any) -> list[tuple[tuple[Any, ...], Tensor]]:
    return list(tree.leaves(value, lambda v: isinstance(v, Tensor)))


class _Backward:
    """One ``log_backward``: the leaves, the hooks and what they caught."""

    def __init__(self, trace: Trace, wanted: list[int]) -> None:
        self.trace = trace
        self.wanted = set(wanted)
        # paddle.grad differentiates by these: ("input", i) / ("param", name) / ("zero", i, path) / ("constant", id)
        self.leaves: dict[Any, Tensor] = {}
        self.caught: dict[int, dict[tuple[Any, ...], Tensor]] = {}  # op index -> path -> gradient, from hooks
        self.outputs: dict[int, Any] = {}  # each wanted op's output, for its structure
        self.last_read = _last_reads(trace)
        self.held: dict[int, list[tuple[int, Tensor]]] = {}  # allocation -> (op index, value living there)
        self.warned = False

    def graph(self) -> Trace:
        """``trace`` with fresh leaves for inputs and parameters, and copies of the buffers."""
        trace = self.trace
        ops = list(trace.ops)
        for op in trace.ops:
            if op.kind == "input" and _differentiable(op.out):
                leaf = _leaf(op.out, trainable=op.index in self.wanted)
                ops[op.index] = attrs.evolve(op, out=leaf)
                if not leaf.stop_gradient:
                    self.leaves["input", op.index] = leaf
            elif op.kind == "op":  # a constant that takes gradients (a tensor the forward closed over)
                for _, t in _tensors((op.args, op.kwargs)):
                    if not t.stop_gradient and _differentiable(t):
                        self.leaves["constant", id(t)] = t
        copies = {}
        for name, record in trace.params.items():
            if isinstance(record.value, Tensor):  # buffers too: a replay that writes one writes its own copy
                trainable = record.trainable and not record.is_buffer and _differentiable(record.value)
                copies[name] = attrs.evolve(record, value=_leaf(record.value, trainable))
                if trainable:
                    self.leaves["param", name] = copies[name].value
        return Trace(
            backend=trace.backend,
            model_name=trace.model_name,
            ops=ops,
            modules=dict(trace.modules),
            params={**trace.params, **copies},
            output_template=trace.output_template,
            notes=dict(trace.notes),
        )

    def lift(self, op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """``out``, with a zero leaf added to each wanted output Paddle computed outside the autograd graph."""
        if op.index not in self.wanted:
            return out
        outside = [(path, t) for path, t in _tensors(out) if t.stop_gradient and _differentiable(t)]
        if not outside:
            return out
        shared = {allocation(t) for _, t in _tensors((args, kwargs))} - {0}
        for path, t in outside:
            if allocation(t) in shared:  # a view of an argument: a new tensor would cut it from its base
                continue
            zero = paddle.zeros_like(t)
            zero.stop_gradient = False
            self.leaves["zero", op.index, path] = zero
            out = tree.replace_at(out, {path: t + zero})
        return out

    def observe(self, op: OpRecord, value: Any) -> None:
        if op.in_place:
            self._check_views(op, value)
        for _, t in _tensors(value):
            key = allocation(t)
            if key:
                self.held.setdefault(key, []).append((op.index, t))
        if op.index not in self.wanted or op.kind != "op":
            return
        self.outputs[op.index] = value
        for path, t in _tensors(value):
            if _differentiable(t) and not t.stop_gradient and ("zero", op.index, path) not in self.leaves:
                t.register_hook(_storing(self.caught.setdefault(op.index, {}), path))

    def _check_views(self, op: OpRecord, value: Any) -> None:
        """Warn when ``op`` wrote into memory another tensor read later shares: Paddle's backward misses it."""
        if self.warned:
            return
        for _, written in _tensors(value):
            if written.stop_gradient:
                continue
            for index, other in self.held.get(allocation(written), ()):
                if other is not written and self.last_read.get(index, -1) > op.index:
                    self.warned = True
                    ops = self.trace.ops
                    warnings.warn(
                        f"{op.label} ({op.func_name}) wrote in place into memory that {ops[index].label} shares, "
                        f"and {ops[index].label} is read later: Paddle's autograd does not follow a write through "
                        f"a view, so its gradients here, and the ones TorchLens reports, miss that write",
                        stacklevel=2,
                    )
                    return

    def gradients(self, target: Tensor) -> dict[str, Any]:
        """One ``paddle.grad`` of ``target``: the hooks fire, the leaves' gradients come back."""
        if target.stop_gradient or not self.leaves:  # nothing the loss reads needs a gradient
            return {"ops": {}, "params": {}}
        try:
            grads = paddle.grad([target], list(self.leaves.values()), allow_unused=True)
        except _BACKWARD_ERRORS as exc:  # an in-place write over a value the backward needs; an rnn in eval mode
            raise UnsupportedError(f"Paddle cannot differentiate the recorded graph: {exc}") from exc
        ops: dict[int, Any] = {}
        params: dict[str, Tensor] = {}
        for key, grad in zip(self.leaves, grads):
            if grad is None:
                continue
            if key[0] == "input":
                ops[key[1]] = grad
            elif key[0] == "param":
                params[key[1]] = grad
            elif key[0] == "zero":
                self.caught.setdefault(key[1], {})[key[2]] = grad
        for index, at in self.caught.items():
            ops[index] = at[()] if () in at else tree.leaves_from(self.outputs[index], at)
        return {"ops": ops, "params": params}


def backward(trace: Trace, loss: Any, wanted: list[int]) -> dict[str, Any]:
    """Gradients of ``loss`` (a function of the output) at the ``wanted`` ops and at the trainable parameters."""
    if isinstance(loss, Tensor) or not callable(loss):
        raise UnsupportedError(
            "the paddle backend computes gradients by replaying the recorded graph under "
            "autograd, so the loss must be a function of the model's output: "
            "trace.log_backward(lambda out: out.sum())"
        )
    run = _Backward(trace, wanted)
    graph = run.graph()
    token = AUTOGRAD.set(run.lift)
    try:
        values = replay_values(graph, run.observe)
    finally:
        AUTOGRAD.reset(token)
    output = tree.map_leaves(
        lambda r: tree.get(values[r.index], r.path) if isinstance(r, Ref) else r, graph.output_template
    )
    with paddle.enable_grad():
        target = loss(output)
    if not isinstance(target, Tensor) or target.size != 1:
        shape = f" of shape {list(target.shape)}" if isinstance(target, Tensor) else ""
        raise UnsupportedError(
            f"the loss must give one number (a tensor of one element), not {type(target).__name__}{shape}"
        )
    return run.gradients(target)


def _last_reads(trace: Trace) -> dict[int, int]:
    """Op index -> the index of the last op reading its value (past the end: the output reads it)."""
    last: dict[int, int] = {}
    for op in trace.ops:
        for _, ref in tree.leaves((op.args, op.kwargs), lambda v: isinstance(v, Ref)):
            last[ref.index] = op.index
    for _, ref in tree.leaves(trace.output_template, lambda v: isinstance(v, Ref)):
        last[ref.index] = len(trace.ops)
    return last


def _storing(into: dict[tuple[Any, ...], Tensor], path: tuple[Any, ...]) -> Any:
    def store(grad: Tensor) -> None:
        into[path] = grad

    return store


def reference_grads(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Any, Any]:
    """The input gradients of the summed float outputs, by Paddle alone (the conformance reference)."""
    leaves = [(path, leaf) for path, leaf in _tensors((args, kwargs)) if _differentiable(leaf)]
    copies = {path: _leaf(leaf, trainable=True) for path, leaf in leaves}
    if not copies:
        return {}
    new_args, new_kwargs = tree.replace_at((args, kwargs), copies)
    with paddle.enable_grad():
        out = target(*new_args, **new_kwargs)
        parts = [t.sum() for _, t in _tensors(out) if _differentiable(t)]
        if not parts:
            return {}
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        if total.stop_gradient:
            return {}
        try:
            grads = paddle.grad([total], list(copies.values()), allow_unused=True)
        except _BACKWARD_ERRORS as exc:  # an in-place write over a value the backward needs; an rnn in eval mode
            raise UnsupportedError(f"Paddle itself cannot differentiate this model: {exc}") from exc
    return {path: g for path, g in zip(copies, grads) if g is not None}
