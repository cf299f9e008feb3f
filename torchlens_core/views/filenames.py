"""Where drawings and viewer pages go: default names of one path component, and checked output paths.

``trace.draw()`` and ``tl.view(trace)`` without a path name the file after the
trace's model name. A loaded trace's model name comes from its file, which
anyone may have written (``"../../somewhere/x"``, ``"/etc/cron.d/x"``, a NUL, a
name of 10 000 characters): used as it is, it would choose where a file is
written. So a default name keeps only letters, digits and ``._+-`` (others
become ``_``), never starts with a dot, and is cut to a length every file
system takes: it always names a file in the working directory. A path the
caller gives is theirs to choose; it is only checked, so that what the system
would refuse raises :class:`OutputPathError` saying why, not a raw
``OSError``, ``ValueError`` or a Graphviz message.
"""

from __future__ import annotations

import os
import re

from torchlens_core.ir.errors import OutputPathError

MAX_STEM = 120  # characters of a default name before its suffix (file systems take 255 bytes)
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
# Names Windows reserves whatever their extension ("con.html" cannot be created there).
_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
)


def default_name(name: str | None, *parts: str | None, suffix: str) -> str:
    """A file name in the working directory: ``name`` (the model's; ``trace`` if nothing of it is left) and
    ``parts`` (module, mode), each made safe, joined by ``_``."""
    safe = [_UNSAFE.sub("_", name or "").strip("._") or "trace"]
    safe += [_UNSAFE.sub("_", part).strip("._") for part in parts if part]
    stem = "_".join(part for part in safe if part)[:MAX_STEM].rstrip(".")
    if stem.split(".")[0].upper() in _RESERVED:
        stem = "_" + stem
    return stem + suffix


def checked_output(path: str | os.PathLike[str], what: str) -> str:
    """``path`` as a string, if a file can be written there; else OutputPathError saying why."""
    try:
        text = os.fspath(path)
    except TypeError:
        raise OutputPathError(
            f"{what} is written to a path (a str or os.PathLike), not {type(path).__name__}"
        ) from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise OutputPathError(f"cannot write {what} to {text!r}: a path cannot hold a NUL character")
    if os.path.isdir(text):
        raise OutputPathError(f"cannot write {what} to {text!r}: it is a folder; give a file name")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise OutputPathError(f"cannot write {what} to {text!r}: the folder {parent!r} does not exist; create it first")
    return text


def write_error(path: str, what: str, exc: OSError | ValueError) -> OutputPathError:
    """The OutputPathError for a failed write of ``what`` to ``path``."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return OutputPathError(f"cannot write {what} to {path!r}: {why}; choose another path")
