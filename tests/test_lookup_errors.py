"""Bad keys, bad selectors, lazy outputs and selectors that match nothing: typed, readable errors, on every backend."""

from __future__ import annotations

import re
from typing import Any

import pytest
from backend_arrays import BACKENDS, array

import torchlens as tl
from torchlens_core.ir.errors import ArgumentTypeError, PatternError, shown

HUGE = "k" * 10_000_000  # a 10 MB key: no message may repeat it


def double_plus_one(a: Any) -> Any:
    return a * 2.0 + 1.0


@pytest.fixture(scope="module", params=BACKENDS)
def small(request: pytest.FixtureRequest) -> tuple[str, tl.Trace]:
    backend = request.param
    return backend, tl.trace(double_plus_one, array(backend, [[1.0, 2.0], [3.0, 4.0]]), backend=backend)


# -- trace[key] ----------------------------------------------------------------------------
def test_a_bool_is_not_a_position(small: tuple[str, tl.Trace]) -> None:
    _, trace = small
    for key in (True, False):
        with pytest.raises(ArgumentTypeError, match="a bool is not an op position") as caught:
            trace[key]
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, tl.TorchLensError)


def test_integer_scalars_of_any_kind_are_positions(small: tuple[str, tl.Trace]) -> None:
    np = pytest.importorskip("numpy")
    _, trace = small
    assert trace[np.int64(1)] is trace[1] and trace[np.int32(-1)] is trace[-1]
    with pytest.raises(ArgumentTypeError, match="a bool is not an op position"):
        trace[np.True_]
    with pytest.raises(ArgumentTypeError, match="not float"):
        trace[1.0]
    with pytest.raises(ArgumentTypeError, match="not slice"):
        trace[0:2]
    with pytest.raises(tl.LabelNotFoundError, match=f"this trace has {len(trace)} ops"):
        trace[np.int64(len(trace))]


def test_bool_tensors_are_refused_too() -> None:
    torch = pytest.importorskip("torch")
    trace = tl.trace(double_plus_one, torch.ones(2))
    with pytest.raises(ArgumentTypeError, match="a bool is not an op position"):
        trace[torch.tensor(True)]
    assert trace[torch.tensor(1)] is trace[1]


def test_a_huge_missing_key_is_cut_in_the_message(small: tuple[str, tl.Trace]) -> None:
    _, trace = small
    with pytest.raises(tl.LabelNotFoundError) as caught:
        trace[HUGE]
    message = str(caught.value)
    assert len(message) < 300 and "10,000,000 characters" in message
    first = next(op for op in trace.ops if op.kind == "op").label  # mul_1_1 (multiply_1_1 in NumPy)
    with pytest.raises(tl.LabelNotFoundError, match=f"did you mean '{first}'"):
        trace[first[:-1] + "9"]  # near misses are still suggested


def test_shown_keeps_short_keys_whole() -> None:
    assert shown("relu_1_2") == "'relu_1_2'"
    assert shown(HUGE).endswith("... (10,000,000 characters)") and len(shown(HUGE)) < 100
    assert len(shown(list(range(10**6)))) < 120


# -- selectors -----------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", ["(", "relu[", "*conv", "a{2,1}"])
def test_a_bad_regex_is_a_typed_value_error_naming_it(pattern: str) -> None:
    with pytest.raises(PatternError) as caught:
        tl.func(pattern)
    error = caught.value
    assert isinstance(error, ValueError) and isinstance(error, tl.TorchLensError)
    assert f"tl.func({pattern!r})" in str(error) and "not a valid regular expression" in str(error)
    with pytest.raises(re.error):  # the same pattern is bad for re itself: the message carries re's reason
        re.compile(pattern)


def test_selector_arguments_of_the_wrong_type_are_typed_errors() -> None:
    for make in (
        lambda: tl.func(3),
        lambda: tl.module(None),
        lambda: tl.in_module(2.0),
        lambda: tl.label("relu_1", 7),
        lambda: tl.func("relu") & "conv2d",
        lambda: tl.where(3),
    ):
        with pytest.raises(ArgumentTypeError):
            make()


def test_save_takes_only_selectors() -> None:
    with pytest.raises(ArgumentTypeError, match="save= takes a selector"):
        tl.trace(double_plus_one, [1.0], backend=BACKENDS[0], save="relu")


def test_a_huge_pattern_is_cut_in_find_and_pluck(small: tuple[str, tl.Trace]) -> None:
    backend, trace = small
    with pytest.raises(tl.LabelNotFoundError) as caught:
        trace.find(tl.func(HUGE))
    assert len(str(caught.value)) < 400
    if "save" in next(b["capabilities"] for b in tl.backends() if b["name"] == backend):
        with pytest.raises(tl.LabelNotFoundError) as caught:
            tl.pluck(double_plus_one, array(backend, [[1.0]]), HUGE, backend=backend)
        assert len(str(caught.value)) < 600 and "10,000,000 characters" in str(caught.value)


# -- save= and halt= that match nothing ------------------------------------------------------
def _save_and_halt(backend: str) -> bool:
    declared = next(b["capabilities"] for b in tl.backends() if b["name"] == backend)
    return "save" in declared and "halt" in declared


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_and_halt_that_match_nothing_both_raise_naming_it(backend: str) -> None:
    if not _save_and_halt(backend):
        pytest.skip(f"{backend} does not declare save/halt")
    x = array(backend, [[1.0, 2.0]])
    first = next(op for op in tl.trace(double_plus_one, x, backend=backend).ops if op.kind == "op")
    typo = tl.func(first.func_name + "x")  # mulx: a typo of mul
    for role, options in (
        ("save=", {"save": typo}),
        ("halt=", {"halt": typo}),
        ("halt=", {"halt": tl.label(first.label, "mul_9_9")}),
    ):
        with pytest.raises(tl.LabelNotFoundError) as caught:
            tl.trace(double_plus_one, x, backend=backend, **options)
        message = str(caught.value)
        assert message.startswith(role) and "matched no op" in message
        assert "the forward has run to the end" in message and first.label in message  # the closest label
    with pytest.raises(tl.LabelNotFoundError, match=r"^save= tl.func\('\w+x'\); halt= tl.module"):
        tl.trace(double_plus_one, x, backend=backend, save=typo, halt=tl.module("head"))
    # What does match still works, and a halt the forward reaches stops it as before.
    picked = tl.func(first.func_name)
    halted = tl.trace(double_plus_one, x, backend=backend, halt=picked, save=picked)
    assert halted.halted and [op.label for op in halted.ops if op.saved and op.kind == "op"] == [first.label]
    assert tl.trace(double_plus_one, x, backend=backend).audit()  # and nothing was left installed


def test_halt_refuses_selectors_that_can_never_stop_the_forward() -> None:
    for selector in (
        tl.where(lambda op: True),
        tl.func("relu") & tl.followed_by(tl.func("add")),
        tl.preceded_by(tl.where(lambda op: True)),
    ):
        with pytest.raises(tl.UnsupportedError, match="halt= cannot use tl.where or tl.followed_by"):
            tl.trace(double_plus_one, [1.0], backend=BACKENDS[0], halt=selector)


# -- models that return generators -----------------------------------------------------------
def a_generator(a: Any) -> Any:
    return (a * 2.0 for _ in range(3))


def a_map(a: Any) -> Any:
    return map(double_plus_one, [a, a])


def a_tuple_holding_a_generator(a: Any) -> Any:
    return a * 2.0, (a * 3.0 for _ in range(2))


async def _doubled(a: Any) -> Any:
    return a * 2.0


CREATED: list[Any] = []


def a_coroutine(a: Any) -> Any:
    CREATED.append(_doubled(a))
    return CREATED[-1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "model,kind",
    [
        (a_generator, "lazy generator"),
        (a_map, "lazy map"),
        (a_tuple_holding_a_generator, r"lazy generator at output\[1\]"),
        (a_coroutine, "coroutine"),
    ],
)
def test_a_lazy_output_is_refused(backend: str, model: Any, kind: str) -> None:
    x = array(backend, [[1.0, 2.0]])
    CREATED.clear()
    with pytest.raises(tl.UnsupportedError, match=f"the model returned a {kind}"):
        tl.trace(model, x, backend=backend)
    if CREATED:  # the coroutine returned is closed: its body never runs, nothing warns "never awaited"
        assert CREATED[-1].cr_frame is None
        for coroutine in CREATED:  # the JAX backend calls a function twice (jaxpr, then plain)
            coroutine.close()
    after = tl.trace(double_plus_one, x, backend=backend)  # nothing of the refused capture is left installed
    assert after.num_ops == 2 and after.audit()
