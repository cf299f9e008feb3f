"""Reading a trace folder's files as ``tl.load`` must: never more than the manifest declares.

A folder may come from anywhere, so each file is opened only if it is a plain
file of the folder itself (no symbolic link, FIFO, device or directory: a link
would let a folder present some other file's bytes as its tensors, a FIFO would
block the reader), its size is compared with the manifest's *before* anything
is read, and what the manifest declares is bounded before anything is read
(``trace.json`` by :data:`MAX_RECORDS_BYTES`, ``arrays.bin`` by this machine's
memory). Each file is then read twice in bounded chunks: first only to hash it
(and, for ``trace.json``, to bound what parsing it would cost: :class:`JsonCost`),
so that a file that fails its hash or its bound is refused having cost a chunk
of memory; then into one buffer of exactly its size, hashed again. So a huge,
endless or hostile file costs little to refuse, and the bytes that are parsed
are the bytes that were hashed (a file changed while it is read fails the
hash; nothing is memory-mapped, which a truncation could turn into a crash).
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
# What parsing trace.json may cost, as JsonCost estimates it (an upper bound on the Python objects json.loads
# makes). Per byte of JSON, the traces of the 39 torch zoo models are charged 8.8 to 13.6 (big ones least), while
# crafted JSON ("[[[]],[[]],...]", "[{},{},...]") is charged up to 86 and really takes up to 34: above
# JSON_COST_PER_BYTE the file is not one tl.save wrote. In all: at most MAX_RECORDS_COST (a real trace of about
# 300 000 ops), and this machine's memory.
JSON_COST_PER_BYTE = 24
JSON_COST_FLOOR = 64 << 20  # small files pass whatever their density
MAX_RECORDS_COST = 8 << 30
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
        raise TraceFileError(
            f"{str(file)!r} is {_kind(before.st_mode)}; tl.load reads only the plain files "
            "tl.save wrote (links and special files in a trace folder are refused)"
        )
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
        n = f.readinto(view[done : done + _CHUNK])  # type: ignore[attr-defined]
        if not n:
            raise TraceFileError(
                f"{str(file)!r} ended after {done} bytes, the manifest says {size}: "
                "the file is truncated or was changed"
            )
        digest.update(view[done : done + n])
        done += n
    if f.read(1):
        raise TraceFileError(f"{str(file)!r} is longer than the {size} bytes the manifest says: it was changed")
    return buffer, digest.hexdigest()


def _hash_streamed(f: BinaryIO, size: int, file: pathlib.Path, cost: JsonCost | None) -> str:
    """The SHA-256 of ``size`` bytes of ``f``, read a chunk at a time into one reused buffer (fed to ``cost``)."""
    chunk = bytearray(min(size, _CHUNK))
    view = memoryview(chunk)
    digest = hashlib.sha256()
    done = 0
    while done < size:
        n = f.readinto(view[: min(_CHUNK, size - done)])  # type: ignore[attr-defined]
        if not n:
            raise TraceFileError(
                f"{str(file)!r} ended after {done} bytes, the manifest says {size}: "
                "the file is truncated or was changed"
            )
        digest.update(view[:n])
        if cost is not None:
            cost.feed(chunk if n == len(chunk) else chunk[:n])
        done += n
    if f.read(1):
        raise TraceFileError(f"{str(file)!r} is longer than the {size} bytes the manifest says: it was changed")
    return digest.hexdigest()


class JsonCost:
    """An upper bound on the memory ``json.loads`` takes for a document, from counts of a few bytes in it.

    Every JSON value but the outermost follows a ``[``, ``{``, ``,`` or ``:``; each of those is charged
    the most a value in that place costs in CPython (a one-key dict 184 bytes, a list 56 and its slot,
    a number or short string about 60 with its slot or dict entry), the text itself once (four times if
    it is not ASCII: the decoded string is then wider). Measured against json.loads (tracemalloc's
    peak), it is above the real cost for every document tried: 1.2 to 3.6 times it for containers,
    about 1.8 for saved traces, up to 8 for lists of small numbers (which CPython shares).
    """

    WEIGHTS = ((ord("{"), 192), (ord("["), 72), (ord(":"), 72), (ord(","), 64))

    def __init__(self) -> None:
        self.total = 64
        self.ascii = True

    def feed(self, chunk: bytes | bytearray) -> None:
        self.total += sum(chunk.count(c) * w for c, w in self.WEIGHTS) + len(chunk)
        self.ascii = self.ascii and chunk.isascii()

    def cost(self, size: int) -> int:
        return self.total if self.ascii else self.total + 3 * size

    def check(self, file: pathlib.Path, size: int) -> None:
        """Refuse a document that would cost more than a saved trace of its size, or than is allowed."""
        cost = self.cost(size)
        if cost > max(JSON_COST_FLOOR, JSON_COST_PER_BYTE * size):
            raise TraceFileError(
                f"{str(file)!r} would take about {_gb(cost)} of memory to parse, {cost / size:.0f} "
                f"bytes per byte of it, more than the {JSON_COST_PER_BYTE} tl.load allows (saved "
                f"traces take 9 to 14): it is not a file tl.save wrote"
            )
        limit = min(MAX_RECORDS_COST, memory_limit() or MAX_RECORDS_COST)
        if cost > limit:
            raise TraceFileError(
                f"{str(file)!r} would take about {_gb(cost)} of memory to parse, more than the "
                f"{_gb(limit)} tl.load allows (torchlens_core.store.folder sets the limit, at most "
                f"this machine's memory)"
            )


def memory_limit() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say): no load may need more."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def read_manifest(file: pathlib.Path) -> bytes:
    """The manifest's bytes (at most :data:`MAX_MANIFEST_BYTES`)."""
    f, size = _open_plain(file)
    with f:
        if size > MAX_MANIFEST_BYTES:
            raise TraceFileError(
                f"{str(file)!r} has {size} bytes; a trace manifest is at most "
                f"{MAX_MANIFEST_BYTES}: this is not a manifest tl.save wrote"
            )
        data, _ = _read_exactly(f, size, file)
    return bytes(data)


def declared_size(name: str, expected: Any, limit: int | None = None, why: str = "") -> int:
    """The size the manifest entry ``{"size", "sha256"}`` of ``name`` declares; refused if malformed or too big."""
    if not (
        isinstance(expected, dict)
        and set(expected) == {"size", "sha256"}
        and type(expected["size"]) is int
        and expected["size"] >= 0
        and isinstance(expected["sha256"], str)
        and len(expected["sha256"]) == 64
    ):
        raise TraceFileError(f"the manifest's entry for {name} is malformed: expected a size and a SHA-256")
    size = expected["size"]
    if limit is not None and size > limit:
        raise TraceFileError(
            f"the manifest says {name} has {size} bytes, more than the {limit} tl.load "
            f"accepts for it ({why or 'torchlens_core.store.folder sets the limit'})"
        )
    return size


def read_checked(
    folder: pathlib.Path, name: str, expected: Any, limit: int | None = None, cost: JsonCost | None = None
) -> bytearray:
    """The bytes of ``folder/name``, checked against its manifest entry ``{"size", "sha256"}``.

    The size is compared before reading and ``limit`` caps it; the hash (and
    ``cost``, fed every chunk) is checked on a first pass that keeps nothing,
    and again on the pass that reads the bytes. Every failure is a
    TraceFileError naming the file.
    """
    file = folder / name
    size = declared_size(name, expected, limit)
    f, actual = _open_plain(file)
    with f:
        if actual != size:
            raise TraceFileError(
                f"{str(file)!r} has {actual} bytes, the manifest says {size}: the file is truncated or was changed"
            )
        if _hash_streamed(f, size, file, cost) != expected["sha256"]:
            raise TraceFileError(
                f"{str(file)!r} does not match the SHA-256 in the manifest: it was changed or corrupted"
            )
        if cost is not None:
            cost.check(file, size)
        f.seek(0)
        data, digest = _read_exactly(f, size, file)
    if digest != expected["sha256"]:
        raise TraceFileError(f"{str(file)!r} was changed while it was being read (its SHA-256 no longer matches)")
    return data
