"""The shared conformance checks, run against every backend's zoo."""

from __future__ import annotations

import pathlib
from typing import Any

import attrs
import pytest

import torchlens as tl
from torchlens_core.backend.arrays import max_error
from torchlens_core.backend.cases import Case
from torchlens_core.backend.manager import hook
from torchlens_core.store.saving import NOT_REPLAYABLE


@attrs.frozen
class Traced:
    backend: str
    case: Case
    model: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    trace: tl.Trace
    own_output: Any


def _run(case: Case, fn: Any) -> Any:
    if case.reset is not None:
        case.reset()
    return fn()


@pytest.fixture(scope="module")
def traced(case_id: tuple[str, Case]) -> Traced:
    backend, case = case_id
    model, args, kwargs = case.build()
    own = _run(case, lambda: model(*args, **kwargs))
    trace = _run(case, lambda: tl.trace(model, *args, backend=backend, **kwargs))
    return Traced(backend, case, model, args, kwargs, trace, own)


def test_output_parity(traced: Traced) -> None:
    recorded = max_error(traced.backend, traced.trace.output, traced.own_output)
    assert recorded <= traced.case.rtol, f"trace output differs from the model's own by {recorded:.3g}"
    replayed = max_error(traced.backend, traced.trace.replay(), traced.own_output)
    assert replayed <= traced.case.rtol, f"replayed output differs from the model's own by {replayed:.3g}"


def test_audit_clean(traced: Traced, request: pytest.FixtureRequest) -> None:
    # The untraced rerun starts from the case's reset, as the capture did: a forward drawing random
    # numbers then draws the same ones, and its rerun is compared too.
    untraced = not request.config.getoption("--no-untraced")
    report = _run(traced.case, lambda: traced.trace.audit(rtol=traced.case.rtol, untraced=untraced))
    assert report, str(report)
    if untraced:
        found = next(f for f in report.findings if f.check == "untraced parity")
        assert not found.detail.startswith("not compared: two"), f"the untraced reruns differ: {found.detail}"


def _views(t: tl.Trace) -> list[Any]:
    """What a loaded trace must give as the original did: op records, tables, summary, drawing, hash."""
    ops = [(o.label, o.kind, o.func_name, o.shape, o.dtype, o.device, o.parents, o.children, o.module_passes,
            o.module_outputs, o.params, o.source, o.in_place, o.saved, o.code_context, o.elapsed, o.flops,
            o.macs, repr(o.config), o.conditions, o.pass_num, o.num_passes) for o in t.ops]
    params = [(p.name, p.module, p.shape, p.dtype, p.numel, p.trainable, p.is_buffer) for p in t.params.values()]
    modules = [(m.path, m.type_name, m.num_params, [(mp.label, mp.ops, mp.output_shapes) for mp in m.passes])
               for m in t.modules.values()]
    return [ops, params, modules, t.output_labels, t.summary(), t.to_dot(), tl.hash(t)]


def test_module_outputs(traced: Traced) -> None:
    if not traced.case.check_modules:
        pytest.skip("case has no modules to observe")
    seen = _run(traced.case, lambda: hook().torchlens_observe_module_outputs(
        backend=traced.backend, target=traced.model, args=traced.args, kwargs=traced.kwargs))
    assert seen, "the framework's module hooks saw no module call"
    recorded = {mp.label: mp for m in traced.trace.modules.values() for mp in m.passes}
    missing = sorted(set(seen) - set(recorded))
    assert not missing, f"module calls not recorded: {missing[:10]}"
    extra = sorted(set(recorded) - set(seen))
    assert not extra, f"module calls recorded that the framework did not see: {extra[:10]}"
    worst = max(((max_error(traced.backend, mp.out, seen[label]), label) for label, mp in recorded.items()
                 if seen[label] is not None), default=(0.0, None))
    assert worst[0] <= traced.case.rtol, f"module output {worst[1]} differs by {worst[0]:.3g}"


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
