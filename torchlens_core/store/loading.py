"""Rebuilding a Trace from ``trace.json`` for ``tl.load``, checking every field on the way.

A folder may be hand-made with hashes to match, so nothing is taken on
trust: every field must have the type and the range ``tl.save`` writes
(counts are integers in range, times and FLOPs finite and non-negative,
shapes lists of sizes), and every reference must name something that exists
(op positions before the op, parameters, module passes, paths inside the
values they point into). What passes gives a trace whose lookups, summary,
tables, drawing, hash, replay and audit raise nothing but TorchLens errors.
Whatever fails raises :class:`TraceFileError` saying which record and field.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

from torchlens_core.backend.base import Backend
from torchlens_core.backend.manager import backend_infos, backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TraceFileError
from torchlens_core.ir.progress import progress
from torchlens_core.ir.records import (
    GRAD_SAVED,
    GRAD_STATUSES,
    OP_KINDS,
    SOURCE_KINDS,
    CodeLocation,
    EditRecord,
    ModulePass,
    ModuleRecord,
    OpRecord,
    ParamRecord,
    ParamRef,
    Ref,
    refs_in,
)
from torchlens_core.ir.schema import module_problem, op_problem, param_problem, shape_problem, sizes_problem
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.checked import LOADED, value_shape
from torchlens_core.store.encoding import Decoder
from torchlens_core.store.saving import NOT_REPLAYABLE

TRACE_KEYS = frozenset(
    {
        "backend",
        "framework_version",
        "model_name",
        "halted",
        "notes",
        "params",
        "modules",
        "ops",
        "output_template",
        "model_output",
        "arrays",
    }
)
PARAM_KEYS = frozenset({"name", "shape", "dtype", "numel", "trainable", "module", "is_buffer", "value"})
MODULE_KEYS = frozenset({"path", "type_name", "params", "passes"})
INPUTS_MODULE_KEYS = MODULE_KEYS | {"inputs"}  # format version 5 on
CONFIG_MODULE_KEYS = INPUTS_MODULE_KEYS | {"config"}  # format version 6 on
# a module's configuration is a handful of settings: bounds well above any real module's
CONFIG_ENTRIES, CONFIG_ITEMS, CONFIG_TEXT = 256, 64, 1_000
OP_KEYS = frozenset(
    {
        "kind",
        "func_name",
        "label",
        "layer_label",
        "func_ordinal",
        "pass_num",
        "num_passes",
        "parent_indices",
        "condition_indices",
        "module_passes",
        "module_outputs",
        "params",
        "shape",
        "dtype",
        "device",
        "source",
        "in_place",
        "saved",
        "elapsed",
        "code_context",
        "cost",
        "arg_names",
        "layer_key",
        "call",
        "args",
        "kwargs",
        "meta",
        "out",
        "not_replayable",
    }
)
EDIT_OP_KEYS = OP_KEYS | {"edits", "pre_edit"}  # format version 3 on
GRAD_OP_KEYS = EDIT_OP_KEYS | {"grad_status", "grad"}  # format version 4 on
EDIT_KEYS = frozenset({"site", "kind", "path", "helpers", "text", "func_name", "module", "in_place"})
MAX_COUNT = 1 << 62  # counts, sizes and ordinals above this only overflow the tables' int64 columns
MAX_LINE = 1 << 31
UNSAVED_PARAMS = "the values of parameters it reads were not saved (tl.save(..., params=False)): "


def check_fields(records: Any) -> dict[str, Any]:
    """``records`` (parsed trace.json), if it is a dict of exactly the fields tl.save writes."""
    if not isinstance(records, dict) or set(records) != TRACE_KEYS:
        found = sorted(records)[:40] if isinstance(records, dict) else type(records).__name__
        raise TraceFileError(f"trace.json should hold the fields {sorted(TRACE_KEYS)}, not {str(found)[:400]}")
    return records


def build(records: Any, blob: bytearray, version: int, decoder: type[Decoder] = Decoder) -> Trace:
    """The Trace ``records`` (parsed trace.json of format ``version``) and ``blob`` (arrays.bin) describe.

    ``decoder``: the Decoder class reading ``blob`` (tl.load(lazy=True): one that reads the file when asked).
    """
    check_fields(records)
    backend = _get(records, "backend", str, "trace")
    _opt(records, "framework_version", str, "trace")
    info = next((i for i in backend_infos() if i.name == backend), None)
    h = backend_named(backend, missing_ok=True)
    dec = decoder(backend, records["arrays"], blob, framework=info is not None and info.available)
    params, unsaved = _params(records, dec)
    modules = _modules(records, dec, params, version)
    ops: list[OpRecord] = []
    why_not: dict[str, str] = {}
    labels: set[str] = set()
    entries = _get(records, "ops", list, "trace")
    with progress("tl.load", total=len(entries)) as bar:  # shown only past a few seconds
        for i, o in enumerate(bar.each(entries)):
            op, why = _op(i, o, ops, dec, h, backend, modules, params, unsaved, version)
            if op.label in labels:
                raise TraceFileError(f"op {i}: label {op.label!r} is used twice")
            labels.add(op.label)
            ops.append(op)
            if why:
                why_not[op.label] = why
    notes = dec.decode(_get(records, "notes", dict, "trace"))
    if not (isinstance(notes, dict) and all(isinstance(k, str) for k in notes)):
        raise TraceFileError("trace: notes should be a dict with string keys")
    output_template = dec.decode(records["output_template"])
    model_output = dec.decode(records["model_output"])
    if not dec.framework:  # arrays are NumPy now: nothing replays
        why_not = {op.label: dec.why for op in ops if op.kind != "output"}
    else:
        _values_agree(backend, ops, params)
    notes[LOADED] = True  # replay checks each value against its record (torchlens_core.replay.checked)
    if why_not:
        notes[NOT_REPLAYABLE] = why_not
    else:
        notes.pop(NOT_REPLAYABLE, None)
    trace = Trace(
        backend=backend,
        model_name=_get(records, "model_name", str, "trace"),
        ops=ops,
        modules=modules,
        params=params,
        output_template=output_template,
        model_output=model_output,
        notes=notes,
        halted=_get(records, "halted", bool, "trace"),
    )
    _link(trace)
    return trace


# -- records -------------------------------------------------------------------------------------
def _params(records: dict[str, Any], dec: Decoder) -> tuple[dict[str, ParamRecord], dict[str, str]]:
    """Parameter records by name, and the names whose values did not load (-> why)."""
    params: dict[str, ParamRecord] = {}
    unsaved: dict[str, str] = {}
    for i, p in enumerate(_get(records, "params", list, "trace")):
        where = f"param {i}"
        _fields(p, PARAM_KEYS, where)
        name = _name(p, "name", where)
        if name in params:
            raise TraceFileError(f"{where}: parameter {name!r} is listed twice")
        value = p["value"]
        if not (value is None or isinstance(value, dict) and len(value) == 1 and set(value) <= {"array", "unsaved"}):
            raise TraceFileError(f"{where}: value should be an array, unsaved or null, not {str(value)[:80]}")
        dec.lossy = False
        decoded = dec.decode(value)
        if value is None:
            unsaved[name] = "saved without its value"
        elif dec.lossy:
            unsaved[name] = "its value could not be rebuilt here"
        params[name] = ParamRecord(
            name=name,
            shape=_sizes(dec.decode(_get(p, "shape", list, where)), where),
            dtype=_get(p, "dtype", str, where),
            numel=_count(p, "numel", where),
            trainable=_get(p, "trainable", bool, where),
            module=_get(p, "module", str, where),
            is_buffer=_get(p, "is_buffer", bool, where),
            value=decoded,
        )
        _schema(param_problem(params[name]), where)
    return params, unsaved


def _modules(
    records: dict[str, Any], dec: Decoder, params: dict[str, ParamRecord], version: int
) -> dict[str, ModuleRecord]:
    modules: dict[str, ModuleRecord] = {}
    for i, m in enumerate(_get(records, "modules", list, "trace")):
        where = f"module {i}"
        _fields(m, CONFIG_MODULE_KEYS if version >= 6 else INPUTS_MODULE_KEYS if version >= 5 else MODULE_KEYS, where)
        path = _get(m, "path", str, where)
        if path in modules:
            raise TraceFileError(f"{where}: module {path!r} is listed twice")
        rec = ModuleRecord(
            path=path,
            type_name=_get(m, "type_name", str, where),
            params=[_known(n, params, "parameter", where) for n in _get(m, "params", list, where)],
            config=_config(m.get("config"), where),
        )
        _schema(module_problem(rec.path, rec.type_name, rec.params, params), where)
        passes = _get(m, "passes", list, where)
        inputs = _get(m, "inputs", list, where) if version >= 5 else [None] * len(passes)
        if len(inputs) != len(passes):
            raise TraceFileError(f"{where}: {len(passes)} passes but inputs for {len(inputs)}")
        rec.passes = [
            ModulePass(path=path, pass_num=n + 1, out_template=dec.decode(t), in_template=_call(dec, a, where))
            for n, (t, a) in enumerate(zip(passes, inputs))
        ]
        modules[path] = rec
    return modules


def _config(config: Any, where: str) -> dict[str, Any] | None:
    """A module's saved configuration: names to plain settings (lists come back as the tuples they were)."""
    if config is None:
        return None
    if not isinstance(config, dict) or len(config) > CONFIG_ENTRIES:
        raise TraceFileError(f"{where}: config should be an object of at most {CONFIG_ENTRIES} settings")
    found: dict[str, Any] = {}
    for name, value in config.items():
        items = value if isinstance(value, list) else [value]
        if (
            len(name) > CONFIG_TEXT
            or len(items) > CONFIG_ITEMS
            or not all(isinstance(v, (bool, int, float, str, type(None))) for v in items)
            or any(isinstance(v, str) and len(v) > CONFIG_TEXT for v in items)
        ):
            raise TraceFileError(
                f"{where}: config setting {name[:80]!r} should be a number, flag, name or a list of them"
            )
        found[name] = tuple(value) if isinstance(value, list) else value
    return found


def _op(
    i: int,
    o: Any,
    ops: list[OpRecord],
    dec: Decoder,
    h: Backend,
    backend: str,
    modules: dict[str, ModuleRecord],
    params: dict[str, ParamRecord],
    unsaved: dict[str, str],
    version: int,
) -> tuple[OpRecord, str | None]:
    where = f"op {i}"
    _fields(o, GRAD_OP_KEYS if version >= 4 else EDIT_OP_KEYS if version >= 3 else OP_KEYS, where)
    kind = _get(o, "kind", str, where)
    if kind not in OP_KINDS:
        raise TraceFileError(f"{where}: unknown kind {kind!r}")
    module_passes = []
    for entry in _get(o, "module_passes", list, where):
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and type(entry[1]) is int
            and entry[0] in modules
            and 1 <= entry[1] <= len(modules[entry[0]].passes)
        ):
            raise TraceFileError(f"{where}: module pass {str(entry)[:80]} names no recorded module pass")
        module_passes.append((entry[0], entry[1]))
    code = []
    for c in _get(o, "code_context", list, where):
        if not (
            isinstance(c, list)
            and len(c) == 3
            and isinstance(c[0], str)
            and type(c[1]) is int
            and 0 <= c[1] < MAX_LINE
            and isinstance(c[2], str)
        ):
            raise TraceFileError(f"{where}: malformed code location {str(c)[:80]}")
        code.append(CodeLocation(c[0], c[1], c[2]))
    dec.lossy = False
    args, kwargs, meta = (dec.decode(_get(o, k, (list, dict), where)) for k in ("args", "kwargs", "meta"))
    lossy = dec.lossy
    if not (isinstance(args, tuple) and _str_keys(kwargs) and _str_keys(meta)):
        raise TraceFileError(f"{where}: args, kwargs and meta should be a tuple and two dicts with string keys")
    names = o["arg_names"]
    if names is not None:
        meta.setdefault("arg_names", tuple(_check(n, str, where) for n in _check(names, list, where)))
    if "arg_names" in meta and not (
        isinstance(meta["arg_names"], tuple) and all(isinstance(n, str) for n in meta["arg_names"])
    ):
        raise TraceFileError(f"{where}: arg_names should be a list of names")
    identity = kind == "op" and bool(meta.get("identity"))
    passes_on = kind == "output" or identity
    if passes_on and (len(args) != 1 or kind == "output" and not isinstance(args[0], Ref)):
        raise TraceFileError(f"{where}: an output or identity node passes exactly one value on")
    used = _check_refs((args, kwargs), i, ops, params, where)
    cost = dec.decode(o["cost"])
    if not (isinstance(cost, tuple) and len(cost) == 2):
        raise TraceFileError(f"{where}: cost should be [flops, macs]")
    dec.lossy = False
    out = dec.decode(o["out"])
    saved = _get(o, "saved", bool, where)
    if not saved and out is not None:
        raise TraceFileError(f"{where}: a value is stored for an op marked as not saved")
    num_passes = _count(o, "num_passes", where, low=1)
    pass_num = _count(o, "pass_num", where, low=1)
    if pass_num > num_passes:
        raise TraceFileError(f"{where}: pass {pass_num} of {num_passes}")
    source = _opt(o, "source", str, where)
    if source is not None and source not in SOURCE_KINDS:
        raise TraceFileError(f"{where}: unknown source {source!r}")
    op = OpRecord(
        index=i,
        kind=kind,
        func_name=_get(o, "func_name", str, where),
        args=args,
        kwargs=kwargs,
        out=out,
        shape=_shape(dec.decode(o["shape"]), where),
        dtype=_opt(o, "dtype", str, where),
        device=_opt(o, "device", str, where),
        module_passes=tuple(module_passes),
        params=tuple(_known(n, params, "parameter", where) for n in _get(o, "params", list, where)),
        source=source,
        in_place=_get(o, "in_place", bool, where),
        code_context=tuple(code),
        elapsed=_amount(dec.decode(o["elapsed"]), "elapsed", where),
        condition_indices=_positions(_get(o, "condition_indices", list, where), where, i),
        layer_key=dec.decode(o["layer_key"]),
        meta=meta,
        parent_indices=_positions(_get(o, "parent_indices", list, where), where, i),
        saved=saved,
        label=_name(o, "label", where),
        layer_label=_name(o, "layer_label", where),
        func_ordinal=_count(o, "func_ordinal", where),
        pass_num=pass_num,
        num_passes=num_passes,
        module_outputs=[_check(n, str, where) for n in _get(o, "module_outputs", list, where)],
        cost=(_amount(cost[0], "flops", where), _amount(cost[1], "macs", where)),
    )
    _known_passes(op, modules, where)
    _schema(op_problem(op, params), where)  # what TraceBuilder checked when the record was made
    edits_why = _edits(op, o, dec, h, backend, where) if version >= 3 else None
    if version >= 4:
        _grads(op, o, dec, where)
    # What the call reads must be what the record says it reads (an argument removed or moved shows here).
    if {r.index for r in refs_in((args, kwargs))} != set(op.parent_indices) or used != set(op.params):
        raise TraceFileError(f"{where}: its arguments read other ops or parameters than its record lists")
    why = _opt(o, "not_replayable", str, where)
    if kind == "input" and dec.lossy:
        why = "its value could not be saved"
    missing = sorted(used & set(unsaved))
    if why is None and missing:
        why = (
            UNSAVED_PARAMS + ", ".join(missing)
            if all(unsaved[n] == "saved without its value" for n in missing)
            else f"it reads parameters that could not be rebuilt here: {missing}"
        )
    why = why or edits_why
    if kind != "op" or identity:
        return op, why
    if why is None and lossy:
        why = "some of its arguments could not be rebuilt here"
    data = o["call"]
    if why is None and data is not None and dec.framework:
        try:
            op.call = h.decode_call(data)
        except ImportError:
            dec.framework = False
            dec.why = f"{backend} is not importable here"
        if op.call is None:
            why = f"the {backend} backend cannot rebuild its call here"
    elif why is None and data is None:
        why = f"the {backend} backend could not save its call"
    return op, why


def _edits(op: OpRecord, o: dict[str, Any], dec: Decoder, h: Backend, backend: str, where: str) -> str | None:
    """Fill ``op.edits`` and ``op.pre_edit``; why the op cannot be replayed with its edits, if it cannot."""
    from torchlens_core.capture.edits import Site
    from torchlens_core.steer.helpers import from_saved

    entries = _get(o, "edits", list, where)
    pre_edit = dec.decode(o["pre_edit"])
    if (pre_edit is not None) and not (entries and op.saved):
        raise TraceFileError(f"{where}: a value before edits is stored for an op that is not saved and edited")
    if entries and op.kind != "op":
        raise TraceFileError(f"{where}: only ops are edited, not {op.kind} nodes")
    array_ops = h.array_ops() if dec.framework and entries else None
    records, why = [], None
    for e in entries:
        _fields(e, EDIT_KEYS, f"{where} edit")
        kind, text = _get(e, "kind", str, where), _get(e, "text", str, where)
        if kind not in ("op", "module"):
            raise TraceFileError(f"{where}: unknown edit kind {kind!r}")
        path = dec.decode(e["path"])
        if not (isinstance(path, tuple) and all(isinstance(k, (int, str)) for k in path)):
            raise TraceFileError(f"{where}: an edit's path should be a list of keys")
        helpers: list[Any] = []
        for data in _get(e, "helpers", list, where):
            if data is None:
                helpers.append(None)
                continue
            _fields(data, frozenset({"name", "arguments"}), f"{where} edit helper")
            arguments = _check(data["arguments"], dict, where)
            try:
                helpers.append(
                    from_saved(_get(data, "name", str, where), {k: dec.decode(v) for k, v in arguments.items()})
                )
            except (TypeError, ValueError) as exc:
                raise TraceFileError(f"{where}: an edit helper does not load: {exc}") from None
        if not helpers:
            raise TraceFileError(f"{where}: an edit with no helper")
        site = None
        if array_ops is not None:
            site = Site(
                _name(e, "site", where),
                kind,
                _get(e, "func_name", str, where),
                _opt(e, "module", str, where),
                path,
                backend,
                array_ops,
                in_place=_get(e, "in_place", bool, where),
            )
        if None in helpers and why is None:
            why = (
                f"it was edited by {text[:120]}, whose helper a file cannot hold (a custom callable or one "
                f"holding another trace)"
            )
        records.append(EditRecord(_name(e, "site", where), kind, path, tuple(helpers), site))
    op.edits, op.pre_edit = tuple(records), pre_edit
    return why


def _values_agree(backend: str, ops: list[OpRecord], params: dict[str, ParamRecord]) -> None:
    """Every saved value has its recorded shape, every parameter value its record's: a replay starts from these."""
    for op in ops:
        if op.out is not None and op.shape is not None and value_shape(backend, op.out) != tuple(op.shape):
            raise TraceFileError(
                f"op {op.index} ({op.label}): its value has shape {value_shape(backend, op.out)}, "
                f"its record says {tuple(op.shape)}"
            )
    for p in params.values():
        if p.value is not None and value_shape(backend, p.value) != tuple(p.shape):
            raise TraceFileError(
                f"parameter {p.name}: its value has shape {value_shape(backend, p.value)}, "
                f"its record says {tuple(p.shape)}"
            )


def _known_passes(op: OpRecord, modules: dict[str, ModuleRecord], where: str) -> None:
    for label in op.module_outputs:
        path, _, n = label.rpartition(":")
        if not (
            path in modules and n.isdigit() and 1 <= int(n) <= len(modules[path].passes) and f"{path}:{int(n)}" == label
        ):
            raise TraceFileError(f"{where}: module output {label[:80]!r} names no recorded module pass")


def _check_refs(template: Any, i: int, ops: list[OpRecord], params: dict[str, ParamRecord], where: str) -> set[str]:
    """Every Ref must point before op ``i`` and into its value; every ParamRef must name a parameter.

    Returns the parameter names read."""
    used = set()
    for _, ref in tree.leaves(template, lambda x: isinstance(x, (Ref, ParamRef))):
        if isinstance(ref, ParamRef):
            used.add(_known(ref.name, params, "parameter", where))
            continue
        if not 0 <= ref.index < i:
            raise TraceFileError(f"{where}: an argument refers to op {ref.index}, which does not run before it")
        _check_path(ops[ref.index], ref, where)
    return used


def _check_path(op: OpRecord, ref: Ref, where: str) -> None:
    """A reference path names an element of the op's output structure (never a part of an array)."""
    if not all(type(k) in (int, str) for k in ref.path):
        raise TraceFileError(f"{where}: a reference path holds something other than positions and names")
    if not ref.path:
        return
    if op.out is not None:
        node = op.out
        for key in ref.path:
            kids = tree.children(node)
            found = [v for k, v in kids or () if k == key and type(k) is type(key)]
            if not found:
                raise TraceFileError(
                    f"{where}: a reference to {ref.path} inside op {ref.index}, which its value does not have"
                )
            node = found[0]
    elif op.shape is not None:  # not saved: the recorded shape has one entry per element of a structure
        structured = bool(op.shape) and not all(type(d) is int for d in op.shape)
        first = ref.path[0]
        if not structured or type(first) is int and not 0 <= first < len(op.shape):
            raise TraceFileError(
                f"{where}: a reference to {ref.path} inside op {ref.index}, "
                f"whose recorded shape {op.shape} has no such element"
            )


def _link(trace: Trace) -> None:
    """Parents, children, conditions, module op lists and back-references, as ``finish_trace`` makes them."""
    ops = trace.ops
    for op in ops:
        op.parents = [ops[i].label for i in op.parent_indices]
        op.conditions = [ops[i].label for i in op.condition_indices]
    for op in ops:
        for i in op.parent_indices:
            ops[i].children.append(op.label)
        for path, n in op.module_passes:
            trace.modules[path].passes[n - 1].ops.append(op.label)
    templates = [("the output", trace.output_template)]
    templates += [(f"module pass {mp.label}", mp.out_template) for m in trace.modules.values() for mp in m.passes]
    templates += [
        (f"module pass {mp.label}'s inputs", mp.in_template) for m in trace.modules.values() for mp in m.passes
    ]
    for where, template in templates:
        for _, ref in tree.leaves(template, lambda x: isinstance(x, (Ref, ParamRef))):
            if isinstance(ref, ParamRef):
                _known(ref.name, trace.params, "parameter", where)
            elif not 0 <= ref.index < len(ops):
                raise TraceFileError(f"{where} refers to op {ref.index}, which is not in the trace")
            else:
                _check_path(ops[ref.index], ref, where)
    ref = weakref.ref(trace)
    for op in ops:
        op.trace_ref = ref
    for module in trace.modules.values():
        for mp in module.passes:
            mp.trace_ref = ref


# -- strict readers: anything unexpected is a TraceFileError naming the record and field ----------
def _grads(op: OpRecord, o: dict[str, Any], dec: Decoder, where: str) -> None:
    """Fill ``op.grad_status`` and ``op.grad``: what save_grads= picked, and the gradient log_backward kept."""
    status = _opt(o, "grad_status", str, where)
    if status is not None and status not in GRAD_STATUSES:
        raise TraceFileError(f"{where}: unknown gradient status {status[:80]!r}")
    grad = dec.decode(o["grad"])
    if grad is not None and status != GRAD_SAVED:
        raise TraceFileError(f"{where}: it holds a gradient but its status is {status!r}")
    op.grad_status, op.grad = status, grad


def _call(dec: Decoder, data: Any, where: str) -> Any:
    """A module pass's recorded ``(args, kwargs)``, or None (not recorded)."""
    if data is None:
        return None
    inputs = dec.decode(data)
    if not (
        type(inputs) is tuple
        and len(inputs) == 2
        and type(inputs[0]) is tuple
        and type(inputs[1]) is dict
        and all(type(k) is str for k in inputs[1])
    ):
        raise TraceFileError(f"{where}: a module pass's inputs are not (args, kwargs)")
    return inputs


def _fields(d: Any, keys: frozenset[str], where: str) -> None:
    if not isinstance(d, dict) or set(d) != keys:
        found = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise TraceFileError(f"{where}: expected the fields {sorted(keys)}, found {str(found)[:200]}")


def _get(d: Any, key: str, types: Any, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise TraceFileError(f"{where}: field {key!r} is missing")
    value = d[key]
    exact = types in (int, bool)  # True is not a count, and 1 is not a flag
    if (type(value) is not types) if exact else not isinstance(value, types):
        raise TraceFileError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _name(d: Any, key: str, where: str) -> str:
    value = _get(d, key, str, where)
    if not value:
        raise TraceFileError(f"{where}: field {key!r} is empty")
    return value


def _count(d: Any, key: str, where: str, low: int = 0) -> int:
    value = _get(d, key, int, where)
    if not low <= value < MAX_COUNT:
        raise TraceFileError(f"{where}: field {key!r} is out of range ({value})")
    return value


def _opt(o: Any, key: str, types: Any, where: str) -> Any:
    value = o.get(key) if isinstance(o, dict) else None
    return None if value is None else _check(value, types, where)


def _check(value: Any, types: Any, where: str) -> Any:
    if not isinstance(value, types):
        raise TraceFileError(f"{where}: unexpected {type(value).__name__} {str(value)[:80]}")
    return value


def _known(name: Any, table: dict[str, Any], what: str, where: str) -> str:
    if not isinstance(name, str) or name not in table:
        raise TraceFileError(f"{where}: {str(name)[:80]!r} names no {what} of the trace")
    return name


def _str_keys(d: Any) -> bool:
    return isinstance(d, dict) and all(isinstance(k, str) for k in d)


def _positions(values: list[Any], where: str, below: int) -> tuple[int, ...]:
    if not all(type(v) is int and 0 <= v < below for v in values):
        raise TraceFileError(f"{where}: expected op positions before {below}")
    return tuple(values)


def _amount(value: Any, what: str, where: str) -> float | None:
    """None, or a finite non-negative number (a time, a FLOP count) that converts to a float."""
    if value is None:
        return None
    try:
        ok = type(value) in (int, float) and math.isfinite(float(value)) and value >= 0
    except OverflowError:
        ok = False
    if not ok:
        raise TraceFileError(f"{where}: {what} should be a finite number, at least 0, not {str(value)[:40]}")
    return value


def _schema(problem: str | None, where: str) -> None:
    """Refuse a record that breaks the schema (:mod:`torchlens_core.ir.schema`) the builder holds backends to."""
    if problem is not None:
        raise TraceFileError(f"{where}: {problem}")


def _sizes(shape: Any, where: str) -> tuple[int, ...]:
    _schema(sizes_problem(shape), where)
    return shape


def _shape(shape: Any, where: str) -> Any:
    """An op's shape: None, a list of sizes, or (several outputs) a list of those."""
    _schema(shape_problem(shape), where)
    return shape
