"""trace.audit(untraced=True) runs the model once more without TorchLens and compares, on every backend."""

from __future__ import annotations

import gc
import random
import weakref
from typing import Any

import pytest
from backend_arrays import BACKENDS, array, numpy_of

import torchlens as tl
from torchlens_core.ir.records import Ref


def untraced_finding(report: tl.AuditReport) -> Any:
    return next(f for f in report.findings if f.check == "untraced parity")


class Scaled:
    """A callable model whose scale can change after the capture, as a tracer-sensitive kernel would."""

    def __init__(self) -> None:
        self.scale = 2.0

    def __call__(self, a: Any, *, shift: Any, bias: Any, flag: bool = True) -> Any:
        return a * self.scale + shift * 3.0 - bias if flag else a


def inputs(backend: str) -> tuple[Any, dict[str, Any]]:
    a = array(backend, [[1.0, 2.0], [3.0, 4.0]])
    # Keyword arrays of one shape given out of alphabetical order: each must come back as itself.
    return a, {"shift": array(backend, [[0.5, 0.25], [1.0, 2.0]]), "bias": array(backend, [[7.0, 8.0], [9.0, 1.0]])}


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unchanged_model_matches_its_trace(backend: str) -> None:
    model = Scaled()
    a, kwargs = inputs(backend)
    trace = tl.trace(model, a, backend=backend, flag=True, **kwargs)
    report = trace.audit(untraced=True)
    assert report, str(report)
    expected = numpy_of(a) * 2.0 + numpy_of(kwargs["shift"]) * 3.0 - numpy_of(kwargs["bias"])
    assert (numpy_of(trace.output) == expected).all()  # the trace itself is right, by a closed form
    assert untraced_finding(report).ok


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_that_computes_otherwise_untraced_fails_the_audit(backend: str) -> None:
    model = Scaled()
    a, kwargs = inputs(backend)
    trace = tl.trace(model, a, backend=backend, **kwargs)
    assert trace.audit(), "without the untraced check, the trace agrees with itself"
    model.scale = 2.5  # untraced, the model now computes something else: the check must say so
    report = trace.audit(untraced=True)
    finding = untraced_finding(report)
    assert not report and not finding.ok and finding.op == trace.output_labels[0]
    assert "tracing changed what the model computes" in finding.detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nondeterministic_model_is_not_compared_and_says_so(backend: str) -> None:
    def noisy(a: Any) -> Any:
        return a * random.random()

    a, _ = inputs(backend)
    # (Only this finding: JAX records a Python-level draw as a constant of its jaxpr, which its output
    # parity check already flags.)
    finding = untraced_finding(tl.trace(noisy, a, backend=backend).audit(untraced=True))
    assert finding.ok and finding.detail.startswith("not compared: two untraced runs differ")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_trace_keeps_no_model_alive_and_says_when_it_is_gone(backend: str) -> None:
    model = Scaled()
    a, kwargs = inputs(backend)
    trace = tl.trace(model, a, backend=backend, **kwargs)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    with pytest.raises(tl.UnsupportedError, match="no longer exists"):
        trace.audit(untraced=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_halted_loaded_and_recorded_traces(backend: str, tmp_path: Any) -> None:
    model = Scaled()
    a, kwargs = inputs(backend)
    declared = next(b["capabilities"] for b in tl.backends() if b["name"] == backend)
    if "halt" in declared:
        first = next(op for op in tl.trace(model, a, backend=backend, **kwargs).ops if op.kind == "op")
        halted = tl.trace(model, a, backend=backend, halt=tl.func(first.func_name), **kwargs)
        finding = untraced_finding(halted.audit(untraced=True))
        assert finding.ok and "halt=" in finding.detail
    trace = tl.trace(model, a, backend=backend, **kwargs)
    loaded = tl.load(tl.save(trace, tmp_path / "trace"))
    with pytest.raises(tl.UnsupportedError, match="does not know it"):
        loaded.audit(untraced=True)
    if "save" in declared:
        recording = tl.record(model, a, backend=backend, **kwargs)
        with pytest.raises(tl.UnsupportedError, match="tl.record"):
            recording.to_trace().audit(untraced=True)


def test_the_rerun_uses_the_recorded_inputs_and_cannot_change_them() -> None:
    torch = pytest.importorskip("torch")

    class WritesItsInput(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            x.mul_(2.0)
            return x + 1.0

    model, x = WritesItsInput(), torch.tensor([1.0, 2.0])
    trace = tl.trace(model, x)
    x.fill_(100.0)  # the caller reuses its buffer: the rerun must still see what the capture saw
    recorded_input = trace[0].out.clone()
    report = trace.audit(rtol=0.0, untraced=True)
    assert report and "bit-identical" in untraced_finding(report).detail
    assert torch.equal(trace[0].out, recorded_input) and torch.equal(recorded_input, torch.tensor([1.0, 2.0]))


def test_random_draws_are_compared_when_the_generator_is_reset() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Dropout(0.5).train()
    x = torch.ones(64)
    torch.manual_seed(0)
    trace = tl.trace(model, x)
    torch.manual_seed(0)  # the state the capture started from: the rerun draws the same mask
    report = trace.audit(rtol=0.0, untraced=True)
    assert report and "bit-identical" in untraced_finding(report).detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_arguments_nested_shared_and_plain_are_remembered_as_given(backend: str) -> None:
    """Arrays inside lists, dicts and dataclasses become Refs to their input nodes (one array passed twice: one
    Ref), everything else is kept as given, and the rerun rebuilds the very structure the model was called with."""
    import dataclasses

    @dataclasses.dataclass
    class Config:
        weight: Any
        power: int

    seen: list[Any] = []

    def model(a: Any, pair: list[Any], *, config: Config, extra: dict[str, Any]) -> Any:
        seen.append((type(pair), type(config), sorted(extra)))
        return (a + pair[1]) * config.weight + extra["same"] * config.power

    a, b, c = (
        array(backend, [[1.0, 2.0], [3.0, 4.0]]),
        array(backend, [[0.5, 0.25], [1.0, 2.0]]),
        array(backend, [[2.0, 1.0], [0.0, 3.0]]),
    )
    trace = tl.trace(model, a, [a, b], backend=backend, config=Config(c, 2), extra={"same": a, "label": "x"})
    call = trace.call
    inputs = {op.index for op in trace.ops if op.kind == "input"}
    ref_a, (ref_a2, ref_b) = call.args[0], call.args[1]
    assert isinstance(call.args[1], list) and ref_a2 is ref_a and ref_b != ref_a
    assert {ref_a.index, ref_b.index} <= inputs
    weight = call.kwargs["config"].weight  # an input node, or (JAX: a dataclass is no pytree) a constant, kept
    assert weight is c if not isinstance(weight, Ref) else weight.index in inputs
    assert call.kwargs["config"].power == 2 and call.kwargs["extra"]["label"] == "x"
    assert call.kwargs["extra"]["same"] is ref_a
    assert trace.audit(untraced=True)
    assert seen[-1] == seen[0] == (list, Config, ["label", "same"])  # the rerun called it the same way


def test_an_array_the_backend_read_as_a_constant_does_not_take_an_inputs_node() -> None:
    """JAX: an array in a dataclass that is no pytree is a constant of the jaxpr, a NumPy input is converted into
    its input node. The constant, met first, has the input's shape; it must not take the input's node."""
    import dataclasses

    import numpy as np

    pytest.importorskip("jax")

    @dataclasses.dataclass
    class Config:
        weight: Any

    def model(config: Config, x: Any) -> Any:
        return x * config.weight + 1.0

    c = np.array([[2.0, 1.0], [0.0, 3.0]], np.float32)
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    trace = tl.trace(model, Config(c), x, backend="jax")
    config, ref = trace.call.args
    assert config.weight is c and isinstance(ref, Ref) and trace.ops[ref.index].kind == "input"
    report = trace.audit(untraced=True)
    assert report and "bit-identical" in untraced_finding(report).detail


def test_an_argument_of_a_shape_no_other_has_is_matched_without_reading_values(monkeypatch: Any) -> None:
    """torch copies its inputs into their nodes (the user may write into them later), so no node holds the
    argument itself; where one free node alone has the argument's shape, that node is the match, with no value
    read through NumPy (a copy of each input at every capture). Several of one shape are still told apart by
    value (test_arguments_nested_shared_and_plain_are_remembered_as_given)."""
    torch = pytest.importorskip("torch")
    from torchlens_core.capture import rerun

    read: list[Any] = []
    fits = rerun._fits
    monkeypatch.setattr(rerun, "_fits", lambda *a: read.append(a[3]) or fits(*a))

    def product(a: Any, b: Any) -> Any:
        return (a * b).sum(0)

    x, y = torch.randn(2, 3), torch.randn(3)
    trace = tl.trace(product, x, y)
    (ref_x, ref_y), inputs = trace.call.args, [op for op in trace.ops if op.kind == "input"]
    assert [op.out is x for op in inputs] == [False, False]  # copies: matched by shape alone
    assert True not in read and (ref_x.index, ref_y.index) == (inputs[0].index, inputs[1].index)
    assert trace.audit(untraced=True)

    same = tl.trace(lambda a, b: a - b, x, x.clone())  # one shape twice: told apart by value
    assert True in read and [r.index for r in same.call.args] == [op.index for op in same.ops if op.kind == "input"]
