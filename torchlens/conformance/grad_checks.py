"""Conformance checks of gradients (``save_grads=``, ``trace.log_backward``), for backends declaring ``gradients``.

Rules of plugin contract 3 (see :func:`~torchlens.conformance.support.since_contract`).
They share one differentiated capture per case (the ``graded`` fixture of
:mod:`torchlens.conformance.checks`), whose input gradients the framework's
own (``torchlens_reference_grads``) check. Collected through
:mod:`torchlens.conformance.checks`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import attrs
import pytest

import torchlens as tl
from torchlens.conformance.support import (
    Traced,
    is_floating,
    is_small,
    mid_op_site,
    needs,
    numpy_error,
    run,
    since_contract,
    small_only,
    to_numpy,
)
from torchlens_core.backend.arrays import is_array_of, max_error
from torchlens_core.backend.manager import backend_named, resolve_backend
from torchlens_core.grads.backward import total
from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import GRAD_NO_DEPENDENCE, GRAD_NOT_SELECTED, OpRecord, Ref, refs_in


@attrs.define
class Graded:
    """A case captured with ``save_grads=True`` and differentiated (the sum of its output's floating-point arrays),
    with the framework's own input gradients; or why that failed, raised again by each check that reads it (so
    that the failure is that check's, and a case's expected failure names it)."""

    trace: tl.Trace | None
    references: dict[Any, Any] | None
    error: BaseException | None = None

    def reference(self) -> dict[Any, Any]:
        if self.error is not None:
            raise self.error
        assert self.references is not None
        return self.references


def grads_of(traced: Traced) -> Graded:
    """What the ``graded`` fixture holds (skips a case the framework cannot differentiate by itself)."""
    needs(traced, "gradients")
    try:
        reference = run(
            traced.case,
            lambda: backend_named(traced.backend).reference_grads(traced.model, traced.args, traced.kwargs),
        )
    except tl.UnsupportedError as exc:
        pytest.skip(str(exc))
    if not reference:
        pytest.skip("no floating-point input to differentiate with respect to")
    try:
        t = run(
            traced.case,
            lambda: tl.trace(traced.model, *traced.args, backend=traced.backend, save_grads=True, **traced.kwargs),
        )
        t.log_backward(total(traced.backend))
    except Exception as exc:  # noqa: BLE001 - raised again inside each check (see Graded)
        return Graded(None, None, exc)
    return Graded(t, reference)


def _input_op(trace: tl.Trace, path: Any) -> OpRecord:
    ref = tree.get((trace.call.args, trace.call.kwargs), path)
    assert isinstance(ref, Ref), f"argument {path} is not an input node of the trace"
    return trace.ops[ref.index]


def _tolerance(traced: Traced) -> float:
    return max(traced.case.rtol, 1e-4)


@since_contract(3)
def test_a_loaded_trace_gives_the_same_gradients(traced: Traced, graded: Graded, tmp_path: pathlib.Path) -> None:
    """Saved and loaded, a differentiated trace keeps each op's gradient status, and its own log_backward gives
    every op and parameter the gradient the live trace gave (and so the inputs the framework's)."""
    small_only(traced)
    graded.reference()
    live = graded.trace
    assert live is not None  # reference() raised what the capture did otherwise
    loaded = tl.load(tl.save(live, tmp_path / "grads"))
    assert [op.grad_status for op in loaded.ops] == [op.grad_status for op in live.ops], (
        "the loaded trace's gradient statuses differ from the saved trace's"
    )
    try:
        run(traced.case, lambda: loaded.log_backward(total(traced.backend)))
    except UnsupportedError as exc:  # a rule the file cannot hold (JAX's custom derivatives are code): said so
        pytest.skip(f"the loaded trace refuses to differentiate: {str(exc).splitlines()[0][:200]}")
    tol = _tolerance(traced)
    compared = 0
    for op in live.ops:
        if op.grad is None:
            continue
        error = max_error(traced.backend, loaded.ops[op.index].grad, op.grad)
        assert error <= tol, f"the loaded trace's gradient at {op.label} is off the live trace's by {error:.3g}"
        compared += 1
    assert compared, "no gradient to compare"
    for name, record in live.params.items():
        if record.grad is not None:
            error = max_error(traced.backend, loaded.params[name].grad, record.grad)
            assert error <= tol, f"the loaded trace's gradient of {name} is off the live trace's by {error:.3g}"


def _ancestors(trace: tl.Trace, index: int) -> set[int]:
    seen, todo = set(), [index]
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(trace.ops[i].parent_indices)
    return seen


def _scalable_outputs(traced: Traced) -> list[OpRecord]:
    """The ops the output is read from, where scaling them scales the loss (the sum of the output's floating-point
    arrays): floating point, and read by nothing else; none where an edit cannot do that (or is not declared)."""
    trace = traced.trace
    outs = list({r.index: trace.ops[r.index] for r in refs_in(trace.output_template)}.values())
    if "intervene" not in resolve_backend(traced.backend).capabilities or any(
        op.kind != "op" or not is_floating(op) or any(trace[c].kind != "output" for c in op.children) for op in outs
    ):
        return []
    return outs


@since_contract(3)
def test_gradients_of_a_selected_op_and_through_an_edit(traced: Traced, graded: Graded) -> None:
    """``save_grads=`` one mid-graph op, in a capture whose output ops are scaled by -3 (with ``intervene``, where
    they are floating point and read by nothing else): the loss is -3 times the clean one, so the selected op's
    gradient is -3 times the full capture's and each input's -3 times the framework's, and every other op has
    none (not selected). A loss that is not one number is refused, and the trace works after. With a loss of
    the output's first floating-point array alone, the selected op and the inputs that array is not computed
    from (by the recorded graph) have no gradient: the loss does not depend on them (the op selected is one of
    those, where the output has another array computed without it)."""

    small_only(traced)
    reference = graded.reference()
    full, backend = graded.trace, traced.backend
    assert full is not None  # reference() raised what the capture did otherwise
    outs = [
        (path, ref)
        for path, ref in tree.leaves(full.output_template, lambda v: isinstance(v, Ref))
        if is_floating(full.ops[ref.index])
    ]
    first = outs[0] if len(outs) > 1 and not outs[0][1].path else None  # one op's whole value
    needed = _ancestors(full, first[1].index) if first is not None else set()
    site = None
    if first is not None:
        site = mid_op_site(full, also=lambda op: op.grad is not None and op.index not in needed)
    site = site or mid_op_site(full, also=lambda op: op.grad is not None)
    if site is None:
        pytest.skip("no floating-point op with children and a gradient to select")
    key = f"{site.layer_label}:{site.pass_num}"
    scaled = _scalable_outputs(traced)
    factor = -3.0 if scaled else 1.0
    edits = [tl.when(tl.label(f"{op.layer_label}:{op.pass_num}"), tl.scale(factor)) for op in scaled]
    narrow = run(
        traced.case,
        lambda: tl.trace(
            traced.model,
            *traced.args,
            backend=backend,
            intervene=edits or None,
            save_grads=tl.label(key),
            **traced.kwargs,
        ),
    )
    if any(_numel(backend, leaf) > 1 for leaf in _float_leaves(backend, narrow.output)):
        with pytest.raises(UnsupportedError):  # a loss that is an array of several numbers
            narrow.log_backward(lambda out: next(v for v in _float_leaves(backend, out) if _numel(backend, v) > 1))
    run(traced.case, lambda: narrow.log_backward(total(backend)))
    tol = _tolerance(traced)
    picked = narrow[key]
    assert picked.grad is not None, f"the selected op {key} has no gradient ({picked.grad_status})"
    error = _scaled_error(backend, picked.grad, full[key].grad, factor)
    assert error <= tol, f"the gradient of the selected {key} is off {factor:g} times the full capture's by {error:.3g}"
    others = [
        op.label
        for op in narrow.ops
        if op.kind == "op" and op.index != picked.index and (op.grad is not None or op.grad_status != GRAD_NOT_SELECTED)
    ]
    assert not others, f"ops save_grads= did not select have gradients or another status: {others[:5]}"
    for path, expected in reference.items():
        op = _input_op(narrow, path)
        assert op.grad is not None, f"no gradient at input {op.label} ({op.grad_status})"
        error = _scaled_error(backend, op.grad, expected, factor)
        assert error <= tol, f"the gradient at input {op.label} is off {factor:g} times the framework's by {error:.3g}"
    if first is None:
        return
    ops = backend_named(backend).array_ops()
    assert ops is not None, f"the {backend} backend declares 'gradients' but answers no array_ops to take a loss with"
    run(traced.case, lambda: narrow.log_backward(lambda out: ops.total(tree.get(out, first[0]))))
    for op in [picked, *(op for op in narrow.ops if op.kind == "input" and is_floating(op))]:
        if op.index not in needed:  # (one it is computed from may still not matter: a path through integers)
            assert op.grad is None and op.grad_status == GRAD_NO_DEPENDENCE, (
                f"the first output array is not computed from {op.label}, whose status is {op.grad_status!r}"
            )


def _scaled_error(backend: str, got: Any, expected: Any, factor: float) -> float:
    """How far ``got`` is from ``factor`` times ``expected`` (arrays, or structures of them: several outputs)."""
    import numpy as np

    a = [to_numpy(backend, v) for _, v in tree.leaves(got, is_array_of(backend))]
    e = [to_numpy(backend, v) for _, v in tree.leaves(expected, is_array_of(backend))]
    if len(a) != len(e):
        return float("inf")
    return max((numpy_error(x, factor * np.asarray(y, dtype=np.float64)) for x, y in zip(a, e)), default=0.0)


def _float_leaves(backend: str, value: Any) -> list[Any]:
    info = backend_named(backend).array_info
    described = [(leaf, info(leaf)) for _, leaf in tree.leaves(value, is_array_of(backend))]
    return [leaf for leaf, d in described if d is not None and d[1].startswith(("float", "bfloat"))]


def _numel(backend: str, value: Any) -> int:
    import math

    described = backend_named(backend).array_info(value)
    assert described is not None, f"array_info does not describe a {type(value).__name__} it told apart as an array"
    return math.prod(described[0])


@since_contract(3)
def test_gradients_are_refused_where_they_cannot_be_given(traced: Traced, graded: Graded) -> None:
    """``save_grads=`` with ``halt=`` is refused, and so is log_backward on a trace captured without
    ``save_grads=``; a loss function that raises leaves a differentiated trace's gradients as they were (on the
    small cases: the backend may replay the graph before it calls the loss)."""
    first = next(op for op in traced.trace.ops if op.kind == "op")
    with pytest.raises(UnsupportedError, match="halt"):
        tl.trace(
            traced.model,
            *traced.args,
            backend=traced.backend,
            save_grads=True,
            halt=tl.label(f"{first.layer_label}:{first.pass_num}"),
            **traced.kwargs,
        )
    with pytest.raises(UnsupportedError, match="save_grads"):
        traced.trace.log_backward(total(traced.backend))
    if graded.trace is None or not is_small(traced):  # a loss is taken after a replay: on the small cases only
        return
    before = [(op.grad_status, op.grad) for op in graded.trace.ops]
    with pytest.raises(_LossFailed):
        graded.trace.log_backward(_broken_loss)
    after = [(op.grad_status, op.grad) for op in graded.trace.ops]
    assert [s for s, _ in after] == [s for s, _ in before], "a failing loss changed the gradient statuses"
    assert all(a is b for (_, a), (_, b) in zip(after, before)), "a failing loss changed the gradients"


class _LossFailed(Exception):
    pass


def _broken_loss(out: Any) -> Any:
    raise _LossFailed("the loss function failed")
