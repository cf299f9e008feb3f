"""What the conformance checks share: the traced case, running it, the rules a contract version added, sites.

Imports no framework: values are read through the backend's hooks
(``torchlens_to_numpy``, ``torchlens_array_info``) and compared in NumPy.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import pytest

import torchlens as tl
from torchlens_core.backend.cases import Case
from torchlens_core.backend.manager import backend_named, contract_of, resolve_backend
from torchlens_core.capture.edits import Intervention, judged_on_trace, replay_refusal
from torchlens_core.ir import tree
from torchlens_core.ir.errors import PluginContractWarning, TorchLensError
from torchlens_core.ir.records import OpRecord, refs_in

FLOATING = ("float", "bfloat", "half", "double")


@attrs.frozen
class Traced:
    """One case of a zoo, built and captured once for every check: the model, its inputs, its trace, its output."""

    backend: str
    case: Case
    model: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    trace: tl.Trace
    own_output: Any


def run(case: Case, fn: Callable[[], Any]) -> Any:
    """``fn()`` after the case's reset: every run of the model draws the random numbers the capture drew."""
    if case.reset is not None:
        case.reset()
    return fn()


def needs(traced: Traced, capability: str) -> None:
    """Skip a check of an option the backend does not declare (tl.trace refuses the option then)."""
    if capability not in resolve_backend(traced.backend).capabilities:
        pytest.skip(f"the {traced.backend} backend does not declare the {capability!r} capability")


def since_contract(version: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark a check as a rule of plugin contract ``version`` (CHANGELOG.md, "For plugin authors").

    A backend declaring that version or a later one (``BackendInfo(contract=N)``)
    must pass it. One written for an earlier version is told of a failure by a
    :class:`~torchlens_core.ir.errors.PluginContractWarning`, and the check is
    reported xfailed: a new rule warns for one release before it fails.
    """

    def mark(check: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(check)  # pytest reads the fixtures from the wrapped signature
        def held_to(**fixtures: Any) -> None:
            backend = fixtures["traced"].backend
            declared = contract_of(backend)
            if declared >= version:
                return check(**fixtures)
            try:
                return check(**fixtures)
            except (Exception, pytest.fail.Exception) as exc:  # noqa: BLE001 - a failure of the new rule (an
                # assertion, an error, a pytest.raises that did not raise; not a skip): reported, not raised
                first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
                message = (
                    f"the {backend} backend declares plugin contract {declared}; {check.__name__} is a rule of "
                    f"contract {version}, which it fails ({type(exc).__name__}: {first}). It will fail "
                    f"the suite once TorchLens stops accepting contract {declared}: fix it and declare "
                    f"BackendInfo(contract={version})"
                )
                warnings.warn_explicit(
                    message,
                    PluginContractWarning,
                    filename=check.__code__.co_filename,
                    lineno=check.__code__.co_firstlineno,
                )  # where the rule is written
                pytest.xfail(message)

        return held_to

    return mark


def other_inputs(traced: Traced) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A second, different set of inputs: the case's own, or the floats nudged and the integers shuffled (the same
    on every call: a seeded draw)."""
    import numpy as np

    if traced.case.other_inputs is not None:
        return traced.case.other_inputs(traced.args, traced.kwargs)
    backend = traced.backend
    h = backend_named(backend)
    rng = np.random.default_rng(0)
    made: dict[int, Any] = {}

    def other_once(value: Any) -> Any:  # an array passed twice (attention's query, key, value) stays one array
        if id(value) not in made:
            made[id(value)] = other(value)
        return made[id(value)]

    def other(value: Any) -> Any:
        info = h.array_info(value)
        if info is None:
            return value
        array = np.asarray(h.to_numpy(value))
        if array.dtype.kind == "f" and array.size:
            scale = float(np.std(array)) or 1.0
            array = (array + 0.05 * scale * rng.standard_normal(array.shape)).astype(array.dtype)
        elif array.dtype.kind in "iu" and array.size > 1:
            array = rng.permutation(array.ravel()).reshape(array.shape)
        else:
            return value
        converted = h.from_numpy(array, info[1], info[2])
        return array if converted is None else converted  # None: the backend's arrays are NumPy's

    return tree.map_leaves(other_once, traced.args), tree.map_leaves(other_once, traced.kwargs)


# The cases the checks of contract 3 that capture, replay or differentiate once more run on: those whose trace
# records at most this many numbers (op values and parameters). The behaviours they check do not depend on a
# model's size, and on the big models of a zoo (a ResNet, a ViT) they would cost minutes; a zoo holds small
# cases too (a zoo without any is not checked by them: keep a few small models in it).
SMALL_CASE = 2**18


def is_small(traced: Traced) -> bool:
    return numbers_recorded(traced.trace) <= SMALL_CASE


def small_only(traced: Traced) -> None:
    """Skip a case above :data:`SMALL_CASE`."""
    recorded = numbers_recorded(traced.trace)
    if recorded > SMALL_CASE:
        pytest.skip(
            f"a large case ({recorded} numbers recorded, more than {SMALL_CASE}): this check runs on the "
            f"zoo's small cases"
        )


def numbers_recorded(trace: tl.Trace) -> int:
    """How many numbers the trace's op values and parameters hold, from their recorded shapes."""
    import math

    def count(shape: Any) -> int:
        if shape is None:
            return 0
        if all(isinstance(d, int) for d in shape):
            return math.prod(shape)
        return sum(count(s) for s in shape if isinstance(s, tuple))

    return sum(count(op.shape) for op in trace.ops) + sum(math.prod(p.shape) for p in trace.params.values())


# -- values, read through the backend's hooks --------------------------------------------------------------------
def to_numpy(backend: str, value: Any) -> Any:
    import numpy as np

    return np.asarray(backend_named(backend).to_numpy(value))


def numpy_error(actual: Any, expected: Any) -> float:
    """``max |a - e| / (1 + |e|)`` in float64; inf for another shape or NaNs in other places."""
    import numpy as np

    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape or not np.array_equal(np.isnan(a), np.isnan(e)):
        return float("inf")
    differ = ~np.isnan(e) & (a != e)  # equal infinities (an attention mask's -inf) are equal
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(a[differ] - e[differ]) / (1.0 + np.abs(e[differ])), initial=0.0))


def tolerance(dtype: str | None, rtol: float) -> float:
    """What arithmetic in ``dtype`` may be off a float64 reference: a few units in its last place."""
    if dtype is not None and ("16" in dtype or "8" in dtype):  # bfloat16, float16, float8
        return max(rtol, 2e-2)
    return max(rtol, 1e-4)


def is_floating(op: OpRecord) -> bool:
    dtype = op.dtype
    return dtype is not None and any(k in dtype for k in FLOATING)


def single_array(op: OpRecord) -> bool:
    """The op returned one array of at least one axis (not a structure, not a scalar)."""
    return op.shape is not None and len(op.shape) >= 1 and all(isinstance(d, int) and d > 0 for d in op.shape)


# -- where the checks edit -------------------------------------------------------------------------------------
def mid_op_site(trace: tl.Trace, also: Callable[[OpRecord], bool] = lambda op: True) -> OpRecord | None:
    """A floating-point op in the middle of the graph, one array of some axes, read by later ops, replayable
    with an edit (and passing ``also``): where the op-site checks edit, one site a case to keep them cheap."""
    ops = [
        op
        for op in trace.ops
        if op.kind == "op"
        and op.children
        and is_floating(op)
        and single_array(op)
        and op.saved
        and replay_refusal(op, op.label) is None
    ]
    middle = len(ops) // 2  # ``also`` asked from the middle outwards, only until one passes
    return next((ops[i] for i in sorted(range(len(ops)), key=lambda i: abs(i - middle)) if also(ops[i])), None)


def module_site(trace: tl.Trace, once: bool = False) -> Any:
    """A module call whose returned arrays are floating point and editable on the recorded graph (no op inside
    the module read them, no pass-through); a call of a module called more than once, and one returning
    several arrays, first, as they are the cases a backend gets wrong. ``once``: a call of a module called once
    (a splice of one call among several is refused where the calls share traced code: JAX's scans). None if
    there is none."""
    found = []
    for module in trace.modules.values():
        if once and len(module.passes) != 1:
            continue
        for mp in module.passes:
            refs = refs_in(mp.out_template) if mp.out_template is not None else []
            if not refs or not all(is_floating(trace.ops[r.index]) and trace.ops[r.index].saved for r in refs):
                continue
            try:
                sites = judged_on_trace(Intervention(tl.module(mp.label), (_keep,)), trace)
            except TorchLensError:  # an op inside the module read what it returned: no hook-like edit there
                continue
            if any(replay_refusal(op, key) is not None for op, _, key, _, _ in sites):
                continue
            found.append((mp.pass_num > 1, len(refs), -abs(refs[0].index - len(trace.ops) // 2), mp))
    return max(found, key=lambda f: f[:3])[3] if found else None


def _keep(value: Any, site: Any) -> Any:
    return value
