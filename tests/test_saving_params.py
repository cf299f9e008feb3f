"""tl.save stores only the parameter values the saved ops read; ``params=False`` stores none.

Per backend installed (the fuzz suite's seed models), plus a torch model whose
big unused layer shows the size saved by a halted trace.
"""

from __future__ import annotations

import pathlib

import pytest
from fuzz_saving import SEEDS
from saving_checks import same_values, views

import torchlens as tl
from torchlens_core.backend.manager import backend_infos, backend_named
from torchlens_core.ir.records import ParamRef
from torchlens_core.ir.tree import leaves

BACKENDS = [i.name for i in backend_infos() if i.available and i.name in SEEDS]
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no backend with a zoo is installed")


def _trace(backend: str, **options: object) -> tl.Trace:
    """The first seed model of the backend that has parameters (the last one if none has)."""
    cases = {c.name: c for c in backend_named(backend).conformance_cases()}
    for name in SEEDS[backend]:
        model, args, kwargs = cases[name].build()
        trace = tl.trace(model, *args, backend=backend, **kwargs, **options)
        if trace.params:
            break
    return trace


def _read(trace: tl.Trace) -> set[str]:
    """The parameters the trace's ops read."""
    refs = (r for op in trace.ops for _, r in leaves((op.args, op.kwargs), lambda x: isinstance(x, ParamRef)))
    return {n for op in trace.ops for n in op.params} | {r.name for r in refs}


def _size(path: pathlib.Path) -> int:
    return (path / "arrays.bin").stat().st_size


@pytest.mark.parametrize("backend", BACKENDS)
def test_params_false_keeps_every_view_and_names_the_missing_parameters_on_replay(backend, tmp_path) -> None:
    trace = _trace(backend)
    read = _read(trace)
    if not read:
        pytest.skip("this model reads no parameters")
    full = tl.save(trace, tmp_path / "full")
    bare = tl.save(trace, tmp_path / "bare", params=False)
    loaded = tl.load(bare)
    assert views(loaded) == views(trace)
    assert all(p.value is None for p in loaded.params.values())
    assert [p.shape for p in loaded.params.values()] == [tuple(p.shape) for p in trace.params.values()]
    assert _size(bare) < _size(full)
    with pytest.raises(tl.UnsupportedError, match="params=False") as info:
        loaded.replay()
    assert any(name in str(info.value) for name in read)
    with pytest.raises(tl.UnsupportedError):
        loaded.audit()
    # The full folder still replays to the model's output.
    assert same_values(backend, tl.load(full).replay(), trace.replay())


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_the_parameters_the_saved_ops_read_are_stored(backend, tmp_path) -> None:
    trace = _trace(backend)
    first = next((op for op in trace.ops if op.params), None)
    if first is None:
        pytest.skip("this model reads no parameters")
    halted = _trace(backend, halt=tl.func(first.func_name))
    assert halted.halted
    read = _read(halted)
    loaded = tl.load(tl.save(halted, tmp_path / "halted"))
    for name, p in loaded.params.items():
        assert (p.value is not None) == (name in read), name
        if name in read:
            assert same_values(backend, p.value, halted.params[name].value)
    assert views(loaded) == views(halted)
    assert "not_replayable" not in loaded.notes
    assert same_values(backend, loaded.replay(), halted.replay())


def test_a_halted_torch_trace_does_not_store_the_weights_it_never_reached(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 100_000))
    halted = tl.trace(model, torch.randn(1, 16), halt=tl.func("relu"))
    full = tl.trace(model, torch.randn(1, 16))
    big = 100_000 * 16 * 4  # the last layer's weight
    assert _size(tl.save(full, tmp_path / "full")) > big
    assert _size(tl.save(halted, tmp_path / "halted")) < 4096  # the first layer, the input and two values
    loaded = tl.load(tmp_path / "halted")
    assert loaded.params["2.weight"].value is None and torch.equal(loaded.params["0.weight"].value, model[0].weight)
    assert loaded.summary() == halted.summary()
