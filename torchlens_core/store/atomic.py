"""Replacing a trace folder in one step, for ``tl.save``: whatever stops a save, the folder is old or new.

The new files are written into a hidden sibling folder (``.<name>.tl-save-<pid>-<random>``),
flushed to disk, and only then put in the folder's place: by an atomic exchange
of the two folders where the system has one (Linux ``renameat2(RENAME_EXCHANGE)``,
macOS ``renamex_np(RENAME_SWAP)``), else by two renames (the old folder moved
aside, the new one moved in). Then the old folder, now the sibling, is removed.
A save killed before the exchange leaves the old folder untouched and a stale
sibling, which the next save to that folder removes (when the process that
made it is gone and it holds nothing but trace files); one killed after
leaves the new folder. Any ``OSError`` (a full disk, no permission) becomes a
:class:`TraceFileError` naming the path and what to do, after the sibling is
removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pathlib
import secrets
import shutil
import sys
import warnings
from collections.abc import Callable, Iterable

from torchlens_core.ir.errors import TraceFileError

TEMP = ".tl-save-"  # marks a sibling being written (or left by a killed save)
_NAME_KEEP = 80  # of the folder's name, in its sibling's name: the whole may not exceed NAME_MAX


def write_folder(
    folder: pathlib.Path, files: Iterable[tuple[str, Iterable[bytes | memoryview]]], own_names: frozenset[str]
) -> None:
    """Make ``folder`` hold exactly ``files`` (name, chunks), replacing what it held in one step.

    ``own_names`` are the file names a folder of this kind holds: a stale
    sibling, or the replaced folder, is removed only if it holds nothing else.
    """
    parent, name = folder.parent, folder.name
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _error(folder, exc, f"creating {str(parent)!r}", replacing=False) from None
    _remove_stale(parent, name, own_names)
    replacing = os.path.isdir(folder)
    temp = parent / f".{name[:_NAME_KEEP]}{TEMP}{os.getpid()}-{secrets.token_hex(4)}"
    doing = f"creating {str(temp)!r} beside it"
    try:
        os.mkdir(temp)  # (not mkdtemp: its mode 0o700 would hide the trace from everyone else)
        for file_name, chunks in files:
            doing = f"writing {file_name}"
            _write_file(temp / file_name, chunks)
        doing = "putting the new folder in place of the old"
        if replacing:  # the new folder keeps the old one's permissions (set last: they may forbid writing)
            os.chmod(temp, os.stat(folder).st_mode & 0o7777)
        old = _swap(temp, folder)
    except BaseException as exc:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _error(folder, exc, doing, replacing) from None
        raise
    _sync_dir(parent)
    if old is not None and not _remove_if_own(old, own_names):
        warnings.warn(
            f"tl.save replaced {str(folder)!r}; what it held before is kept at {str(old)!r} (it held other "
            f"files than a saved trace, or could not be removed)",
            stacklevel=3,
        )


def _write_file(file: pathlib.Path, chunks: Iterable[bytes | memoryview]) -> None:
    """A new file of ``chunks``, on disk (fsync) before the folder that holds it goes into place."""
    with open(file, "xb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def _swap(new: pathlib.Path, folder: pathlib.Path) -> pathlib.Path | None:
    """Put ``new`` at ``folder``; returns where the folder that was there went (None: there was none)."""
    if not os.path.lexists(folder):
        os.rename(new, folder)
        return None
    if _exchange(new, folder):
        return new  # the old folder now has the new one's temporary name
    aside = folder.parent / f".{folder.name[:_NAME_KEEP]}{TEMP}{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(folder, aside)  # no atomic exchange here: for a moment the folder is only at ``aside``
    try:
        os.rename(new, folder)
    except BaseException:
        os.rename(aside, folder)
        raise
    return aside


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swap two paths atomically; False where this system (or file system) cannot."""
    swap = _exchange_call()
    if swap is None:
        return False
    if swap(os.fsencode(a), os.fsencode(b)) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # a file system without exchange (some network and FUSE ones): rename instead
    raise OSError(code, os.strerror(code), str(b))


_EXCHANGE: list[Callable[[bytes, bytes], int] | None] = []


def _exchange_call() -> Callable[[bytes, bytes], int] | None:
    """The C library's atomic exchange of two paths, or None where it has none (looked up once)."""
    if not _EXCHANGE:
        call: Callable[[bytes, bytes], int] | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
                at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
                fn = libc.renameat2
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]

                def renameat2(a: bytes, b: bytes) -> int:
                    return fn(at_cwd, a, at_cwd, b, exchange)

                call = renameat2
            elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
                fn = libc.renamex_np
                fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]

                def renamex_np(a: bytes, b: bytes) -> int:
                    return fn(a, b, 2)  # RENAME_SWAP

                call = renamex_np
        except (OSError, AttributeError, TypeError):  # no C library to load (Windows): two renames
            call = None
        _EXCHANGE.append(call)
    return _EXCHANGE[0]


def _sync_dir(folder: pathlib.Path) -> None:
    """Flush a directory's entries (the rename) to disk, where directories can be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # Windows: directories cannot be opened; the rename is already durable there
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale(parent: pathlib.Path, name: str, own_names: frozenset[str]) -> None:
    """Remove siblings of ``parent/name`` left by saves that were killed (their process is gone)."""
    if os.name != "posix":
        return  # no way here to tell a finished process from a running one
    prefix = f".{name[:_NAME_KEEP]}{TEMP}"
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(prefix)]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(prefix) :].partition("-")[0]
        if pid.isdigit() and not _running(int(pid)) and entry.is_dir(follow_symlinks=False):
            _remove_if_own(pathlib.Path(entry.path), own_names)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True


def _remove_if_own(folder: pathlib.Path, own_names: frozenset[str]) -> bool:
    """Remove ``folder`` if it holds only files a saved trace has; True if it is gone."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    if not set(names) <= own_names:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not os.path.lexists(folder)


def _error(folder: pathlib.Path, exc: OSError, doing: str, replacing: bool) -> TraceFileError:
    """The TraceFileError for an OSError while saving: what failed, what the folder holds now, what to do."""
    what = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        todo = "free some space on that disk, or save elsewhere"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        todo = (
            f"tl.save writes the new trace beside the folder, so it needs write permission in "
            f"{str(folder.parent)!r} too; save where you can write"
        )
    else:
        todo = "save elsewhere, or retry"
    held = "the folder still holds the trace it held before" if replacing else "nothing was saved there"
    return TraceFileError(f"cannot save to {str(folder)!r}: {what} while {doing}; {held}: {todo}")
