"""Replaying recorded torch ops.

Random ops run with the RNG state recorded just before them, so dropout
replays exactly; ``torch.empty`` and friends give back the bytes they held.
In-place ops write into the replayed values, as they did in the model, so a
write through a view reaches its base; replay starts from
copies of the inputs and copies a parameter, buffer or constant before writing
into it, so neither the trace nor the model changes.
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import Observe, interpret


def _copy_tensors(value: Any) -> Any:
    return tree.map_leaves(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, value)


def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if "uninitialized" in op.meta:
        return op.meta["uninitialized"].clone()
    if "out" in kwargs and not isinstance(op.kwargs.get("out"), Ref):
        kwargs = {**kwargs, "out": _copy_tensors(kwargs["out"])}
    elif op.in_place and args and not isinstance(op.args[0], Ref):
        args = (_copy_tensors(args[0]), *args[1:])
    state = op.meta.get("rng_state")
    if state is None:
        out = op.call(*args, **kwargs)
    else:
        cuda_states = op.meta.get("cuda_rng_states")
        with torch.random.fork_rng(devices=range(len(cuda_states)) if cuda_states else []):
            torch.set_rng_state(state)
            if cuda_states:
                torch.cuda.set_rng_state_all(cuda_states)
            out = op.call(*args, **kwargs)
    if op.in_place and not isinstance(out, torch.Tensor):  # __setitem__ returns None
        out = kwargs.get("out", args[0])
    return out


# Replay runs without autograd, except for the backward of a trace whose graph is gone (grads.py).
AUTOGRAD = contextvars.ContextVar("torchlens_torch_replay_autograd", default=False)


def replay_graph(trace: Trace, observe: Observe | None = None) -> list[Any]:
    # Some kernels update buffers inside C++ (batch_norm's running statistics in
    # training mode): put the model's buffers back as they were after replay.
    if AUTOGRAD.get():  # a backward's replay: its buffers are copies of its own, and its graph needs their versions
        with torch.enable_grad():
            return interpret(trace, run_op, observe, copy_input=_copy_tensors)
    buffers = [p.value for p in trace.params.values() if p.is_buffer and isinstance(p.value, torch.Tensor)]
    with torch.no_grad():
        saved = [b.clone() for b in buffers]
    try:
        with torch.no_grad():
            return interpret(trace, run_op, observe, copy_input=_copy_tensors)
    finally:
        with torch.no_grad():
            for buffer, value in zip(buffers, saved):
                buffer.copy_(value)
