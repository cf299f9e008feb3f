"""Python values made from recorded arrays: what replay on new inputs must check.

A recorded graph has baked in every Python value the forward made from an
array: the branch ``if x.mean() > 0`` took, the count of a loop that breaks on
``abs(d).max() < tol``, the ``n`` of ``zeros(int(n))``. A backend reports each
such conversion to the builder (``TraceBuilder.to_python``) by the name of
its conversion in :data:`CONVERSIONS`, so that ``trace.replay(*new)`` and
``fork.replay()`` convert the replayed value the same way and raise
``GraphDoesNotHold`` where it differs.

:class:`Conversions` does this for a backend whose model gets wrapper arrays
(:mod:`torchlens_core.capture.wrapped`): mixed into the wrapper class, each
conversion converts the plain value the wrapper stands for, as the framework
would, and reports it while its capture records this thread (a helper of
``intervene=``, another thread, or code after the capture converts
unreported). Conversions a framework has and :data:`CONVERSIONS` names
differently are reported as the conversion that decides them:

- ``complex(x)`` as ``item`` (``x.item()`` decides it), ``math.trunc(x)`` as
  ``int``; ``round(x)`` and ``hash`` of a scalar as ``item`` (stricter than
  needed: any change of the value is refused, not only one that rounds or
  hashes differently);
- ``x.item(i)`` and ``x.tobytes()`` as ``tolist`` of the whole array (equal
  values give equal answers; the one change ``tobytes`` sees and ``tolist``
  does not, ``0.0`` to ``-0.0``, goes unchecked);
- a loop over ``x`` (``for row in x``) as ``len``: the rows are recorded
  ``getitem`` ops, the count is the Python value;
- ``v in x`` as ``(x == v).any()`` (NumPy's definition): two recorded ops and
  a ``bool``;
- a read of the shape (``_tl_read_shape``, which the wrapper calls from its
  ``shape`` and ``size``) as ``len``: a shape depends on values only after an
  op such as ``x[mask]``, whose data-dependent axis is the first one.

:class:`PythonValue` is the call of a function that answered with a Python
number (``np.allclose``): recorded as an op whose value is that number as a
0-d NumPy array (host data, whatever the framework), reported as its ``item``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator
from typing import Any

# how a value was turned into a Python one -> the same conversion, on a replayed value
CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "bool": bool,
    "int": int,
    "float": float,
    "index": operator.index,
    "len": len,
    "item": lambda v: v.item(),
    "tolist": lambda v: v.tolist(),
    "shape": lambda v: [int(d) for d in v.shape],
}


def converted(t: Any, how: str, convert: Callable[[Any], Any] | None = None) -> Any:
    """``convert`` (default: ``CONVERSIONS[how]``) applied to what wrapper ``t`` stands for; reported as ``how``.

    The recorder may hand back another wrapper to convert: a recorded copy,
    when ``t``'s memory was written since its op ran (``WrappedRecorder.reading``).
    """
    link = t._tl
    found = link.recorder.reading(t, values=how != "len") if link is not None else None
    conversion = CONVERSIONS[how]
    if found is None:  # not recorded by a capture running on this thread: as the framework converts
        return (convert or conversion)(t._tl_plain())
    source, ref = found
    plain = source._tl.plain
    result = (convert or conversion)(plain)
    link.recorder.report(ref.index, ref.path, how, result if convert is None else conversion(plain))
    return result


class Conversions:
    """Mixin of a backend's wrapper array: each conversion of the array into a Python value, reported.

    The wrapper class says what it stands for when no capture links it
    (:meth:`_tl_unlinked`), how to read its shape without reporting it
    (:meth:`_tl_shape`), and how to round to ``ndigits`` as a recorded op
    (:meth:`_tl_round`).
    """

    __slots__ = ()
    _tl: Any = None  # the wrapped.Link of the capture the wrapper belongs to; None: none

    def _tl_plain(self) -> Any:
        """The plain value this wrapper stands for."""
        link = self._tl
        return link.plain if link is not None else self._tl_unlinked()

    def _tl_unlinked(self) -> Any:
        """The plain value of a wrapper no capture made (the framework's array sharing its memory)."""
        raise NotImplementedError(f"{type(self).__name__} must say what it stands for unlinked (_tl_unlinked)")

    def _tl_shape(self) -> tuple[int, ...]:
        """The wrapper's shape, read without reporting it."""
        raise NotImplementedError(f"{type(self).__name__} must say how to read its shape (_tl_shape)")

    def _tl_round(self, ndigits: int) -> Any:
        """``round(x, ndigits)``: an array again, so the framework's rounding, recorded as an op."""
        raise NotImplementedError(f"{type(self).__name__} must say how to round to digits (_tl_round)")

    def __bool__(self) -> bool:
        return converted(self, "bool")

    def __int__(self) -> int:
        return converted(self, "int")

    def __float__(self) -> float:
        return converted(self, "float")

    def __index__(self) -> int:
        return converted(self, "index")

    def __complex__(self) -> complex:
        return converted(self, "item", complex)

    # A scalar (NumPy's ``x.sum()``) rounds and truncates to a Python int as the scalar does; a 0-d array
    # refuses, as the framework's array does (the plain value's own method decides which).
    def __round__(self, ndigits: int | None = None) -> Any:
        if ndigits is not None:
            return self._tl_round(ndigits)
        return converted(self, "item", round)

    def __trunc__(self) -> int:
        return converted(self, "int", math.trunc)  # int() truncates as trunc does

    def __len__(self) -> int:
        return converted(self, "len")

    def __iter__(self) -> Iterator[Any]:
        if self.ndim == 0:  # type: ignore[attr-defined]
            return iter(self._tl_plain())  # the TypeError the framework gives for its scalar or 0-d array
        count = len(self)  # reported: the loop runs that many times

        def rows() -> Iterator[Any]:
            for i in range(count):
                yield self[i]  # type: ignore[index] # a recorded getitem, as the array's own iterator indexes

        return rows()

    def __contains__(self, value: Any) -> bool:
        return bool((self == value).any())  # NumPy's definition, so each step is recorded

    def __hash__(self) -> int:
        # What the framework gave as a scalar stays usable as a dict key, as the scalar is.
        link = self._tl
        if link is not None and link.scalar:
            return converted(self, "item", hash)
        return hash(self._tl_plain())  # the framework's own answer: an array is unhashable

    def item(self, *args: Any) -> Any:
        if args:  # one element, named by position: decided by the whole array's values
            return converted(self, "tolist", lambda v: v.item(*args))
        return converted(self, "item")

    def tolist(self) -> Any:
        return converted(self, "tolist")

    def tobytes(self, order: str = "C") -> bytes:
        return converted(self, "tolist", lambda v: v.tobytes(order))

    def _tl_read_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """``shape`` (this array's), reported as a read of its first axis."""
        if shape:
            converted(self, "len")
        return shape


class PythonValue:
    """A function that answered with a Python value, as the call of an op: the value as a 0-d NumPy array.

    Replay runs the function and hands on its answer as an array, so that
    ``CONVERSIONS["item"]`` (or ``tolist``, for a tuple) gives it back and
    the core can compare it with what the recorded forward got.
    """

    __slots__ = ("function",)

    def __init__(self, function: Any) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.host(self.function(*args, **kwargs))

    @staticmethod
    def host(value: Any) -> Any:
        """``value`` (a Python answer, or the 0-d array of one) as a NumPy array."""
        import numpy as np  # host data, not a framework's: imported on first use only

        return np.asarray(value)

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
