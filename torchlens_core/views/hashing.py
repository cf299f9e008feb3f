"""Structural hashes: pin an architecture without pinning its weights.

The hash covers, op by op in execution order: kind, function, output shape and
dtype, which earlier ops it read (by position), the module passes it ran in,
and the shapes of the parameters it used. Values, weights and memory addresses
never enter it, and neither do module names: each module pass is named by the
module's type, so renaming an attribute keeps the hash (``module_names=True``
pins the paths too).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import pathlib
from typing import TYPE_CHECKING, Any

from torchlens_core.ir.errors import ArchitectureChanged

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace

PREFIX = "tl2-"  # bump when what the hash covers changes (tl2: module types, not names, by default)


def structure(trace: Trace, module_names: bool = False) -> list[str]:
    """The canonical text the hash is taken over, one line per op."""
    lines = []
    for op in trace.ops:
        where = "/".join(
            f"{path if module_names else trace.modules[path].type_name}:{n}" for path, n in op.module_passes
        )
        params = ",".join(str(tuple(trace.params[p].shape)) for p in op.params if p in trace.params)
        lines.append(
            f"{op.index} {op.kind} {op.func_name} shape={op.shape} dtype={op.dtype} "
            f"reads={list(op.parent_indices)} in={where or '-'} params=[{params}]"
        )
    return lines


def structural_hash(trace: Trace, module_names: bool = False) -> str:
    """A short, stable hash of the trace's structure (see the module docstring)."""
    digest = hashlib.sha256("\n".join(structure(trace, module_names)).encode()).hexdigest()
    return PREFIX + digest[:32]


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("TORCHLENS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "torchlens")
    return pathlib.Path(root) / "structures"


def remember(digest: str, lines: list[str]) -> None:
    """Keep the structure behind a hash, so that a later mismatch can show a diff."""
    try:
        folder = _cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{digest}.txt").write_text("\n".join(lines) + "\n")
    except OSError:  # a read-only home: the hash still works, the diff will be shorter
        pass


def check(trace: Trace, expected: str | None, module_names: bool = False) -> str:
    """The trace's hash; printed when ``expected`` is None, compared with it otherwise."""
    lines = structure(trace, module_names)
    digest = PREFIX + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]
    remember(digest, lines)
    if expected is None:
        print(f"structural hash: {digest}  (pin it: tl.assert_unchanged(model, x, {digest!r}))")
        return digest
    if digest == expected:
        return digest
    known = _cache_dir() / f"{expected}.txt"
    if known.exists():
        diff = difflib.unified_diff(known.read_text().splitlines(), lines, "pinned", "now", n=1, lineterm="")
        detail = "\n".join(list(diff)[:60])
    else:
        detail = f"(the pinned structure is not cached here; the structure now has {len(lines)} ops:)\n" + "\n".join(
            lines[:20]
        )
    raise ArchitectureChanged(f"the architecture changed: pinned {expected}, now {digest}\n{detail}")


def assert_unchanged(
    model: Any, *args: Any, expected: str | None = None, module_names: bool = False, **kwargs: Any
) -> str:
    """Trace ``model`` and compare its structural hash with ``expected``.

    ``expected=None`` prints and returns the hash to pin; a different hash
    raises :class:`ArchitectureChanged` with a readable diff of what changed
    (the structure behind each hash is cached under ``~/.cache/torchlens``, or
    ``$TORCHLENS_CACHE``). The pinned hash may also come last among the
    positional arguments: ``tl.assert_unchanged(model, x, pinned)``.
    """
    if expected is None and args and isinstance(args[-1], str) and args[-1].startswith(PREFIX):
        args, expected = args[:-1], args[-1]  # tl.assert_unchanged(model, x, pinned), as the README writes it
    from torchlens_core.capture.api import trace

    return check(trace(model, *args, **kwargs), expected, module_names)
