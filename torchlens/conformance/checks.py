"""The conformance checks, run against every case of a backend's zoo.

Collected by :mod:`torchlens.conformance.plugin` (``pytest --torchlens-backend
NAME``) from the installed package, or imported by a checkout's own test module
(TorchLens's ``conformance/test_conformance.py``). Each check takes the
``torchlens_case`` parameter (backend name, Case) that the plugin gives it.
Every assertion carries its own message: the plugin imports this module
before collection, so pytest does not rewrite it (and writes nothing into
TorchLens's install).
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import torchlens as tl
from torchlens.conformance.plugin import suite_settings
from torchlens.conformance.rerun import rerun_module_outputs
from torchlens.conformance.support import Traced, needs, since_contract, small_only
from torchlens.conformance.support import other_inputs as _other_inputs
from torchlens.conformance.support import run as _run
from torchlens_core.backend.arrays import max_error
from torchlens_core.backend.cases import Case
from torchlens_core.backend.manager import backend_named
from torchlens_core.capture.edits import replay_refusal
from torchlens_core.ir import tree
from torchlens_core.ir.errors import GraphDoesNotHold
from torchlens_core.ir.records import Ref, refs_in
from torchlens_core.replay.evaluator import replay_values
from torchlens_core.store.saving import NOT_REPLAYABLE


@pytest.fixture(scope="module")
def traced(torchlens_case: tuple[str, Case]) -> Traced:
    backend, case = torchlens_case
    model, args, kwargs = case.build()
    own = _run(case, lambda: model(*args, **kwargs))
    trace = _run(case, lambda: tl.trace(model, *args, backend=backend, **kwargs))
    return Traced(backend, case, model, args, kwargs, trace, own)


@pytest.fixture(scope="module")
def graded(traced: Traced) -> Any:
    """The case captured with save_grads=True and differentiated, and the framework's input gradients."""
    from torchlens.conformance.grad_checks import grads_of

    return grads_of(traced)


def test_output_parity(traced: Traced) -> None:
    recorded = max_error(traced.backend, traced.trace.output, traced.own_output)
    assert recorded <= traced.case.rtol, f"trace output differs from the model's own by {recorded:.3g}"
    replayed = max_error(traced.backend, traced.trace.replay(), traced.own_output)
    assert replayed <= traced.case.rtol, f"replayed output differs from the model's own by {replayed:.3g}"


def test_audit_clean(traced: Traced, request: pytest.FixtureRequest) -> None:
    # The untraced rerun starts from the case's reset, as the capture did: a forward drawing random
    # numbers then draws the same ones, and its rerun is compared too.
    untraced = suite_settings(request.config).untraced
    report = _run(traced.case, lambda: traced.trace.audit(rtol=traced.case.rtol, untraced=untraced))
    assert report, str(report)
    if untraced:
        found = next(f for f in report.findings if f.check == "untraced parity")
        assert not found.detail.startswith("not compared: two"), f"the untraced reruns differ: {found.detail}"


def _views(t: tl.Trace) -> list[Any]:
    """What a loaded trace must give as the original did: op records, tables, summary, drawing, hash."""
    ops = [
        (
            o.label,
            o.kind,
            o.func_name,
            o.shape,
            o.dtype,
            o.device,
            o.parents,
            o.children,
            o.module_passes,
            o.module_outputs,
            o.params,
            o.source,
            o.in_place,
            o.saved,
            o.code_context,
            o.elapsed,
            o.flops,
            o.macs,
            repr(o.config),
            o.conditions,
            o.pass_num,
            o.num_passes,
        )
        for o in t.ops
    ]
    params = [(p.name, p.module, p.shape, p.dtype, p.numel, p.trainable, p.is_buffer) for p in t.params.values()]
    modules = [
        (m.path, m.type_name, m.num_params, [(mp.label, mp.ops, mp.output_shapes) for mp in m.passes])
        for m in t.modules.values()
    ]
    return [ops, params, modules, t.output_labels, t.summary(), t.to_dot(), tl.hash(t)]


def test_module_outputs(traced: Traced) -> None:
    if not traced.case.check_modules:
        pytest.skip("case has no modules to observe")
    seen = _run(
        traced.case,
        lambda: backend_named(traced.backend).observe_module_outputs(traced.model, traced.args, traced.kwargs),
    )
    recorded = {mp.label: mp for m in traced.trace.modules.values() for mp in m.passes}
    if seen is None:  # no observer: each module run alone on the inputs its pass recorded
        seen = _rerun_alone(traced)
    if not seen and not recorded:
        pytest.skip("the model calls no submodule: neither the framework's hooks nor the trace saw one")
    assert seen, "the framework's module hooks saw no module call"
    missing = sorted(set(seen) - set(recorded))
    assert not missing, f"module calls not recorded: {missing[:10]}"
    extra = sorted(set(recorded) - set(seen))
    assert not extra, f"module calls recorded that the framework did not see: {extra[:10]}"
    worst = max(
        (
            (max_error(traced.backend, mp.out, seen[label]), label)
            for label, mp in recorded.items()
            if seen[label] is not None
        ),
        default=(0.0, None),
    )
    assert worst[0] <= traced.case.rtol, f"module output {worst[1]} differs by {worst[0]:.3g}"


def _rerun_alone(traced: Traced) -> dict[str, Any]:
    """The fallback for a backend without module hooks (see :mod:`torchlens.conformance.rerun`)."""
    try:
        rerun = rerun_module_outputs(traced.backend, traced.model, traced.trace, traced.case.reset)
    except Exception as exc:
        raise AssertionError(f"a module run alone on its recorded inputs raised {type(exc).__name__}: {exc}") from exc
    if not rerun.outputs:
        reasons = sorted(set(rerun.not_run.values()))
        pytest.skip(
            f"the backend has no module observer hook and no module pass could be run alone ({reasons}): "
            f"implement torchlens_observe_module_outputs, or pass inputs= to TraceBuilder.enter_module"
        )
    return {label: rerun.outputs.get(label) for label in [*rerun.outputs, *rerun.not_run]}  # None: not compared


def test_round_trip(traced: Traced, tmp_path: pathlib.Path) -> None:
    # Runs after test_module_outputs on purpose: the model has run again since the capture (a
    # training-mode model bumps its BatchNorm counters in place), and the trace must still hold,
    # and save, the values that ran.
    trace, backend, rtol = traced.trace, traced.backend, traced.case.rtol
    loaded = tl.load(tl.save(trace, tmp_path / "trace"))
    assert _views(loaded) == _views(trace), "the loaded trace's records, tables, summary or drawing differ"
    for a, b in zip(trace.ops, loaded.ops):
        assert max_error(backend, b.out, a.out) == 0.0, f"the saved value of {a.label} changed on load"
    assert max_error(backend, loaded.model_output, trace.model_output) == 0.0, "the model output changed on load"
    missing = loaded.notes.get(NOT_REPLAYABLE, {})
    assert not missing, f"ops not replayable after loading: {missing}"
    replayed = max_error(backend, loaded.replay(), traced.own_output)
    assert replayed <= rtol, f"the loaded trace replays to an output off the model's own by {replayed:.3g}"
    report = loaded.audit(rtol=rtol)
    assert report, str(report)


# -- checks that catch lost edges: an array the backend failed to link to its op is a frozen constant, which
# replay on the recorded inputs cannot tell from a real edge ----------------------------------------------------
def test_replay_on_other_inputs(traced: Traced) -> None:
    args, kwargs = _other_inputs(traced)
    own = _run(traced.case, lambda: traced.model(*args, **kwargs))
    try:
        values = _run(traced.case, lambda: replay_values(traced.trace, new_inputs=(args, kwargs)))
    except GraphDoesNotHold as exc:  # the forward's graph depends on the values, and replay says so, as it must
        pytest.skip(f"the recorded graph does not hold for other inputs: {str(exc).splitlines()[0][:200]}")
    replayed = tree.map_leaves(lambda r: values[r.index] if isinstance(r, Ref) else r, traced.trace.output_template)
    error = max_error(traced.backend, replayed, own)
    assert error <= traced.case.rtol, f"replayed on other inputs, the output is off the model's own by {error:.3g}"
    moved = [
        op
        for op in traced.trace.ops
        if op.kind == "op" and op.saved and max_error(traced.backend, values[op.index], op.out) > 0
    ]
    assert moved, "no op's value changed with the inputs: the check cannot tell an edge from a constant here"


def _identity(value: Any, site: Any) -> Any:
    return value


def _edited_route_output(traced: Traced, site: Any) -> Any:
    """The output of a capture with one identity edit, at ``site`` (an op, or a module call, as the edits it
    stands for), so that it takes the route those edited captures take. A backend may compute an edited forward
    another way than a plain one (JAX: op by op, where a repeat capture of the same program runs it compiled,
    rounding some values in the last bit otherwise; tinygrad: each op realized as it returns where ops are
    edited), so an edit that changes nothing is held to that route's own output, bit for bit, and the route to
    the plain capture's within the case's tolerance."""
    baseline = _run(
        traced.case,
        lambda: tl.trace(
            traced.model, *traced.args, backend=traced.backend, intervene=tl.when(site, _identity), **traced.kwargs
        ),
    )
    route = max_error(traced.backend, baseline.output, traced.trace.output)
    assert route <= traced.case.rtol, f"a capture with an identity edit is off the plain capture by {route:.3g}"
    return baseline.output


def test_a_capture_leaves_no_reference_cycles(traced: Traced) -> None:
    """A capture and its dropped trace free everything by reference counting: no object of TorchLens (or of the
    backend's package) is left in a cycle for the cyclic GC, which would keep the capture's bookkeeping, and any
    value it holds, alive until a collection runs, and make that collection pay for it."""
    import gc

    packages = {"torchlens", *_backend_packages(traced.backend)}
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the next collection finds unreachable stays in gc.garbage
    try:
        trace = _run(traced.case, lambda: tl.trace(traced.model, *traced.args, backend=traced.backend, **traced.kwargs))
        del trace
        gc.collect()
        ours = sorted({_owner_name(o) for o in gc.garbage if _package_of(o) in packages} - {""})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not ours, f"a capture left reference cycles through {', '.join(ours[:8])} for the cyclic GC"


def _backend_packages(backend: str) -> set[str]:
    """The top-level packages of the plugin objects registered for ``backend``."""
    from torchlens_core.backend.manager import plugin_manager

    return {
        type(plugin).__module__.split(".")[0]
        for name, plugin in plugin_manager().list_name_plugin()
        if name == backend or getattr(plugin, "name", None) == backend
    }


def _package_of(obj: Any) -> str:
    module = getattr(obj, "__module__", None) if callable(obj) and not isinstance(obj, type) else None
    module = module if isinstance(module, str) else type(obj).__module__
    return module.split(".")[0]


def _owner_name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def test_identity_edits_leave_the_output_unchanged(traced: Traced) -> None:
    """An identity edit at every op: the edit machinery of every op runs, and changes nothing."""
    needs(traced, "intervene")
    everything = tl.when(tl.where(lambda op: True), _identity)
    edited = _run(
        traced.case,
        lambda: tl.trace(traced.model, *traced.args, backend=traced.backend, intervene=everything, **traced.kwargs),
    )
    assert len(edited.interventions) >= edited.num_ops, "some ops were not edited"
    first = next(op.label for op in traced.trace.ops if op.kind == "op")
    change = max_error(traced.backend, edited.output, _edited_route_output(traced, tl.label(first)))
    assert change == 0.0, f"identity edits changed the traced output by {change:.3g}"
    report = _run(traced.case, lambda: edited.audit(rtol=traced.case.rtol))
    assert report, str(report)


def _copied(value: Any, site: Any) -> Any:
    return site.ops.copy(value)


def test_copies_at_every_module_site_leave_the_output_unchanged(traced: Traced) -> None:
    """Every module call's output replaced by a copy of itself, as a forward hook returning copies would: the
    caller gets new arrays, later ops read them as the module's output, and nothing changes."""
    needs(traced, "intervene")
    paths = [
        path
        for path, module in traced.trace.modules.items()
        if any(mp.out_template is not None and refs_in(mp.out_template) for mp in module.passes)
    ]
    if not paths:
        pytest.skip("no module call returned an array")
    edited = _run(
        traced.case,
        lambda: tl.trace(
            traced.model,
            *traced.args,
            backend=traced.backend,
            intervene=[tl.when(tl.module(p), _copied) for p in paths],
            **traced.kwargs,
        ),
    )
    assert edited.interventions, "no module output was edited"
    change = max_error(traced.backend, edited.output, _edited_route_output(traced, tl.module(paths[0])))
    assert change == 0.0, f"copies of module outputs changed the traced output by {change:.3g}"
    report = _run(traced.case, lambda: edited.audit(rtol=traced.case.rtol))
    assert report, str(report)


def test_zero_ablation_live_equals_fork_replay(traced: Traced) -> None:
    """Zeros at a mid-graph op: captured live, and replayed on a fork of the clean trace, give one output."""
    needs(traced, "intervene")
    ops = [
        op
        for op in traced.trace.ops
        if op.kind == "op"
        and op.children
        and op.dtype
        and replay_refusal(op, op.label) is None  # a pass-through a fork refuses to replay edits at
        and any(k in op.dtype for k in ("float", "bfloat", "half", "double"))
    ]
    if not ops:
        pytest.skip("no floating-point op with children to ablate")
    site = ops[len(ops) // 2]
    where = tl.label(f"{site.layer_label}:{site.pass_num}")
    live = _run(
        traced.case,
        lambda: tl.trace(
            traced.model,
            *traced.args,
            backend=traced.backend,
            intervene=tl.when(where, tl.zero_ablate()),
            **traced.kwargs,
        ),
    )
    assert live[f"{site.layer_label}:{site.pass_num}"].edited
    fork = traced.trace.fork().when(where, tl.zero_ablate())
    if [op.func_name for op in live.ops] != [op.func_name for op in traced.trace.ops]:
        # The zeros changed a value the forward branched or counted on: the recorded graph does not hold,
        # and replaying the fork must say so rather than give the old graph's answer.
        with pytest.raises(tl.GraphDoesNotHold):
            _run(traced.case, fork.replay)
        return
    replayed = _run(traced.case, fork.replay)
    error = max_error(traced.backend, replayed, live.output)
    assert error <= traced.case.rtol, f"zeros at {site.label}: live and fork().replay() differ by {error:.3g}"


# -- gradients: checked against the framework's own, for backends with the "gradients" capability ----------------
def test_gradients_match_the_framework(traced: Traced, graded: Any) -> None:
    reference = graded.reference()
    t = graded.trace
    template = (t.call.args, t.call.kwargs)
    tolerance = max(traced.case.rtol, 1e-4)
    for path, expected in reference.items():
        ref = tree.get(template, path)
        assert isinstance(ref, Ref), f"argument {path} is not an input node of the trace"
        got = t.ops[ref.index].grad
        assert got is not None, f"no gradient at {t.ops[ref.index].label} ({t.ops[ref.index].grad_status})"
        error = max_error(traced.backend, got, expected)
        assert error <= tolerance, f"the gradient at {t.ops[ref.index].label} is off the framework's by {error:.3g}"


# -- lost edges: arrays the backend did not link to the op that made them (torchlens_core/replay/lost_edges.py) ---
def test_no_lost_edges(traced: Traced) -> None:
    """No array constant equals an earlier op's output, nor changes when the model runs on other inputs.

    Traced again on the other inputs of replay_on_other_inputs, every op
    must read the constants it read before: one that moved is computed from
    the inputs, so an op's output the backend did not link (or a call it did
    not see). audit_clean runs the first half too; this check names both.
    """
    from torchlens_core.replay.lost_edges import constants_equal_to_outputs, constants_that_moved

    found = list(constants_equal_to_outputs(traced.trace))
    args, kwargs = _other_inputs(traced)
    other = _run(traced.case, lambda: tl.trace(traced.model, *args, backend=traced.backend, **kwargs))
    moved = list(constants_that_moved(traced.trace, other))
    if moved:  # traced once more on the first inputs: a constant no run gives back alike is not an edge
        again = _run(traced.case, lambda: tl.trace(traced.model, *traced.args, backend=traced.backend, **traced.kwargs))
        moved = list(constants_that_moved(traced.trace, other, again))
    found += moved
    assert not found, "lost edges:\n" + "\n".join(f"  {f.op}: {f.detail}" for f in found[:10])


# -- a rule of plugin contract 4 ------------------------------------------------------------------------------------
@since_contract(4)
def test_ops_named_when_the_capture_finishes_are_named_as_when_added(traced: Traced) -> None:
    """Under contract 4 an op gets its label when the capture finishes, not at ``add_op``: a capture that reads a
    label while it records would read none. The case captured so has the labels, graph and output of the same
    capture naming each op as it is added (whatever contract the backend declares; on small cases)."""
    from torchlens_core.capture.builder import forced_naming

    small_only(traced)

    def captured(as_added: bool) -> tl.Trace:
        with forced_naming(as_added):
            return _run(
                traced.case, lambda: tl.trace(traced.model, *traced.args, backend=traced.backend, **traced.kwargs)
            )

    at_end, as_added = captured(False), captured(True)

    def fields(trace: tl.Trace) -> list[tuple[Any, ...]]:
        return [
            (op.kind, op.func_name, op.label, op.layer_label, op.pass_num, op.num_passes, op.parents, op.children)
            for op in trace.ops
        ]

    named_at_end, named_as_added = fields(at_end), fields(as_added)
    differ = [(a, b) for a, b in zip(named_at_end, named_as_added) if a != b]
    assert len(named_at_end) == len(named_as_added) and not differ, (
        f"named when the capture finishes, {len(named_at_end)} ops; as they are added, {len(named_as_added)}; "
        f"first difference: {differ[:1]}"
    )
    moved = max_error(traced.backend, at_end.output, as_added.output)
    assert moved <= traced.case.rtol, f"the two captures' outputs differ by {moved:.3g}"


# -- the checks of behaviours every backend with a capability must have, rules of plugin contract 3 ---------------
# (collected here: pytest takes the checks of this module's namespace, wherever they are written). Imported last, so
# that they run after the checks above.
from torchlens.conformance.edit_checks import (  # noqa: E402, F401
    test_a_module_call_edit_is_what_its_caller_gets,
    test_array_ops_agree_with_numpy,
    test_every_helper_edits_an_op_as_numpy_computes_it,
    test_refused_and_failing_edits_leave_the_model_as_it_was,
    test_splice_module_runs_the_replacement_instead,
)
from torchlens.conformance.flop_checks import test_flops_are_known  # noqa: E402, F401
from torchlens.conformance.grad_checks import (  # noqa: E402, F401
    test_a_loaded_trace_gives_the_same_gradients,
    test_gradients_are_refused_where_they_cannot_be_given,
    test_gradients_of_a_selected_op_and_through_an_edit,
)
from torchlens.conformance.replay_checks import (  # noqa: E402, F401
    test_a_loaded_trace_replays_new_inputs_as_the_model_runs_them,
    test_replay_refuses_inputs_it_cannot_take,
)
