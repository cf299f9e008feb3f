"""``tl.validate(trace)``: does this trace cover the whole forward, every value and every computation?

``status = tl.validate(trace)`` lists the reasons a trace is partial;
``bool(status)`` is True for a complete trace and raises
:class:`~torchlens_core.ir.errors.PartialCoverage` otherwise, so that
``assert tl.validate(trace)`` or ``if tl.validate(trace):`` can never pass
over a partial trace in silence. Reasons, each a (kind, detail) pair:

- ``halted``: ``halt=`` stopped the forward; the ops after it never ran;
- ``values``: ``save=`` (or a halt, a drop) left ops without their values;
- ``escapes``: ``escape_detector="shadow"`` saw kernels no recorded op accounts for;
- ``collectives``: ``torch.distributed`` calls ran without ``tl.distributed.arm()``, unrecorded;
- ``observer_effect``: the traced run took another path than an untraced one would (a fused kernel...);
- ``mutated``: a kept value was changed in place after it was recorded, without a copy;
- ``not_replayable``: ops with no call to run again, so replay cannot check them;
- ``audit``: with ``audit=True``, checks of :meth:`Trace.audit` that failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from torchlens_core.ir.errors import PartialCoverage

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace


@attrs.frozen
class Coverage:
    """What :func:`validate` found. ``bool()`` raises :class:`PartialCoverage` unless it is complete."""

    reasons: tuple[tuple[str, str], ...]

    @property
    def complete(self) -> bool:
        return not self.reasons

    def __bool__(self) -> bool:
        if self.reasons:
            raise PartialCoverage(
                "the trace is partial: " + "; ".join(f"{kind}: {detail}" for kind, detail in self.reasons)
            )
        return True

    def __str__(self) -> str:
        if not self.reasons:
            return "Coverage: complete"
        return "Coverage: partial\n" + "\n".join(f"  {kind}: {detail}" for kind, detail in self.reasons)


def _examples(labels: list[str]) -> str:
    return ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")


def validate(trace: Trace, *, audit: bool = False) -> Coverage:
    """Why ``trace`` is partial, if it is (see the module docstring); ``audit=True`` also replays it."""
    reasons: list[tuple[str, str]] = []
    ops = [op for op in trace.ops if op.kind == "op"]
    if trace.halted:
        last = ops[-1].label if ops else "the inputs"
        reasons.append(("halted", f"halt= stopped the forward after {last}; what came after never ran"))
    unsaved = [op.label for op in ops if not op.saved]
    if unsaved:
        reasons.append(("values", f"{len(unsaved)} of {len(ops)} ops kept no value (save=): {_examples(unsaved)}"))
    escapes = trace.notes.get("escapes") or []
    if escapes:
        kernels = sum(e["count"] for e in escapes)
        first = escapes[0]
        reasons.append(
            (
                "escapes",
                f"{kernels} kernel call(s) ran outside every recorded op, first {first['kernel']} "
                f"after {first['after']}",
            )
        )
    unrecorded = trace.notes.get("unrecorded_collectives") or []
    if unrecorded:
        reasons.append(
            (
                "collectives",
                f"{len(unrecorded)} collective call(s) ran unrecorded "
                f"({_examples(unrecorded)}): arm tl.distributed before capturing",
            )
        )
    effects = trace.notes.get("observer_effect") or {}
    if effects:
        reasons.append(("observer_effect", "; ".join(f"{path}: {why}" for path, why in list(effects.items())[:3])))
    mutated = [op.label for op in ops if op.meta.get("mutated_after_recording")]
    if mutated:
        reasons.append(("mutated", f"changed in place after being recorded: {_examples(mutated)}"))
    unrunnable = [op.label for op in ops if op.call is None and not op.meta.get("identity")]
    if unrunnable:
        reasons.append(("not_replayable", f"no call to run again: {_examples(unrunnable)}"))
    if audit:
        report = trace.audit()
        reasons += [("audit", f"{f.check}: {f.detail}") for f in report.failures]
    return Coverage(tuple(reasons))
