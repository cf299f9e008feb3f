"""``tl.save(trace, path)`` and ``tl.load(path)``: a versioned trace folder with no pickle in it.

``path`` is a folder holding three files (docs/saving.md has the details):

- ``manifest.json``: format name and version, the TorchLens version, and the
  size and SHA-256 of each other file;
- ``trace.json``: every record (ops, modules, parameters, templates), values
  encoded by :mod:`torchlens_core.store.encoding`;
- ``arrays.bin``: the raw bytes of every array, placed by ``trace.json``'s table.

Loading checks the format and version first, then both hashes, then every
field; whatever is wrong raises :class:`TraceFileError`. Nothing in a file is
unpickled or evaluated: calls are rebuilt by the backend's
``torchlens_decode_call``, which resolves names only inside its framework's
allow-listed namespaces.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
import weakref
from typing import TYPE_CHECKING, Any

from torchlens_core.backend.manager import backend_infos, hook
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, TraceFileError
from torchlens_core.ir.records import CodeLocation, ModulePass, ModuleRecord, OpRecord, ParamRecord, ParamRef, Ref
from torchlens_core.ir.trace import Trace

if TYPE_CHECKING:
    from torchlens_core.store.encoding import Decoder, Encoder

# torchlens_core.store.encoding (and with it NumPy) is imported on the first save or load, not with TorchLens.
FORMAT = "torchlens-trace"
FORMAT_VERSION = 1  # bump on any change a reader of the old version would misread
MANIFEST, RECORDS, ARRAYS = "manifest.json", "trace.json", "arrays.bin"
NOT_REPLAYABLE = "not_replayable"  # trace.notes key: {op label: why it cannot be replayed}


def save(trace: Any, path: str | os.PathLike[str]) -> pathlib.Path:
    """Write ``trace`` (a Trace, or a ``tl.record`` Recording) to the folder ``path``; returns it.

    The folder is created; one that already holds a saved trace is overwritten,
    any other non-empty folder or a file is refused. Values that cannot be
    saved (objects no backend knows) do not fail the save: the ops that need
    them load as not replayable.
    """
    if hasattr(trace, "to_trace"):
        trace = trace.to_trace()
    if not isinstance(trace, Trace):
        raise TypeError(f"tl.save saves a Trace, not {type(trace).__name__}")
    folder = pathlib.Path(os.fspath(path))
    if folder.exists() and not folder.is_dir():
        raise TraceFileError(f"cannot save to {str(folder)!r}: it is a file; tl.save writes a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MANIFEST).exists():
        raise TraceFileError(f"cannot save to {str(folder)!r}: it is a non-empty folder that holds no saved trace")
    from torchlens_core.store.encoding import Encoder

    h = hook()
    enc = Encoder(h, trace.backend)
    records = {
        "backend": trace.backend,
        "framework_version": _framework_version(trace.backend),
        "model_name": trace.model_name,
        "halted": trace.halted,
        "notes": enc.encode(trace.notes),
        "params": [_param_json(p, enc) for p in trace.params.values()],
        "modules": [_module_json(m, enc) for m in trace.modules.values()],
        "ops": [_op_json(op, enc, h, trace.backend) for op in trace.ops],
        "output_template": enc.encode(trace.output_template),
        "model_output": enc.encode(trace.model_output),
    }
    records["arrays"] = enc.arrays
    text = json.dumps(records, allow_nan=False, separators=(",", ":")).encode()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)  # a save that stops half-way leaves no loadable folder
    (folder / RECORDS).write_bytes(text)
    digest = hashlib.sha256()
    with open(folder / ARRAYS, "wb") as f:
        for chunk in enc.chunks:
            f.write(chunk)
            digest.update(chunk)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "torchlens_version": _version("torchlens"),
        "files": {RECORDS: {"size": len(text), "sha256": hashlib.sha256(text).hexdigest()},
                  ARRAYS: {"size": enc.size, "sha256": digest.hexdigest()}},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return folder


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a trace written by :func:`save`.

    Arrays load as the backend's arrays when its framework imports here, and
    the trace can then be replayed and audited; without the framework they load
    as NumPy arrays and everything but replay works. Raises
    :class:`TraceFileError` for a missing, truncated, tampered or newer-format file.
    """
    folder = pathlib.Path(os.fspath(path))
    if not (folder / MANIFEST).is_file():
        what = "does not exist" if not folder.exists() else f"holds no {MANIFEST}"
        raise TraceFileError(f"{str(folder)!r} {what}: tl.load reads the folder tl.save wrote")
    manifest = _read_json(folder / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TraceFileError(f"{str(folder / MANIFEST)!r} is not a TorchLens trace manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise TraceFileError(
            f"{str(folder)!r} is trace format version {version!r}; this TorchLens "
            f"({_version('torchlens')}) reads version {FORMAT_VERSION}"
            + (": upgrade TorchLens to load it" if type(version) is int and version > FORMAT_VERSION else ""))
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != {RECORDS, ARRAYS}:
        raise TraceFileError(f"{str(folder / MANIFEST)!r} should list {RECORDS} and {ARRAYS}")
    data = {name: _read_checked(folder, name, files[name]) for name in (RECORDS, ARRAYS)}
    records = _parse_json(bytes(data[RECORDS]), folder / RECORDS)
    try:
        return _build(records, data[ARRAYS])
    except TorchLensError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything a well-formed file cannot cause
        raise TraceFileError(f"{str(folder)!r} is malformed: {type(exc).__name__}: {exc}") from exc


# -- writing -----------------------------------------------------------------------------------
def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _framework_version(backend: str) -> str | None:
    info = next((i for i in backend_infos() if i.name == backend), None)
    return info.framework_version if info is not None else None


def _param_json(p: ParamRecord, enc: Encoder) -> dict[str, Any]:
    return {"name": p.name, "shape": enc.encode(tuple(p.shape)), "dtype": p.dtype, "numel": int(p.numel),
            "trainable": bool(p.trainable), "module": p.module, "is_buffer": bool(p.is_buffer),
            "value": enc.encode(p.value)}


def _module_json(m: ModuleRecord, enc: Encoder) -> dict[str, Any]:
    return {"path": m.path, "type_name": m.type_name, "params": list(m.params),
            "passes": [enc.encode(mp.out_template) for mp in m.passes]}


def _op_json(op: OpRecord, enc: Encoder, h: Any, backend: str) -> dict[str, Any]:
    call, why = None, None
    if op.kind == "op" and not op.meta.get("identity"):
        call, why = _encode_call(op, h, backend)
    try:
        cost = [op.flops, op.macs]
    except Exception:  # noqa: BLE001 - a FLOP formula that fails must not fail the save
        cost = [None, None]
    from torchlens_core.views.metadata import arg_names

    names = op.meta.get("arg_names") or (arg_names(op.call) if op.call is not None else None)
    before = enc.unsaved
    entry = {
        "kind": op.kind, "func_name": op.func_name, "label": op.label, "layer_label": op.layer_label,
        "func_ordinal": op.func_ordinal, "pass_num": op.pass_num, "num_passes": op.num_passes,
        "parent_indices": list(op.parent_indices), "condition_indices": list(op.condition_indices),
        "module_passes": [[path, n] for path, n in op.module_passes], "module_outputs": list(op.module_outputs),
        "params": list(op.params), "shape": enc.encode(op.shape), "dtype": op.dtype, "device": op.device,
        "source": op.source, "in_place": op.in_place, "saved": op.saved, "elapsed": enc.encode(op.elapsed),
        "code_context": [[c.file, c.line_number, c.func_name] for c in op.code_context],
        "cost": enc.encode(tuple(cost)), "arg_names": list(names) if names else None,
        "layer_key": enc.encode(op.layer_key),
        "call": call, "args": enc.encode(op.args), "kwargs": enc.encode(op.kwargs), "meta": enc.encode(op.meta),
    }
    entry["out"] = enc.encode(op.out)
    if why is None and enc.unsaved != before and op.kind == "op":
        why = "some of its arguments or metadata could not be saved"
    entry["not_replayable"] = why
    return entry


def _encode_call(op: OpRecord, h: Any, backend: str) -> tuple[Any, str | None]:
    from torchlens_core.store.encoding import is_json

    try:
        data = h.torchlens_encode_call(backend=backend, op=op)
    except Exception as exc:  # noqa: BLE001 - recorded as the reason, never fatal
        return None, f"encoding its call failed: {exc}"
    if data is None:
        return None, f"the {backend} backend cannot save the call {op.func_name!r}"
    if not is_json(data):
        return None, f"the {backend} backend encoded the call {op.func_name!r} as something that is not JSON"
    return data, None


# -- reading -----------------------------------------------------------------------------------
def _read_json(file: pathlib.Path) -> Any:
    return _parse_json(file.read_bytes(), file)


def _parse_json(raw: bytes, file: pathlib.Path) -> Any:
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TraceFileError(f"{str(file)!r} is not valid JSON (truncated or corrupted?): {exc}") from None


def _read_checked(folder: pathlib.Path, name: str, expected: Any) -> bytearray:
    file = folder / name
    if not file.is_file():
        raise TraceFileError(f"{str(file)!r} is missing: the saved trace is incomplete")
    if not (isinstance(expected, dict) and type(expected.get("size")) is int
            and isinstance(expected.get("sha256"), str)):
        raise TraceFileError(f"the manifest's entry for {name} is malformed")
    data = bytearray(file.read_bytes())  # a bytearray: arrays read from it are writable, without a copy
    if len(data) != expected["size"]:
        raise TraceFileError(f"{str(file)!r} has {len(data)} bytes, the manifest says {expected['size']}: "
                             "the file is truncated or was changed")
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise TraceFileError(f"{str(file)!r} does not match the SHA-256 in the manifest: it was changed or corrupted")
    return data


def _get(d: Any, key: str, types: Any, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise TraceFileError(f"{where}: field {key!r} is missing")
    value = d[key]
    if types is int and type(value) is not int or types is not int and not isinstance(value, types):
        raise TraceFileError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _build(records: Any, blob: bytearray) -> Trace:
    from torchlens_core.store.encoding import Decoder

    backend = _get(records, "backend", str, "trace")
    info = next((i for i in backend_infos() if i.name == backend), None)
    h = hook()
    dec = Decoder(h, backend, _get(records, "arrays", list, "trace"), blob,
                  framework=info is not None and info.available)
    params: dict[str, ParamRecord] = {}
    lossy_params: set[str] = set()
    for i, p in enumerate(_get(records, "params", list, "trace")):
        where = f"param {i}"
        dec.lossy = False
        rec = ParamRecord(name=_get(p, "name", str, where), shape=dec.decode(_get(p, "shape", list, where)),
                          dtype=_get(p, "dtype", str, where), numel=_get(p, "numel", int, where),
                          trainable=_get(p, "trainable", bool, where), module=_get(p, "module", str, where),
                          is_buffer=_get(p, "is_buffer", bool, where), value=dec.decode(p.get("value")))
        if dec.lossy:
            lossy_params.add(rec.name)
        params[rec.name] = rec
    modules: dict[str, ModuleRecord] = {}
    for i, m in enumerate(_get(records, "modules", list, "trace")):
        where = f"module {i}"
        path = _get(m, "path", str, where)
        names = _get(m, "params", list, where)
        rec = ModuleRecord(path=path, type_name=_get(m, "type_name", str, where),
                           params=[_check(n, str, where) for n in names])
        rec.passes = [ModulePass(path=path, pass_num=n + 1, out_template=dec.decode(t))
                      for n, t in enumerate(_get(m, "passes", list, where))]
        modules[path] = rec
    ops: list[OpRecord] = []
    why_not: dict[str, str] = {}
    for i, o in enumerate(_get(records, "ops", list, "trace")):
        op, why = _op(i, o, dec, h, backend, modules, lossy_params)
        ops.append(op)
        if why:
            why_not[op.label] = why
    notes = dec.decode(_get(records, "notes", dict, "trace"))
    if not isinstance(notes, dict):
        raise TraceFileError("trace: notes should be a dict")
    if not dec.framework:  # arrays are NumPy now: nothing replays
        why_not = {op.label: dec.why for op in ops if op.kind != "output"}
    if why_not:
        notes[NOT_REPLAYABLE] = why_not
    else:
        notes.pop(NOT_REPLAYABLE, None)
    trace = Trace(backend=backend, model_name=_get(records, "model_name", str, "trace"), ops=ops, modules=modules,
                  params=params, output_template=dec.decode(records.get("output_template")),
                  model_output=dec.decode(records.get("model_output")), notes=notes,
                  halted=_get(records, "halted", bool, "trace"))
    _link(trace)
    return trace


def _check(value: Any, types: Any, where: str) -> Any:
    if not isinstance(value, types):
        raise TraceFileError(f"{where}: unexpected {type(value).__name__} {value!r}")
    return value


def _ints(values: Any, where: str, below: int) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(type(v) is int and 0 <= v < below for v in values):
        raise TraceFileError(f"{where}: expected op positions before {below}")
    return tuple(values)


def _op(i: int, o: Any, dec: Decoder, h: Any, backend: str, modules: dict[str, ModuleRecord],
        lossy_params: set[str]) -> tuple[OpRecord, str | None]:
    where = f"op {i}"
    kind = _get(o, "kind", str, where)
    if kind not in ("input", "op", "output"):
        raise TraceFileError(f"{where}: unknown kind {kind!r}")
    module_passes = []
    for entry in _get(o, "module_passes", list, where):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and type(entry[1]) is int
                and entry[0] in modules and 1 <= entry[1] <= len(modules[entry[0]].passes)):
            raise TraceFileError(f"{where}: module pass {entry!r} names no recorded module pass")
        module_passes.append((entry[0], entry[1]))
    code = []
    for c in _get(o, "code_context", list, where):
        if not (isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and type(c[1]) is int
                and isinstance(c[2], str)):
            raise TraceFileError(f"{where}: malformed code location {c!r}")
        code.append(CodeLocation(c[0], c[1], c[2]))
    dec.lossy = False
    args, kwargs, meta = (dec.decode(_get(o, k, (list, dict), where)) for k in ("args", "kwargs", "meta"))
    lossy = dec.lossy
    if not (isinstance(args, tuple) and isinstance(kwargs, dict) and isinstance(meta, dict)):
        raise TraceFileError(f"{where}: args, kwargs and meta should be a tuple and two dicts")
    cost = dec.decode(o.get("cost"))
    if not (isinstance(cost, tuple) and len(cost) == 2 and all(c is None or type(c) in (int, float) for c in cost)):
        raise TraceFileError(f"{where}: cost should be [flops, macs]")
    names = o.get("arg_names")
    if names is not None:
        meta.setdefault("arg_names", tuple(_check(n, str, where) for n in _check(names, list, where)))
    for leaf in tree.leaves((args, kwargs), lambda x: isinstance(x, (Ref, ParamRef))):
        ref = leaf[1]
        if isinstance(ref, Ref) and not 0 <= ref.index < i:
            raise TraceFileError(f"{where}: an argument refers to op {ref.index}, which does not run before it")
    dec.lossy = False
    out = dec.decode(o.get("out"))
    op = OpRecord(
        index=i, kind=kind, func_name=_get(o, "func_name", str, where), args=args, kwargs=kwargs, out=out,
        shape=dec.decode(o.get("shape")), dtype=_opt(o, "dtype", str, where), device=_opt(o, "device", str, where),
        module_passes=tuple(module_passes), params=tuple(_check(n, str, where) for n in _get(o, "params", list, where)),
        source=_opt(o, "source", str, where), in_place=_get(o, "in_place", bool, where),
        code_context=tuple(code), elapsed=_opt_number(dec.decode(o.get("elapsed")), where),
        condition_indices=_ints(_get(o, "condition_indices", list, where), where, i),
        layer_key=dec.decode(o.get("layer_key")), meta=meta,
        parent_indices=_ints(_get(o, "parent_indices", list, where), where, i),
        saved=_get(o, "saved", bool, where), label=_get(o, "label", str, where),
        layer_label=_get(o, "layer_label", str, where), func_ordinal=_get(o, "func_ordinal", int, where),
        pass_num=_get(o, "pass_num", int, where), num_passes=_get(o, "num_passes", int, where),
        module_outputs=[_check(n, str, where) for n in _get(o, "module_outputs", list, where)],
        cost=cost)
    why = _opt(o, "not_replayable", str, where)
    if kind == "input" and dec.lossy:
        why = "its value could not be saved"
    if kind != "op" or meta.get("identity"):
        return op, why
    if why is None and lossy:
        why = "some of its arguments could not be rebuilt here"
    used = {p.name for _, p in tree.leaves((args, kwargs), lambda x: isinstance(x, ParamRef))}
    if why is None and used & lossy_params:
        why = f"it reads parameters that could not be rebuilt here: {sorted(used & lossy_params)}"
    data = o.get("call")
    if why is None and data is not None and dec.framework:
        try:
            op.call = h.torchlens_decode_call(backend=backend, data=data)
        except ImportError:
            dec.framework = False
            dec.why = f"{backend} is not importable here"
        if op.call is None:
            why = f"the {backend} backend cannot rebuild its call here"
    return op, why


def _opt(o: Any, key: str, types: Any, where: str) -> Any:
    value = o.get(key) if isinstance(o, dict) else None
    return None if value is None else _check(value, types, where)


def _opt_number(value: Any, where: str) -> float | None:
    if value is not None and type(value) not in (int, float):
        raise TraceFileError(f"{where}: elapsed should be a number")
    return value


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
    for template in [trace.output_template, *(mp.out_template for m in trace.modules.values() for mp in m.passes)]:
        for _, ref in tree.leaves(template, lambda x: isinstance(x, Ref)):
            if not 0 <= ref.index < len(ops):
                raise TraceFileError(f"an output refers to op {ref.index}, which is not in the trace")
            if ops[ref.index].out is not None:
                try:
                    tree.get(ops[ref.index].out, ref.path)
                except (IndexError, KeyError, TypeError, AttributeError):
                    raise TraceFileError(f"an output refers to {ref.path} inside op {ref.index}, "
                                         "which its value does not have") from None
    ref = weakref.ref(trace)
    for op in ops:
        op.trace_ref = ref
    for module in trace.modules.values():
        for mp in module.passes:
            mp.trace_ref = ref


__all__ = ["FORMAT_VERSION", "load", "save"]
