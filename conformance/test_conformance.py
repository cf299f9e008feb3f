"""The shared conformance checks, run against every backend's zoo."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import torchlens as tl
from torchlens_core.arrays import max_error
from torchlens_core.conformance import Case
from torchlens_core.plugins import hook


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


def test_audit_clean(traced: Traced) -> None:
    report = traced.trace.audit(rtol=traced.case.rtol)
    assert report, str(report)


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
