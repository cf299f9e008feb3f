"""audit(untraced=True): does the model, run without TorchLens, compute what the trace says?

Replay parity compares the trace with itself. A tracer can also change what
runs (PyTorch's fused attention kernels refuse to run under a function mode,
a framework may pick other kernels when it sees an observer), and then the
trace is faithful to a forward that never happens untraced. This check runs
the model once more, untraced, on copies of the recorded inputs (see
:mod:`torchlens_core.capture.rerun`), and compares its output with the
trace's.

A forward that draws random numbers or changes its own state gives another
output on every run. When the untraced output is off, the model is run a
second time: if the two untraced runs disagree as well, the trace cannot be
judged this way, and the finding says so (passing); if they agree, tracing
changed the result, and the finding fails. Either rerun is a real forward:
it advances random generators and updates training-mode statistics, as any
call of the model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchlens_core.backend.arrays import is_array_of
from torchlens_core.backend.manager import backend_named
from torchlens_core.capture.rerun import RecordedCall
from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import refs_in
from torchlens_core.replay.audit import Finding

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace

NAME = "untraced parity"


def untraced_parity(trace: Trace, rtol: float) -> list[Finding]:
    call = _call_of(trace)
    if trace.halted:
        return [Finding(NAME, True, "not compared: halt= stopped the traced forward before it returned")]
    if trace.interventions or trace.notes.get("spliced"):
        return [
            Finding(
                NAME,
                True,
                "not compared: intervene= edited the traced forward, and an untraced run cannot make the same edits",
            )
        ]
    recorded = [trace.ops[r.index].out for r in refs_in(trace.output_template)]
    model = call.model()  # raises, typed, if it has been freed
    try:
        first = _run(model, call, trace)
    except Exception as exc:  # noqa: BLE001 - the model's own failure is the finding
        return [Finding(NAME, False, f"the traced forward ran, the untraced one raised {type(exc).__name__}: {exc}")]
    error, at = _worst(trace.backend, first, recorded)
    if error <= rtol:
        same = "bit-identical" if error == 0 else f"within rtol {rtol:g}"
        return [Finding(NAME, True, f"recorded vs untraced output {error:.3g} ({same})")]
    second = _run(model, call, trace)
    spread, _ = _worst(trace.backend, second, first)
    if spread > rtol:
        return [
            Finding(
                NAME,
                True,
                f"not compared: two untraced runs differ from each other by {spread:.3g} "
                f"(the forward draws random numbers or changes its state); recorded vs "
                f"the first {error:.3g}",
            )
        ]
    if at is None:
        return [
            Finding(
                NAME, False, f"the untraced forward returned {len(first)} arrays, the trace recorded {len(recorded)}"
            )
        ]
    label = trace.output_labels[at]
    return [
        Finding(
            NAME,
            False,
            f"recorded vs untraced output {error:.3g} at {label}, while two untraced runs "
            f"agree ({spread:.3g}): tracing changed what the model computes",
            label,
        )
    ]


def _call_of(trace: Trace) -> RecordedCall:
    call = trace.call
    if isinstance(call, RecordedCall):
        return call
    if isinstance(call, str):
        raise UnsupportedError(f"audit(untraced=True): the call that made this trace could not be kept ({call})")
    raise UnsupportedError(
        "audit(untraced=True) needs to run the model again, and this trace does not know it: "
        "traces loaded with tl.load and made by tl.record keep no model; use tl.trace"
    )


def _run(model: Any, call: RecordedCall, trace: Trace) -> list[Any]:
    args, kwargs = call.inputs(trace)
    output = model(*args, **kwargs)
    return [v for _, v in tree.leaves(output, is_array_of(trace.backend))]


def _worst(backend: str, actual: list[Any], expected: list[Any]) -> tuple[float, int | None]:
    """The largest error between two lists of output arrays, and the position of the output it is at."""
    if len(actual) != len(expected):
        return float("inf"), None
    error = backend_named(backend, missing_ok=True).array_error
    worst, at = 0.0, None
    for i, (a, e) in enumerate(zip(actual, expected)):
        value = error(a, e)
        if value is None:
            raise UnsupportedError(f"the {backend} backend cannot compare its arrays (it has no array_error)")
        if not value <= worst:  # NaN counts as worst
            worst, at = value, i
    return worst, at
