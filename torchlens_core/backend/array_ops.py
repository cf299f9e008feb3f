"""ArrayOps: the few array operations the core needs from a framework to edit values.

Interventions (``tl.trace(..., intervene=...)``) run the same helpers on every
backend: ``tl.zero_ablate()``, ``tl.mean_ablate()``, ``tl.project_off()``...
Arithmetic between arrays and with Python numbers uses the framework's own
operators (``+ - * /``), which every framework TorchLens supports has; an
``ArrayOps`` supplies the rest, answered by ``torchlens_array_ops``. Every
method returns the framework's arrays, of the dtype and on the device of the
array it was given (``like`` for :meth:`from_numpy`).

:class:`NumpyArrayOps` is the reference: short enough to read in one go, and
what the NumPy plugin and the core's own tests use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class ArrayOps:
    """What a backend implements for interventions; see the module docstring."""

    def zeros_like(self, x: Any) -> Any:
        """Zeros of ``x``'s shape, dtype and device."""
        raise NotImplementedError

    def mean(self, x: Any, axes: tuple[int, ...]) -> Any:
        """The mean over ``axes``, keeping them as size-1 axes (so it broadcasts back against ``x``)."""
        raise NotImplementedError

    def sum(self, x: Any, axis: int) -> Any:
        """The sum over one axis, kept as a size-1 axis."""
        raise NotImplementedError

    def clip(self, x: Any, low: float | None, high: float | None) -> Any:
        """``x`` clamped to ``[low, high]``; None leaves that side open."""
        raise NotImplementedError

    def total(self, x: Any) -> Any:
        """The sum of every element, as a scalar array (differentiable where the framework differentiates)."""
        raise NotImplementedError

    def take(self, x: Any, indices: Sequence[int], axis: int) -> Any:
        """The slices of ``x`` at ``indices`` along ``axis``, in that order."""
        raise NotImplementedError

    def from_numpy(self, array: Any, like: Any) -> Any:
        """A NumPy array as this framework's array, with ``like``'s dtype and device."""
        raise NotImplementedError

    def copy(self, x: Any) -> Any:
        """A copy that no later write into ``x`` changes."""
        raise NotImplementedError

    def write_into(self, target: Any, value: Any) -> Any:
        """For an edit of an op that wrote in place: ``value``'s contents written into ``target``, returned.

        Frameworks whose arrays never change in place return ``value``: the
        op's output is a new array anyway.
        """
        return value


class NumpyArrayOps(ArrayOps):
    """ArrayOps on NumPy arrays (and the reference for other backends).

    A NumPy scalar (``np.float64``, what ``x.sum()`` gives) stays a scalar:
    ``np.zeros_like`` and ``np.array(copy=True)`` would make it a 0-d array,
    which a model could write into, or fail to hash, where the scalar could
    not. ``plain``, optional: the plain NumPy value a value handed to a helper
    stands for (a backend's ndarray subclass that records its calls, say),
    applied first, so the answers are plain NumPy values.
    """

    def __init__(self, plain: Callable[[Any], Any] | None = None) -> None:
        import numpy as np

        self.np = np
        self.plain = plain if plain is not None else _same

    def zeros_like(self, x: Any) -> Any:
        x = self.plain(x)
        zeros = self.np.zeros_like(x)
        return zeros[()] if isinstance(x, self.np.generic) else zeros

    def mean(self, x: Any, axes: tuple[int, ...]) -> Any:
        x = self.plain(x)
        return x.mean(axis=axes, keepdims=True).astype(x.dtype, copy=False)

    def sum(self, x: Any, axis: int) -> Any:
        x = self.plain(x)
        return x.sum(axis=axis, keepdims=True).astype(x.dtype, copy=False)

    def clip(self, x: Any, low: float | None, high: float | None) -> Any:
        x = self.plain(x)
        return self.np.clip(x, low, high).astype(x.dtype, copy=False)

    def total(self, x: Any) -> Any:
        return self.np.sum(self.plain(x))

    def take(self, x: Any, indices: Sequence[int], axis: int) -> Any:
        return self.np.take(self.plain(x), list(indices), axis=axis)

    def from_numpy(self, array: Any, like: Any) -> Any:
        return self.np.asarray(self.plain(array), dtype=like.dtype)

    def copy(self, x: Any) -> Any:
        x = self.plain(x)
        return x if isinstance(x, self.np.generic) else self.np.array(x, copy=True)  # a scalar is never written

    def write_into(self, target: Any, value: Any) -> Any:
        target = self.plain(target)
        target[...] = self.plain(value)
        return target


def _same(x: Any) -> Any:
    return x
