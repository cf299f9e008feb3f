"""Replaying recorded Paddle ops.

Each op calls the original C op (or Tensor method) it recorded, with its
arguments resolved, under ``paddle.no_grad()``. Random ops run with the RNG
state recorded just before them, so dropout replays exactly. In-place ops
write into the replayed values, as they did in the model, so a write through
a view reaches its base; replay starts from copies of the inputs and copies a
parameter, buffer or constant before writing into it, so neither the trace nor
the model changes. ``paddle.empty`` gives back its recorded (uninitialized)
value, and batch norm's backward-only outputs are dropped as in capture.

Under :data:`AUTOGRAD` (the replay of ``trace.log_backward``, see
:mod:`torchlens_paddle.grads`) replay runs with gradients on, those copies are
clones that stay in the autograd graph (the gradient reaches the inputs and
parameters they were taken from), and each op's output passes through the
backward's ``lift`` before anything reads it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import paddle

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import Observe, interpret
from torchlens_paddle import meta_check
from torchlens_paddle.arrays import attached_copy, snapshot
from torchlens_paddle.capture import drop_scratch

Tensor = paddle.Tensor

# Replay runs without autograd, except for the backward of trace.log_backward (grads.py), which sets
# this to its ``lift(op, args, kwargs, out)``: what later ops read of op's output ``out``.
Lift = Callable[[OpRecord, tuple[Any, ...], dict[str, Any], Any], Any]
AUTOGRAD: contextvars.ContextVar[Lift | None] = contextvars.ContextVar("torchlens_paddle_replay_autograd", default=None)


def _copy_tensors(value: Any) -> Any:
    copy = snapshot if AUTOGRAD.get() is None else attached_copy
    return tree.map_leaves(lambda v: copy(v) if isinstance(v, Tensor) else v, value)


def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if "undefined" in op.meta:  # paddle.empty: its value is whatever memory it got, as recorded
        return _copy_tensors(op.meta["undefined"])
    meta_check.check_loaded(op, args, kwargs)  # a loaded file's call goes through Paddle's static InferMeta first
    writes = op.meta.get("writes", ())
    if writes:
        copied, kwargs = list(args), dict(kwargs)
        for where in writes:  # never write into a parameter, a buffer or a constant
            if isinstance(where, int):
                if not isinstance(op.args[where], Ref):
                    copied[where] = _copy_tensors(copied[where])
            elif not isinstance(op.kwargs.get(where), Ref):
                kwargs[where] = _copy_tensors(kwargs[where])
        args = tuple(copied)
    state = op.meta.get("rng_state")
    if state is None:
        out = op.call(*args, **kwargs)
    else:
        saved = paddle.get_rng_state()
        paddle.set_rng_state(state)
        try:
            out = op.call(*args, **kwargs)
        finally:
            paddle.set_rng_state(saved)
    scratch = op.meta.get("scratch")
    if scratch and isinstance(out, (tuple, list)):
        out = drop_scratch(out, scratch)
    if out is None and writes:  # __setitem__ returns None: its value is the tensor it wrote
        where = writes[0]
        out = args[where] if isinstance(where, int) else kwargs[where]
    return out


def replay_graph(trace: Trace, observe: Observe | None = None) -> list[Any]:
    lift = AUTOGRAD.get()
    if lift is not None:

        def run(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return lift(op, args, kwargs, run_op(op, args, kwargs))

        with paddle.enable_grad():
            return interpret(trace, run, observe, copy_input=_copy_tensors)
    with paddle.no_grad():
        return interpret(trace, run_op, observe, copy_input=_copy_tensors)
