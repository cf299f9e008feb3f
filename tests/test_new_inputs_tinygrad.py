"""Replay on new inputs on the tinygrad backend: every Python value the forward made from a tensor is checked.

tinygrad has no ``Tensor.__bool__`` (it raises), ``__int__``, ``__float__`` or
``__index__``: a forward reads values through ``item``, ``tolist``, ``numpy``
and ``data``, which realize the tensor. The reference for every replay is the
model itself, called plainly on the new inputs (or, for edits, run with the
edit written in by hand). Each conversion has a function whose new inputs keep
the converted value (replay must equal the plain call) and one whose new
inputs change it (replay must raise GraphDoesNotHold naming the op converted,
where without the report it would silently give the recorded graph's answer:
checked too).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tinygrad")
from tinygrad import Tensor, nn

import torchlens as tl
from torchlens_core.ir.errors import ArgumentTypeError, UnsupportedError
from torchlens_tinygrad import capture, zoo

X_NP = np.array([[0.5, 1.5, 2.3, 0.25], [1.0, 0.75, 2.0, 0.125], [0.5, 0.5, 1.25, 1.75]], dtype=np.float32)
TABLE = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0]  # a plain Python list


def T(a: Any) -> Tensor:
    return Tensor(np.asarray(a, dtype=np.float32)).realize()


def np_(t: Any) -> np.ndarray:
    return t.numpy() if isinstance(t, Tensor) else np.asarray(t)


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
    assert labels and any(f"{label}'s value" in message for label in labels), message


# -- each conversion: (name, function, new inputs keeping the value, new inputs changing it, op converted) ---
def by_bool(x):
    if (x.sum() > 0).item():
        return x * 2
    return x - 1


def by_int(x):
    return x * int(x.max().item())  # 2.3 -> 2


def by_float(x):
    return x - x.min().item()


def by_index(x):
    return x * TABLE[x.argmax().item()]


def by_range(x):
    h = x
    for _ in range(x.argmax().item()):  # a loop count
        h = h * 0.5
    return h


def by_tolist(x):
    return x * max(x[0].tolist())


def by_numpy(x):
    return x * float(x[0].numpy().max())


def by_data(x):
    return x * max(x[0].data().tolist())  # a memoryview of the values


def by_format(x):
    return x * float(f"{x.max().item():.1f}")


def by_input_numpy(x):
    return x * float(x.numpy()[1, 1])  # the input node's own values


def by_while(x):
    while (x.max() > 1).item():  # the count of halvings
        x = x / 2
    return x


CONVERSIONS = [
    ("bool", by_bool, X_NP + 1, -X_NP, "gt"),
    ("int", by_int, with_at(X_NP, (0, 0), 0.1), X_NP + 1, "max"),
    ("float", by_float, with_at(X_NP, (0, 0), 0.9), with_at(X_NP, (2, 3), 0.1), "min"),
    ("index", by_index, X_NP * 1.5, with_at(X_NP, (2, 0), 5.0), "argmax"),
    ("range", by_range, X_NP * 1.5, with_at(X_NP, (2, 0), 5.0), "argmax"),
    ("tolist", by_tolist, with_at(X_NP, (1, 1), 9.0), with_at(X_NP, (0, 2), 5.0), "getitem"),
    ("numpy", by_numpy, with_at(X_NP, (1, 1), 9.0), with_at(X_NP, (0, 2), 5.0), "getitem"),
    ("data", by_data, with_at(X_NP, (1, 1), 9.0), with_at(X_NP, (0, 2), 5.0), "getitem"),
    ("format", by_format, with_at(X_NP, (0, 0), 0.1), X_NP + 1, "max"),
    ("input_numpy", by_input_numpy, X_NP.copy(), with_at(X_NP, (1, 1), 3.0), "input"),
    ("while", by_while, X_NP * 1.1, X_NP * 4, "gt"),
]


@pytest.mark.parametrize(("fn", "same", "changed", "op"), [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS])
def test_a_value_that_stays_the_same_replays_and_one_that_changes_raises(fn, same, changed, op) -> None:
    t = tl.trace(fn, T(X_NP))
    assert converted(t), "the conversion was not reported"
    own = fn(T(same))
    assert np.array_equal(same, X_NP) or not close(own, fn(T(X_NP))), "the new inputs change nothing"
    assert close(t.replay(T(same)), own)
    raises_naming(t, op, T(changed))


def test_without_the_reports_the_changed_inputs_would_have_replayed_wrong() -> None:
    """What the reports stop: on each 'changed' input the recorded graph gives another output than the model."""
    for name, fn, _, changed, _ in CONVERSIONS:
        t = tl.trace(fn, T(X_NP))
        for op in t.ops:
            op.meta.pop("to_python", None)  # the trace a backend without the reports would leave
        assert not close(t.replay(T(changed)), fn(T(changed))), name


def test_each_conversion_is_reported_as_the_kind_replay_repeats() -> None:
    t = tl.trace(by_numpy, T(X_NP))
    assert converted(t) == [(t["getitem_1"].label, "tolist")]  # every value the array holds
    (recorded,) = t["getitem_1"].meta["to_python"]
    assert recorded == ((), "tolist", X_NP[0].tolist())
    t = tl.trace(by_data, T(X_NP))
    assert converted(t) == [(t["getitem_1"].label, "tolist")]
    t = tl.trace(by_bool, T(X_NP))
    assert t["gt_1"].meta["to_python"] == [((), "item", True)]


def test_a_value_converted_again_and_again_is_reported_once() -> None:
    def fn(x):
        flag = x.sum() > 0
        h = x
        for _ in range(4):
            if flag.item():
                h = h * 1.5
        return h

    t = tl.trace(fn, T(X_NP))
    assert converted(t) == [(t["gt_1"].label, "item")]
    assert close(t.replay(T(X_NP + 1)), fn(T(X_NP + 1)))


# -- values read after a write, values too large to keep ------------------------------------------------
def read_view_of_input(x):
    corner = x[:1, :1]  # a view of the input's buffer ...
    x.assign(x + 1)  # ... which this writes: capture realizes each op, so the corner reads the new value
    return x * corner.sum().item()


def test_a_value_converted_after_a_write_into_its_buffer_is_checked_as_it_was_read() -> None:
    t = tl.trace(read_view_of_input, T(X_NP))
    assert close(t.output, (X_NP + 1) * 1.5)  # as recorded: the corner, 0.5 + 1, read after the write
    (sum_,) = [op for op in t.ops if op.func_name == "sum"]
    assert converted(t) == [(sum_.label, "item")]
    same = with_at(X_NP, (2, 2), 7.0)
    assert close(t.replay(T(same)), (same + 1) * 1.5)
    raises_naming(t, "sum", T(with_at(X_NP, (0, 0), 0.0)))


def item_of_view_of_input(x):
    corner = x[:1, :1]
    x += 1
    return x * corner.item()  # item() on the view itself: read as it is now, a recorded copy


def test_a_view_read_after_its_buffer_was_written_is_recorded_as_read() -> None:
    t = tl.trace(item_of_view_of_input, T(X_NP))
    (clone,) = [op for op in t.ops if op.func_name == "clone"]
    assert converted(t) == [(clone.label, "item")] and clone.parents == [t["getitem_1"].label]
    assert close(t.replay(T(X_NP)), t.output)  # without the copy replay would check 0.5, read before the write
    raises_naming(t, "clone", T(with_at(X_NP, (0, 0), 0.0)))


def test_a_value_too_large_to_keep_refuses_new_inputs() -> None:
    def fn(x):
        return x * float(x.numpy().mean())

    t = tl.trace(fn, Tensor.randn(80, 80).realize())
    assert converted(t) == [(t["input_1"].label, "tolist")]
    with pytest.raises(UnsupportedError, match="too large to keep"):
        t.replay(Tensor.randn(80, 80).realize())


# -- real models -----------------------------------------------------------------------------------------
def test_the_zoo_branch_reports_its_test_and_refuses_the_other_sign() -> None:
    (case,) = [c for c in zoo.cases() if c.name == "branch_positive"]
    model, (x, w), _ = case.build()
    t = tl.trace(model, x, w)
    assert converted(t) == [(t["gt_1"].label, "item")]
    assert close(t.replay(x, w * 3), model(x, w * 3))  # the weights decide no branch
    raises_naming(t, "gt", -x, w)
    assert close(model(-x, w), (-x @ w).tanh() - 1)  # the other branch is what the model computes there


class UntilSettled:
    """A recurrent cell run until its state stops moving: the number of steps is decided by values."""

    def __init__(self) -> None:
        self.cell = nn.Linear(4, 4)
        self.steps = 0  # counted by the model's own code, no TorchLens

    def __call__(self, x: Tensor) -> Tensor:
        h = x
        self.steps = 0
        for _ in range(50):
            new = self.cell(h).tanh() * 0.5 + x
            done = ((new - h).abs().max() < 1e-3).item()
            h = new
            self.steps += 1
            if done:
                break
        return h


def test_a_loop_that_would_run_another_number_of_times_raises() -> None:
    Tensor.manual_seed(3)
    model = UntilSettled()
    x = (Tensor.rand(2, 4) * 0.1).realize()
    t = tl.trace(model, x)
    counts = []
    for v in (x, x * 1.001, x * 40):
        model(v.realize())
        counts.append(model.steps)
    assert counts[0] == counts[1] != counts[2]
    assert close(t.replay((x * 1.001).realize()), model((x * 1.001).realize()))
    raises_naming(t, "lt", (x * 40).realize())


# -- edits that change a decided value -----------------------------------------------------------------
class Gate:
    """Takes one of two heads on the sign of a mean; ``tap`` is where a hand-made run writes an edit in."""

    def __init__(self) -> None:
        Tensor.manual_seed(5)
        self.fc, self.pos, self.neg = nn.Linear(4, 4), nn.Linear(4, 3), nn.Linear(4, 3)
        self.fc.weight = Tensor.eye(4).contiguous().realize()  # h = x: the branch follows the sign of x's mean
        self.fc.bias = Tensor.zeros(4).contiguous().realize()

    def __call__(self, x: Tensor, tap: Any = None) -> Tensor:
        h = self.fc(x)
        m = h.mean()
        if tap is not None:
            m = tap(m)
        if (m > 0).item():
            return self.pos(h).relu() * m
        return self.neg(h) - m


def test_a_fork_edit_that_flips_a_branch_raises_on_replay_and_reruns_live() -> None:
    gate, x = Gate(), T(X_NP[:2])
    t = tl.trace(gate, x)
    flipped = t.fork().when(tl.func("mean"), lambda v, site: -v)
    with pytest.raises(tl.GraphDoesNotHold, match=t["gt_1"].label):
        flipped.replay()
    live = flipped.rerun(gate, x)
    assert close(live.output, gate(x, tap=lambda m: -m)) and not close(live.output, gate(x))
    assert "relu" not in {op.func_name for op in live.ops}


def test_a_fork_edit_that_keeps_the_branch_replays_as_the_live_edit() -> None:
    gate, x = Gate(), T(X_NP[:2])
    t = tl.trace(gate, x)
    fork = t.fork().when(tl.func("mean"), lambda v, site: v * 3)  # still positive
    assert close(fork.replay(), gate(x, tap=lambda m: m * 3))
    x2 = (x * 2).realize()
    assert close(fork.replay(x2), gate(x2, tap=lambda m: m * 3))  # new inputs and the edit together
    with pytest.raises(tl.GraphDoesNotHold, match=t["gt_1"].label):
        fork.replay((-x).realize())
    assert close(fork.rerun(gate, x).output, fork.replay())


def test_an_edit_made_while_tracing_holds_on_new_inputs_of_the_same_branch() -> None:
    gate, x = Gate(), T(X_NP[:2])
    t = tl.trace(gate, x, intervene=tl.when(tl.func("mean"), lambda v, site: -v))  # the negative branch, live
    assert close(t.output, gate(x, tap=lambda m: -m))
    x2 = (x * 2).realize()
    assert close(t.replay(x2), gate(x2, tap=lambda m: -m))
    with pytest.raises(tl.GraphDoesNotHold, match="gt_1"):
        t.replay((-x).realize())  # the edited mean turns positive


# -- conversions that are not the forward's ---------------------------------------------------------------
def test_conversions_in_other_threads_or_in_edit_helpers_are_not_reported() -> None:
    seen: dict[str, float] = {}

    def fn(x):
        total = x.sum()
        worker = threading.Thread(target=lambda: seen.setdefault("total", total.item()))
        worker.start()
        worker.join()
        return x * 2

    def helper(v, site):
        return v if v.max().item() > -1e9 else -v  # the helper's own conversion: no part of the graph

    t = tl.trace(fn, T(X_NP), intervene=tl.when(tl.func("mul"), helper))
    assert seen == {"total": pytest.approx(float(X_NP.sum()), rel=1e-6)}
    assert converted(t) == []
    assert close(t.replay(T(-X_NP)), fn(T(-X_NP)))


def _methods() -> dict[str, Any]:
    """Every Tensor method capture wraps, as the class holds it now (tinygrad's own wrapper: the function inside)."""
    found = {}
    for name, raw in capture._wrappable():
        cell = capture.metadata_cell(raw)
        found[name] = cell.cell_contents if cell is not None else raw
    return found


def test_a_failing_conversion_leaves_nothing_patched() -> None:
    before = _methods()

    def fn(x):
        return x * x.item()  # twelve elements: tinygrad refuses

    with pytest.raises(AssertionError, match="one element"):
        tl.trace(fn, T(X_NP))
    assert _methods() == before
    assert T(X_NP).sum().item() == pytest.approx(float(X_NP.sum()), rel=1e-6)


# -- how new inputs are matched, and what is refused -------------------------------------------------------
def test_a_numpy_array_is_not_a_new_input() -> None:
    # (another shape, dtype or count: the conformance suite's replay checks, on every backend)
    t = tl.trace(Gate(), T(X_NP[:2]))
    with pytest.raises(ArgumentTypeError, match="not an array"):
        t.replay(X_NP[:2])


def test_replay_leaves_the_new_inputs_as_they_were() -> None:
    def fn(x):
        x += 1  # writes into the caller's tensor
        return x * 2

    t = tl.trace(fn, T(X_NP))
    new = T(X_NP + 5)
    assert close(t.replay(new), (X_NP + 6) * 2)
    assert close(new, X_NP + 5)
