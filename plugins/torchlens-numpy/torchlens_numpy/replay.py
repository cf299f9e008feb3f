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

from torchlens.backend import Observe, OpRecord, Trace, interpret, replay_written, tree


def _copy(value: Any) -> Any:
    # order="K" keeps the memory layout, so a reshape is a view (or a copy) exactly as it was.
    return tree.map_leaves(lambda v: np.copy(v, order="K") if isinstance(v, np.ndarray) else v, value)


def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    state = op.meta.get("rng_state")
    if state is None:
        return replay_written(op, args, kwargs, _copy)
    saved = np.random.get_state()
    np.random.set_state(state)
    try:
        return replay_written(op, args, kwargs, _copy)
    finally:
        np.random.set_state(saved)


def replay_graph(trace: Trace, observe: Observe | None = None) -> list[Any]:
    return interpret(trace, run_op, observe, copy_input=_copy)
