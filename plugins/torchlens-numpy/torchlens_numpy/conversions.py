"""Python values made from recorded arrays: what replay on new inputs must check.

A recorded graph has baked in every Python value the function made from an
array: the branch ``if x.mean() > 0`` took, the count of a loop that breaks on
``np.abs(d).max() < tol``, the ``n`` of ``np.zeros(int(n))``. Each such
conversion of a Tracked array is reported to the builder
(``TraceBuilder.to_python``) with the conversion's name from
``torchlens_core.replay.inputs.CONVERSIONS``, so that ``trace.replay(*new)``
and ``fork.replay()`` convert the replayed value the same way and raise
``GraphDoesNotHold`` where it differs.

:class:`Conversions` is the part of ``Tracked`` that does this. Each method
converts the plain value the array stands for, as NumPy would, and reports
it while its capture records this thread (a helper of ``intervene=``, another
thread, or code after the capture converts unreported, as plain NumPy).
Conversions NumPy has and the core names differently are reported as the
core conversion that decides them:

- ``complex(x)`` as ``item`` (``x.item()`` decides it), ``math.trunc(x)`` as
  ``int``; ``round(x)`` and ``hash`` of a NumPy scalar as ``item`` (stricter
  than needed: any change of the value is refused, not only one that rounds
  or hashes differently);
- ``x.item(i)`` and ``x.tobytes()`` as ``tolist`` of the whole array (equal
  values give equal answers; the one change ``tobytes`` sees and ``tolist``
  does not, ``0.0`` to ``-0.0``, goes unchecked);
- a loop over ``x`` (``for row in x``) as ``len``: the rows are recorded
  ``getitem`` ops, the count is the Python value;
- ``v in x`` as what NumPy defines it to be, ``(x == v).any()``: two recorded
  ops and a ``bool``;
- ``x.shape``, ``x.size``, ``np.shape(x)``, ``np.size(x)`` as ``len``: a shape
  depends on values only after an op such as ``x[mask]`` or ``np.nonzero``,
  whose data-dependent axis is the first one (``x[:, mask]`` is the
  exception: the core has no conversion for a whole shape).

:class:`PythonValue` is the call of a NumPy function that answered with a
Python number (``np.allclose``, ``np.array_equal``):
recorded as an op whose value is that number as a 0-d array, reported as its
``item``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from torchlens_core.replay.inputs import CONVERSIONS

# Functions whose answer depends on shapes, dtypes or memory only, never on values: not ops. np.shape and
# np.size are reported as reads of the shape (``len``), as ``x.shape`` is.
VALUE_FREE = frozenset({"shape", "size", "ndim", "iscomplexobj", "isrealobj", "result_type", "can_cast",
                        "may_share_memory", "shares_memory", "isfortran"})
SHAPE_READS = frozenset({"shape", "size"})


def _plain(t: Any) -> Any:
    link = t._tl
    return link.plain if link is not None else np.ndarray.view(t, np.ndarray)


def _converted(t: Any, how: str, convert: Callable[[Any], Any] | None = None) -> Any:
    """``convert`` (default: the core's ``how``) applied to what ``t`` stands for; reported as ``how``.

    The recorder may hand back another array to convert: a recorded copy, when
    ``t``'s memory was written since its op ran (see ``Recorder.reading``).
    """
    link = t._tl
    found = link.recorder.reading(t, values=how != "len") if link is not None else None
    conversion = CONVERSIONS[how]
    if found is None:  # not recorded by a capture running on this thread: plain NumPy
        return (convert or conversion)(_plain(t))
    source, ref = found
    plain = source._tl.plain
    result = (convert or conversion)(plain)
    link.recorder.report(ref.index, ref.path, how, result if convert is None else conversion(plain))
    return result


class Conversions:
    """Mixin of ``Tracked``: each conversion of the array into a Python value, reported."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return _converted(self, "bool")

    def __int__(self) -> int:
        return _converted(self, "int")

    def __float__(self) -> float:
        return _converted(self, "float")

    def __index__(self) -> int:
        return _converted(self, "index")

    def __complex__(self) -> complex:
        return _converted(self, "item", complex)

    # A NumPy scalar (``x.sum()``) rounds and truncates to a Python int as the scalar does; a 0-d array
    # refuses, as ndarray does (the plain value's own method decides which).
    def __round__(self, ndigits: int | None = None) -> Any:
        if ndigits is not None:
            return np.round(self, ndigits)  # a NumPy value: a recorded op
        return _converted(self, "item", round)

    def __trunc__(self) -> int:
        return _converted(self, "int", math.trunc)  # int() truncates as trunc does

    def __len__(self) -> int:
        return _converted(self, "len")

    def __iter__(self) -> Iterator[Any]:
        if self.ndim == 0:  # type: ignore[attr-defined]
            return iter(_plain(self))  # the TypeError NumPy gives for its scalar, or for a 0-d array
        count = len(self)  # reported: the loop runs that many times

        def rows() -> Iterator[Any]:
            for i in range(count):
                yield self[i]  # a recorded getitem, as ndarray's own iterator indexes

        return rows()

    def __contains__(self, value: Any) -> bool:
        return bool((self == value).any())  # NumPy's definition, so each step is recorded

    def __hash__(self) -> int:
        # What NumPy gave as a scalar stays usable as a dict key, as the scalar is.
        link = self._tl  # type: ignore[attr-defined]
        if link is not None and link.scalar:
            return _converted(self, "item", hash)
        raise TypeError("unhashable type: 'numpy.ndarray'")

    def item(self, *args: Any) -> Any:
        if args:  # one element, named by position: decided by the whole array's values
            return _converted(self, "tolist", lambda v: v.item(*args))
        return _converted(self, "item")

    def tolist(self) -> Any:
        return _converted(self, "tolist")

    def tobytes(self, order: str = "C") -> bytes:
        return _converted(self, "tolist", lambda v: v.tobytes(order))

    def _tl_read_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` (this array's), reported as a read of its first axis."""
        if shape:
            _converted(self, "len")
        return shape


class PythonValue:
    """A NumPy function that answered with a Python value, as the call of an op: the value as a 0-d array.

    Replay runs the function and hands on its answer as an array, so that
    ``CONVERSIONS["item"]`` (or ``tolist``, for a tuple) gives it back and
    the core can compare it with what the recorded forward got.
    """

    __slots__ = ("function",)

    def __init__(self, function: Any) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return np.asarray(self.function(*args, **kwargs))

    def __repr__(self) -> str:
        return f"PythonValue({getattr(self.function, '__name__', self.function)!r})"


def python_conversion(result: Any) -> str | None:
    """How a Python answer is read back from its 0-d (or 1-d) array, or None for one that is not a number.

    Strings (``np.array2string``) and objects are left out: printing decides nothing.
    """
    if isinstance(result, (bool, int, float, complex)):
        return "item"
    if isinstance(result, (tuple, list)) and all(isinstance(v, (bool, int, float)) for v in result):
        return "tolist"
    return None
