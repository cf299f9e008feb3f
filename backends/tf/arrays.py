"""What the core may ask of a TensorFlow value: shape, dtype, device, NumPy copies, distance.

Eager tensors and variables are this backend's arrays, Keras 3's variables
included (a ``keras.Variable`` wraps a ``tf.Variable`` and is none itself: a
layer that returns one, such as a rotary table, returns an array); NumPy
arrays count too, so that a model's NumPy output (``model.predict``) compares
with a recorded tensor. Nothing here imports TensorFlow unless it is already
imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchlens_core.backend.array_ops import ArrayOps
from torchlens_core.backend.arrays import numpy_error

_DEVICES: dict[str, str] = {}


def _tf() -> Any:
    return sys.modules.get("tensorflow")


def resource_variable(v: Any) -> Any:
    """The tf.Variable behind a Keras variable (or the variable itself); None for anything else."""
    tf = _tf()
    if tf is None:
        return None
    if isinstance(v, tf.Variable) and hasattr(v, "handle"):
        return v
    inner = getattr(v, "_value", None)
    if isinstance(inner, tf.Variable):
        return inner
    return None


def _unwrapped(value: Any) -> Any:
    """A Keras variable as the tf.Variable it holds (its dtype a DType, its device a device); else ``value``."""
    tf = _tf()
    if tf is None or isinstance(value, tf.Variable | tf.Tensor | np.ndarray):
        return value
    variable = resource_variable(value)
    return value if variable is None else variable


def is_tf_array(value: Any) -> bool:
    """An eager tensor or a variable, a Keras one included (symbolic tensors are not values)."""
    tf = _tf()
    if tf is None:
        return False
    value = _unwrapped(value)
    if isinstance(value, tf.Variable):
        return True
    return isinstance(value, tf.Tensor) and hasattr(value, "numpy")


def is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or is_tf_array(value)


def device_name(device: str) -> str:
    """``"/job:localhost/replica:0/task:0/device:CPU:0"`` -> ``"cpu"``; GPU 1 -> ``"gpu:1"``."""
    name = _DEVICES.get(device)
    if name is None:
        kind, _, number = device.rpartition("device:")[2].partition(":")
        kind = kind.lower() or "cpu"
        name = _DEVICES[device] = "cpu" if kind == "cpu" else f"{kind}:{number or 0}"
    return name


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if isinstance(value, np.ndarray):
        return tuple(value.shape), str(value.dtype), "cpu"
    if not is_tf_array(value):
        return None
    value = _unwrapped(value)
    return tuple(int(d) for d in value.shape), value.dtype.name, device_name(value.device)


def to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value.copy()
    tf = _tf()
    value = _unwrapped(value)
    if isinstance(value, tf.Variable):
        value = value.read_value()
    if value.dtype == tf.resource or value.dtype == tf.variant:
        raise TypeError(f"a {value.dtype.name} tensor (a handle, not data) has no NumPy form")
    return np.array(value.numpy(), copy=True)


def _dtype_name(value: Any) -> str:
    return str(value.dtype) if isinstance(value, np.ndarray) else value.dtype.name


def array_error(actual: Any, expected: Any) -> float:
    """``max |a - e| / (1 + |e|)``; inf for another shape or dtype, or NaNs in other places."""
    actual, expected = (_unwrapped(v) if is_array(v) else np.asarray(v) for v in (actual, expected))
    if tuple(actual.shape) != tuple(expected.shape) or _dtype_name(actual) != _dtype_name(expected):
        return float("inf")
    return numpy_error(to_numpy(actual), to_numpy(expected), exact_integers=False)


class TFArrayOps(ArrayOps):
    """ArrayOps on eager tensors, for interventions.

    Tensors are immutable, so :meth:`write_into` keeps the default (the edit
    is a new tensor) and :meth:`copy` needs no copy of the data; an edit of a
    variable write reaches the variable through the capture, which assigns the
    edited state to it. Everything runs on the device of the tensor given.
    Integer and boolean means are taken in float64 and cast back, as NumPy's
    ``mean(...).astype(dtype)`` does; sums keep the dtype.
    """

    def zeros_like(self, x: Any) -> Any:
        return _tf().zeros_like(x)

    def mean(self, x: Any, axes: tuple[int, ...]) -> Any:
        tf = _tf()
        if x.dtype.is_floating or x.dtype.is_complex:
            return tf.reduce_mean(x, axis=list(axes), keepdims=True)
        return tf.cast(tf.reduce_mean(tf.cast(x, tf.float64), axis=list(axes), keepdims=True), x.dtype)

    def sum(self, x: Any, axis: int) -> Any:
        tf = _tf()
        if x.dtype == tf.bool:  # NumPy sums booleans as integers; any is what they cast back to
            return tf.reduce_any(x, axis=axis, keepdims=True)
        return tf.reduce_sum(x, axis=axis, keepdims=True)

    def total(self, x: Any) -> Any:
        return _tf().reduce_sum(x)

    def clip(self, x: Any, low: float | None, high: float | None) -> Any:
        tf = _tf()
        with tf.device(x.device):
            if low is not None:
                x = tf.maximum(x, tf.cast(_in_range(low, x.dtype), x.dtype))
            if high is not None:
                x = tf.minimum(x, tf.cast(_in_range(high, x.dtype), x.dtype))
        return x

    def take(self, x: Any, indices: Sequence[int], axis: int) -> Any:
        tf = _tf()
        with tf.device(x.device):
            return tf.gather(x, tf.constant(list(indices), dtype=tf.int64), axis=axis)

    def from_numpy(self, array: Any, like: Any) -> Any:
        tf = _tf()
        with tf.device(like.device):
            return tf.constant(np.asarray(array).astype(like.dtype.as_numpy_dtype, copy=False))

    def copy(self, x: Any) -> Any:
        tf = _tf()
        x = _unwrapped(x)
        if isinstance(x, tf.Variable):  # its value now: a later write to the variable does not change it
            return tf.identity(x.read_value())
        return x  # a tensor never changes (a variable's read is copied before the variable is written)


ARRAY_OPS = TFArrayOps()


def _in_range(bound: float, dtype: Any) -> float:
    """A clip bound an integer dtype can hold (a cast would wrap -1 to 255 for uint8)."""
    return min(max(bound, dtype.min), dtype.max) if dtype.is_integer else bound
