"""The core's machinery for backends that hand the model wrapper arrays (torchlens_core.capture.wrapped,
.conversions, .calls), checked on docs/writing-a-backend.md's toy wrapper, not on the numpy plugin that uses it.

The guide's ``Boxed`` stands for a NumPy array and dispatches a few operators, as a third party's wrapper of its
framework's arrays would; every expected value is NumPy's own answer on the plain arrays.
"""

from __future__ import annotations

import importlib.util
import math
import operator
import pathlib
import re
import types
from typing import Any

import numpy as np
import pytest

from torchlens_core.capture.calls import CallNames, MethodCall, constant, replay_written
from torchlens_core.capture.conversions import CONVERSIONS, PythonValue
from torchlens_core.ir.errors import TraceFileError
from torchlens_core.ir.records import OpRecord, Ref

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "writing-a-backend.md"


@pytest.fixture(scope="module")
def boxed(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    """The guide's wrapper backend (``Boxed`` and its recorder), as a reader copies it from the page."""
    found = re.search(r"<!-- example: wrapped_backend\.py -->\n```python\n(.*?)\n```\n", DOC.read_text(), re.S)
    assert found, "docs/writing-a-backend.md lost its wrapper backend block"
    path = tmp_path_factory.mktemp("guide") / "wrapped_backend.py"
    path.write_text(found.group(1) + "\n")
    spec = importlib.util.spec_from_file_location("wrapped_backend", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _op(trace: Any, func_name: str) -> OpRecord:
    return next(op for op in trace.ops if op.func_name == func_name)


def test_a_wrapper_backend_records_its_calls_linked_and_its_returned_constant(boxed: types.ModuleType) -> None:
    x = np.arange(3.0)
    kept: list[Any] = []

    def model(a: Any) -> Any:
        kept.append(a)
        return (a * 2.0) + a, np.ones(2)  # the second array: returned, never computed

    trace = boxed.trace_boxed(model, x)
    assert [op.func_name for op in trace.ops] == ["input", "multiply", "add", "constant", "output", "output"]
    multiply, add, const = trace.ops[1:4]
    assert multiply.parent_indices == (0,) and add.parent_indices == (1, 0)
    assert multiply.args == (Ref(0), 2.0) and add.args == (Ref(1), Ref(0))
    assert const.call is constant and not const.parent_indices
    out, ones = trace.output
    assert type(out) is np.ndarray and np.array_equal(out, x * 2.0 + x) and np.array_equal(ones, np.ones(2))
    assert np.array_equal(add.out, x * 2.0 + x) and type(add.out) is np.ndarray  # op.out holds plain values
    after = kept[0] * 3.0  # a wrapper used after its capture: plain NumPy, nothing recorded
    assert type(after) is np.ndarray and np.array_equal(after, x * 3.0) and len(trace.ops) == 6


def test_the_guides_wrapper_trace_replays_and_audits_with_the_numpy_hooks(boxed: types.ModuleType) -> None:
    pytest.importorskip("torchlens_numpy")  # the hooks that replay a trace of NumPy arrays
    x = np.array([0.5, -1.0, 2.0])

    def model(a: Any) -> Any:
        y = a * 3.0
        y[1] = 4.0  # in place: the recorded value of multiply stays what it computed
        return y + a if bool(y.sum() > 0) else y

    trace = boxed.trace_boxed(model, x)
    expected = x * 3.0
    expected[1] = 4.0
    assert np.array_equal(trace.output, expected + x) and np.array_equal(trace.replay(), expected + x)
    assert _op(trace, "multiply").out.tolist() == (x * 3.0).tolist()
    report = trace.audit()
    assert report, str(report)


def test_conversions_are_reported_once_each_as_replay_converts_them(boxed: types.ModuleType) -> None:
    x = np.array([0.5, 1.5, 2.5])
    got: dict[str, Any] = {}

    def model(a: Any) -> Any:
        y = a * 2.0
        got["len"], got["float"], got["rows"] = len(y), float(y[1]), [float(r) for r in y]
        got["bool"] = bool(y.sum() > 3.0)
        got["int"], got["complex"], got["round"] = int(y[2]), complex(y[0]), round(y[2])
        got["close"], got["shape"] = y.close_to(a * 2.0), y.shape_of()
        return y

    trace = boxed.trace_boxed(model, x)
    y = x * 2.0
    assert got == {
        "len": 3,
        "float": 3.0,
        "rows": [1.0, 3.0, 5.0],
        "bool": bool(y.sum() > 3.0),
        "int": 5,
        "complex": 1 + 0j,
        "round": round(5.0),
        "close": True,
        "shape": (3,),
    }
    # len is read three times (len(), the loop, and np.shape's shape read) and reported once
    assert _op(trace, "multiply").meta["to_python"] == [((), "len", 3)]
    assert _op(trace, "greater").meta["to_python"] == [((), "bool", True)]
    reported = [(how, result) for op in trace.ops for _, how, result in op.meta.get("to_python", ())]
    assert ("item", y[0].item()) in reported and ("item", y[2].item()) in reported  # complex(), round(): by item
    close = _op(trace, "allclose")
    assert isinstance(close.call, PythonValue) and close.meta["to_python"] == [((), "item", True)]
    assert close.call(y, y).item() is True and "shape" not in [op.func_name for op in trace.ops]
    for op in trace.ops:  # what replay applies to each value gives what the forward got
        for _, how, result in op.meta.get("to_python", ()):
            assert CONVERSIONS[how](op.out) == result, (op.label, how)


def test_a_value_written_through_another_view_is_recorded_as_a_copy_before_it_converts(boxed: types.ModuleType) -> None:
    x = np.arange(4.0)
    got: dict[str, Any] = {}

    def model(a: Any) -> Any:
        y = a + 0.0
        v = y[:2]  # a view of y's memory
        y[0] = 7.0  # written after v's op ran: v now reads what no recorded op computed
        got["v"] = v.tolist()
        return y

    trace = boxed.trace_boxed(model, x)
    assert got["v"] == [7.0, 1.0]  # NumPy's view, as it reads after the write
    names = [op.func_name for op in trace.ops]
    assert names == ["input", "add", "getitem", "setitem", "copy", "output"], names
    getitem, copy = _op(trace, "getitem"), _op(trace, "copy")
    assert getitem.out.tolist() == [0.0, 1.0]  # the view's value as its op computed it: copied before the write
    assert copy.call == MethodCall("copy") and copy.parent_indices == (getitem.index,)
    assert copy.meta["to_python"] == [((), "tolist", [7.0, 1.0])] and "to_python" not in getitem.meta


def test_call_names_round_trip_and_refuse_what_is_not_listed() -> None:
    names = CallNames(
        {"numpy": np, "numpy.linalg": np.linalg},
        methods=("sum",),
        operators={"getitem": operator.getitem},
        refused=("save", "load"),
    )
    for call, data in (
        (np.linalg.norm, {"function": "numpy.linalg:norm"}),
        (MethodCall("sum"), {"method": "sum"}),
        (operator.getitem, {"operator": "getitem"}),
        (constant, {"constant": 0}),
        (PythonValue(np.allclose), {"python_value": {"function": "numpy:allclose"}}),
    ):
        assert names.encode(call) == data
        again = names.decode(data)
        assert again == call or (isinstance(again, PythonValue) and again.function is call.function)
    a = np.arange(6.0).reshape(2, 3)
    assert names.decode({"method": "sum"})(a) == a.sum() and math.isclose(
        names.decode({"function": "numpy.linalg:norm"})(a), float(np.sqrt((a * a).sum()))
    )
    assert names.encode(print) is None and names.encode(MethodCall("mean")) is None  # not listed: not saved
    for data in (
        {"function": "os:system"},
        {"function": "numpy:save"},
        {"function": "numpy:__class__"},
        {"method": "__reduce__"},
        {"operator": "attrgetter"},
        {"python_value": {"python_value": {}}},
        {"function": "numpy:sum", "method": "sum"},
        ["numpy", "load"],
    ):
        with pytest.raises(TraceFileError):
            names.decode(data)


def test_replay_written_writes_into_values_and_only_into_copies_of_constants() -> None:
    kept = np.ones(3)
    x = np.arange(3.0)
    into_constant = OpRecord(
        index=1, kind="op", func_name="add", call=np.add, args=(Ref(0), 1.0), kwargs={"out": (kept,)}, in_place=True
    )
    got = replay_written(into_constant, (x, 1.0), {"out": (kept,)}, np.copy)
    assert np.array_equal(got, x + 1.0) and got is not kept and np.array_equal(kept, np.ones(3))
    value = np.zeros(3)
    into_value = OpRecord(
        index=2, kind="op", func_name="setitem", call=operator.setitem, args=(Ref(1), 0, 5.0), in_place=True
    )
    got = replay_written(into_value, (value, 0, 5.0), {}, np.copy)  # setitem returns None: what it wrote
    assert got is value and value.tolist() == [5.0, 0.0, 0.0]


def test_conversions_are_one_table_for_capture_and_replay() -> None:
    from torchlens_core.replay import inputs

    assert inputs.CONVERSIONS is CONVERSIONS
    assert CONVERSIONS["index"](np.int64(3)) == operator.index(np.int64(3)) == 3
