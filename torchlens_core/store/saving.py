"""``tl.save(trace, path)`` and ``tl.load(path)``: a versioned trace folder with no pickle in it.

``path`` is a folder holding three files (docs/saving.md has the details):

- ``manifest.json``: format name and version, the TorchLens version, and the
  size and SHA-256 of each other file;
- ``trace.json``: every record (ops, modules, parameters, templates), values
  encoded by :mod:`torchlens_core.store.encoding`;
- ``arrays.bin``: the raw bytes of every array, placed by ``trace.json``'s table.

Saving writes the three files beside the folder and swaps them in
(:mod:`torchlens_core.store.atomic`): an interrupted save leaves the old trace.
Loading reads the files as :mod:`torchlens_core.store.folder` says (plain
files only, sizes checked and bounded before reading, hashes checked before
anything is held, nothing read beyond what the manifest declares, trace.json's
parsing cost bounded), checks the format and version, both hashes, then every
field and reference (:mod:`torchlens_core.store.loading`); whatever is wrong
raises :class:`TraceFileError`. Nothing in a file is unpickled or evaluated:
calls are rebuilt by the backend's ``torchlens_decode_call``, which accepts
only its framework's pure array operations.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
from typing import TYPE_CHECKING, Any

from torchlens_core.backend.base import Backend
from torchlens_core.backend.manager import backend_infos, backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, TraceFileError
from torchlens_core.ir.progress import progress
from torchlens_core.ir.records import EditRecord, ModuleRecord, OpRecord, ParamRecord, ParamRef
from torchlens_core.ir.schema import UNSAVEABLE
from torchlens_core.ir.trace import Trace
from torchlens_core.store.atomic import write_folder

if TYPE_CHECKING:
    from torchlens_core.store.encoding import Encoder

# torchlens_core.store.encoding (and with it NumPy) is imported on the first save or load, not with TorchLens.
FORMAT = "torchlens-trace"
# Bump on any change a reader of the old version would misread. 2: a parameter's value may be null (not saved).
# 3: ops carry the edits intervene= made (``edits``, ``pre_edit``). 4: ops carry save_grads= (``grad_status``,
# ``grad``), so that a loaded trace runs log_backward as the one saved did. 5: modules carry each pass's inputs.
# 6: modules carry their configuration (``config``: print(op)'s Config line).
FORMAT_VERSION = 6
# 1: every parameter value present; 1 and 2: no op edited; 1 to 3: no gradients; 1 to 4: no module inputs;
# 1 to 5: no module configuration
READS_VERSIONS = (1, 2, 3, 4, 5, 6)
MANIFEST, RECORDS, ARRAYS = "manifest.json", "trace.json", "arrays.bin"
TRACE_FILES = frozenset({MANIFEST, RECORDS, ARRAYS})
NOT_REPLAYABLE = "not_replayable"  # trace.notes key: {op label: why it cannot be replayed}


def save(trace: Any, path: str | os.PathLike[str], *, params: bool = True) -> pathlib.Path:
    """Write ``trace`` (a Trace, or a ``tl.record`` Recording) to the folder ``path``; returns it.

    The folder is created; one that already holds a saved trace (and nothing
    else) is replaced, any other non-empty folder or a file is refused. The
    new trace is written beside the folder and swapped in at the end
    (:mod:`torchlens_core.store.atomic`): a save that is killed, or runs out
    of disk, leaves the folder holding the trace it held before, and an
    ``OSError`` becomes a :class:`TraceFileError` naming the path. Values that cannot be
    saved (objects no backend knows) do not fail the save: the ops that need
    them load as not replayable.

    Every parameter's record is saved (name, shape, dtype, counts), but values
    only for the parameters the saved ops read, which is all that replay needs
    (a halted trace of a few ops stores a few weights, not the model's).
    ``params=False`` saves no parameter values at all: the loaded trace still
    gives lookups, summary, tables, drawing and hash, and its ops that read
    parameters load as not replayable, naming them.
    """
    if hasattr(trace, "to_trace"):
        trace = trace.to_trace()
    if not isinstance(trace, Trace):
        raise TypeError(f"tl.save saves a Trace, not {type(trace).__name__}")
    unsaveable = trace.notes.get(UNSAVEABLE)
    if unsaveable:
        raise TraceFileError(
            f"tl.save refuses this trace, which tl.load would refuse: {unsaveable} The backend "
            f"plugin must record such fields as TraceBuilder.add_op says (PluginContractWarning)"
        )
    folder = pathlib.Path(os.fspath(path))
    target = _target(folder)
    from torchlens_core.store.encoding import Encoder

    h = backend_named(trace.backend, missing_ok=True)
    enc = Encoder(trace.backend)
    read = _params_read(trace) if params else set()
    if any(op.stored is not None for op in trace.ops):  # values in a folder (save_to=, lazy=True): one at a time
        from torchlens_core.store.stream import save_stored

        save_stored(trace, folder, read)
        return folder
    with progress("tl.save", total=len(trace.ops)) as bar:  # shown only past a few seconds
        ops = [_op_json(op, enc, h, trace.backend) for op in bar.each(trace.ops)]
    text = records_json(trace, enc, ops, read)
    digest = hashlib.sha256()
    for chunk in enc.chunks:
        digest.update(chunk)
    # Written beside the folder and swapped in: a save that stops anywhere leaves the old trace or the new one.
    write_folder(
        target,
        [(RECORDS, [text]), (ARRAYS, enc.chunks), (MANIFEST, [manifest_json(text, enc.size, digest)])],
        TRACE_FILES,
    )
    return folder


def records_json(trace: Trace, enc: Encoder, ops: list[dict[str, Any]], params_read: set[str]) -> bytes:
    """trace.json's bytes: the trace's records, its ops as ``ops`` (encoded already), and ``enc``'s array table
    (tl.save and tl.trace(save_to=) write the same file)."""
    records = {
        "backend": trace.backend,
        "framework_version": _framework_version(trace.backend),
        "model_name": trace.model_name,
        "halted": trace.halted,
        "notes": enc.encode(trace.notes),
        "params": [_param_json(p, enc, p.name in params_read) for p in trace.params.values()],
        "modules": [_module_json(m, enc) for m in trace.modules.values()],
        "ops": ops,
        "output_template": enc.encode(trace.output_template),
        "model_output": enc.encode(trace.model_output),
    }
    records["arrays"] = enc.arrays
    return json.dumps(records, allow_nan=False, separators=(",", ":")).encode()


def manifest_json(records: bytes, arrays_size: int, arrays_digest: Any) -> bytes:
    """manifest.json's bytes, for trace.json's ``records`` and an arrays.bin of that size and SHA-256 digest."""
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "torchlens_version": _version("torchlens"),
        "files": {
            RECORDS: {"size": len(records), "sha256": hashlib.sha256(records).hexdigest()},
            ARRAYS: {"size": arrays_size, "sha256": arrays_digest.hexdigest()},
        },
    }
    return (json.dumps(manifest, indent=1) + "\n").encode()


def _target(folder: pathlib.Path) -> pathlib.Path:
    """Where ``save`` writes: the folder (the one a link to a folder points to); refuses what it must not replace."""
    if folder.is_symlink() and folder.is_dir():
        folder = folder.resolve()  # the link stays; the trace is replaced where it points
    elif folder.is_symlink() and not folder.exists():
        raise TraceFileError(f"cannot save to {str(folder)!r}: it is a link to nothing; tl.save writes a folder")
    folder = pathlib.Path(os.path.abspath(folder))
    if folder.exists() and not folder.is_dir():
        raise TraceFileError(f"cannot save to {str(folder)!r}: it is a file; tl.save writes a folder")
    if not folder.is_dir():
        return folder
    try:
        names = set(os.listdir(folder))
    except OSError as exc:
        raise TraceFileError(f"cannot save to {str(folder)!r}: {exc.strerror or exc}") from None
    if names and MANIFEST not in names:
        raise TraceFileError(
            f"cannot save to {str(folder)!r}: it is a non-empty folder that holds no saved trace; "
            "pick another path, or empty the folder"
        )
    if names - TRACE_FILES:
        others = ", ".join(sorted(names - TRACE_FILES)[:5])
        raise TraceFileError(
            f"cannot save to {str(folder)!r}: besides a saved trace it holds other files ({others}), "
            "which replacing the folder would delete; move them out, or pick another path"
        )
    try:
        inside = os.path.commonpath([os.path.abspath(os.getcwd()), str(folder)]) == str(folder)
    except (OSError, ValueError):  # no working directory any more, or another drive
        inside = False
    if inside:
        raise TraceFileError(
            f"cannot save to {str(folder)!r}: it is (or holds) the working directory, which tl.save "
            "would have to replace; save from outside it"
        )
    return folder


def load(path: str | os.PathLike[str], *, lazy: bool = False) -> Trace:
    """Read a trace written by :func:`save` (or by ``tl.trace(..., save_to=path)``).

    ``lazy=True``: load the records only; each op's value is read from the
    folder's ``arrays.bin`` when it is read (``op.out``), and not kept, so a
    trace larger than memory opens (:mod:`torchlens_core.store.stream`).

    Arrays load as the backend's arrays when its framework imports here, and
    the trace can then be replayed and audited; without the framework they load
    as NumPy arrays and everything but replay works. Raises
    :class:`TraceFileError` for a missing, truncated, tampered, malformed or
    newer-format folder, for links or special files inside it, and for one
    whose loading would take memory out of proportion to its size or beyond
    this machine's (:mod:`torchlens_core.store.folder` sets the bounds and
    refuses before reading what it refuses).
    """
    from torchlens_core.store import folder as files

    root = pathlib.Path(os.fspath(path))
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise TraceFileError(f"{str(root)!r} {what}: tl.load reads the folder tl.save wrote")
    if not os.path.lexists(root / MANIFEST):
        raise TraceFileError(f"{str(root)!r} holds no {MANIFEST}: tl.load reads the folder tl.save wrote")
    manifest = _parse_json(files.read_manifest(root / MANIFEST), root / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TraceFileError(f"{str(root / MANIFEST)!r} is not a TorchLens trace manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version not in READS_VERSIONS:
        raise TraceFileError(
            f"{str(root)!r} is trace format version {version!r}; this TorchLens "
            f"({_version('torchlens')}) reads versions {READS_VERSIONS[0]} to {READS_VERSIONS[-1]}"
            + (": upgrade TorchLens to load it" if type(version) is int and version > FORMAT_VERSION else "")
        )
    entries = manifest.get("files")
    if not isinstance(entries, dict) or set(entries) != {RECORDS, ARRAYS}:
        raise TraceFileError(f"{str(root / MANIFEST)!r} should list {RECORDS} and {ARRAYS}")
    # What the manifest declares is bounded before any file is read (arrays.bin: it must fit in memory), and
    # trace.json's table must account for every byte of arrays.bin before arrays.bin is read.
    blob_size = files.declared_size(
        ARRAYS,
        entries[ARRAYS],
        None if lazy else files.memory_limit(),
        "loading needs it all in memory, and that is more than this machine's memory: "
        "tl.load(path, lazy=True) reads each value when it is read",
    )
    try:
        raw = files.read_checked(root, RECORDS, entries[RECORDS], limit=files.MAX_RECORDS_BYTES, cost=files.JsonCost())
        text = _utf8(raw, root / RECORDS)
        del raw  # the bytes are not needed while the objects are made
        records = _parse_json(text, root / RECORDS)
        del text
        from torchlens_core.store.encoding import check_table
        from torchlens_core.store.loading import build, check_fields

        if lazy:
            from torchlens_core.store.stream import open_lazy

            return open_lazy(root, entries[ARRAYS], records, version)
        check_table(check_fields(records)["arrays"], blob_size)
        blob = files.read_checked(root, ARRAYS, entries[ARRAYS])
        return build(records, blob, version)
    except TorchLensError:
        raise
    except MemoryError:  # within the bounds above, but more than this machine has free now
        raise TraceFileError(
            f"{str(root)!r} needs more memory to load than is free here ({RECORDS}: "
            f"{entries[RECORDS]['size']} bytes, {ARRAYS}: {blob_size} bytes): free memory, or load "
            "it on a larger machine"
        ) from None
    except Exception as exc:
        raise TraceFileError(f"{str(root)!r} is malformed: {type(exc).__name__}: {exc}") from exc


def _utf8(raw: bytes | bytearray, file: pathlib.Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFileError(f"{str(file)!r} is not valid JSON (truncated or corrupted?): {exc}") from None


def _parse_json(raw: bytes | str, file: pathlib.Path) -> Any:
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(raw if isinstance(raw, str) else _utf8(raw, file), parse_constant=no_constants)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise TraceFileError(f"{str(file)!r} is not valid JSON (truncated or corrupted?): {exc}") from None


# -- writing -----------------------------------------------------------------------------------
def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _framework_version(backend: str) -> str | None:
    info = next((i for i in backend_infos() if i.name == backend), None)
    return info.framework_version if info is not None else None


def _params_read(trace: Trace) -> set[str]:
    """The parameters the trace's ops and outputs read: the only values replay needs."""
    names: set[str] = set()
    templates = [trace.output_template, *(mp.out_template for m in trace.modules.values() for mp in m.passes)]
    templates += [mp.in_template for m in trace.modules.values() for mp in m.passes]
    for op in trace.ops:
        names.update(op.params)
        templates.append((op.args, op.kwargs))
    for template in templates:
        names.update(ref.name for _, ref in tree.leaves(template, lambda x: isinstance(x, ParamRef)))
    return names


def _param_json(p: ParamRecord, enc: Encoder, with_value: bool) -> dict[str, Any]:
    return {
        "name": p.name,
        "shape": enc.encode(tuple(p.shape)),
        "dtype": p.dtype,
        "numel": int(p.numel),
        "trainable": bool(p.trainable),
        "module": p.module,
        "is_buffer": bool(p.is_buffer),
        "value": enc.encode(p.value) if with_value else None,
    }


def _module_json(m: ModuleRecord, enc: Encoder) -> dict[str, Any]:
    return {
        "path": m.path,
        "type_name": m.type_name,
        "params": list(m.params),
        "passes": [enc.encode(mp.out_template) for mp in m.passes],
        "inputs": [enc.encode(mp.in_template) for mp in m.passes],
        "config": _config_json(m),
    }


_PLAIN = (bool, int, float, str, type(None))


def _config_json(m: ModuleRecord) -> dict[str, Any] | None:
    """The module's configuration as JSON: its plain settings (numbers, flags, names, and tuples of them)."""
    try:
        config = m.config  # worked out now if the backend deferred it
    except Exception:  # noqa: BLE001 - a module that cannot say its configuration must not fail the save
        return None
    if not isinstance(config, dict):
        return None
    kept: dict[str, Any] = {}
    for name, value in config.items():
        items = value if isinstance(value, (tuple, list)) else (value,)
        if isinstance(name, str) and all(type(v) in _PLAIN and v == v and v not in (_INF, -_INF) for v in items):
            kept[name] = list(value) if isinstance(value, (tuple, list)) else value
    return kept


_INF = float("inf")


def _op_json(op: OpRecord, enc: Encoder, h: Backend, backend: str) -> dict[str, Any]:
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
        "kind": op.kind,
        "func_name": op.func_name,
        "label": op.label,
        "layer_label": op.layer_label,
        "func_ordinal": op.func_ordinal,
        "pass_num": op.pass_num,
        "num_passes": op.num_passes,
        "parent_indices": list(op.parent_indices),
        "condition_indices": list(op.condition_indices),
        "module_passes": [[path, n] for path, n in op.module_passes],
        "module_outputs": list(op.module_outputs),
        "params": list(op.params),
        "shape": enc.encode(op.shape),
        "dtype": op.dtype,
        "device": op.device,
        "source": op.source,
        "in_place": op.in_place,
        "saved": op.saved,
        "elapsed": enc.encode(op.elapsed),
        "code_context": [[c.file, c.line_number, c.func_name] for c in op.code_context],
        "cost": enc.encode(tuple(cost)),
        "arg_names": list(names) if names else None,
        "layer_key": enc.encode(op.layer_key),
        "call": call,
        "args": enc.encode(op.args),
        "kwargs": enc.encode(op.kwargs),
        "meta": enc.encode(op.meta),
    }
    entry["out"] = enc.encode(op.out)
    entry["pre_edit"] = enc.encode(op.pre_edit)
    entry["edits"] = [_edit_json(edit, enc) for edit in op.edits]
    entry["grad_status"] = op.grad_status
    entry["grad"] = enc.encode(op.grad)
    if why is None and enc.unsaved != before and op.kind == "op":
        why = "some of its arguments or metadata could not be saved"
    entry["not_replayable"] = why
    return entry


def _edit_json(edit: EditRecord, enc: Encoder) -> dict[str, Any]:
    """An edit as data: where, and each helper by name and arguments (None: not a helper a file can hold)."""
    from torchlens_core.steer.helpers import saved_form

    site = edit.where
    helpers = []
    for helper in edit.helpers:
        form = saved_form(helper)
        helpers.append(
            None if form is None else {"name": form[0], "arguments": {k: enc.encode(v) for k, v in form[1].items()}}
        )
    return {
        "site": edit.site,
        "kind": edit.kind,
        "path": enc.encode(edit.path),
        "helpers": helpers,
        "text": repr(edit),
        "func_name": site.func_name,
        "module": site.module,
        "in_place": site.in_place,
    }


def _encode_call(op: OpRecord, h: Backend, backend: str) -> tuple[Any, str | None]:
    from torchlens_core.store.encoding import is_json

    try:
        data = h.encode_call(op)
    except Exception as exc:  # noqa: BLE001 - recorded as the reason, never fatal
        return None, f"encoding its call failed: {exc}"
    if data is None:
        return None, f"the {backend} backend cannot save the call {op.func_name!r}"
    if not is_json(data):
        return None, f"the {backend} backend encoded the call {op.func_name!r} as something that is not JSON"
    return data, None


__all__ = ["FORMAT_VERSION", "load", "save"]
