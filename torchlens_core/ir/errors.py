"""Typed errors. Every error TorchLens raises is a ``TorchLensError``."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TorchLensError(Exception):
    """Base class of every error TorchLens raises on purpose."""


class BackendNotFoundError(TorchLensError, LookupError):
    """A backend name was asked for that no installed plugin provides."""


class UnsupportedError(TorchLensError, TypeError):
    """The backend cannot capture this target or honour this request."""


class CaptureError(TorchLensError, RuntimeError):
    """Capture failed; nothing of it is left installed."""


class PluginContractWarning(FutureWarning):
    """A backend plugin does something the next version of the plugin contract refuses (CHANGELOG.md, "For
    plugin authors"): it works in this version, and fails once the plugin declares the new one, or in the
    release after this one."""


class TraceFileError(TorchLensError, ValueError):
    """A saved trace cannot be read: missing, truncated, tampered, malformed or of another format version."""


class LabelNotFoundError(TorchLensError, KeyError):
    """A lookup key names no op or module of the trace."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0]) if self.args else ""


class ReplayError(TorchLensError, RuntimeError):
    """An op could not be re-executed."""


class GraphDoesNotHold(ReplayError):
    """Replay on new inputs: the recorded graph took a value as fixed (a branch, a count) that these inputs change."""


class PartialCoverage(TorchLensError, AssertionError):
    """tl.validate: the trace covers only part of the forward (``bool(status)`` raises it, naming why)."""


class ArchitectureChanged(TorchLensError, AssertionError):
    """The traced structure differs from the pinned one."""


class GraphvizNotFoundError(TorchLensError, RuntimeError):
    """The Graphviz ``dot`` program is not installed."""


class DrawingTooLargeError(TorchLensError, ValueError):
    """A drawing has more nodes than ``draw(max_nodes=)`` allows; the message says how long Graphviz would take
    and what to draw instead (``collapse="auto"``, ``collapse=N``, ``module=``)."""


class LargeDrawingWarning(UserWarning):
    """A drawing Graphviz will take long to lay out; the message gives the estimate and what to draw instead."""


class OutputPathError(TorchLensError, OSError):
    """A drawing or viewer page cannot be written where asked (no such folder, a folder, a name the system refuses)."""


class ExtractError(TorchLensError, ValueError):
    """The dataset, or the store at ``output_dir``, cannot be extracted as asked."""


class InterventionError(TorchLensError, ValueError):
    """An intervention helper returned something its site cannot take (another shape, dtype or device)."""


class MissingDependencyError(TorchLensError, ImportError):
    """An optional feature needs a package that is not installed; the message names the extra to install."""


class ArgumentTypeError(TorchLensError, TypeError):
    """An argument of the wrong type: a bool as an op position, a string where a selector goes."""


class PatternError(TorchLensError, ValueError):
    """A selector's regular expression does not compile; the message names the pattern and why."""


class FieldError(TorchLensError, ValueError):
    """A receptive or projective field asked of the wrong thing: a position off the grid, an op with no path."""


def shown(key: object, limit: int = 60) -> str:
    """``repr(key)`` cut to a readable length: messages repeat user keys, which may be megabytes long."""
    if isinstance(key, str) and len(key) > limit:
        return f"{key[:limit]!r}... ({len(key):,} characters)"
    text = repr(key)
    return text if len(text) <= limit + 2 else f"{text[:limit]}... ({len(text):,} characters)"


def closest(key: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """The candidates nearest to ``key``, best first (for "did you mean" messages)."""
    pool = list(dict.fromkeys(candidates))
    if len(key) > 3 * max(map(len, pool), default=0):
        return []  # too long to reach difflib's 0.5 ratio with any candidate, or to prefix one
    near = difflib.get_close_matches(key, pool, n=n, cutoff=0.5)
    if len(near) < n:  # prefix matches catch "conv2d" -> "conv2d_1_1"
        near += [c for c in pool if c.startswith(key) and c not in near][: n - len(near)]
    return near
