"""What the core may ask of a TensorFlow value: shape, dtype, device, NumPy copies, distance.

Eager tensors and variables are this backend's arrays; NumPy arrays count too,
so that a model's NumPy output (``model.predict``) compares with a recorded
tensor. Nothing here imports TensorFlow unless it is already imported.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from torchlens_core.backend.arrays import numpy_error

_DEVICES: dict[str, str] = {}


def _tf() -> Any:
    return sys.modules.get("tensorflow")


def is_tf_array(value: Any) -> bool:
    """An eager tensor or a variable (symbolic tensors are not values)."""
    tf = _tf()
    if tf is None:
        return False
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
    return tuple(int(d) for d in value.shape), value.dtype.name, device_name(value.device)


def to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value.copy()
    tf = _tf()
    if isinstance(value, tf.Variable):
        value = value.read_value()
    if value.dtype == tf.resource or value.dtype == tf.variant:
        raise TypeError(f"a {value.dtype.name} tensor (a handle, not data) has no NumPy form")
    return np.array(value.numpy(), copy=True)


def _dtype_name(value: Any) -> str:
    return str(value.dtype) if isinstance(value, np.ndarray) else value.dtype.name


def array_error(actual: Any, expected: Any) -> float:
    """``max |a - e| / (1 + |e|)``; inf for another shape or dtype, or NaNs in other places."""
    actual, expected = (v if is_array(v) else np.asarray(v) for v in (actual, expected))
    if tuple(actual.shape) != tuple(expected.shape) or _dtype_name(actual) != _dtype_name(expected):
        return float("inf")
    return numpy_error(to_numpy(actual), to_numpy(expected), exact_integers=False)
