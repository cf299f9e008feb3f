"""Reading a trace folder's files as ``tl.load`` must: never more than the manifest declares.

A folder may come from anywhere, so each file is opened only if it is a plain
file of the folder itself (no symbolic link, FIFO, device or directory: a link
would let a folder present some other file's bytes as its tensors, a FIFO would
block the reader), its size is compared with the manifest's *before* anything
is read, and it is read in bounded chunks into one buffer of exactly that size
while its SHA-256 is computed. So a huge or endless file costs nothing, and
the bytes that are parsed are the bytes that were hashed (a file changed while
it is read fails the hash; nothing is memory-mapped, which a truncation could
turn into a crash).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import stat
from typing import Any, BinaryIO

from torchlens_core.ir.errors import TraceFileError

MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes
# trace.json is parsed into Python objects several times its size: a cap keeps a hostile
# manifest from declaring gigabytes of JSON. Real traces are far below it (about 2 KB per op).
MAX_RECORDS_BYTES = 1 << 30
_CHUNK = 1 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in after the check must not block the open


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _open_plain(file: pathlib.Path) -> tuple[BinaryIO, int]:
    """``file`` opened unbuffered, and its size; TraceFileError unless it is a plain file, not a link."""
    try:
        before = os.lstat(file)
    except FileNotFoundError:
        raise TraceFileError(f"{str(file)!r} is missing: the saved trace is incomplete") from None
    except OSError as exc:
        raise TraceFileError(f"{str(file)!r} cannot be read: {exc}") from None
    if not stat.S_ISREG(before.st_mode):
        raise TraceFileError(f"{str(file)!r} is {_kind(before.st_mode)}; tl.load reads only the plain files "
                             "tl.save wrote (links and special files in a trace folder are refused)")
    try:
        fd = os.open(file, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | getattr(os, "O_BINARY", 0))
    except OSError as exc:  # ELOOP: it became a link after the check
        raise TraceFileError(f"{str(file)!r} cannot be opened as a plain file: {exc}") from None
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise TraceFileError(f"{str(file)!r} was replaced while it was being opened")
    return os.fdopen(fd, "rb", buffering=0), after.st_size


def _read_exactly(f: BinaryIO, size: int, file: pathlib.Path) -> tuple[bytearray, str]:
    """``size`` bytes of ``f`` in chunks, and their SHA-256; refuses a file that turns out longer or shorter."""
    buffer = bytearray(size)  # writable: NumPy arrays on it can be handed to frameworks without a copy
    view = memoryview(buffer)
    digest = hashlib.sha256()
    done = 0
    while done < size:
        n = f.readinto(view[done:done + _CHUNK])  # type: ignore[attr-defined]
        if not n:
            raise TraceFileError(f"{str(file)!r} ended after {done} bytes, the manifest says {size}: "
                                 "the file is truncated or was changed")
        digest.update(view[done:done + n])
        done += n
    if f.read(1):
        raise TraceFileError(f"{str(file)!r} is longer than the {size} bytes the manifest says: it was changed")
    return buffer, digest.hexdigest()


def read_manifest(file: pathlib.Path) -> bytes:
    """The manifest's bytes (at most :data:`MAX_MANIFEST_BYTES`)."""
    f, size = _open_plain(file)
    with f:
        if size > MAX_MANIFEST_BYTES:
            raise TraceFileError(f"{str(file)!r} has {size} bytes; a trace manifest is at most "
                                 f"{MAX_MANIFEST_BYTES}: this is not a manifest tl.save wrote")
        data, _ = _read_exactly(f, size, file)
    return bytes(data)


def read_checked(folder: pathlib.Path, name: str, expected: Any, limit: int | None = None) -> bytearray:
    """The bytes of ``folder/name``, checked against its manifest entry ``{"size", "sha256"}``.

    The size is compared before reading and ``limit`` caps it; the hash is
    compared after. Every failure is a TraceFileError naming the file.
    """
    file = folder / name
    if not (isinstance(expected, dict) and set(expected) == {"size", "sha256"} and type(expected["size"]) is int
            and expected["size"] >= 0 and isinstance(expected["sha256"], str) and len(expected["sha256"]) == 64):
        raise TraceFileError(f"the manifest's entry for {name} is malformed: expected a size and a SHA-256")
    size = expected["size"]
    if limit is not None and size > limit:
        raise TraceFileError(f"the manifest says {name} has {size} bytes, more than the {limit} tl.load "
                             f"accepts for it (torchlens_core.store.folder sets the limit)")
    f, actual = _open_plain(file)
    with f:
        if actual != size:
            raise TraceFileError(f"{str(file)!r} has {actual} bytes, the manifest says {size}: "
                                 "the file is truncated or was changed")
        data, digest = _read_exactly(f, size, file)
    if digest != expected["sha256"]:
        raise TraceFileError(f"{str(file)!r} does not match the SHA-256 in the manifest: it was changed or corrupted")
    return data
