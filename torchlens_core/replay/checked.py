"""Replaying a trace read from a file: each value must agree with its record before anything reads it.

A hand-edited file can describe calls whose results disagree with the shapes
it records (a ``torch.zeros`` made one row larger than recorded, say). Fed to
the next kernel, such a value can do worse than raise: ``torch.lstm`` given a
hidden state of the wrong batch size reads and writes out of bounds. So
replay of a loaded trace compares every value it computes with the op's
recorded shape the moment it is computed, and stops with :class:`ReplayError`
at the first disagreement, before a later op can use the value. (``tl.load``
has already checked every saved value, input and parameter against its
record.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ReplayError

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace
    from torchlens_core.replay.evaluator import Observe

LOADED = "loaded_from_file"  # trace.notes key set by tl.load: replay checks values against their records


def from_file(op: OpRecord) -> bool:
    """Whether ``op`` belongs to a trace ``tl.load`` read: the ops a backend checks before replaying them (a live
    trace's ran with these very arguments in the model's forward)."""
    trace = op.trace_ref() if op.trace_ref is not None else None
    return trace is not None and bool(trace.notes.get(LOADED))


def refused(op: OpRecord, reason: str) -> ReplayError:
    """The error for a loaded op a backend's check refuses before running it, ``reason`` saying what disagreed."""
    return ReplayError(
        f"{op.label} ({op.func_name}) of this loaded trace is refused: {reason}. The file was changed "
        "after tl.save wrote it; the call is not run, as it could fail or corrupt memory"
    )


def wrong_shape(op: OpRecord, got: Any, what: str) -> ReplayError:
    """:func:`refused` for a call whose ``what`` (its recorded arguments, parameters...) give shape ``got``."""
    recorded = None if op.shape is None else tuple(op.shape)
    return refused(op, f"with its recorded {what} it gives shape {got}, its record says {recorded}")


class PassedChecks:
    """The calls a backend's check before replaying a loaded op has passed, by signature, so that a model's
    repeated blocks are checked once; bounded, as a process may load many traces (emptied when full)."""

    def __init__(self, limit: int = 1 << 14) -> None:
        self.limit = limit
        self._passed: dict[Any, None] = {}

    def run(self, signature: Any, check: Callable[[], None]) -> None:
        """``check()`` unless a call of this ``signature`` passed before (None: a call that cannot be keyed,
        always checked); remembered if it passes (it raises otherwise)."""
        if signature is not None and signature in self._passed:
            return
        check()
        if signature is not None:
            if len(self._passed) >= self.limit:
                self._passed.clear()
            self._passed[signature] = None


def value_shape(backend: str, value: Any) -> Any:
    """The shape an op records for ``value``: an array's shape, or one entry per element of a structure."""
    info = backend_named(backend, missing_ok=True).array_info

    def shape(v: Any) -> tuple[int, ...] | None:
        found = info(v)
        return None if found is None else tuple(found[0])

    kids = tree.children(value)
    return shape(value) if kids is None else tuple(shape(v) for _, v in kids)


def agreeing(trace: Trace, observe: Observe | None) -> Observe:
    """An ``observe`` for :func:`interpret` that first checks each value against its op's recorded shape."""

    def check(op: OpRecord, value: Any) -> None:
        if op.shape is not None and value_shape(trace.backend, value) != tuple(op.shape):
            raise ReplayError(
                f"replaying {op.label} ({op.func_name}) gave a value of shape "
                f"{value_shape(trace.backend, value)}, its record says {tuple(op.shape)}: the loaded "
                "file's records and calls disagree, so replay stops before anything uses the value"
            )
        if observe is not None:
            observe(op, value)

    return check
