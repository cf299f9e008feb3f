"""What a capture keeps (``save=``) and when it stops (``halt=``), decided as ops arrive.

Every backend gets both for free: the TraceBuilder consults the policy after
each op and each module call. A value the save selector rejects is dropped at
once (``op.out`` is None, ``op.saved`` False); one it cannot judge yet (an
output of a module still running, ``followed_by``, ``where``) is held until it
can, at the latest when the trace is finished. The structure of every op is
recorded either way.

``lookback=N`` also keeps, for each op ``save=`` picks, the N ops that ran just
before it: their values too with ``lookback_payload_policy="detached_raw"``
(detached from any autograd graph), only their records (which every op has
anyway) with ``"metadata_only"``, the default. Either way they are marked
``op.meta["lookback"]``.

``halt=`` stops the forward as soon as every op its selector will ever pick
has run: for ``tl.module``/``tl.in_module``, when that module's call (its first,
or the one named with ``:n``) returns; for ``tl.label``, when every named op
has run; for any other selector, after its first match.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.capture.edits import Intervention, interventions
from torchlens_core.capture.selectors import (
    AllOf,
    AnyOf,
    FollowedBy,
    InModule,
    Label,
    Module,
    Not,
    PrecededBy,
    Selector,
    Where,
    near_names,
    op_keys,
    split_pass,
)
from torchlens_core.ir.errors import ArgumentTypeError, LabelNotFoundError, UnsupportedError, shown

if TYPE_CHECKING:
    from torchlens_core.capture.builder import TraceBuilder
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace


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
    raise ArgumentTypeError(
        f"{name}= takes a selector such as tl.func('relu') or tl.module('layer3'), "
        f"not {type(value).__name__} ({shown(value)})"
    )


def _grads(value: Any) -> bool | Selector:
    if isinstance(value, (bool, Selector)):
        return value
    raise ArgumentTypeError(
        f"save_grads= takes True, False or a selector such as tl.func('relu'), "
        f"not {type(value).__name__} ({shown(value)})"
    )


def _folder(value: Any) -> Any:
    if value is None or isinstance(value, (str, os.PathLike)):
        return value
    raise ArgumentTypeError(
        f"save_to= takes a folder path (a str or pathlib.Path), not {type(value).__name__} ({shown(value)})"
    )


# save_to=: how to open the folder a capture writes its values into, as they are produced. The trace folder's
# format belongs to the store layer, above this one: torchlens_core.store.stream registers its opener here when
# it is imported (``import torchlens`` imports it), so the capture layer never imports the store.
SAVE_TO_OPENERS: list[Callable[[str | os.PathLike[str]], Any]] = []

LOOKBACK_POLICIES = ("metadata_only", "detached_raw")
ESCAPE_DETECTORS = (None, "shadow")


@attrs.frozen
class CaptureOptions:
    """TorchLens's own options of one capture."""

    save: Selector | None = attrs.field(default=None, converter=lambda v: _selector(v, "save"))
    halt: Selector | None = attrs.field(default=None, converter=lambda v: _selector(v, "halt"))
    lookback: int = 0
    lookback_payload_policy: str = "metadata_only"
    record: bool = False  # tl.record: hand back a Recording, finished only when read
    # tl.when(...) interventions, applied as the forward runs (capture/edits.py)
    intervene: tuple[Intervention, ...] = attrs.field(default=(), converter=interventions)
    # gradients to keep when trace.log_backward runs: True (every op), False, or a selector
    save_grads: bool | Selector = attrs.field(default=False, converter=lambda v: _grads(v))
    # "shadow": also watch the framework's kernels and report compute that no recorded op accounts for
    escape_detector: str | None = None
    # a trace folder: each value save= keeps is written there as it is produced (torchlens_core.store.stream)
    save_to: str | os.PathLike[str] | None = attrs.field(default=None, converter=lambda v: _folder(v))
    # the open torchlens_core.store.stream.Stream writing save_to, set by tl.trace for the capture's builder
    stream: Any = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.escape_detector not in ESCAPE_DETECTORS:
            raise UnsupportedError(
                f"escape_detector= takes one of {ESCAPE_DETECTORS}, not {shown(self.escape_detector)}"
            )
        if not isinstance(self.lookback, int) or self.lookback < 0:
            raise ArgumentTypeError(f"lookback= takes a number of ops >= 0, not {shown(self.lookback)}")
        if self.lookback and self.save is None:
            raise UnsupportedError("lookback= keeps the ops before each op save= picks: give save= too")
        if self.lookback_payload_policy not in LOOKBACK_POLICIES:
            raise UnsupportedError(
                f"lookback_payload_policy must be one of {LOOKBACK_POLICIES}, not {self.lookback_payload_policy!r}"
            )
        if self.halt is not None and _has(self.halt, Not):
            raise UnsupportedError(
                "halt= cannot use ~: 'stop once everything except X has run' never comes before the end of the forward"
            )
        if self.halt is not None and self.save_grads is not False:
            raise UnsupportedError("save_grads= with halt=: a halted forward has no output to take a loss of")
        if self.save_to is not None and self.record:
            raise UnsupportedError("save_to= with tl.record: a Recording is finished only when read; use tl.trace")
        if self.halt is not None and _has(self.halt, (Where, FollowedBy), deep=True):
            raise UnsupportedError(
                "halt= cannot use tl.where or tl.followed_by: they judge finished records (an "
                "op's children run after it), so they could never stop the forward early; "
                "use them with save="
            )


def _has(selector: Selector, kinds: type | tuple[type, ...], deep: bool = False) -> bool:
    """Is ``selector`` of these kinds, or one of its ``&`` / ``|`` parts (``deep``: or inside ``~``, preceded_by)?"""
    if isinstance(selector, kinds):
        return True
    if isinstance(selector, (AllOf, AnyOf)):
        return any(_has(p, kinds, deep) for p in selector.parts)
    return deep and isinstance(selector, (Not, PrecededBy)) and _has(selector.inner, kinds, deep)


class Policy:
    @property
    def builder(self) -> TraceBuilder:
        builder = self._builder()
        assert builder is not None, "a capture's policy outlived its builder"
        return builder

    def __init__(self, options: CaptureOptions, builder: TraceBuilder) -> None:
        self.save = options.save
        self.halt = options.halt
        self.active = self.save is not None or self.halt is not None
        # Held weakly: the builder holds this policy, and a cycle would keep a dropped trace's values
        # (the builder's ops) alive until the cyclic GC ran, which captures pause.
        self._builder = weakref.ref(builder)
        self.pending: list[OpRecord] = []
        # The last `lookback` ops, and those of them whose drop waits to see if a picked op follows.
        self.recent: deque[OpRecord] = deque(maxlen=options.lookback or None)
        self.lookback = options.lookback
        self.keep_lookback_values = options.lookback_payload_policy == "detached_raw"
        self.held: set[int] = set()
        self.windows: dict[int, list[int]] = {}  # a pending op -> the ops before it, held till it is decided
        self.pins: dict[int, int] = {}  # an op -> how many pending ops' windows hold it
        self.seen_keys: set[str] = set()
        self.matched: set[int] = set()  # ids of halt sub-selectors that have matched an op

    # -- as ops arrive ----------------------------------------------------------------------
    def recorded(self, op: OpRecord) -> None:
        if self.save is not None:
            verdict = self.save.decide(op, self.builder)
            if self.lookback:
                self._look_back(op, verdict)
            if verdict is False and op.index not in self.held:
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
                if verdict is None:
                    still.append(op)
                else:
                    self._settle(op, verdict)
            self.pending = still
        if self.halt is not None and self._ready(self.halt):
            raise HaltCapture(self.builder)

    def finish(self, trace: Trace) -> None:
        for op in self.pending:
            self._settle(op, self.save is None or self.save.test(op, trace))
        self.pending = []
        for index in self.held:  # windows no picked op claimed
            drop(trace.ops[index])
        self.held.clear()
        if not trace.halted:
            self._check_matched(trace)

    def _check_matched(self, trace: Trace) -> None:
        """save= that kept nothing, or halt= that never stopped the forward: a typo, most likely.

        Both are errors, raised once the forward has run to the end (whether a
        selector matches is known only then), naming what matched nothing and
        the closest labels and module paths.
        """
        unmatched: list[tuple[str, Selector]] = []
        if self.save is not None and not any(op.saved for op in trace.ops if op.kind == "op"):
            unmatched.append(("save=", self.save))
        if self.halt is not None:  # the forward was not halted: some part of halt= never came
            parts = self._unready(self.halt)
            if unmatched and parts == [self.halt] and self.halt == self.save:
                unmatched = [("save= and halt=", self.halt)]  # one selector given twice (tl.pluck)
            else:
                unmatched += [("halt=", part) for part in parts]
        if unmatched:
            named = "; ".join(f"{role} {shown(selector, 120)}" for role, selector in unmatched)
            hint = near_names(trace, *(selector for _, selector in unmatched))
            raise LabelNotFoundError(f"{named}: matched no op; the forward has run to the end{hint}")

    def _settle(self, op: OpRecord, picked: bool) -> None:
        """A pending op is decided: keep or drop it, and the window of ops before it."""
        if not picked:
            drop(op)
        for index in self.windows.pop(op.index, []):
            self.pins[index] -= 1
            earlier = self.builder.ops[index]
            if picked:
                self._claim(earlier)
            elif index in self.held and not self.pins[index] and earlier not in self.recent:
                self.held.discard(index)
                drop(earlier)

    def _claim(self, earlier: OpRecord) -> None:
        earlier.meta["lookback"] = True
        if earlier.index in self.held:
            self.held.discard(earlier.index)
            earlier.out = backend_named(self.builder.backend, missing_ok=True).detach(earlier.out)

    def _look_back(self, op: OpRecord, verdict: bool | None) -> None:
        window = list(self.recent)
        if verdict is True:
            for earlier in window:
                self._claim(earlier)
        elif verdict is None:
            self.windows[op.index] = [earlier.index for earlier in window]
            for earlier in window:
                self.pins[earlier.index] = self.pins.get(earlier.index, 0) + 1
        if len(self.recent) == self.lookback:
            leaving = self.recent[0]
            if leaving.index in self.held and not self.pins.get(leaving.index):
                self.held.discard(leaving.index)  # no picked op came within its window
                drop(leaving)
        self.recent.append(op)
        if verdict is False and self.keep_lookback_values:
            self.held.add(op.index)

    # -- halting ---------------------------------------------------------------------------
    def _note_matches(self, selector: Selector, op: OpRecord) -> None:
        if isinstance(selector, (AllOf, AnyOf)):
            for part in selector.parts:
                self._note_matches(part, op)
        elif selector.decide(op, self.builder):
            self.matched.add(id(selector))

    def _unready(self, selector: Selector) -> list[Selector]:
        """The parts of a halt selector that never became ready."""
        if isinstance(selector, (AllOf, AnyOf)):
            return [p for part in selector.parts for p in self._unready(part)]
        return [] if self._ready(selector) else [selector]

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
    op.out = op.pre_edit = None
    op.saved = False
