"""Replaying recorded torch ops.

Random ops run with the RNG state recorded just before them (or a copy of
the ``generator=`` they were given), so dropout replays exactly; ops
recorded under ``torch.autocast`` run under the same (autocast.py);
``torch.empty`` and friends give back the bytes they held.
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
from torchlens_core.ir.errors import ReplayError
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import Observe, interpret
from torchlens_torch import autocast, meta_check

# op.meta key: the keyword an in-place op's written tensor came by (torch.nn.init.kaiming_uniform_(tensor=w))
WRITTEN_KEYWORD = "written_keyword"
# op.meta key: {"device", "state"} of the torch.Generator a random op was given by keyword (generator=g)
GENERATOR_STATE = "generator_state"


def _copy_tensors(value: Any) -> Any:
    return tree.map_leaves(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, value)


def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if "uninitialized" in op.meta:
        return op.meta["uninitialized"].clone()
    meta_check.check_loaded(op, args, kwargs)  # a loaded file's call is tried on meta tensors first
    keyword = op.meta.get(WRITTEN_KEYWORD)  # the written tensor came by keyword (nn.init.kaiming_uniform_(tensor=w))
    if "out" in kwargs and not isinstance(op.kwargs.get("out"), Ref):
        kwargs = {**kwargs, "out": _copy_tensors(kwargs["out"])}
    elif op.in_place and keyword is not None:
        if keyword not in kwargs:
            raise ReplayError(f"{op.label} wrote into its keyword argument {keyword!r}, which it was not given")
        if not isinstance(op.kwargs.get(keyword), Ref):
            kwargs = {**kwargs, keyword: _copy_tensors(kwargs[keyword])}
    elif op.in_place and args and not isinstance(op.args[0], Ref):
        args = (_copy_tensors(args[0]), *args[1:])
    recorded = op.meta.get(autocast.META_KEY)
    if recorded is None and not autocast.any_enabled():  # most ops
        out = _call(op, args, kwargs)
    else:
        with autocast.as_recorded(recorded):
            out = _call(op, args, kwargs)
    if op.in_place and not isinstance(out, torch.Tensor):  # __setitem__ returns None
        out = kwargs.get("out", kwargs[keyword] if keyword is not None else args[0])
    return out


def _call(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``op``'s call, with the generator states it drew from when it is random."""
    own = op.meta.get(GENERATOR_STATE)
    if own is not None:  # a generator of its own, as it was before the call (the recorded kwargs hold None)
        generator = torch.Generator(device=own["device"])
        generator.set_state(own["state"])
        kwargs = {**kwargs, "generator": generator}
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
