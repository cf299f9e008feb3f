"""Array adapters: what the core may ask of a NumPy value (an ndarray, or a NumPy scalar).

``ARRAY_OPS`` is what intervention helpers use on this backend (``torchlens_array_ops``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchlens_core.backend.array_ops import NumpyArrayOps
from torchlens_core.backend.arrays import numpy_error
from torchlens_numpy.capture import plain_leaf as _untracked


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not isinstance(value, (np.ndarray, np.generic)):
        return None
    return tuple(np.shape(value)), value.dtype.name, "cpu"


def to_numpy(value: Any) -> np.ndarray:
    return np.array(value, copy=True)


def array_error(actual: Any, expected: Any) -> float:
    """max |a - e| / (1 + |e|); inf for a shape or dtype mismatch or NaNs in other places."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape or a.dtype != e.dtype:
        return math.inf
    return numpy_error(a, e)


class PluginArrayOps(NumpyArrayOps):
    """The core's NumPy reference ArrayOps, made safe for what this plugin hands a helper.

    Two differences from the reference, both so that an edit keeps the kind
    of value the function had:

    - a :class:`~torchlens_numpy.capture.Tracked` array (a helper closing over
      one, or a steering vector that escaped a capture) is read as the plain
      array it stands for, so the answer is a plain ndarray and no op is
      recorded, whichever capture or thread the helper runs in;
    - a NumPy scalar (``x.sum()`` gives an ``np.float64``) stays a scalar:
      ``np.zeros_like`` and ``np.array(copy=True)`` would make it a 0-d array,
      which a function can write into or fail to hash where the scalar could not.
    """

    def zeros_like(self, x: Any) -> Any:
        x = _untracked(x)
        zeros = np.zeros_like(x)
        return zeros[()] if isinstance(x, np.generic) else zeros

    def mean(self, x: Any, axes: tuple[int, ...]) -> Any:
        return super().mean(_untracked(x), axes)

    def sum(self, x: Any, axis: int) -> Any:
        return super().sum(_untracked(x), axis)

    def clip(self, x: Any, low: float | None, high: float | None) -> Any:
        return super().clip(_untracked(x), low, high)

    def take(self, x: Any, indices: Sequence[int], axis: int) -> Any:
        return super().take(_untracked(x), indices, axis)

    def from_numpy(self, array: Any, like: Any) -> Any:
        return np.asarray(_untracked(array), dtype=like.dtype)

    def copy(self, x: Any) -> Any:
        x = _untracked(x)
        return x if isinstance(x, np.generic) else np.array(x, copy=True)  # a scalar cannot be written into

    def write_into(self, target: Any, value: Any) -> Any:
        # The target is the array an in-place op wrote (plain: ops run on plain arrays); every
        # view of it, the function's Tracked ones included, sees the edit.
        target = _untracked(target)
        target[...] = _untracked(value)
        return target


ARRAY_OPS = PluginArrayOps()
