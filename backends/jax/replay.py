"""Replay: run each recorded primitive again with ``bind`` on the replayed arguments.

JAX arrays are immutable, so no op can change an input, a parameter or
another op's value: replay needs no copies.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.ir.records import OpRecord
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import Observe, interpret
from torchlens_jax import meta_check


def replay_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``op.call`` is ``(primitive, params)``, as the jaxpr equation had them.

    ``op.kwargs`` are those params again, for reading (``op.config``, FLOP
    formulas); they are static, so the originals are bound and ``kwargs`` is not."""
    primitive, params = op.call
    meta_check.check_loaded(op, args)  # a loaded file's parameters go through JAX's shape rules first
    out = primitive.bind(*args, **params)
    return tuple(out) if primitive.multiple_results else out


def replay_graph(trace: Trace, observe: Observe | None = None) -> list[Any]:
    return interpret(trace, replay_op, observe)
