"""Before an op of a loaded trace runs, the same call made lazily on empty tensors: arguments that disagree are refused.

A file can be hand-made with hashes to match, and an allow-listed method is not
safe with any arguments: a ``conv2d`` given another stride or ``groups``, or a
``reshape`` given other sizes, reaches tinygrad, which raises an untyped
error or builds a value of another shape. tinygrad is lazy: a method builds a
graph of UOps and computes its output's shape there, with its own argument
checks, and no kernel runs until something is realized. So the call is first
made with every tensor argument replaced by ``Tensor.empty`` of its shape,
dtype and device (a buffer never allocated, weak-typed constants by a constant
of their dtype), and the result is never realized. If the call raises, or its
output's shape is not the recorded one, the op is refused with a
:class:`ReplayError` before the real tensors see the arguments. An in-place
method writes into the empty tensors only.

Only loaded traces are checked: a live trace's ops ran with these very
arguments in the model's forward. Not checked, and run as before
(LIMITATIONS.md): the methods that read values (``item``, ``tolist``, ``numpy``,
``data``, ``realize``, and ``nonzero`` and ``masked_select``, whose output shape
depends on them: building them would realize the empty tensors), calls with no
tensor argument (``Tensor.arange``), tensors sharded over several devices, and
symbolic shapes.
"""

from __future__ import annotations

import types
from typing import Any

from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord
from torchlens_core.replay.checked import PassedChecks, from_file, refused, wrong_shape

# Methods that realize their tensors (item, tolist...) or whose output shape depends on values: never built here.
_READS_VALUES = frozenset({"item", "data", "tolist", "numpy", "realize", "nonzero", "masked_select"})


def check_loaded(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse ``op``'s call with these arguments when its trace was loaded and the lazy call on empties disagrees."""
    if from_file(op):
        check(op, args, kwargs)


def check(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Make ``op.call`` on empty tensors, never realized; ReplayError if it raises or gives another shape.

    A call already seen to pass (the same method, the same shapes, dtypes and devices, the same constants
    of the same types, the same recorded shape) passes again without building: the lazy call sees nothing
    else, and a model repeats the same calls in each of its blocks.
    """
    func = op.call.__func__ if isinstance(op.call, types.MethodType) else op.call
    if getattr(func, "__name__", None) in _READS_VALUES:
        return
    _PASSED.run(_signature(op, args, kwargs), lambda: _check(op, args, kwargs))


_PASSED = PassedChecks()  # calls that passed, by signature (see check)
_CONSTANTS = frozenset({int, float, bool, str, type(None), complex})


def _plain_shape(t: Tensor) -> bool:
    return all(type(d) is int for d in t.shape)


def _signature(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What the lazy call's verdict depends on, hashable; None where some argument is not plain enough to say."""

    def describe(v: Any) -> Any:
        t = type(v)
        if isinstance(v, Tensor):
            if not (isinstance(v.device, str) and _plain_shape(v)):
                raise TypeError
            return ("tensor", v.shape, v.dtype, v.device)
        if t in _CONSTANTS:
            return (t, v)  # the type too: True == 1 == 1.0, but a method may take them apart
        if t is tuple or t is list:
            return (t, tuple(describe(x) for x in v))
        if t is dict:
            return (t, tuple((k, describe(x)) for k, x in v.items()))
        if isinstance(v, slice):
            return (slice, describe(v.start), describe(v.stop), describe(v.step))
        if v is Ellipsis or isinstance(v, DType):  # a DType is a frozen dataclass: hashable, compared by value
            return (t, v)
        raise TypeError

    try:
        key = (op.call, op.shape, op.in_place, describe(args), describe(kwargs))
        hash(key)
    except TypeError:
        return None
    return key


def _empty(t: Tensor) -> Tensor:
    """A tensor of ``t``'s shape, dtype and device that holds nothing: a buffer never allocated, or for a weak
    dtype (a Python constant, which has no storage) a constant broadcast to that shape."""
    if t.dtype in dtypes.weaks:
        return Tensor(0, dtype=t.dtype).reshape((1,) * len(t.shape)).expand(t.shape)
    return Tensor.empty(*t.shape, dtype=t.dtype, device=t.device)


def _check(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The lazy call itself: returns where it cannot be made, raises ReplayError where it disagrees."""
    found = []

    def to_empty(v: Any) -> Any:
        if not isinstance(v, Tensor):
            return v
        if not (isinstance(v.device, str) and _plain_shape(v)):
            raise _Unchecked
        found.append(v)
        return _empty(v)

    try:
        empty_args, empty_kwargs = tree.map_leaves(to_empty, args), tree.map_leaves(to_empty, kwargs)
    except _Unchecked:
        return
    if not found:
        return
    try:
        out = op.call(*empty_args, **empty_kwargs)
    except NotImplementedError:
        return
    except Exception as exc:  # noqa: BLE001 - tinygrad's checks raise AssertionError, ValueError, RuntimeError...
        raise refused(
            op, f"its recorded arguments do not fit together ({type(exc).__name__}: {str(exc)[:300]})"
        ) from None
    if out is None and op.in_place:  # __setitem__ returns None: its value is the tensor it wrote
        out = empty_args[0]
    got = _shape(out)
    if got is not None and op.shape is not None and _plain(got) and got != tuple(op.shape):
        raise wrong_shape(op, got, "arguments")


def _plain(shape: Any) -> bool:
    """Is every dimension an int (not symbolic), in a shape or in each shape of a structure."""
    return all(type(d) is int or d is None or (type(d) is tuple and _plain(d)) for d in shape)


class _Unchecked(Exception):
    """A tensor argument that has no empty twin (sharded over devices, or of a symbolic shape)."""


def _shape(value: Any) -> Any:
    """``value``'s shape as an op records it (:func:`torchlens_core.replay.checked.value_shape`); None: no tensor."""
    if isinstance(value, Tensor):
        return tuple(value.shape)
    kids = tree.children(value)
    if not kids:
        return None
    return tuple(tuple(v.shape) if isinstance(v, Tensor) else None for _, v in kids)
