"""One schema for op, parameter and module records: TraceBuilder refuses at capture what tl.load refuses at load.

The reference is the loader itself: a record the builder takes is saved with tl.save and read back with
tl.load, which must accept it; a record the loader would refuse never gets past the builder.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import attrs
import numpy as np
import pytest

pytest.importorskip("torchlens_numpy")

import torchlens as tl
import torchlens_numpy.capture as numpy_capture
from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.capture.recorder import Recorder
from torchlens_core.ir.records import (
    CodeLocation,
    DType,
    OpRecord,
    ParamRecord,
    ParamRef,
    Ref,
    new_op,
    op_from_fields,
    raw_dtype,
)
from torchlens_core.ir.schema import shape_problem
from torchlens_core.store.encoding import Decoder, Encoder


def two_outputs(x):
    return np.divmod(x, 3.0)  # one op, two arrays: its shape has one entry per output


@pytest.mark.parametrize("capture", [tl.trace, tl.record], ids=["trace", "record"])
def test_a_list_of_shapes_is_refused_where_the_op_is_recorded(monkeypatch: pytest.MonkeyPatch, capture) -> None:
    """A plugin that records a multi-output shape as a list of tuples hears so at capture, not at tl.load: from
    tl.trace and tl.record alike, naming the op and the model's line that called it."""
    real = numpy_capture._info

    def listed(v):  # the third-party backend of the report: a list where the schema has a tuple
        shape, dtype = real(v)
        return (list(shape) if shape and isinstance(shape[0], tuple) else shape), dtype

    monkeypatch.setattr(numpy_capture, "_info", listed)
    with pytest.raises(tl.CaptureError) as info:
        capture(two_outputs, np.arange(6.0).reshape(2, 3), backend="numpy")
    text = str(info.value)
    assert "numpy backend" in text and "divmod" in text and "shape" in text and "((2, 3), (2,))" in text, text
    line = two_outputs.__code__.co_firstlineno + 1
    assert f"called at {__file__}:{line}" in text, text
    monkeypatch.setattr(numpy_capture, "_info", real)
    trace = tl.trace(two_outputs, np.arange(6.0).reshape(2, 3), backend="numpy")  # nothing left behind
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["divmod"]


def test_the_same_trace_with_tuples_saves_and_loads(tmp_path: pathlib.Path) -> None:
    x = np.arange(6.0).reshape(2, 3)
    trace = tl.trace(two_outputs, x, backend="numpy")
    op = next(op for op in trace.ops if op.kind == "op")
    assert op.shape == ((2, 3), (2, 3))
    tl.save(trace, tmp_path / "t")
    loaded = tl.load(tmp_path / "t")
    assert loaded[op.label].shape == op.shape
    for got, want in zip(loaded.replay(), np.divmod(x, 3.0)):
        assert np.array_equal(got, want)


def test_a_file_with_a_list_of_shapes_is_refused_with_the_builders_words(tmp_path: pathlib.Path) -> None:
    import hashlib

    trace = tl.trace(two_outputs, np.arange(6.0).reshape(2, 3), backend="numpy")
    folder = tl.save(trace, tmp_path / "t")
    records = json.loads((folder / "trace.json").read_text())
    index = next(i for i, o in enumerate(records["ops"]) if o["kind"] == "op")
    records["ops"][index]["shape"] = {"list": records["ops"][index]["shape"]}  # what a list of tuples saves as
    text = json.dumps(records, separators=(",", ":")).encode()
    (folder / "trace.json").write_bytes(text)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["trace.json"] = {"size": len(text), "sha256": hashlib.sha256(text).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(tl.TraceFileError) as info:
        tl.load(folder)
    assert f"op {index}: " + shape_problem([(2, 3), (2, 3)]) in str(info.value)


BAD_SHAPES = [
    [(2, 3), (2,)],
    [2, 3],
    (np.int64(2), 3),
    (2.0, 3),
    (True, 3),
    (-1, 3),
    ("2", 3),
    ((2, 3), [2]),
    (2, (3,)),
    (1 << 62,),
    tuple(range(65)),
]
GOOD_SHAPES = [None, (), (2, 3), ((2, 3), (2,)), ((2, 3), None), (((1,), (2,)), (3,)), (0,)]


def test_new_op_makes_the_record_the_constructor_makes() -> None:
    """The capture's constructor (no properties an op) sets every field of OpRecord, given or at its default: a
    field added to OpRecord and not to new_op fails here."""
    given = {
        "index": 3,
        "kind": "op",
        "func_name": "add",
        "call": np.add,
        "args": (Ref(1), ParamRef("w")),
        "kwargs": {"out": None},
        "out": np.ones(2),
        "shape": (2,),
        "dtype": "float64",
        "device": "cpu",
        "module_passes": (("block", 1),),
        "params": ("w",),
        "source": None,
        "in_place": False,
        "code_context": (CodeLocation("model.py", 3, "forward"),),
        "layer_key": None,
        "parent_indices": (1,),
        "meta": {"k": 1},
        "elapsed": 0.5,
        "condition_indices": (0,),
    }
    made, reference = new_op(**given), OpRecord(**given)
    assert attrs.fields_dict(OpRecord).keys() - given.keys()  # (defaults are checked too)
    for field in attrs.fields(OpRecord):
        assert getattr(made, field.name) is getattr(reference, field.name) or (
            getattr(made, field.name) == getattr(reference, field.name)
            and type(getattr(made, field.name)) is type(getattr(reference, field.name))
        ), field.name
    assert type(made.dtype) is DType and made.parents is not new_op(**given).parents  # lists are its own


def test_op_from_fields_makes_the_record_the_constructor_makes() -> None:
    """Every field a value of its own (a field moved in OpRecord, or in op_from_fields, lands elsewhere)."""
    names = [f.name for f in attrs.fields(OpRecord)]
    values = [f"value of {name}" for name in names]
    values[names.index("stored")] = None  # (nothing on disk: op_from_fields's condition)
    made, reference = op_from_fields(values), OpRecord(*values)
    for name in names:
        assert getattr(made, name) == getattr(reference, name) == values[names.index(name)], name
    assert type(made.dtype) is DType and type(raw_dtype(made)) is str
    with pytest.raises(ValueError):  # a field more (or fewer) than OpRecord has
        op_from_fields([*values, None])


@pytest.mark.parametrize(
    ("shape", "good"), [(s, False) for s in BAD_SHAPES] + [(s, True) for s in GOOD_SHAPES], ids=repr
)
def test_the_builder_takes_a_shape_exactly_when_its_saved_form_loads(shape, good: bool) -> None:
    """For each shape: the builder's verdict, and the loader's on the value tl.save writes and tl.load decodes."""
    builder = TraceBuilder("numpy")
    x = builder.add_input(np.zeros(3), shape=(3,), dtype="float64", device="cpu")
    try:
        builder.add_op("f", np.negative, (Ref(x.index),), {}, (x.index,), None, shape=shape)
        builder.check_ops()  # what finishing the capture does first
        taken = True
    except tl.CaptureError as exc:
        assert "shape" in str(exc)
        taken = False
    enc = Encoder("numpy")
    data = json.loads(json.dumps(enc.encode(shape)))
    decoded = Decoder("numpy", enc.arrays, bytearray(b"".join(enc.chunks)), framework=True).decode(data)
    assert taken == (shape_problem(decoded) is None)
    assert taken == good


def _bad_records() -> list[tuple[dict[str, Any], str]]:
    """Calls of ``add_op`` with one field a file cannot hold each, and the field the error must name."""
    ok = {"args": ("x",), "parent_indices": (0,), "shape": (3,), "dtype": "float64", "device": "cpu"}
    read_w = {"args": ("x", ParamRef("w")), "params": ("w",)}
    cases = [
        ({"dtype": np.dtype("float64")}, "dtype"),
        ({"in_place": 1}, "in_place"),
        ({"elapsed": np.float64(0.1)}, "elapsed"),
        ({"elapsed": float("nan")}, "elapsed"),
        ({"code_context": (("f.py", 3, "g"),)}, "code_context"),
        ({"code_context": 5}, "code_context"),  # not even a tuple: still a CaptureError, naming no site
        ({"code_context": (None,)}, "code_context"),
        ({"code_context": (CodeLocation("f.py", -1, "g"),)}, "code_context"),
        ({"conditions": [0]}, "conditions"),  # a list where a tuple goes: refused even when empty
        ({"conditions": (1,)}, "conditions"),  # not an earlier op
        ({"meta": {1: "a"}}, "meta"),
        ({"params": ("v",)}, "params"),
        ({**read_w, "parent_indices": ()}, "parent_indices"),  # an argument the record does not list
        ({"args": ("x", ParamRef("w"))}, "params"),
        ({"args": ["x"]}, "args should be a tuple"),
        ({"args": (Ref(5),), "parent_indices": (5,)}, "earlier ops"),
        ({"args": (Ref(5),), "parent_indices": ()}, "does not run before it"),
    ]
    return [({**ok, **extra}, field) for extra, field in cases]


def _add(builder: TraceBuilder, fields: dict[str, Any]) -> Any:
    x = Ref(0)
    args = tuple(x if a == "x" else a for a in fields["args"])
    if isinstance(fields["args"], list):
        args = [x if a == "x" else a for a in fields["args"]]
    rest = {k: v for k, v in fields.items() if k not in ("args", "parent_indices")}
    return builder.add_op("f", np.add, args, {}, fields["parent_indices"], None, **rest)


def _builder() -> TraceBuilder:
    builder = TraceBuilder("numpy")
    builder.add_param(ParamRecord("w", (3,), "float64", 3, True, ""))
    builder.add_input(np.zeros(3), shape=(3,), dtype="float64", device="cpu")
    return builder


@pytest.mark.parametrize(("fields", "field"), _bad_records(), ids=lambda v: v if isinstance(v, str) else "")
def test_other_fields_a_file_cannot_hold_are_refused_when_the_capture_finishes(fields, field: str) -> None:
    """Checked in one loop once the forward has run (contract 4): the error names the op, its call site and the
    field."""
    builder = _builder()
    site = CodeLocation("model.py", 12, "forward")
    if "code_context" not in fields:
        fields = {**fields, "code_context": (site,)}
    _add(builder, fields)  # taken for now: nothing reads it while the forward runs
    with pytest.raises(tl.CaptureError, match=field) as info:
        builder.finish()
    assert "op 1 ('f'" in str(info.value)
    if "code_context" not in field:
        assert "called at model.py:12" in str(info.value)


def test_a_call_site_passed_once_does_not_pass_a_bad_one_beside_it() -> None:
    """The check passes each call site once per capture (ops share them): a bad entry next to one passed already
    is still refused, and so is a list of conditions that is empty."""
    site = CodeLocation("model.py", 12, "forward")
    for bad, field in (({"code_context": (site, None)}, "code_context"), ({"conditions": []}, "conditions")):
        builder = _builder()
        _add(builder, {"args": ("x",), "parent_indices": (0,), "code_context": (site,)})
        _add(builder, {"args": ("x",), "parent_indices": (0,), "code_context": (site,), **bad})
        with pytest.raises(tl.CaptureError, match=field) as info:
            builder.finish()
        assert "op 2 ('f'" in str(info.value)


@pytest.mark.parametrize(("fields", "field"), _bad_records(), ids=lambda v: v if isinstance(v, str) else "")
def test_other_fields_a_file_cannot_hold_are_refused_as_added_where_records_are_read_live(fields, field: str) -> None:
    """Where records are read as the forward runs (a backend written before contract 4, intervene=, save=...),
    add_op refuses the record itself, and keeps nothing."""
    from torchlens_core.capture.builder import forced_naming

    with forced_naming(True):
        builder = _builder()
    with pytest.raises(tl.CaptureError, match=field):
        _add(builder, fields)
    assert len(builder.ops) == 1  # nothing refused was kept


def test_parameters_a_file_cannot_hold_are_refused_where_declared() -> None:
    builder = _builder()
    with pytest.raises(tl.CaptureError, match="a shape should be a tuple"):
        builder.add_param(ParamRecord("v", [3], "float64", 3, True, ""))
    with pytest.raises(tl.CaptureError, match="trainable"):
        builder.add_param(ParamRecord("v", (3,), "float64", 3, np.bool_(True), ""))
    assert list(builder.params) == ["w"]  # nothing refused was kept
    op = _add(
        builder,
        {
            "args": ("x", ParamRef("w")),
            "parent_indices": (0,),
            "params": ("w",),
            "code_context": (CodeLocation("f.py", 3, "g"),),
            "elapsed": 0.5,
            "shape": (3,),
            "dtype": "float64",
            "device": "cpu",
        },
    )
    builder.check_ops()
    assert op.index == 1


def test_a_backend_written_for_contract_1_is_warned_and_its_trace_is_not_saved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """Contract 2 made the schema an error at capture; a plugin that declares no contract (1) still captures,
    hears a PluginContractWarning, and gets a TraceFileError from tl.save instead of a file tl.load refuses."""
    from torchlens_core.backend import manager
    from torchlens_core.capture import builder as builder_module

    real = numpy_capture._info

    def listed(v):
        shape, dtype = real(v)
        return (list(shape) if shape and isinstance(shape[0], tuple) else shape), dtype

    monkeypatch.setattr(manager, "contract_of", lambda name: 1)
    monkeypatch.setattr(builder_module, "_WARNED", set())
    monkeypatch.setattr(numpy_capture, "_info", listed)
    x = np.arange(6.0).reshape(2, 3)
    with pytest.warns(tl.PluginContractWarning, match="shape"):
        trace = tl.trace(two_outputs, x, backend="numpy")
    for got, want in zip(trace.output, np.divmod(x, 3.0)):  # the capture itself still works
        assert np.array_equal(got, want)
    with pytest.raises(tl.TraceFileError, match="shape"):
        tl.save(trace, tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_a_backend_written_before_contract_4_has_its_ops_named_as_they_are_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Contract 4 names ops when the capture finishes; a plugin written for contract 3 may read a label right
    after add_op, so it still gets one there (the conformance suite tells it whether it is ready for contract 4)."""
    from torchlens_core.backend import manager
    from torchlens_core.capture import builder as builder_module

    seen_at_add = []
    real_add_op = builder_module.TraceBuilder.add_op

    def add_op(self, *args, **kwargs):  # what a plugin reading labels as it records sees
        op = real_add_op(self, *args, **kwargs)
        seen_at_add.append(op.label)
        return op

    def looped(x):
        for _ in range(3):
            x = np.tanh(x) * 2.0
        return x

    monkeypatch.setattr(builder_module.TraceBuilder, "add_op", add_op)
    x = np.linspace(-1.0, 1.0, 6)
    at_end = tl.trace(looped, x, backend="numpy")
    assert len(seen_at_add) == 6 and set(seen_at_add) == {""}  # contract 4: named when the capture finishes
    seen_at_add.clear()
    monkeypatch.setattr(manager, "contract_of", lambda name: 3)
    as_added = tl.trace(looped, x, backend="numpy")
    ops = [op for op in as_added.ops if op.kind == "op"]
    assert [op.label for op in ops] == [op.label for op in at_end.ops if op.kind == "op"]
    # named as added, before the capture knew how many passes each layer has
    assert seen_at_add == [f"{op.layer_label}:{op.pass_num}" if op.pass_num > 1 else op.layer_label for op in ops]
    assert np.array_equal(as_added.output, looped(x))


def test_the_suite_tells_a_backend_reading_labels_while_it_records_that_contract_4_would_break_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The suite's rule of contract 4 captures the case with ops named at the end: a backend that keys its own
    bookkeeping by label as it records fails there; written for contract 3 it is warned (the check xfailed),
    written for contract 4 the check fails."""
    from torchlens.conformance import checks, support
    from torchlens.conformance.support import Traced
    from torchlens_core.backend import manager
    from torchlens_core.backend.cases import Case
    from torchlens_core.capture import builder as builder_module

    real_add_op = builder_module.TraceBuilder.add_op

    def keyed_by_label(self, *args, **kwargs):  # a plugin keeping {label: op} as it records
        op = real_add_op(self, *args, **kwargs)
        seen = self.notes.setdefault("by_label", {})
        if op.label in seen:
            raise RuntimeError(f"two ops labelled {op.label!r}")
        seen[op.label] = op.index
        return op

    def model(x):
        return np.tanh(x) * 2.0 + 1.0

    x = np.linspace(-1.0, 1.0, 6)
    case = Case("keyed", lambda: (model, (x,), {}))
    traced = Traced("numpy", case, model, (x,), {}, tl.trace(model, x, backend="numpy"), model(x))
    check = checks.test_ops_named_when_the_capture_finishes_are_named_as_when_added
    check(traced=traced)  # the numpy plugin reads no label while it records
    monkeypatch.setattr(builder_module.TraceBuilder, "add_op", keyed_by_label)
    for module in (manager, support):  # what the builder and the suite read
        monkeypatch.setattr(module, "contract_of", lambda name: 3)
    with pytest.warns(tl.PluginContractWarning, match="rule of contract 4"), pytest.raises(pytest.xfail.Exception):
        check(traced=traced)
    for module in (manager, support):
        monkeypatch.setattr(module, "contract_of", lambda name: 4)
    with pytest.raises(RuntimeError, match="two ops labelled ''"):
        check(traced=traced)


class _Arrays(Recorder):
    """The least recorder of NumPy arrays: what a third-party backend builds on the core's Recorder."""

    array_types = (np.ndarray,)

    def describe(self, value: Any) -> tuple[tuple[int, ...], str, str]:
        return tuple(int(d) for d in value.shape), str(value.dtype), "cpu"

    def copy(self, value: Any) -> Any:
        return value.copy()


def _recorder() -> tuple[_Arrays, np.ndarray, np.ndarray]:
    builder = _builder()
    x, w = builder.ops[0].out, np.ones(3)
    builder.params["w"].value = w
    recorder = _Arrays(builder, {id(w): "w"})
    recorder.produced(x, Ref(0))
    return recorder, x, w


def test_reads_the_core_templated_are_not_walked_again_and_are_right() -> None:
    """call_template's arguments list what they read as they are made: record() takes them, the check of the reads
    is left out for that op, and they are what a walk of the arguments finds (the loader's own check)."""
    from torchlens_core.ir.schema import op_problem

    recorder, x, w = _recorder()
    a, k, parents, params = recorder.call_template((x, [w, 2.0, x], {"y": x}), {"out": None, "scale": w})
    y = np.add(x, w)
    recorder.record("add", np.add, a, k, parents, params, y)
    op = recorder.builder.ops[-1]
    assert (parents, params) == ((0,), ("w",))
    assert op.parent_indices == (0,) and op.params == ("w",)
    assert recorder.builder.templated_reads == {op.index}
    assert op_problem(op, recorder.builder.params) is None  # the full check, reads included, passes
    trace = recorder.builder.finish()
    assert trace[op.index].parents == ["input_1"]


def test_reads_handed_in_otherwise_are_still_checked() -> None:
    """Anything but call_template's own objects, unchanged, is checked in full when the capture finishes: another
    list of parents, keyword arguments changed after templating, or a template of the backend's own."""
    for change in ("parents", "kwargs", "own"):
        recorder, x, w = _recorder()
        a, k, parents, params = recorder.call_template((x,), {"scale": 2.0})
        if change == "parents":
            parents = tuple([*parents])  # equal, but not the same object: checked, and passes
        elif change == "kwargs":
            k["other"] = ParamRef("w")  # a read the params do not list
        else:
            a = (Ref(0), ParamRef("w"))  # the backend's own, reading a parameter the params do not list
        recorder.record("mul", np.multiply, a, k, parents, params, np.multiply(x, 2.0))
        assert recorder.builder.templated_reads == set(), change
        if change == "parents":
            recorder.builder.finish()  # right, and checked
            continue
        with pytest.raises(tl.CaptureError, match="params lists") as info:
            recorder.builder.finish()
        assert "op 1 ('mul'" in str(info.value), change


def test_a_template_taken_is_good_for_one_record_only() -> None:
    """A second record() handed the same objects (a backend recording one template twice) is checked in full."""
    recorder, x, w = _recorder()
    a, k, parents, params = recorder.call_template((x, w), {})
    recorder.record("add", np.add, a, k, parents, params, np.add(x, w))
    recorder.record("add", np.add, a, k, parents, params, np.add(x, w))
    assert recorder.builder.templated_reads == {1}
    recorder.builder.finish()
