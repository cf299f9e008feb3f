"""What a capture keeps (``save=``) and when it stops (``halt=``), decided as ops arrive.

Every backend gets both for free: the TraceBuilder consults the policy after
each op and each module call. A value the save selector rejects is dropped at
once (``op.out`` is None, ``op.saved`` False); one it cannot judge yet (an
output of a module still running, ``followed_by``, ``where``) is held until it
can, at the latest when the trace is finished. The structure of every op is
recorded either way.

``halt=`` stops the forward as soon as every op its selector will ever pick
has run: for ``tl.module``/``tl.in_module``, when that module's call (its first,
or the one named with ``:n``) returns; for ``tl.label``, when every named op
has run; for any other selector, after its first match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.errors import UnsupportedError
from torchlens_core.selectors import AllOf, AnyOf, InModule, Label, Module, Not, Selector, op_keys, split_pass

if TYPE_CHECKING:
    from torchlens_core.builder import TraceBuilder
    from torchlens_core.records import OpRecord
    from torchlens_core.trace import Trace


class HaltCapture(BaseException):
    """Raised from inside the forward to stop it; tl.trace catches it.

    A BaseException, like KeyboardInterrupt, so that a model's own
    ``except Exception`` cannot swallow it.
    """

    def __init__(self, builder: TraceBuilder) -> None:
        super().__init__("halted by halt=")
        self.builder = builder


def _selector(value: Any, name: str) -> Selector | None:
    if value is None or isinstance(value, Selector):
        return value
    raise TypeError(f"{name}= takes a selector such as tl.func('relu') or tl.module('layer3'), "
                    f"not {type(value).__name__}")


@attrs.frozen
class CaptureOptions:
    """TorchLens's own options of one capture."""

    save: Selector | None = attrs.field(default=None, converter=lambda v: _selector(v, "save"))
    halt: Selector | None = attrs.field(default=None, converter=lambda v: _selector(v, "halt"))

    def __attrs_post_init__(self) -> None:
        if self.halt is not None and _has_not(self.halt):
            raise UnsupportedError("halt= cannot use ~: 'stop once everything except X has run' never comes "
                                   "before the end of the forward")


def _has_not(selector: Selector) -> bool:
    if isinstance(selector, Not):
        return True
    return isinstance(selector, (AllOf, AnyOf)) and any(_has_not(p) for p in selector.parts)


class Policy:
    def __init__(self, options: CaptureOptions, builder: TraceBuilder) -> None:
        self.save = options.save
        self.halt = options.halt
        self.active = self.save is not None or self.halt is not None
        self.builder = builder
        self.pending: list[OpRecord] = []
        self.seen_keys: set[str] = set()
        self.matched: set[int] = set()  # ids of halt sub-selectors that have matched an op

    # -- as ops arrive ----------------------------------------------------------------------
    def recorded(self, op: OpRecord) -> None:
        if self.save is not None:
            verdict = self.save.decide(op, self.builder)
            if verdict is False:
                drop(op)
            elif verdict is None:
                self.pending.append(op)
        if self.halt is not None:
            self.seen_keys.update(op_keys(op))
            self._note_matches(self.halt, op)
            if self._ready(self.halt):
                raise HaltCapture(self.builder)

    def closed(self, path: str, n: int) -> None:
        if self.pending:
            still = []
            for op in self.pending:
                verdict = self.save.decide(op, self.builder) if self.save is not None else True
                if verdict is False:
                    drop(op)
                elif verdict is None:
                    still.append(op)
            self.pending = still
        if self.halt is not None and self._ready(self.halt):
            raise HaltCapture(self.builder)

    def finish(self, trace: Trace) -> None:
        for op in self.pending:
            if self.save is not None and not self.save.test(op, trace):
                drop(op)
        self.pending = []

    # -- halting ---------------------------------------------------------------------------
    def _note_matches(self, selector: Selector, op: OpRecord) -> None:
        if isinstance(selector, (AllOf, AnyOf)):
            for part in selector.parts:
                self._note_matches(part, op)
        elif selector.decide(op, self.builder):
            self.matched.add(id(selector))

    def _ready(self, selector: Selector) -> bool:
        if isinstance(selector, (Module, InModule)):
            base, n = split_pass(selector.path)
            return (base, n or 1) in self.builder.closed_passes
        if isinstance(selector, Label):
            return all(key in self.seen_keys for key in selector.keys)
        if isinstance(selector, (AllOf, AnyOf)):
            return all(self._ready(part) for part in selector.parts)
        return id(selector) in self.matched


def drop(op: OpRecord) -> None:
    op.out = None
    op.saved = False
