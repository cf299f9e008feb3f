"""Replay on new inputs on the Paddle backend: every Python value the forward made from a tensor is checked.

The reference for every replay is the model itself, called plainly on the new
inputs (or, for edits, the model run with the edit written in by hand). Each
conversion path has a function whose new inputs keep the converted value
(replay must equal the plain call) and one whose new inputs change it (replay
must raise GraphDoesNotHold naming the op converted, where without the report
it would silently give the recorded graph's answer: checked too).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
import paddle.nn.functional as F  # noqa: E402
from paddle import nn  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError, TorchLensError, UnsupportedError  # noqa: E402
from torchlens_paddle import intercept, zoo  # noqa: E402

X_NP = np.array([[0.5, 1.5, 2.3, 0.25], [1.0, 0.75, 2.0, 0.125], [0.5, 0.5, 1.25, 1.75]], dtype=np.float32)
TABLE = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0]  # a plain Python list


def P(a: Any) -> Any:
    return paddle.to_tensor(np.asarray(a, dtype=np.float32))


def np_(t: Any) -> np.ndarray:
    return np.array(t.numpy()) if isinstance(t, paddle.Tensor) else np.asarray(t)


def close(actual: Any, expected: Any, tol: float = 1e-6) -> bool:
    a, e = np_(actual), np_(expected)
    return a.shape == e.shape and np.allclose(a, e, rtol=tol, atol=tol)


def with_at(a: np.ndarray, index: tuple[int, int], value: float) -> np.ndarray:
    b = a.copy()
    b[index] = value
    return b


def converted(t: tl.Trace) -> list[tuple[str, str]]:
    """(op label, conversion) of every Python value the capture reported."""
    return [(op.label, how) for op in t.ops for _, how, _ in op.meta.get("to_python", ())]


def raises_naming(t: tl.Trace, func_name: str, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(tl.GraphDoesNotHold) as caught:
        t.replay(*args, **kwargs)
    labels = [op.label for op in t.ops if op.func_name == func_name]
    message = str(caught.value)
    # The core also checks every op's output shapes: a value-dependent shape is caught where it first changes.
    assert labels and (
        any(f"{label}'s value" in message or f"{label}'s output" in message for label in labels)
        or "has shape" in message
    ), message


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
    return x * TABLE[x.argmax()]  # a list indexed by a tensor: __index__


def by_range(x):
    h = x
    for _ in range(x.argmax()):  # a loop count: __index__
        h = h * 0.5
    return h


def by_complex(x):
    return x * complex(x.min()).real


def by_item(x):
    return x / x.min().item()


def by_item_at(x):
    return x * x.item(5)  # one element of the input, by flat position


def by_tolist(x):
    return x * max(x[0].tolist())


def by_numpy(x):
    return x * float(x[0].numpy().max())


def by_asarray(x):
    return x * float(np.asarray(x[0]).max())  # NumPy asks the tensor: __array__


def by_format(x):
    return x * float(f"{x.max():.1f}")  # Tensor.__format__ reads the value


def by_len(x):
    positive = x[x > 1]  # how many: decided by the values
    return positive.sum() / len(positive)


def by_shape(x):
    positive = x[x > 1]
    return positive.sum() / positive.shape[0]


def by_unique_shape(x):
    values, _ = paddle.unique(paddle.floor(x), return_counts=True)  # several outputs, shapes decided by values
    return x.sum() * paddle.ones([values.shape[0]])  # a shape read into a factory's fixed shape


def by_while(x):
    while x.max() > 1:  # the count of halvings
        x = x / 2
    return x


KEEPS_ABOVE_ONE = np.where(X_NP > 1, X_NP * 1.5, X_NP * 0.5)  # the same elements above 1 as X

CONVERSIONS = [  # name, function, same, changed, op, whether replay's shape check alone catches it
    ("bool", by_bool, X_NP + 1, -X_NP, "gt", False),
    ("int", by_int, with_at(X_NP, (0, 0), 0.1), X_NP + 1, "max", False),
    ("float", by_float, with_at(X_NP, (0, 0), 0.9), with_at(X_NP, (2, 3), 0.1), "min", False),
    ("index", by_index, X_NP * 1.5, with_at(X_NP, (2, 0), 5.0), "argmax", False),
    ("range", by_range, X_NP * 1.5, with_at(X_NP, (2, 0), 5.0), "argmax", False),
    ("complex", by_complex, with_at(X_NP, (0, 0), 0.9), X_NP + 1, "min", False),
    ("item", by_item, with_at(X_NP, (0, 0), 0.9), X_NP + 1, "min", False),
    ("item_at", by_item_at, X_NP.copy(), with_at(X_NP, (1, 1), 3.0), "input", False),
    ("tolist", by_tolist, with_at(X_NP, (1, 1), 9.0), with_at(X_NP, (0, 2), 5.0), "getitem", False),
    ("numpy", by_numpy, with_at(X_NP, (1, 1), 9.0), with_at(X_NP, (0, 2), 5.0), "getitem", False),
    ("asarray", by_asarray, with_at(X_NP, (1, 1), 9.0), with_at(X_NP, (0, 2), 5.0), "getitem", False),
    ("format", by_format, with_at(X_NP, (0, 0), 0.1), X_NP + 1, "max", False),
    ("len", by_len, KEEPS_ABOVE_ONE, X_NP * 2, "getitem", True),
    ("shape", by_shape, KEEPS_ABOVE_ONE, X_NP * 2, "getitem", True),
    ("unique_shape", by_unique_shape, X_NP * 1.1, X_NP * 2, "unique", False),
    ("while", by_while, X_NP * 1.1, X_NP * 4, "gt", False),
]


@pytest.mark.parametrize(
    ("fn", "same", "changed", "op"), [c[1:5] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS]
)
def test_a_value_that_stays_the_same_replays_and_one_that_changes_raises(fn, same, changed, op) -> None:
    t = tl.trace(fn, P(X_NP))
    if fn is not by_shape:  # a shape read is no conversion of a tensor: replay checks every op's shape
        assert converted(t), "the conversion was not reported"
    own = fn(P(same))
    assert np.array_equal(same, X_NP) or not close(own, fn(P(X_NP))), "the new inputs change nothing"
    assert close(t.replay(P(same)), own)
    raises_naming(t, op, P(changed))


def test_without_the_reports_the_changed_inputs_would_have_replayed_wrong() -> None:
    """What the reports stop: on each 'changed' input the recorded graph gives another output than the model."""
    for name, fn, _, changed, _, shape_checked in CONVERSIONS:
        if shape_checked:
            continue
        t = tl.trace(fn, P(X_NP))
        for op in t.ops:
            op.meta.pop("to_python", None)  # the trace a backend without the reports would leave
        try:
            replayed = t.replay(P(changed))
        except tl.GraphDoesNotHold as caught:  # a shape that changed: the core's own safety net caught it
            assert "has shape" in str(caught), name
            continue
        assert not close(replayed, fn(P(changed))), name


def test_each_conversion_is_reported_as_the_kind_replay_repeats() -> None:
    t = tl.trace(by_complex, P(X_NP))
    assert converted(t) == [(t["min_1"].label, "item")]  # complex(t) equals t.item(), which replay can repeat
    t = tl.trace(by_asarray, P(X_NP))
    assert converted(t) == [(t["getitem_1"].label, "tolist")]  # every value NumPy got
    (recorded,) = t["getitem_1"].meta["to_python"]
    assert recorded == ((), "tolist", X_NP[0].tolist())
    t = tl.trace(by_item_at, P(X_NP))
    assert converted(t) == [(t["input_1"].label, "tolist")]  # x.item(5): the element is one of them
    t = tl.trace(by_unique_shape, P(X_NP))
    shapes = [(path, result) for path, how, result in t["unique_1"].meta["to_python"] if how == "shape"]
    assert shapes[0] == ((0,), [3])  # the distinct floors of X: 0, 1, 2


def test_an_input_converted_directly_is_checked_too() -> None:
    def fn(x, flag):
        return x * 2.0 if flag else x - 1.0  # the input node's own value decides

    yes, no = paddle.to_tensor(True), paddle.to_tensor(False)
    t = tl.trace(fn, P(X_NP), yes)
    assert converted(t) == [(t["input_2"].label, "bool")]
    assert close(t.replay(P(X_NP * 3), yes), fn(P(X_NP * 3), yes))
    with pytest.raises(tl.GraphDoesNotHold, match="input_2's value"):
        t.replay(P(X_NP), no)


def test_a_value_converted_again_and_again_is_reported_once() -> None:
    def fn(x):
        flag = x.sum() > 0
        h = x
        for _ in range(4):
            if flag:
                h = h * 1.5
        return h

    t = tl.trace(fn, P(X_NP))
    assert converted(t) == [(t["gt_1"].label, "bool")]
    assert close(t.replay(P(X_NP + 1)), fn(P(X_NP + 1)))


# -- values read after a write, values too large to keep ------------------------------------------------
def read_after_write(x):
    h = x * 1.0
    corner = h[:1, :1]  # a view of h ...
    h.add_(paddle.ones_like(h))  # ... whose memory this writes
    return x * corner.item()  # the corner as it is now, not as getitem made it


def test_a_value_converted_after_a_write_through_another_view_is_checked_as_it_was_read() -> None:
    x = P(X_NP)
    t = tl.trace(read_after_write, x)
    assert close(t.output, read_after_write(P(X_NP)))
    (clone,) = [op for op in t.ops if op.func_name == "clone"]  # the value as read: recorded after the write
    assert converted(t) == [(clone.label, "item")] and t[clone.label].parents == [t["getitem_1"].label]
    same = with_at(X_NP, (2, 2), 7.0)
    assert close(t.replay(P(same)), read_after_write(P(same)))  # 1.5 = 0.5 + 1 read on replay too
    raises_naming(t, "clone", P(with_at(X_NP, (0, 0), 0.0)))


def test_a_value_too_large_to_keep_refuses_new_inputs() -> None:
    def fn(x):
        return x * float(x.numpy().mean())

    big = paddle.randn([80, 80])
    t = tl.trace(fn, big)
    assert converted(t) == [(t["input_1"].label, "tolist")]
    with pytest.raises(UnsupportedError, match="too large to keep"):
        t.replay(paddle.randn([80, 80]))


# -- real models -----------------------------------------------------------------------------------------
def test_the_zoo_branch_reports_its_test_and_refuses_the_other_sign() -> None:
    (case,) = [c for c in zoo.cases() if c.name == "branch_positive"]
    model, (x,), _ = case.build()
    t = tl.trace(model, x)
    assert converted(t) == [(t["gt_1"].label, "bool")]
    raises_naming(t, "gt", -x)
    assert close(model(-x), model.neg(-x) - 1)  # the other branch is what the model computes there


class UntilSettled(nn.Layer):
    """A recurrent cell run until its state stops moving: the number of steps is decided by values."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        h = x
        for _ in range(50):
            new = paddle.tanh(self.cell(h)) * 0.5 + x
            done = (new - h).abs().max() < 1e-3
            h = new
            if done:
                break
        return h


def _steps(model: UntilSettled, x: Any) -> int:
    """How many steps the model runs on ``x``, counted by a forward hook of the cell (no TorchLens)."""
    calls = []
    handle = model.cell.register_forward_post_hook(lambda layer, args, out: calls.append(1))
    try:
        model(x)
    finally:
        handle.remove()
    return len(calls)


def test_a_loop_that_would_run_another_number_of_times_raises() -> None:
    paddle.seed(3)
    model = UntilSettled()
    x = paddle.rand([2, 4]) * 0.1
    t = tl.trace(model, x)
    same, more = x * 1.001, x * 40
    assert _steps(model, same) == _steps(model, x) != _steps(model, more)
    assert close(t.replay(same), model(same))
    raises_naming(t, "lt", more)


# -- edits that change a decided value -----------------------------------------------------------------
class Gate(nn.Layer):
    """Takes one of two heads on the sign of a mean; ``tap`` is where a hand-made run writes an edit in."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.pos = nn.Linear(4, 3)
        self.neg = nn.Linear(4, 3)
        self.fc.weight.set_value(paddle.eye(4))  # h = x: the branch follows the sign of x's mean
        self.fc.bias.set_value(paddle.zeros([4]))

    def forward(self, x, tap=None):
        h = self.fc(x)
        m = h.mean()
        if tap is not None:
            m = tap(m)
        if m > 0:
            return F.relu(self.pos(h)) * m
        return self.neg(h) - m


@pytest.fixture
def gate() -> Gate:
    paddle.seed(5)
    return Gate()


def test_a_fork_edit_that_flips_a_branch_raises_on_replay_and_reruns_live(gate: Gate) -> None:
    x = P(X_NP[:2])
    t = tl.trace(gate, x)
    flipped = t.fork().when(tl.func("mean"), lambda v, site: -v)
    with pytest.raises(tl.GraphDoesNotHold, match=t["gt_1"].label):
        flipped.replay()
    live = flipped.rerun(gate, x)
    by_hand = gate(x, tap=lambda m: -m)
    assert close(live.output, by_hand) and not close(live.output, gate(x))
    assert "sub" in {op.func_name for op in live.ops} and "relu" not in {op.func_name for op in live.ops}


def test_a_fork_edit_that_keeps_the_branch_replays_as_the_live_edit(gate: Gate) -> None:
    x = P(X_NP[:2])
    t = tl.trace(gate, x)
    fork = t.fork().when(tl.func("mean"), lambda v, site: v * 3)  # still positive
    assert close(fork.replay(), gate(x, tap=lambda m: m * 3))
    assert close(fork.replay(x * 2), gate(x * 2, tap=lambda m: m * 3))  # new inputs and the edit together
    with pytest.raises(tl.GraphDoesNotHold, match=t["gt_1"].label):
        fork.replay(-x)
    assert close(fork.rerun(gate, x).output, fork.replay())


def test_an_edit_made_while_tracing_holds_on_new_inputs_of_the_same_branch(gate: Gate) -> None:
    x = P(X_NP[:2])
    t = tl.trace(gate, x, intervene=tl.when(tl.func("mean"), lambda v, site: -v))  # the negative branch, live
    assert close(t.output, gate(x, tap=lambda m: -m))
    assert close(t.replay(x * 2), gate(x * 2, tap=lambda m: -m))
    with pytest.raises(tl.GraphDoesNotHold, match="gt_1"):
        t.replay(-x)  # the edited mean turns positive


# -- conversions that are not the forward's ---------------------------------------------------------------
def test_conversions_in_other_threads_or_in_edit_helpers_are_not_reported() -> None:
    seen: dict[str, float] = {}

    def fn(x):
        total = x.sum()
        worker = threading.Thread(target=lambda: seen.setdefault("total", float(total)))
        worker.start()
        worker.join()
        return x * 2

    def helper(v, site):
        return v if float(v.max()) > -1e9 else -v  # the helper's own conversion: no part of the graph

    t = tl.trace(fn, P(X_NP), intervene=tl.when(tl.func("mul"), helper))
    assert seen == {"total": pytest.approx(float(X_NP.sum()), rel=1e-6)}
    assert converted(t) == []
    assert close(t.replay(P(-X_NP)), fn(P(-X_NP)))


def test_a_failing_conversion_leaves_nothing_patched() -> None:
    def fn(x):
        if x > 0:  # a tensor of 12 elements: Paddle refuses
            return x
        return -x

    with pytest.raises(Exception) as caught:
        tl.trace(fn, P(X_NP))
    assert not isinstance(caught.value, TorchLensError)
    for attr in intercept.DECIDING:
        method = paddle.Tensor.__dict__.get(attr)
        assert method is None or not getattr(method, "_torchlens_wrapper", False), attr
    assert close(paddle.to_tensor(X_NP).numpy(), X_NP) and bool(paddle.to_tensor(1.0) > 0)


# -- how new inputs are matched, and what is refused -------------------------------------------------------
def test_keyword_inputs_are_matched_where_the_model_took_them() -> None:
    (case,) = [c for c in zoo.cases() if c.name == "keyword_inputs"]
    model, (x,), kwargs = case.build()
    t = tl.trace(model, x, **kwargs)
    mask = paddle.rand([2, 8]) > 0.5
    assert close(t.replay(x * 2, mask=mask, scale=0.5), model(x * 2, mask=mask, scale=0.5))
    with pytest.raises(ArgumentTypeError, match="scale"):
        t.replay(x, mask=mask, scale=0.7)  # a number the graph holds


def test_replay_leaves_the_new_inputs_as_they_were() -> None:
    def fn(x):
        x.add_(paddle.ones_like(x))  # writes into the caller's tensor
        return x * 2

    t = tl.trace(fn, P(X_NP))
    new = P(X_NP + 5)
    assert close(t.replay(new), (X_NP + 6) * 2)
    assert close(new, X_NP + 5)
