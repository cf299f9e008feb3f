"""Replaying recorded NumPy ops.

Draws from the global RNG run with the state recorded just before them, and
the caller's RNG state is put back afterwards, so replay is exact and changes
nothing outside the trace. In-place ops write into the replayed values, as
they did in the function, so a write through a view reaches its base; replay
starts from copies of the inputs and copies a constant before writing into
it, so neither the trace nor the caller's arrays change.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import Observe, interpret


def _copy(value: Any) -> Any:
    # order="K" keeps the memory layout, so a reshape is a view (or a copy) exactly as it was.
    return tree.map_leaves(lambda v: np.copy(v, order="K") if isinstance(v, np.ndarray) else v, value)


def _copy_unless_ref(template: Any, value: Any) -> Any:
    """``value`` with the arrays that are not recorded values (constants) copied."""
    if isinstance(template, Ref):
        return value
    kids = tree.children(template)
    if kids is None:
        return _copy(value)
    values = [v for _, v in tree.children(value)]
    return tree.rebuild(value, [_copy_unless_ref(t, v) for (_, t), v in zip(kids, values, strict=True)])


def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if op.in_place:  # the written array: a replayed value, or a private copy of a constant
        if "out" in kwargs:
            kwargs = {**kwargs, "out": _copy_unless_ref(op.kwargs["out"], kwargs["out"])}
        elif args:
            args = (_copy_unless_ref(op.args[0], args[0]), *args[1:])
    state = op.meta.get("rng_state")
    if state is None:
        out = op.call(*args, **kwargs)
    else:
        saved = np.random.get_state()
        np.random.set_state(state)
        try:
            out = op.call(*args, **kwargs)
        finally:
            np.random.set_state(saved)
    if out is None and op.in_place:  # x[i] = v, a.sort(), np.copyto(...) return None
        out = kwargs["out"] if "out" in kwargs else args[0]
    return out


def replay_graph(trace: Trace, observe: Observe | None = None) -> list[Any]:
    return interpret(trace, run_op, observe, copy_input=_copy)
