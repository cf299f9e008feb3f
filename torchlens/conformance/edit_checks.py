"""Conformance checks of interventions (``intervene=``), for backends declaring ``intervene`` (and ``splice``).

Rules of plugin contract 3 (see :func:`~torchlens.conformance.support.since_contract`).
Each case is edited at one site (one op, one module call), so that the
checks cost about one capture each. The references are independent of the
capture: NumPy computing each helper on the values the backend handed it,
the framework's own module hooks (``torchlens_observe_module_outputs``) for
what a module returned before its edit, the recorded graph replayed with
the same edit (``trace.fork()``). Collected through :mod:`torchlens.conformance.checks`.
"""

from __future__ import annotations

from typing import Any

import pytest

import torchlens as tl
from torchlens.conformance.rerun import module_at
from torchlens.conformance.support import (
    FLOATING,
    Traced,
    mid_op_site,
    module_site,
    needs,
    numpy_error,
    run,
    since_contract,
    single_array,
    small_only,
    to_numpy,
    tolerance,
)
from torchlens_core.backend.array_ops import NumpyArrayOps
from torchlens_core.backend.arrays import is_array_of, max_error
from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import GraphDoesNotHold
from torchlens_core.ir.records import OpRecord, refs_in


def _capture(traced: Traced, **options: Any) -> tl.Trace:
    return run(
        traced.case, lambda: tl.trace(traced.model, *traced.args, backend=traced.backend, **options, **traced.kwargs)
    )


def _audited(traced: Traced, trace: tl.Trace) -> None:
    report = run(traced.case, lambda: trace.audit(rtol=traced.case.rtol))
    assert report, str(report)


def _key(op: OpRecord) -> str:
    return f"{op.layer_label}:{op.pass_num}"


# -- every built-in helper, at one op, against NumPy -----------------------------------------------------------
def _unit_along_last(d: Any, ndim: int) -> Any:
    import numpy as np

    return (d / np.linalg.norm(d)).reshape([1] * (ndim - 1) + [-1])


def _component(p: Any, d: Any) -> Any:
    u = _unit_along_last(d, p.ndim)
    return (p * u).sum(axis=-1, keepdims=True) * u


def _helper_steps(trace: tl.Trace, site: OpRecord, reference: Any, dtype: Any) -> list[tuple[str, Any, Any]]:
    """``(name, helper, the same edit in NumPy)`` for every built-in helper that edits a value, in the order
    they run at the site. ``reference`` is the site's value in ``trace`` (which swap_with and the other
    reference helpers read); each NumPy edit takes the value the helper was handed. The steering vector is a
    NumPy array of the site's NumPy ``dtype``: on a backend whose arrays are NumPy's it is used as it is, and
    NumPy's promotion would change the site's dtype, which an edit may not."""
    import numpy as np

    shape = site.shape
    assert shape is not None, f"the site {site.label} is not one array"
    n = shape[-1]
    vector = np.linspace(-1.0, 1.0, n).astype(dtype)
    off, onto = np.cos(np.arange(n) + 0.5), np.linspace(0.5, 2.0, n)
    picks = np.random.default_rng(3).permutation(reference.shape[0])[: shape[0]]
    draws = 0.1 * np.random.default_rng(7).standard_normal(shape)
    return [
        ("zero_ablate", tl.zero_ablate(), lambda p: np.zeros_like(p)),
        ("swap_with", tl.swap_with(trace), lambda p: reference),
        ("resample_ablate", tl.resample_ablate(trace, seed=3), lambda p: reference[picks]),
        (
            "mean_ablate(reference, dims=(-1,))",
            tl.mean_ablate(trace, dims=(-1,)),
            lambda p: np.broadcast_to(reference.mean(axis=-1, keepdims=True), shape),
        ),
        ("steer", tl.steer(vector, 2.0), lambda p: p + 2.0 * vector),
        ("scale", tl.scale(-0.5), lambda p: p * -0.5),
        ("noise", tl.noise(0.1, seed=7), lambda p: p + draws),
        ("project_off", tl.project_off(off), lambda p: p - _component(p, off)),
        ("project_onto", tl.project_onto(onto), lambda p: _component(p, onto)),
        ("clamp", tl.clamp(min=-0.3, max=0.2), lambda p: np.clip(p, -0.3, 0.2)),
        ("mean_ablate", tl.mean_ablate(), lambda p: np.broadcast_to(p.mean(axis=0, keepdims=True), shape)),
    ]


@since_contract(3)
def test_every_helper_edits_an_op_as_numpy_computes_it(traced: Traced) -> None:
    """Every built-in helper, in turn, at one mid-graph op: each gets the value the one before it returned, and
    returns what NumPy computes from it; the value before the edit is the clean capture's; the op records both,
    and the edited capture audits clean (so every later op read the edit, as the model did)."""
    import numpy as np

    needs(traced, "intervene")
    small_only(traced)
    site = mid_op_site(traced.trace, also=lambda op: bool(np.isfinite(to_numpy(traced.backend, op.out)).all()))
    if site is None:
        pytest.skip("no floating-point op with children and finite values to edit")
    backend, key = traced.backend, _key(site)
    clean = to_numpy(backend, site.out)
    steps = _helper_steps(traced.trace, site, clean.astype("float64"), clean.dtype)
    clean = clean.astype("float64")
    seen: list[Any] = []
    recording = [True]

    def record(value: Any, where: Any) -> Any:  # a copy: an edit of an in-place op is written into the value
        if recording[0]:
            seen.append(where.ops.copy(value))
        return value

    helpers = [record]
    for _, helper, _ in steps:
        helpers += [helper, record]
    edited = _capture(traced, intervene=tl.when(tl.label(key), *helpers))
    recording[0] = False  # the audit's replay runs the helpers again
    op = edited[key]
    assert op.edited, f"{key} is not marked edited"
    assert [(e.site, e.kind) for e in edited.interventions] == [(key, "op")], edited.interventions
    values = [to_numpy(backend, v).astype("float64") for v in seen]
    assert len(values) == len(steps) + 1, f"the helpers at {key} ran {len(values) - 1} times, not {len(steps)}"
    before = numpy_error(values[0], clean)
    assert before <= traced.case.rtol, (
        f"the value handed to the first helper at {key} is off the clean capture's by {before:.3g}"
    )
    assert numpy_error(to_numpy(backend, op.pre_edit), values[0]) == 0.0, (
        f"{key}'s pre_edit is not its value before the edit"
    )
    tol = tolerance(site.dtype, traced.case.rtol)
    for (name, _, by_hand), given, got in zip(steps, values, values[1:]):
        error = numpy_error(got, by_hand(given))
        assert error <= tol, f"{name} at {key} is off NumPy's answer by {error:.3g}"
    assert numpy_error(to_numpy(backend, op.out), values[-1]) == 0.0, f"{key}'s recorded value is not the edit"
    _audited(traced, edited)


# -- a module call's output, as a hook returning the edit would give it -----------------------------------------
def _module_edit(value: Any) -> Any:
    """What ``tl.scale(-2.0), tl.noise(0.05, seed=5)`` make of one array, in NumPy."""
    import numpy as np

    return value * -2.0 + 0.05 * np.random.default_rng(5).standard_normal(value.shape)


def _array_leaves(backend: str, value: Any) -> list[Any]:
    return [leaf for _, leaf in tree.leaves(value, is_array_of(backend))]


@since_contract(3)
def test_a_module_call_edit_is_what_its_caller_gets(traced: Traced) -> None:
    """One module call's output edited (every array it returned), the capture saving that call alone: the call's
    output is NumPy's edit of what the framework's module hooks saw it return, later ops read the edit (the
    output equals the clean trace's graph replayed with the same edit), and ops ``save=`` left out stay unsaved."""
    needs(traced, "intervene")
    small_only(traced)
    mp = module_site(traced.trace)
    if mp is None:
        pytest.skip("no module call returns a floating-point array an edit can reach")
    backend, where = traced.backend, tl.module(mp.label)
    helpers = (tl.scale(-2.0), tl.noise(0.05, seed=5))
    edited = _capture(traced, save=where, intervene=tl.when(where, *helpers))
    leaves = refs_in(mp.out_template)
    assert [(e.site, e.kind) for e in edited.interventions] == [(mp.label, "module")] * len(leaves), (
        f"the edits recorded are {edited.interventions}, not one per array {mp.label} returned"
    )
    observed = run(
        traced.case,
        lambda: backend_named(traced.backend).observe_module_outputs(traced.model, traced.args, traced.kwargs),
    )
    seen = (observed or {}).get(mp.label)
    before = _array_leaves(backend, seen if seen is not None else mp.out)  # the framework's view, where it has one
    after = _array_leaves(backend, edited.modules[mp.path].passes[mp.pass_num - 1].out)
    assert len(after) == len(before), f"{mp.label} returned {len(before)} arrays; the edited trace has {len(after)}"
    tol = tolerance(traced.trace.ops[leaves[0].index].dtype, traced.case.rtol)
    for i, (b, a) in enumerate(zip(before, after)):
        error = numpy_error(to_numpy(backend, a), _module_edit(to_numpy(backend, b).astype("float64")))
        assert error <= tol, (
            f"array {i} of {mp.label}'s edited output is off the hook-seen value, edited in NumPy, by {error:.3g}"
        )
    assert any(op.kind == "op" and not op.saved for op in edited.ops), (
        "save= picked one module call; every op was saved"
    )
    replayed = _replayed_with(traced, where, *helpers)
    if replayed is not None:
        error = max_error(backend, replayed, edited.output)
        assert error <= traced.case.rtol, (
            f"edited at {mp.label}, the output is off the recorded graph replayed with the same edit by {error:.3g}"
        )


def _replayed_with(traced: Traced, where: Any, *helpers: Any) -> Any:
    """The clean trace's graph replayed with ``helpers`` at ``where``; None where the edit changes a value the
    forward branched on (GraphDoesNotHold: the zero-ablation check holds a backend to saying so)."""
    try:
        return run(traced.case, traced.trace.fork().when(where, *helpers).replay)
    except GraphDoesNotHold:
        return None


# -- tl.splice_module --------------------------------------------------------------------------------------------
@since_contract(3)
def test_splice_module_runs_the_replacement_instead(traced: Traced) -> None:
    """One module call replaced by a function that calls the module itself, then edited: the replacement runs
    once, its ops are recorded inside the call, and the output is the clean graph replayed with the same edit.
    Replaced by a function returning (copies of) what the call returned in the clean capture, the module does
    not run: no op but identity ops is recorded inside the call, and the output is the model's own."""
    needs(traced, "splice")
    small_only(traced)
    mp = module_site(traced.trace, once=True)
    module = module_at(traced.model, mp.path) if mp is not None else None
    if module is None:
        pytest.skip("no module called once that a replacement can stand in for (or no callable at its path)")
    calls: list[int] = []

    def replacement(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return module(*args, **kwargs)

    where = tl.module(mp.label)
    spliced = _capture(traced, intervene=tl.when(where, tl.splice_module(replacement), tl.scale(-2.0)))
    assert len(calls) == 1, f"the replacement of {mp.label} ran {len(calls)} times"
    inside = [op.func_name for op in spliced.ops if (mp.path, mp.pass_num) in [tuple(p) for p in op.module_passes]]
    assert inside, f"no op of the replacement was recorded inside {mp.label}"
    _audited(traced, spliced)
    # The module ran inside the replacement, maybe by another route (torch leaves its fused kernels when a
    # module's call is wrapped), and computed the same values: the clean graph, its output edited, is the reference.
    tol = tolerance(traced.trace.ops[refs_in(mp.out_template)[0].index].dtype, traced.case.rtol)
    replayed = _replayed_with(traced, where, tl.scale(-2.0))
    if replayed is not None:
        error = max_error(traced.backend, replayed, spliced.output)
        assert error <= tol, (
            f"spliced at {mp.label}, the output is off the clean graph replayed with the "
            f"module's output edited by {error:.3g}"
        )
    ops, is_array = backend_named(traced.backend).array_ops(), is_array_of(traced.backend)
    returned = tree.map_leaves(lambda v: ops.copy(v) if ops is not None and is_array(v) else v, mp.out)
    instead = _capture(traced, intervene=tl.when(where, tl.splice_module(lambda *args, **kwargs: returned)))
    ran = [
        op.label
        for op in instead.ops
        if (mp.path, mp.pass_num) in [tuple(p) for p in op.module_passes] and not op.meta.get("identity")
    ]  # (the explicit identity op of an array returned, not computed)
    assert not ran, f"{mp.label} was replaced by a function computing nothing, yet ops ran inside it: {ran[:5]}"
    error = max_error(traced.backend, instead.output, traced.own_output)
    assert error <= tol, f"{mp.label} replaced by its own clean output, the output is off the model's by {error:.3g}"


# -- what an edit must not do ------------------------------------------------------------------------------------
class _HelperFailed(Exception):
    pass


def _raise(error: BaseException) -> Any:
    def helper(value: Any, site: Any) -> Any:
        raise error

    return helper


@since_contract(3)
def test_refused_and_failing_edits_leave_the_model_as_it_was(traced: Traced) -> None:
    """At the first op: an edit changing the shape (and one changing the dtype) is refused naming the site and
    both forms; a helper's exception, a KeyboardInterrupt too, comes out as raised, at op and module sites;
    afterwards the model computes what it computed before."""
    needs(traced, "intervene")
    small_only(traced)
    first = next((op for op in traced.trace.ops if op.kind == "op" and single_array(op) and op.saved), None)
    if first is None:
        pytest.skip("no op returning one array")
    assert first.shape is not None  # single_array(first)
    key, shape = _key(first), list(first.shape)

    def grows(value: Any, site: Any) -> Any:
        return site.ops.take(value, [*range(shape[0]), 0], 0)

    with pytest.raises(tl.InterventionError) as refused:
        _capture(traced, intervene=tl.when(tl.label(key), grows))
    grown = [shape[0] + 1, *shape[1:]]
    assert key in str(refused.value) and str(shape) in str(refused.value) and str(grown) in str(refused.value), (
        f"the refusal does not name the site {key} and shapes {shape} and {grown}: {refused.value}"
    )
    retyped = _another_dtype(traced.backend, first)
    if retyped is not None:
        with pytest.raises(tl.InterventionError, match=retyped[1]):
            _capture(traced, intervene=tl.when(tl.label(key), lambda value, site: retyped[0]))
    sites = [tl.label(key)]
    module = next(
        (
            mp
            for m in traced.trace.modules.values()
            for mp in m.passes
            if mp.out_template is not None and refs_in(mp.out_template)
        ),
        None,
    )
    if module is not None and "modules" in _capabilities(traced.backend):
        sites.append(tl.module(module.label))
    for where in sites:
        for error in (_HelperFailed("helper failed"), KeyboardInterrupt()):
            with pytest.raises(type(error)):
                _capture(traced, intervene=tl.when(where, _raise(error)))
    again = run(traced.case, lambda: traced.model(*traced.args, **traced.kwargs))
    change = max_error(traced.backend, again, traced.own_output)
    assert change <= traced.case.rtol, f"after the failed captures the model's output changed by {change:.3g}"


def _capabilities(backend: str) -> frozenset[str]:
    from torchlens_core.backend.manager import resolve_backend

    return resolve_backend(backend).capabilities


def _another_dtype(backend: str, op: OpRecord) -> tuple[Any, str] | None:
    """``op``'s value as another floating-point dtype, and that dtype's name; None if the backend cannot make it."""
    h = backend_named(backend)
    info = h.array_info(op.out)
    if info is None:
        return None
    other = "float32" if info[1] == "float64" else "float64"
    try:
        made = h.from_numpy(to_numpy(backend, op.out).astype(other), other, info[2])
    except Exception:  # noqa: BLE001 - a backend without that dtype: the shape refusal stands alone
        return None
    found = h.array_info(made) if made is not None else None
    return (made, other) if found is not None and found[1] != info[1] and other in found[1] else None


# -- the backend's array operations ----------------------------------------------------------------------------
def _samples(traced: Traced) -> list[Any]:
    """The case's own arrays to try the operations on: the smallest one of each dtype among the inputs and the
    recorded values, at least one axis and two elements, floating point or integer (read from the recorded
    dtype and shape: nothing is converted but the samples)."""
    import math

    info = backend_named(traced.backend).array_info
    found: dict[str, tuple[int, Any]] = {}
    described = [
        (leaf, info(leaf)) for _, leaf in tree.leaves((traced.args, traced.kwargs), is_array_of(traced.backend))
    ]
    candidates: list[tuple[Any, tuple[int, ...], str]] = [(leaf, d[0], d[1]) for leaf, d in described if d is not None]
    candidates += [
        (op.out, op.shape, op.dtype)
        for op in traced.trace.ops
        if op.saved and op.kind in ("input", "op") and single_array(op) and op.dtype and op.shape is not None
    ]
    for value, shape, dtype in candidates:
        size = math.prod(shape)
        if (
            len(shape) >= 1
            and size >= 2
            and (any(k in dtype for k in FLOATING) or "int" in dtype)
            and (dtype not in found or size < found[dtype][0])
        ):
            found[dtype] = (size, value)
    return [value for _, value in found.values()]


@since_contract(3)
def test_array_ops_agree_with_numpy(traced: Traced) -> None:
    """The backend's ArrayOps (torchlens_array_ops), on arrays of the case, give NumpyArrayOps' answers on the
    same values, in the array's own dtype; a copy is not changed by writing into the array it was copied from."""
    import numpy as np

    needs(traced, "intervene")
    backend = traced.backend
    h = backend_named(backend)
    ops, reference = h.array_ops(), NumpyArrayOps()
    assert ops is not None, "a backend declaring 'intervene' answers torchlens_array_ops"
    for x in _samples(traced):
        data = to_numpy(backend, x)
        described = h.array_info(x)
        assert described is not None, f"array_info does not describe the array {type(x).__name__} it gave"
        dtype = described[1]
        last = data.ndim - 1
        low, high = (float(q) for q in np.quantile(data.astype(np.float64), [0.25, 0.75]))
        if data.dtype.kind in "iu":
            low, high = int(low), int(high)
        rows = [data.shape[0] - 1, 0, data.shape[0] - 1]
        pairs = [
            ("zeros_like", ops.zeros_like(x), reference.zeros_like(data)),
            ("mean over (0,)", ops.mean(x, (0,)), reference.mean(data, (0,))),
            (
                "mean over every axis",
                ops.mean(x, tuple(range(data.ndim))),
                reference.mean(data, tuple(range(data.ndim))),
            ),
            ("sum over the last axis", ops.sum(x, last), reference.sum(data, last)),
            ("clip", ops.clip(x, low, high), reference.clip(data, low, high)),
            ("clip above only", ops.clip(x, None, high), reference.clip(data, None, high)),
            ("take", ops.take(x, rows, 0), reference.take(data, rows, 0)),
            ("from_numpy", ops.from_numpy(np.ones(data.shape), x), reference.from_numpy(np.ones(data.shape), data)),
            ("copy", ops.copy(x), reference.copy(data)),
        ]
        tol = tolerance(dtype, 0.0) if data.dtype.kind == "f" else 0.0
        for name, got, want in pairs:
            found = h.array_info(got)
            assert found is not None and found[1] == dtype, f"{name} of a {dtype} array gave {found}"
            error = numpy_error(to_numpy(backend, got), want)
            assert error <= tol, f"{name} of a {dtype} array is off NumPy's by {error:.3g}"
        kept = ops.copy(x)
        written = ops.write_into(ops.copy(x), x * 2)
        assert numpy_error(to_numpy(backend, written), data.astype(np.float64) * 2) == 0.0, (
            f"write_into of a {dtype} array did not give the value written"
        )
        assert numpy_error(to_numpy(backend, kept), data) == 0.0, f"a copy of a {dtype} array changed"
        assert numpy_error(to_numpy(backend, x), data) == 0.0, f"writing into a copy changed the {dtype} array"
