"""Replay on new inputs on the numpy plugin: every Python value the function made from an array is checked.

The reference for every replay is the traced function itself, called plainly
on the new inputs (or, for edits, the function rewritten by hand with the edit
in it). Each conversion path has a case whose new inputs keep the converted
value (replay must equal the plain call) and one whose new inputs change it
(replay must raise GraphDoesNotHold naming the op that was converted, where
without the report it would silently give the recorded graph's answer).
"""

from __future__ import annotations

import math
import threading

import pytest

pytest.importorskip("torchlens_numpy")
import numpy as np

import torchlens as tl
from torchlens_core.ir.errors import UnsupportedError
from torchlens_numpy import zoo

X = np.array([[0.5, 1.5, 2.3, 0.25], [1.0, 0.75, 2.0, 0.125], [0.5, 0.5, 1.25, 1.75]])
KEEPS_ABOVE_ONE = np.where(X > 1, X * 1.5, X * 0.5)  # the same elements above 1 as X
TABLE = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0])  # a constant


def trace(fn, *args, **kwargs) -> tl.Trace:
    return tl.trace(fn, *args, backend="numpy", **kwargs)


def close(actual, expected) -> bool:
    a, e = np.asarray(actual), np.asarray(expected)
    return a.shape == e.shape and a.dtype == e.dtype and np.allclose(a, e, rtol=1e-12, atol=0)


def with_at(x, index, value):
    y = x.copy()
    y[index] = value
    return y


def converted(t: tl.Trace) -> list[tuple[str, str]]:
    """(op label, conversion) of every Python value the capture reported."""
    return [(op.label, how) for op in t.ops for _, how, _ in op.meta.get("to_python", ())]


def raises_naming(t: tl.Trace, func_name: str, *args, **kwargs) -> None:
    with pytest.raises(tl.GraphDoesNotHold) as caught:
        t.replay(*args, **kwargs)
    labels = [op.label for op in t.ops if op.func_name == func_name]
    message = str(caught.value)
    # The core also checks every op's output shape: a value-dependent shape is caught where it first changes.
    assert labels and (any(f"{label}'s value" in message for label in labels) or "output has shape" in message), message


# -- each conversion: (name, function, new inputs keeping the value, new inputs changing it, op converted) ---
def by_bool(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def by_int(x):
    return x * int(x.max())  # 2.3 -> 2


def by_float(x):
    return x - float(x.min())


def by_index(x):
    return x * TABLE[x.argmax()]  # indexing a plain array with a NumPy integer: __index__


def by_slice(x):
    return x.reshape(-1)[: (x > 1).sum()]  # a slice bound from an array


def by_complex(x):
    return x * complex(x.min()).real


def by_hash(x):
    return x * {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}[x[0].argmax()]  # a NumPy integer as a dict key


def by_contains(x):
    if 2.0 in x:
        return x + 1
    return x - 1


def by_item(x):
    return x / x.min().item()


def by_item_at(x):
    return x * x.item(5)


def by_tolist(x):
    return x * max(x[0].tolist())


def by_tobytes(x):
    return x * sum(x.tobytes())


def by_round(x):
    return x * round(x.max())


def by_trunc(x):
    return x * math.trunc(x.max())


def by_len(x):
    positive = x[x > 1]  # how many: decided by the values
    return positive.sum() / len(positive)


def by_shape(x):
    positive = x[x > 1]
    return positive.sum() / positive.shape[0]


def by_size(x):
    positive = x[x > 1]
    return positive.sum() / positive.size


def by_np_shape(x):
    positive = x[x > 1]
    return positive.sum() / np.shape(positive)[0]


def by_iteration(x):
    total = x[0, 0] * 0
    for v in x[x > 1]:  # one recorded getitem per element: the count is baked in
        total = total + v * v
    return total


def by_while(x):
    while x.max() > 1:  # the count of halvings
        x = x / 2
    return x


def by_allclose(x):
    if np.allclose(x, 0):  # a Python bool from NumPy: a recorded op
        return x
    return x + 1


def by_array_equal(x):
    if np.array_equal(x, np.abs(x)):
        return x * 3
    return x


CONVERSIONS = [
    ("bool", by_bool, X + 1, -X, "greater"),
    ("int", by_int, with_at(X, (0, 0), 0.1), X + 1, "max"),
    ("float", by_float, with_at(X, (0, 0), 0.9), with_at(X, (2, 3), 0.1), "min"),
    ("index", by_index, X * 1.5, with_at(X, (2, 0), 5.0), "argmax"),
    ("slice_bound", by_slice, KEEPS_ABOVE_ONE, X * 0.5, "sum"),
    ("complex", by_complex, with_at(X, (0, 0), 0.9), X + 1, "min"),
    ("hash", by_hash, X * 1.5, with_at(X, (0, 0), 9.0), "argmax"),
    ("contains", by_contains, with_at(X, (0, 0), 2.0), with_at(X, (1, 2), 2.5), "any"),
    ("item", by_item, with_at(X, (0, 0), 0.9), X + 1, "min"),
    ("item_at", by_item_at, X.copy(), with_at(X, (1, 1), 3.0), "input"),
    ("tolist", by_tolist, with_at(X, (1, 1), 9.0), with_at(X, (0, 2), 5.0), "getitem"),
    ("tobytes", by_tobytes, X.copy(), X + 1, "input"),
    ("round", by_round, with_at(X, (0, 0), 0.9), X * 2, "max"),
    ("trunc", by_trunc, X * 1.1, X * 2, "max"),
    ("len", by_len, KEEPS_ABOVE_ONE, X * 2, "getitem"),
    ("shape", by_shape, KEEPS_ABOVE_ONE, X * 2, "getitem"),
    ("size", by_size, KEEPS_ABOVE_ONE, X * 2, "getitem"),
    ("np.shape", by_np_shape, KEEPS_ABOVE_ONE, X * 2, "getitem"),
    ("iteration", by_iteration, KEEPS_ABOVE_ONE, X * 2, "getitem"),
    ("while", by_while, X * 1.1, X * 4, "greater"),
    ("allclose", by_allclose, X + 1, X * 0, "allclose"),
    ("array_equal", by_array_equal, X * 2, -X, "array_equal"),
]


@pytest.mark.parametrize(("fn", "same", "changed", "op"), [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS])
def test_a_value_that_stays_the_same_replays_and_one_that_changes_raises(fn, same, changed, op) -> None:
    t = trace(fn, X)
    assert converted(t), "the conversion was not reported"
    assert close(t.replay(same), fn(same))
    # the replay ran the graph on the new values: the plain call gives another answer on them than on X
    assert same is not X and (np.array_equal(same, X) or not close(fn(same), fn(X)))
    raises_naming(t, op, changed)


def test_without_the_checks_the_changed_inputs_would_have_replayed_wrong() -> None:
    """What the checks stop: each 'changed' input really gives another output than the recorded graph does."""
    for _, fn, _, changed, _ in CONVERSIONS:
        t = trace(fn, X)
        for op in t.ops:
            op.meta.pop("to_python", None)  # the trace as a backend without reports would leave it
        try:
            replayed = t.replay(changed)
        except tl.GraphDoesNotHold as caught:  # a shape that changed: the core's own safety net caught it
            assert "output has shape" in str(caught), fn.__name__
            continue
        assert not close(replayed, fn(changed)), fn.__name__


# -- real functions: the zoo ------------------------------------------------------------------------------
def _settling_steps(x, w):
    """How many steps zoo.rnn_until_settled runs, counted by hand."""
    h = x
    for step in range(50):
        new = np.tanh(h @ w) * 0.5 + x
        done = np.abs(new - h).max() < 1e-3
        h = new
        if done:
            return step + 1
    return 50


def test_a_loop_that_would_run_another_number_of_times_raises() -> None:
    _, (x, w), _ = zoo._build_rnn_until_settled()
    t = trace(zoo.rnn_until_settled, x, w)
    same, more = x * 1.001, x * 40
    assert _settling_steps(same, w) == _settling_steps(x, w) != _settling_steps(more, w)
    assert close(t.replay(same, w), zoo.rnn_until_settled(same, w))
    raises_naming(t, "less", more, w)


def test_a_branch_that_would_flip_raises_naming_the_comparison() -> None:
    _, (x, w), _ = zoo._build_branch()
    t = trace(zoo.branch, x, w)
    assert converted(t) == [(t["greater_1"].label, "bool")]
    assert close(t.replay(x * 2, w), zoo.branch(x * 2, w))
    assert close(t.replay(x, w * 3), zoo.branch(x, w * 3))  # the weights decide no branch
    with pytest.raises(tl.GraphDoesNotHold, match=t["greater_1"].label):
        t.replay(-x, w)


# -- edits that change a decided value -----------------------------------------------------------------
def branch_by_hand(x, w, mean_edit):
    if mean_edit(x.mean()) > 0:
        return np.maximum(x @ w, 0)
    return np.tanh(x @ w) - 1


def test_a_fork_edit_that_flips_a_branch_raises_on_replay_and_reruns_live() -> None:
    _, (x, w), _ = zoo._build_branch()
    t = trace(zoo.branch, x, w)
    flipped = t.fork().when(tl.func("mean"), lambda v, site: -v)
    with pytest.raises(tl.GraphDoesNotHold, match=t["greater_1"].label):
        flipped.replay()
    live = flipped.rerun(zoo.branch, x, w)
    assert close(live.output, branch_by_hand(x, w, lambda m: -m))
    assert not close(live.output, zoo.branch(x, w))


def test_a_fork_edit_that_keeps_the_branch_replays_as_the_live_edit() -> None:
    _, (x, w), _ = zoo._build_branch()
    t = trace(zoo.branch, x, w)
    fork = t.fork().when(tl.func("mean"), lambda v, site: v * 3)  # still positive
    assert close(fork.replay(), branch_by_hand(x, w, lambda m: m * 3))
    assert close(fork.replay(x * 2, w), branch_by_hand(x * 2, w, lambda m: m * 3))
    with pytest.raises(tl.GraphDoesNotHold):
        fork.replay(-x, w)
    assert close(fork.rerun(zoo.branch, x, w).output, fork.replay())


def test_an_edit_of_a_python_answer_is_what_the_function_gets() -> None:
    say_true = tl.when(tl.func("allclose"), lambda v, site: np.ones_like(v))
    t = trace(by_allclose, X, intervene=say_true)
    assert close(t.output, X)  # the branch np.allclose(...) == True takes, by hand
    report = t.audit()
    assert report, str(report)
    assert close(t.replay(X * 3), X * 3)  # the edit holds on other inputs: the same branch
    fork = trace(by_allclose, X).fork().when(tl.func("allclose"), lambda v, site: np.ones_like(v))
    with pytest.raises(tl.GraphDoesNotHold, match="allclose"):  # the recorded graph took the False branch
        fork.replay()
    assert close(fork.rerun(by_allclose, X).output, X)


# -- values read after a write, and values that leave the trace ---------------------------------------
def read_after_write(x):
    h = x * 1.0
    corner = h[:1, :1]  # a view of h
    h += 1  # writes the corner too
    return x * corner.item()  # the corner as it is now, not as getitem made it


def test_a_value_converted_after_a_write_through_another_view_is_checked_as_it_was_read() -> None:
    t = trace(read_after_write, X)
    assert close(t.output, read_after_write(X))
    same = with_at(X, (2, 2), 7.0)
    assert close(t.replay(same), read_after_write(same))  # the recorded 1.5 is what the replay reads too
    raises_naming(t, "copy", with_at(X, (0, 0), 0.0))


def through_asarray(x):
    plain = np.asarray(x)  # NumPy does not dispatch this: a plain view of the input
    return x + plain


def test_a_recorded_value_that_left_the_trace_is_checked() -> None:
    t = trace(through_asarray, X)
    assert close(t.replay(X.copy()), through_asarray(X))
    raises_naming(t, "input", X + 1)  # the graph holds X's values as a constant


def test_conversions_outside_the_capturing_thread_or_in_helpers_are_not_the_functions() -> None:
    seen, held = {}, {}

    def fn(x):
        total = x.sum()  # recorded, converted only by the worker
        held["x"] = x
        worker = threading.Thread(target=lambda: seen.setdefault("total", float(total)))
        worker.start()
        worker.join()
        return x * 2

    def helper(v, site):  # converts the function's own Tracked input, as plain NumPy
        return v if bool(held["x"].max() > 0) else -v

    t = trace(fn, X, intervene=tl.when(tl.func("multiply"), helper))
    assert seen == {"total": float(X.sum())}
    assert converted(t) == [] and [op.func_name for op in t.ops if op.kind == "op"] == ["sum", "multiply"]
    assert close(t.replay(-X), fn(-X))


def test_an_array_that_escapes_converts_without_changing_the_trace() -> None:
    kept = []

    def fn(x):
        h = x * 2
        kept.append(h)
        return h + 1

    t = trace(fn, X)
    assert kept[0].tolist() == (X * 2).tolist() and len(kept[0]) == 3  # the escaped Tracked array itself
    assert converted(t) == []


# -- how new inputs are matched --------------------------------------------------------------------------
def keyword_and_nested(x, *, params):
    return np.tanh(x @ params["w"]) + params["b"][0]


def test_keyword_and_nested_inputs_are_matched_where_the_function_took_them() -> None:
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((4, 2)), [rng.standard_normal(2)]
    t = trace(keyword_and_nested, X, params={"w": w, "b": b})
    w2, b2 = rng.standard_normal((4, 2)), [rng.standard_normal(2)]
    assert close(t.replay(X + 1, params={"w": w2, "b": b2}), keyword_and_nested(X + 1, params={"w": w2, "b": b2}))


def writes_its_input(x):
    x *= 2  # into the caller's array
    return x + 1


def test_replay_leaves_the_new_inputs_as_they_were() -> None:
    t = trace(writes_its_input, X.copy())
    new = X + 1
    kept = new.copy()
    assert close(t.replay(new), writes_its_input(kept.copy()))
    assert np.array_equal(new, kept)


def test_a_conversion_too_large_to_keep_refuses_replay_on_new_inputs() -> None:
    big = np.linspace(0.0, 1.0, 5000)

    def fn(x):
        h = x * 2
        return h * len(set(h.tolist()))

    t = trace(fn, big)
    assert close(t.replay(), fn(big))  # on the recorded inputs nothing needs checking
    with pytest.raises(UnsupportedError, match="too large"):
        t.replay(big + 1)


# -- NumPy numbers among the arguments ------------------------------------------------------------------
def scaled(x, scale, *, shift):
    if scale > 0:
        return x * scale + shift
    return x - shift


def test_a_numpy_number_argument_is_an_input_replay_takes_anew() -> None:
    scale, shift = np.float64(2.0), np.float32(0.5)
    t = trace(scaled, X, scale, shift=shift)
    assert [op.shape for op in t.ops if op.kind == "input"] == [(3, 4), (), ()]
    new = (X + 1, np.float64(3.0))
    assert close(t.replay(*new, shift=np.float32(-1.0)), scaled(*new, shift=np.float32(-1.0)))
    with pytest.raises(tl.GraphDoesNotHold, match=t["greater_1"].label):
        t.replay(X, np.float64(-3.0), shift=shift)
    report = t.audit(untraced=True)  # the call is remembered: the scalars are its input nodes
    assert report, str(report)
