"""Per-op metadata worked out from the recorded graph: config arguments and graph distances."""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, Any

from torchlens_core.ir.records import Distances, ParamRef, Ref

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace

_NAMES: dict[Any, tuple[str, ...] | None] = {}
_DOC_SIGNATURE = re.compile(r"^\s*[\w.]+\((.*?)\)", re.S)


def arg_names(call: Any) -> tuple[str, ...] | None:
    """Parameter names of a callable, from its signature or, for builtins, its docstring's first line."""
    try:
        return _NAMES[call]
    except (KeyError, TypeError):
        pass
    names: tuple[str, ...] | None = None
    try:
        names = tuple(p for p in inspect.signature(call).parameters if p not in ("self", "cls"))
    except (TypeError, ValueError):
        match = _DOC_SIGNATURE.match(getattr(call, "__doc__", None) or "")
        if match:
            parts = [p.strip().split("=")[0].split(":")[0].strip() for p in match.group(1).split(",")]
            names = tuple(p.lstrip("*") for p in parts if p and p not in ("*", "/", "self"))
    try:
        _NAMES[call] = names
    except TypeError:  # unhashable callables: not cached
        pass
    return names


# Constants that are never data: most of a call's configuration, decided without asking for attributes.
_PLAIN = frozenset({int, float, bool, str, complex, type(None), type(Ellipsis)})


def _is_data(value: Any) -> bool:
    """Arrays, recorded values and parameters are data, not configuration."""
    t = type(value)
    if t in _PLAIN:
        return False
    if t is tuple or t is list:
        return any(_is_data(v) for v in value)
    if t is dict:
        return any(_is_data(v) for v in value.values())
    # Arrays have a shape and a dtype; a dtype object (NumPy's has a shape) is configuration.
    return (
        t is Ref
        or t is ParamRef
        or (hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type))
    )


def config(op: OpRecord) -> dict[str, Any]:
    """The op's non-array arguments, named by the callable's signature where it has one."""
    names: tuple[str, ...] | None = None  # looked up at the first positional setting (most ops have none)
    out: dict[str, Any] = {}
    for i, value in enumerate(op.args):
        if not _is_data(value):
            if names is None:
                names = op.meta.get("arg_names") or (arg_names(op.call) if op.call is not None else None) or ()
            out[names[i] if i < len(names) else f"arg{i}"] = value
    for name, value in op.kwargs.items():
        if not _is_data(value):
            out[name] = value
    return out


def distances(trace: Trace) -> list[Distances]:
    """Min and max path length (in edges) from any input to each op, and from each op to any output."""
    ops = trace.ops
    n = len(ops)
    min_in: list[int | None] = [None] * n
    max_in: list[int | None] = [None] * n
    for op in ops:  # ops are in execution order: parents come first
        if op.kind == "input":
            min_in[op.index] = max_in[op.index] = 0
            continue
        lows = [low for i in op.parent_indices if (low := min_in[i]) is not None]
        highs = [high for i in op.parent_indices if (high := max_in[i]) is not None]  # set with min_in
        if lows:
            min_in[op.index] = min(lows) + 1
            max_in[op.index] = max(highs) + 1
    min_out: list[int | None] = [None] * n
    max_out: list[int | None] = [None] * n
    for op in reversed(ops):
        if op.kind == "output":
            min_out[op.index] = max_out[op.index] = 0
        d_min, d_max = min_out[op.index], max_out[op.index]
        if d_min is None or d_max is None:  # both or neither: they are set together
            continue
        for i in op.parent_indices:
            low, high = min_out[i], max_out[i]
            if low is None or d_min + 1 < low:
                min_out[i] = d_min + 1
            if high is None or d_max + 1 > high:
                max_out[i] = d_max + 1
    return [Distances(min_in[i], max_in[i], min_out[i], max_out[i]) for i in range(n)]
