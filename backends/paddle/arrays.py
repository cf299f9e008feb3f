"""Array adapters: what the core may ask of a Paddle tensor."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import paddle

from torchlens_core.backend.arrays import numpy_error
from torchlens_core.ir import tree

Tensor = paddle.Tensor
# The C method, as it was before any capture replaced it: detaching never records an op.
_detach = getattr(Tensor.__dict__["detach"], "__wrapped__", Tensor.__dict__["detach"])

_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``paddle.float32`` -> ``"float32"``."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("paddle.")
    return name


def device_name(place: Any) -> str:
    """``Place(cpu)`` -> ``"cpu"``, ``Place(gpu:0)`` -> ``"gpu"``: the kind of device, as torch's ``device.type``."""
    if place.is_cpu_place():
        return "cpu"
    if place.is_gpu_place():
        return "gpu"
    text = str(place)  # Place(xpu:0), Place(gpu_pinned)...
    return text.removeprefix("Place(").removesuffix(")").split(":")[0]


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not isinstance(value, Tensor):
        return None
    return tuple(value.shape), dtype_name(value.dtype), device_name(value.place)


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
