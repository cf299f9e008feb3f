"""Array adapters: what the core may ask of a Paddle tensor."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
from paddle import Tensor

from torchlens_core.backend.array_ops import ArrayOps
from torchlens_core.backend.arrays import numpy_error
from torchlens_core.ir import tree

# The C methods, as they were before any capture replaced them: detaching and copying never record an op.
_detach = getattr(Tensor.__dict__["detach"], "__wrapped__", Tensor.__dict__["detach"])
_clone = getattr(Tensor.__dict__["clone"], "__wrapped__", Tensor.__dict__["clone"])
_data_ptr = Tensor.__dict__["data_ptr"]
_offset = Tensor.__dict__["_offset"]

# id(dtype) -> (dtype, name). Paddle's dtypes are a few long-lived objects (``t.dtype is paddle.float32``), but
# hashing one runs Python-level code (~0.7 us, on every recorded op): keyed by identity instead, the dtype kept
# so that its id cannot be reused by another object.
_DTYPE_NAMES: dict[int, tuple[Any, str]] = {}


def dtype_name(dtype: Any) -> str:
    """``paddle.float32`` -> ``"float32"``."""
    entry = _DTYPE_NAMES.get(id(dtype))
    if entry is None or entry[0] is not dtype:
        if len(_DTYPE_NAMES) > 256:  # dtypes made afresh each time would otherwise pile up here
            _DTYPE_NAMES.clear()
        entry = _DTYPE_NAMES[id(dtype)] = (dtype, str(dtype).removeprefix("paddle."))
    return entry[1]


def device_name(place: Any) -> str:
    """``Place(cpu)`` -> ``"cpu"``, ``Place(gpu:0)`` -> ``"gpu"``: the kind of device, as torch's ``device.type``."""
    if place.is_cpu_place():
        return "cpu"
    if place.is_gpu_place():
        return "gpu"
    text = str(place)  # Place(xpu:0), Place(gpu_pinned)...
    return text.removeprefix("Place(").removesuffix(")").split(":")[0]


def snapshot(t: Tensor) -> Tensor:
    """A detached copy of ``t`` (through the original C methods: never recorded)."""
    copy = _clone(_detach(t))
    copy.stop_gradient = t.stop_gradient
    return copy


def attached_copy(t: Tensor) -> Tensor:
    """A copy of ``t`` in memory of its own that stays in the autograd graph (its gradient reaches ``t``)."""
    return _clone(t)


def allocation(t: Tensor) -> int:
    """The address of the allocation ``t`` views (0 when it has none): views of one tensor share it."""
    try:
        ptr = _data_ptr(t)
        return ptr - _offset(t) if ptr else 0
    except (RuntimeError, ValueError, TypeError):
        return 0


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not isinstance(value, Tensor):
        return None
    try:
        device = device_name(value.place)
    except RuntimeError:  # an output some kernels leave unallocated (unique's unused counts, rnn's scratch)
        device = "undefined"
    return tuple(value.shape), dtype_name(value.dtype), device


def to_numpy(value: Tensor) -> Any:
    if value.dtype == paddle.bfloat16:  # NumPy has no bfloat16: Paddle hands back raw uint16
        value = value.astype("float32")
    return np.array(value.detach().cpu().numpy(), copy=True)


def array_error(actual: Tensor, expected: Tensor) -> float:
    """max |a - e| / (1 + |e|); inf for a shape or dtype mismatch or NaNs in other places."""
    if list(actual.shape) != list(expected.shape) or actual.dtype != expected.dtype:
        return math.inf
    return numpy_error(to_numpy(actual), to_numpy(expected))


def detach(value: Any) -> Any:
    """``value`` (a tensor or a structure of them) cut from the autograd graph; the memory is shared."""
    return tree.map_leaves(lambda v: _detach(v) if isinstance(v, Tensor) else v, value)


class PaddleArrayOps(ArrayOps):
    """ArrayOps on Paddle tensors, for interventions.

    Edits stay in the autograd graph (gradients flow through an edited value).
    Paddle's in-place writes are seen by every view of the written memory, so
    an in-place op's edit is written into its output (:meth:`write_into`).
    """

    def zeros_like(self, x: Tensor) -> Tensor:
        return paddle.zeros_like(x)

    def mean(self, x: Tensor, axes: tuple[int, ...]) -> Tensor:
        if x.is_floating_point() or x.is_complex():
            return x.mean(axis=list(axes), keepdim=True)
        # Paddle's mean takes floating tensors only: an integer mean is taken in float64, cast back
        return x.astype("float64").mean(axis=list(axes), keepdim=True).astype(x.dtype)

    def sum(self, x: Tensor, axis: int) -> Tensor:
        return x.sum(axis=axis, keepdim=True, dtype=x.dtype)  # without dtype=, int32 sums to int64

    def clip(self, x: Tensor, low: float | None, high: float | None) -> Tensor:
        return paddle.clip(x, low, high)

    def total(self, x: Tensor) -> Tensor:
        return x.sum()

    def take(self, x: Tensor, indices: Sequence[int], axis: int) -> Tensor:
        return paddle.index_select(x, paddle.to_tensor(list(indices), dtype="int64", place=x.place), axis=axis)

    def from_numpy(self, array: Any, like: Tensor) -> Tensor:
        return paddle.to_tensor(np.asarray(array), dtype=like.dtype, place=like.place)

    def copy(self, x: Tensor) -> Tensor:
        # A constant (stop_gradient, as detach makes it): a leaf that wanted gradients could not be written in
        # place, and a model may write into what a module returned (tl.swap_with puts such copies there)
        return _clone(_detach(x))

    def write_into(self, target: Tensor, value: Tensor) -> Tensor:
        if value is target:
            return target
        if allocation(value) == allocation(target):  # a view of the memory it is written into: copy it first
            value = _clone(value)
        paddle.assign(value, output=target)  # into target's memory: its views see the edit too
        return target


ARRAY_OPS = PaddleArrayOps()
