"""``tl.trace(..., save_to=path)``: each kept value written to a trace folder as it is produced.

The folder is the one ``tl.save`` writes (:mod:`torchlens_core.store.saving`):
``arrays.bin`` is appended to while the forward runs, one value at a time, as
its op is recorded and ``save=`` has kept it (a value ``save=`` cannot judge yet
waits until it can). Each value is copied to the host (NumPy bytes) and
hashed as it is written, and only its place in the file stays in memory: the op
record's ``stored`` (a :class:`StoredValue`), from which ``op.out`` and
``op.pre_edit`` are read back, one value per read, when read. On a GPU the
trace then holds no device memory of its own. ``trace.json`` and the manifest
(sizes and SHA-256 of both files) are written when the capture has finished.

Like ``tl.save``, everything is written into a hidden sibling of the folder
(:mod:`torchlens_core.store.atomic`), swapped into place only once complete: a
capture that raises, or a process that is killed, leaves the folder as it was
(the trace saved there before, or nothing), never a half-written trace.

``tl.load(path, lazy=True)`` opens such a folder (any trace folder) the same
way: records in memory, values read from ``arrays.bin`` when read
(:func:`open_lazy`), so a trace larger than memory can be reopened.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import queue
import secrets
import shutil
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from torchlens_core.backend.manager import backend_infos, backend_named
from torchlens_core.capture.policy import SAVE_TO_OPENERS
from torchlens_core.ir.errors import TorchLensError, TraceFileError
from torchlens_core.ir.schema import UNSAVEABLE
from torchlens_core.store import atomic
from torchlens_core.store.encoding import Decoder, Encoder
from torchlens_core.store.saving import (
    ARRAYS,
    MANIFEST,
    RECORDS,
    TRACE_FILES,
    _op_json,
    _params_read,
    _target,
    manifest_json,
    records_json,
)

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace

BUFFER = 1 << 20  # small values are gathered up to this many bytes into one write
IN_FLIGHT = 16 << 20  # bytes handed to the writing thread and not yet on disk, at most


class _Writer:
    """Writes ``arrays.bin`` in a thread of its own, so that the forward goes on while the disk works.

    The capture's thread copies each value and hands its bytes over, to be hashed and written here
    (at most :data:`IN_FLIGHT` bytes wait: a slower disk slows the forward
    rather than filling memory); the first error writing is raised in the
    capture's thread at its next hand-over, read or commit.
    """

    def __init__(self, file: Any, digest: Any) -> None:
        self.file, self.digest = file, digest
        self.chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.waiting = 0
        self.error: BaseException | None = None
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="torchlens save_to writer", daemon=True)
        self.thread.start()

    def put(self, chunk: bytes) -> None:
        with self.changed:
            while self.waiting > IN_FLIGHT and self.error is None:
                self.changed.wait()
            self._raise()
            self.waiting += len(chunk)
        self.chunks.put(chunk)

    def drain(self) -> None:
        """Return once everything handed over is written (or raise what writing it raised)."""
        with self.changed:
            while self.waiting and self.error is None:
                self.changed.wait()
            self._raise()

    def close(self) -> None:
        self.chunks.put(None)
        self.thread.join()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while (chunk := self.chunks.get()) is not None:
            try:
                if self.error is None:
                    self.digest.update(chunk)  # (hashlib and the write let the capture's thread run meanwhile)
                    view, done = memoryview(chunk), 0
                    while done < len(chunk):  # an unbuffered write may write part (Linux: at most ~2 GiB)
                        done += self.file.write(view[done:])
            except BaseException as exc:  # noqa: BLE001 - handed to the capture's thread
                self.error = exc
            with self.changed:
                self.waiting -= len(chunk)
                self.changed.notify_all()


class Reader:
    """Reads spans of one open ``arrays.bin``; the file stays readable after it is renamed or replaced."""

    def __init__(self, fd: int, size: int = 0, before_read: Any = None, stamp: Any = None) -> None:
        self.fd, self.size, self.before_read = fd, size, before_read
        self.stamp = stamp  # the complete file's (size, mtime): a read of a file changed since then is refused
        self._closer = weakref.finalize(self, os.close, fd)

    def __len__(self) -> int:
        return self.size

    def seal(self) -> None:
        """The file is complete: from now on each read first checks it is still as it is now."""
        self.stamp = _stamp(os.fstat(self.fd))

    def read(self, offset: int, nbytes: int) -> bytearray:
        if self.before_read is not None:
            self.before_read()  # what is still buffered, written first
        if self.stamp is not None:
            # The descriptor is the file's, not its path's: one renamed or replaced by another still reads as
            # it was, but one copied over or truncated in place reads other bytes, which its hash no longer
            # guards. Its size or modification time then differs (an fstat: a microsecond a read).
            now = _stamp(os.fstat(self.fd))
            if now[0] != self.stamp[0]:
                raise TraceFileError(
                    f"arrays.bin was changed after the trace was opened: it has {now[0]} bytes, it had {self.stamp[0]}"
                )
            if now != self.stamp:
                raise TraceFileError(
                    "arrays.bin was rewritten after the trace was opened (its modification time changed)"
                )
        buffer = bytearray(nbytes)  # writable: frameworks take NumPy arrays on it without a copy
        view = memoryview(buffer)
        done = 0
        while done < nbytes:
            n = _read_at(self.fd, view[done:], offset + done)
            if not n:
                raise TraceFileError(
                    f"arrays.bin ended at byte {offset + done}, before the value at {offset} "
                    f"({nbytes} bytes): the file was truncated after the trace was opened"
                )
            done += n
        return buffer

    def close(self) -> None:
        self._closer()


def _stamp(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def _read_at(fd: int, into: memoryview, offset: int) -> int:
    """Read into ``into`` from ``offset`` of ``fd``; the bytes read (0 at the end of the file)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [into], offset)
    with _SEEK:  # (Windows has no positioned read: seek and read, one reader at a time)
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, len(into))
    into[: len(data)] = data
    return len(data)


_SEEK = threading.Lock()


class LazyDecoder(Decoder):
    """A :class:`Decoder` that reads each array's bytes from the file when it is decoded, and keeps none."""

    def __init__(self, backend: str, table: Any, blob: Reader, framework: bool) -> None:
        super().__init__(backend, table, blob, framework)  # type: ignore[arg-type] # (len(blob) is its size)

    def raw(self, entry: dict[str, Any], storage: np.dtype) -> np.ndarray:
        return np.frombuffer(self.blob.read(entry["offset"], entry["nbytes"]), dtype=storage)  # type: ignore[attr-defined]

    def array(self, row: int) -> Any:
        value = super().array(row)
        self.cache.pop(row, None)  # the next read reads the file again: values are not held
        return value


class StoredValue:
    """Where an op's value (``out``) and its value before edits (``pre_edit``) lie in ``arrays.bin``.

    Each is the value's encoding in ``trace.json`` (``{"array": row}``, a list
    of those for several outputs...) or None. ``source`` is the :class:`Stream`
    writing the file, or the :class:`Opened` folder reading it. ``record`` is
    the op's record (a weak reference): each value read is checked against
    its shape and dtype, as ``tl.load`` checks every value it loads, and a
    value that cannot be read, or is not what the record says, raises a
    :class:`TraceFileError` naming the op, never a wrong value.
    """

    __slots__ = ("out", "pre_edit", "source", "record")

    def __init__(self, source: Any, out: Any, pre_edit: Any, record: weakref.ref[OpRecord] | None = None) -> None:
        self.source, self.out, self.pre_edit, self.record = source, out, pre_edit, record

    def get(self, name: str) -> Any:
        data = getattr(self, name)
        if data is None:
            return None
        try:
            value = self.source.decode(data)
        except TraceFileError as exc:
            raise self._error(name, str(exc)) from None
        op = self.record() if self.record is not None else None
        if name == "out" and op is not None:
            wrong = _disagreement(self.source.backend, value, op.shape, op.dtype)
            if wrong:
                raise self._error(name, f"{wrong}: the folder's trace.json and arrays.bin do not belong together")
        return value

    def _error(self, name: str, why: str) -> TraceFileError:
        op = self.record() if self.record is not None else None
        index, label = (op.index, op.label) if op is not None else ("?", "?")
        what = "value" if name == "out" else "value before edits"
        return TraceFileError(
            f"op {index} ({label}): its {what} cannot be read from {self.source}: {why}. The "
            f"values stay in that folder's arrays.bin, read when read: load the folder again "
            f"(tl.load checks it against its manifest), or, if it was changed, save the trace "
            f"again (tl.save, or tl.trace(..., save_to=))"
        )

    def put(self, name: str, value: Any) -> tuple[StoredValue | None, Any]:
        """A value given to ``op.<name>``: ``(where the op's values lie now, what stays in memory)``.

        While the capture writes, the value is written too (an edit at a
        module's exit, say); afterwards (the folder is complete) it stays in
        memory and the stored one is forgotten.
        """
        data = None
        if value is not None and self.source.writing:
            data, value = self.source.encode(value), None
        fields = {"out": self.out, "pre_edit": self.pre_edit, name: data}
        if fields["out"] is None and fields["pre_edit"] is None:
            return None, value
        return StoredValue(self.source, fields["out"], fields["pre_edit"], self.record), value

    def __repr__(self) -> str:
        return f"<StoredValue in {self.source}>"


def record_of(op: OpRecord) -> weakref.ref[OpRecord]:
    """What a value read for ``op`` is checked against, and named by: the op's record, as it is when read (a
    weak reference: the record holds its StoredValue)."""
    return weakref.ref(op)


def _disagreement(backend: str, value: Any, shape: Any, dtype: str | None) -> str | None:
    """How ``value`` differs from its op's recorded shape and dtype (None: it agrees), as tl.load checks.

    The dtype is checked for a single array rebuilt as the backend's own (one loaded as NumPy, with no
    framework here, may be a wider dtype: bfloat16 as float32).
    """
    from torchlens_core.replay.checked import value_shape

    if shape is None:
        return None
    found = value_shape(backend, value)
    if found != tuple(shape):
        return f"the value read has shape {found}, its record says {tuple(shape)}"
    info = backend_named(backend, missing_ok=True).array_info(value) if dtype is not None else None
    if (
        info is not None
        and isinstance(shape, (list, tuple))
        and all(type(d) is int for d in shape)
        and info[1] != dtype
    ):
        return f"the value read has dtype {info[1]}, its record says {dtype}"
    return None


class Stream:
    """The trace folder a capture with ``save_to=`` writes; made (and the path checked) before the forward runs."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(os.fspath(path))
        self.folder = _target(self.path)  # a file, a folder holding other things, the working directory: refused
        parent, name = self.folder.parent, self.folder.name
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise atomic._error(self.folder, exc, f"creating {str(parent)!r}", replacing=False) from None
        atomic._remove_stale(parent, name, TRACE_FILES)
        self.temp = parent / f".{name[: atomic._NAME_KEEP]}{atomic.TEMP}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(self.temp)
            self.file = open(self.temp / ARRAYS, "xb", buffering=0)
            fd = os.open(self.temp / ARRAYS, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            shutil.rmtree(self.temp, ignore_errors=True)
            raise atomic._error(
                self.folder, exc, f"creating {str(self.temp)!r} beside it", os.path.isdir(self.folder)
            ) from None
        self.digest = hashlib.sha256()
        self.gathered = bytearray()  # small values, written together
        self.writer = _Writer(self.file, self.digest)
        self.reader = Reader(fd, before_read=self._flush)
        self.writing = True
        self.enc: Encoder | None = None
        self.dec: LazyDecoder | None = None

    def __repr__(self) -> str:
        return f"{str(self.path)!r}"

    # -- while the forward runs -------------------------------------------------------------------
    def begin(self, backend: str) -> None:
        """The capture's backend is known: its hooks encode the values."""
        self.enc = Encoder(backend)
        self.enc.chunks = _Sink(self)  # type: ignore[assignment] # chunks go to the file, not to a list
        info = next((i for i in backend_infos() if i.name == backend), None)
        self.dec = LazyDecoder(backend, self.enc.arrays, self.reader, info is not None and info.available)

    def store(self, op: OpRecord, last: bool = False) -> None:
        """Write ``op``'s value (and its value before edits) now; the op keeps only where they lie.

        A value holding something that is not an array yet (a placeholder a
        backend fills at the end of the forward, as JAX's compiled capture
        does) stays in memory until the ``last`` call, at the commit.
        """
        out, pre_edit = op.out, op.pre_edit
        if out is None and pre_edit is None:
            return
        assert self.enc is not None, "Stream.begin was not called"
        before = self.enc.unsaved
        data_out = self.encode(out) if out is not None else None
        data_pre = self.encode(pre_edit) if pre_edit is not None else None
        if self.enc.unsaved != before and not last:
            return  # (what was written of it stays unused in the file)
        op.out = op.pre_edit = None  # (before ``stored`` is set: with it, these would be written)
        op.stored = StoredValue(self, data_out, data_pre, record_of(op))

    def encode(self, value: Any) -> Any:
        assert self.enc is not None, "Stream.begin was not called"
        try:
            data = self.enc.encode(value)
        except OSError as exc:
            raise atomic._error(self.folder, exc, f"writing {ARRAYS}", os.path.isdir(self.folder)) from None
        finally:
            self.enc.seen.clear()  # one copy per value: holding the arrays to spot repeats would hold them all
        return data

    @property
    def backend(self) -> str:
        assert self.dec is not None
        return self.dec.backend

    def decode(self, data: Any) -> Any:
        assert self.dec is not None
        self.dec.table = self.enc.arrays if self.enc is not None else self.dec.table
        return self.dec.decode(data)

    def _write(self, chunk: bytes | memoryview) -> None:
        self.reader.size += len(chunk)
        if len(chunk) < BUFFER:
            self.gathered += chunk
            if len(self.gathered) < BUFFER:
                return
        try:
            self._hand_over()
            if len(chunk) >= BUFFER:
                self.writer.put(chunk if isinstance(chunk, bytes) else bytes(chunk))
        except OSError as exc:
            raise atomic._error(self.folder, exc, f"writing {ARRAYS}", os.path.isdir(self.folder)) from None

    def _hand_over(self) -> None:
        if self.gathered:
            chunk, self.gathered = bytes(self.gathered), bytearray()
            self.writer.put(chunk)

    def _flush(self) -> None:
        if self.writing:
            self._hand_over()
            self.writer.drain()

    # -- at the end -----------------------------------------------------------------------------
    def commit(self, trace: Trace) -> None:
        """Write ``trace.json`` and the manifest, and put the complete folder in place of ``save_to``."""
        if self.enc is None:  # a backend whose builder never saw the options: every value is written now
            self.begin(trace.backend)
        enc = self.enc
        assert enc is not None and self.writing
        unsaveable = trace.notes.get(UNSAVEABLE)
        if unsaveable:
            raise TraceFileError(f"save_to= cannot write this trace, which tl.load would refuse: {unsaveable}")
        for op in trace.ops:  # values kept until the end (held for save=, or recorded without the builder)
            if op.kind == "op" and op.stored is None:
                self.store(op, last=True)
        h = backend_named(trace.backend, missing_ok=True)
        read = _params_read(trace)
        ops = []
        try:
            for op in trace.ops:
                stored = op.stored
                op.stored = None  # encoded as no value here; the stored encodings are put in below
                try:
                    entry = _op_json(op, enc, h, trace.backend)
                finally:
                    op.stored = stored
                if stored is not None:
                    entry["out"], entry["pre_edit"] = stored.out, stored.pre_edit
                ops.append(entry)
            text = records_json(trace, enc, ops, read)
        except OSError as exc:
            raise atomic._error(self.folder, exc, "finishing the trace folder", os.path.isdir(self.folder)) from None
        self.finish(text)

    def finish(self, text: bytes) -> None:
        """Write ``trace.json`` (``text``, whose array table is this stream's) and the manifest, and swap the
        complete folder in."""
        enc = self.enc
        assert enc is not None and self.writing
        try:
            enc.seen.clear()
            self._flush()
            self.writer.close()  # every byte written, and hashed
            os.fsync(self.file.fileno())
            self.file.close()
            self.reader.seal()
            atomic._write_file(self.temp / RECORDS, [text])
            atomic._write_file(self.temp / MANIFEST, [manifest_json(text, enc.size, self.digest)])
            replacing = os.path.isdir(self.folder)
            if replacing:
                os.chmod(self.temp, os.stat(self.folder).st_mode & 0o7777)
            old = atomic._swap(self.temp, self.folder)
        except OSError as exc:
            raise atomic._error(self.folder, exc, "finishing the trace folder", os.path.isdir(self.folder)) from None
        self.writing = False
        self.enc = None
        atomic._sync_dir(self.folder.parent)
        if old is not None:
            atomic._remove_if_own(old, TRACE_FILES)

    def abort(self) -> None:
        """The capture failed: remove what was written (the folder at ``save_to`` is as it was)."""
        self.writing = False
        self.enc = None
        self.writer.close()  # (what it still had to write is written, then the thread ends)
        try:
            self.file.close()
        except OSError:
            pass
        self.reader.close()
        shutil.rmtree(self.temp, ignore_errors=True)


class _Sink:
    """``Encoder.chunks`` of a :class:`Stream`: each chunk is written (buffered) and hashed, not kept."""

    def __init__(self, stream: Stream) -> None:
        self.write = stream._write

    def append(self, chunk: bytes | memoryview) -> None:
        self.write(chunk)


class Opened:
    """A trace folder opened with ``tl.load(path, lazy=True)``: its values, read from ``arrays.bin`` when read."""

    writing = False

    def __init__(self, root: pathlib.Path, decoder: LazyDecoder) -> None:
        self.root, self.dec = root, decoder

    @property
    def backend(self) -> str:
        return self.dec.backend

    def decode(self, data: Any) -> Any:
        return self.dec.decode(data)

    def __repr__(self) -> str:
        return f"{str(self.root)!r}"


def open_lazy(root: pathlib.Path, entry: Any, records: Any, version: int) -> Trace:
    """The trace of ``records`` (checked trace.json) whose op values stay in ``root/arrays.bin`` until read.

    ``arrays.bin`` is hashed (a chunk at a time, never held) and checked
    against the manifest's ``entry`` before anything is built; each value is
    then read from the open file when read.
    """
    from torchlens_core.store import folder as files
    from torchlens_core.store.encoding import check_table
    from torchlens_core.store.loading import build, check_fields

    size = files.declared_size(ARRAYS, entry)
    check_table(check_fields(records)["arrays"], size)
    file = root / ARRAYS
    f, actual = files._open_plain(file)
    try:
        stamp = _stamp(os.fstat(f.fileno()))  # before hashing: a change from here on is refused at each read
        if actual != size:
            raise TraceFileError(
                f"{str(file)!r} has {actual} bytes, the manifest says {size}: the file is truncated or was changed"
            )
        if files._hash_streamed(f, size, file, None) != entry["sha256"]:
            raise TraceFileError(
                f"{str(file)!r} does not match the SHA-256 in the manifest: it was changed or corrupted"
            )
        reader = Reader(os.dup(f.fileno()), size, stamp=stamp)
    finally:
        f.close()
    kept = []
    for i, o in enumerate(records["ops"]):  # op values are set aside: build reads only the rest
        if not isinstance(o, dict) or "out" not in o:
            raise TraceFileError(f"op {i}: field 'out' is missing")
        out, pre_edit = o["out"], o.get("pre_edit")
        if out is not None and o.get("saved") is not True:
            raise TraceFileError(f"op {i}: a value is stored for an op marked as not saved")
        if o.get("kind") == "op" and (out is not None or pre_edit is not None):
            o["out"] = None
            if pre_edit is not None:
                o["pre_edit"] = None
            kept.append((i, out, pre_edit))
    try:
        trace = build(records, reader, version, decoder=LazyDecoder)  # type: ignore[arg-type]
    except TorchLensError:
        raise
    except Exception as exc:
        raise TraceFileError(f"{str(root)!r} is malformed: {type(exc).__name__}: {exc}") from exc
    info = next((i for i in backend_infos() if i.name == trace.backend), None)
    source = Opened(root, LazyDecoder(trace.backend, records["arrays"], reader, info is not None and info.available))
    for i, out, pre_edit in kept:
        op = trace.ops[i]
        if pre_edit is not None and not op.edits:
            raise TraceFileError(f"op {i}: a value before edits is stored for an op that is not saved and edited")
        op.stored = StoredValue(source, out, pre_edit, record_of(op))
    return trace


def save_stored(trace: Trace, path: str | os.PathLike[str], read: set[str]) -> None:
    """``tl.save`` of a trace whose values lie in a folder (``tl.trace(save_to=)``, ``tl.load(lazy=True)``):
    each value read, written and let go in turn, as ``save_to=`` writes them, so that at most one value (and
    :data:`IN_FLIGHT` bytes on their way to the disk) is in memory, never the whole file; written beside the
    folder and swapped in, as ``tl.save`` does. ``read``: the parameters whose values are saved."""
    from torchlens_core.ir.progress import progress

    stream = Stream(path)
    try:
        stream.begin(trace.backend)
        enc = stream.enc
        assert enc is not None
        h = backend_named(trace.backend, missing_ok=True)
        ops = []
        with progress("tl.save", total=len(trace.ops)) as bar:  # shown only past a few seconds
            for op in bar.each(trace.ops):
                stored = op.stored
                op.stored = None  # encoded as no value here; the stored ones are copied one at a time below
                try:
                    entry = _op_json(op, enc, h, trace.backend)
                finally:
                    op.stored = stored
                for name in ("out", "pre_edit") if stored is not None else ():
                    if getattr(stored, name) is not None:  # (else a value given since, in memory: encoded above)
                        entry[name] = stream.encode(stored.get(name))
                ops.append(entry)
        text = records_json(trace, enc, ops, read)
    except OSError as exc:
        stream.abort()
        raise atomic._error(stream.folder, exc, f"writing {ARRAYS}", os.path.isdir(stream.folder)) from None
    except BaseException:
        stream.abort()
        raise
    try:
        stream.finish(text)
    except BaseException:
        stream.abort()
        raise


SAVE_TO_OPENERS.append(Stream)  # tl.trace(save_to=) opens its folder with this (torchlens_core.capture.policy)
