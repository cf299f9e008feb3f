"""Before an op of a loaded trace runs, the same call on ``meta`` tensors: arguments that disagree are refused.

A file can be hand-made with hashes to match, and an allow-listed call is not
safe with any arguments: ``torch.lstm`` with ``batch_first`` flipped reads and
writes its hidden state out of bounds and kills the process (``free(): invalid
next size``) before its output could be compared with its record
(:mod:`torchlens_core.replay.checked`). The meta kernels compute shapes only,
with the real kernels' argument checks, so the call is made there first with
every tensor argument's shape, strides and dtype: if it raises, or its
output's shape is not the recorded one, the op is refused with a
:class:`ReplayError` before the real kernel sees the arguments.

Only loaded traces are checked: a live trace's ops ran with these very
arguments in the model's forward. A call with no tensor argument (a factory
such as ``torch.zeros``) makes no meta call, nor does one whose tensors cannot
be put on ``meta`` (sparse, nested) or whose kernel has no meta version
(``nonzero``, ``item``: outputs that depend on values); those run unchecked,
as before (LIMITATIONS.md).
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord
from torchlens_core.replay.checked import PassedChecks, from_file, refused, wrong_shape

# What torch says when a call cannot be made on meta tensors at all, besides NotImplementedError (no meta
# kernel): a result that depends on values. The op then runs unchecked; any other error is the arguments' fault.
# Exact phrases: an error that merely echoes a string argument must not pass for one of these.
_NO_META = (
    "tensor.item() cannot be called on meta tensors",
    "cannot repeat_interleave a meta tensor",
    "can't convert meta device type tensor",
    "data-dependent expression",
    "may return an output tensor with data-dependent shape",
)


def check_loaded(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse ``op``'s call with these arguments when its trace was loaded and the call on meta tensors disagrees."""
    if from_file(op):
        check(op, args, kwargs)


def check(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Run ``op.call`` on meta copies of the tensor arguments; ReplayError if it raises or gives another shape.

    A call already seen to pass (same callable, the same shapes, strides and dtypes, the same constants of the
    same types, the same recorded shape) passes again without a meta call: meta kernels compute shapes only,
    so their verdict depends on nothing else, and some are slow Python decompositions (batch_norm's costs a
    millisecond), while a model repeats the same calls in each of its blocks.
    """
    _PASSED.run(_signature(op, args, kwargs), lambda: _check(op, args, kwargs))


_PASSED = PassedChecks()  # calls that passed, by signature (see check)
_CONSTANTS = frozenset(
    {int, float, bool, str, type(None), complex, torch.dtype, torch.device, torch.layout, torch.memory_format}
)


def _signature(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What the meta call's verdict depends on, hashable; None where some argument is not plain enough to say."""

    def describe(v: Any) -> Any:
        t = type(v)
        if isinstance(v, torch.Tensor):
            if v.layout is not torch.strided:
                raise TypeError
            return ("tensor", tuple(v.shape), v.stride(), v.dtype)
        if t in _CONSTANTS:
            return (t, v)  # the type too: True == 1 == 1.0, but a kernel may take them apart
        if t is tuple or t is list or t is torch.Size:
            return (t, tuple(describe(x) for x in v))
        if t is dict:
            return (t, tuple((k, describe(x)) for k, x in v.items()))
        raise TypeError

    try:
        key = (op.call, op.shape, op.in_place, describe(args), describe(kwargs))
        hash(key)
    except TypeError:
        return None
    return key


def _check(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The meta call itself: returns where it cannot be made, raises ReplayError where it disagrees."""
    found = []

    def to_meta(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        found.append(v)
        if v.layout is not torch.strided or v.is_nested or v.is_quantized:
            raise _Unchecked
        return torch.empty_strided(tuple(v.shape), v.stride(), dtype=v.dtype, device="meta")

    try:
        meta_args, meta_kwargs = tree.map_leaves(to_meta, args), tree.map_leaves(to_meta, kwargs)
    except _Unchecked:
        return
    if not found:
        return
    try:
        with torch.no_grad():
            out = op.call(*meta_args, **meta_kwargs)
    except NotImplementedError:
        return
    except Exception as exc:  # noqa: BLE001 - sorted below: the kernel's limits, or the arguments' fault
        text = str(exc)
        if any(phrase in text.lower() for phrase in _NO_META):
            return
        raise refused(op, f"its recorded arguments do not fit together ({type(exc).__name__}: {text[:300]})") from None
    got = _shape(out)
    if got is not None and op.shape is not None and got != tuple(op.shape):
        raise wrong_shape(op, got, "arguments")


class _Unchecked(Exception):
    """A tensor argument that has no meta twin (sparse, nested, quantized)."""


def _shape(value: Any) -> Any:
    """``value``'s shape as an op records it (see :func:`torchlens_core.replay.checked.value_shape`); None: no array."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    kids = tree.children(value)
    if not kids:
        return None
    return tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else None for _, v in kids)
