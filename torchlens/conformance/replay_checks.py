"""Conformance checks of replay on new inputs (``trace.replay(*inputs)``), for every backend.

Rules of plugin contract 3 (see :func:`~torchlens.conformance.support.since_contract`).
The references are the model's own output on the new inputs and the inputs
as they were before the replay. Collected through
:mod:`torchlens.conformance.checks`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import torchlens as tl
from torchlens.conformance.support import (
    Traced,
    numpy_error,
    other_inputs,
    run,
    since_contract,
    small_only,
    to_numpy,
)
from torchlens_core.backend.arrays import is_array_of, max_error
from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ArgumentTypeError, GraphDoesNotHold
from torchlens_core.ir.records import Ref


def _as_backend(backend: str, array: Any, dtype: str, device: str) -> Any:
    made = backend_named(backend).from_numpy(array, dtype, device)
    return array if made is None else made  # None: the backend's arrays are NumPy's


@since_contract(3)
def test_replay_refuses_inputs_it_cannot_take(traced: Traced) -> None:
    """The first array the model took, given again with another shape, another dtype, or not as an array, and
    one positional argument too many: replay refuses each with an ArgumentTypeError saying what it got."""
    import numpy as np

    backend = traced.backend
    given = (traced.args, traced.kwargs)
    arrays = list(tree.leaves(given, is_array_of(backend)))
    if not arrays:
        pytest.skip("the model takes no array")
    path, x = arrays[0]
    described = backend_named(backend).array_info(x)
    assert described is not None, f"array_info does not describe an array it told apart: {type(x).__name__}"
    shape, dtype, device = described
    if not shape:
        pytest.skip("the first array the model takes has no axes to grow")
    data = to_numpy(backend, x)

    def replay_with(value: Any) -> Any:  # everywhere the model took that array (attention's query, key, value)
        args, kwargs = tree.replace_at(given, {p: value for p, leaf in arrays if leaf is x})
        return traced.trace.replay(*args, **kwargs)

    grown = [2 * shape[0], *shape[1:]]
    with pytest.raises(ArgumentTypeError, match=rf"shape {_listed(grown)}.* shape {_listed(shape)}"):
        replay_with(_as_backend(backend, np.concatenate([data, data]), dtype, device))
    with pytest.raises(ArgumentTypeError, match="not an array"):
        replay_with(None)
    other = "float64" if dtype != "float64" else "float32"
    try:
        retyped = _as_backend(backend, data.astype(other), other, device)
    except Exception:  # noqa: BLE001 - a backend without that dtype: the other refusals stand alone
        retyped = None
    info = backend_named(backend).array_info(retyped) if retyped is not None else None
    if info is not None and info[1] != dtype:
        with pytest.raises(ArgumentTypeError, match=info[1]):
            replay_with(retyped)
    with pytest.raises(ArgumentTypeError, match="positional"):
        traced.trace.replay(*traced.args, x, **traced.kwargs)


def _listed(shape: Any) -> str:
    return str(list(shape)).replace("[", r"\[").replace("]", r"\]")


def _negated(backend: str, values: list[Any]) -> list[Any]:
    """Every floating-point array of ``values`` negated: a branch on a sign takes the other way."""
    h = backend_named(backend)

    def flip(value: Any) -> Any:
        info = h.array_info(value)
        data = to_numpy(backend, value) if info is not None else None
        if info is None or data is None or data.dtype.kind != "f":
            return value
        return _as_backend(backend, -data, info[1], info[2])

    return [flip(v) for v in values]


def _outcome(fn: Any) -> tuple[Any, GraphDoesNotHold | None]:
    try:
        return fn(), None
    except GraphDoesNotHold as exc:
        return None, exc


class _Inputs:
    """New values for a trace's input nodes: as the model takes them (its recorded call, the parameters it was
    passed as they were), and as a loaded trace, which does not know the call, takes them (in input-node order)."""

    def __init__(self, traced: Traced, new: tuple[Any, Any]) -> None:
        call = traced.trace.call
        template = (call.args, call.kwargs)
        self.slots: dict[int, list[Any]] = {}  # input node -> where the model took it (once, or several times)
        for path, ref in tree.leaves(template, lambda v: isinstance(v, Ref)):
            self.slots.setdefault(ref.index, []).append(path)
        self.original = (traced.args, traced.kwargs)
        self.values = [tree.get(new, self.slots[i][0]) for i in sorted(self.slots)]

    def with_values(self, values: list[Any]) -> _Inputs:
        made = object.__new__(_Inputs)
        made.__dict__.update(self.__dict__, values=values)
        return made

    @property
    def call(self) -> tuple[Any, Any]:
        """(args, kwargs) for the model: the new input arrays where it took them, everything else as it was."""
        return tree.replace_at(
            self.original, {path: value for i, value in zip(sorted(self.slots), self.values) for path in self.slots[i]}
        )


@since_contract(3)
def test_a_loaded_trace_replays_new_inputs_as_the_model_runs_them(traced: Traced, tmp_path: pathlib.Path) -> None:
    """Saved and loaded, the trace replays other input arrays (given in input-node order) to the model's own
    output on them (or refuses, with GraphDoesNotHold, exactly when the trace before saving refuses them), and
    leaves them as they were; given one array too many, it refuses (ArgumentTypeError). A trace whose forward
    turned values into Python ones (a branch, a loop count) keeps those checks: on its floating-point inputs
    negated, the loaded and the saved trace refuse alike, or replay the model's output alike."""
    small_only(traced)
    loaded = tl.load(tl.save(traced.trace, tmp_path / "trace"))
    new = _Inputs(traced, other_inputs(traced))
    _compare(traced, loaded, new, "other inputs")
    with pytest.raises(ArgumentTypeError, match="one array per input node"):
        loaded.replay(*new.values, *new.values[:1])
    if any(op.meta.get("to_python") for op in traced.trace.ops):
        _compare(traced, loaded, new.with_values(_negated(traced.backend, new.values)), "negated inputs")


def _compare(traced: Traced, loaded: tl.Trace, new: _Inputs, what: str) -> None:
    """``loaded`` replays ``new`` as the model runs it, or refuses it exactly where the trace before saving does."""
    backend = traced.backend
    args, kwargs = new.call
    own = run(traced.case, lambda: traced.model(*args, **kwargs))
    _, refused_before = _outcome(lambda: run(traced.case, lambda: traced.trace.replay(*args, **kwargs)))
    before = [to_numpy(backend, v) for v in new.values if is_array_of(backend)(v)]
    replayed, refused = _outcome(lambda: run(traced.case, lambda: loaded.replay(*new.values)))
    assert (refused is None) == (refused_before is None), (
        f"on {what} the loaded trace {'refuses' if refused else 'replays'}, the saved one "
        f"{'refused' if refused_before else 'replayed'}: {refused or refused_before}"
    )
    if refused is None:
        error = max_error(backend, replayed, own)
        assert error <= traced.case.rtol, (
            f"the loaded trace replays {what} to an output off the model's own by {error:.3g}"
        )
    after = [to_numpy(backend, v) for v in new.values if is_array_of(backend)(v)]
    assert all(numpy_error(a, b) == 0.0 for a, b in zip(after, before)), (
        f"replaying the loaded trace changed the {what}"
    )
