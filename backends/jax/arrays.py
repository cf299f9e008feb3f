"""What the core needs to know about JAX arrays: shape, dtype, device, NumPy copies, distance, edits.

NumPy arrays count too, because users pass them as inputs and jaxprs carry
them as constants. Nothing here imports JAX unless JAX is already imported
(:class:`JaxArrayOps` imports it when an edit first needs it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchlens_core.backend.array_ops import ArrayOps, NumpyArrayOps
from torchlens_core.backend.arrays import numpy_error


def is_jax_array(value: Any) -> bool:
    """A jax.Array (tracers included), without importing JAX."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.Array)


def is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or is_jax_array(value)


def device_name(value: Any) -> str:
    """ "cpu" for host memory; "gpu:1", "tpu:0"... for accelerators (the platform and device id)."""
    if isinstance(value, np.ndarray):
        return "cpu"
    try:
        device = value.device
        if not hasattr(device, "platform"):  # a sharding over several devices
            device = next(iter(value.devices()))
    except Exception:  # noqa: BLE001 - a tracer, or an array already deleted
        return "unknown"
    return "cpu" if device.platform == "cpu" else f"{device.platform}:{device.id}"


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not is_array(value):
        return None
    return tuple(int(d) for d in value.shape), dtype_name(value.dtype), device_name(value)


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``str(dtype)``, remembered: NumPy's ``dtype.__str__`` is Python code that costs microseconds, and a
    capture asks for every op's dtype (and, through ``tl.trace``'s own bookkeeping, every argument's)."""
    try:
        name = _DTYPE_NAMES.get(dtype)
    except TypeError:  # an unhashable dtype-like
        return str(dtype)
    if name is None:
        name = str(dtype)
        if len(_DTYPE_NAMES) < 1024:  # structured dtypes could be made without end
            _DTYPE_NAMES[dtype] = name
    return name


def _is_key(value: Any) -> bool:
    """A typed PRNG key array (dtype ``key<fry>``), which NumPy cannot hold as is."""
    return is_jax_array(value) and str(value.dtype).startswith("key<")


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy copy; PRNG key arrays become their raw key data."""
    if _is_key(value):
        import jax

        value = jax.random.key_data(value)
    return np.array(value, copy=True)


def array_error(actual: Any, expected: Any) -> float:
    """``max |a - e| / (1 + |e|)``; inf for another shape or dtype or NaNs elsewhere."""
    actual, expected = (v if is_array(v) else np.asarray(v) for v in (actual, expected))
    if tuple(actual.shape) != tuple(expected.shape) or str(actual.dtype) != str(expected.dtype):
        return float("inf")
    return numpy_error(to_numpy(actual), to_numpy(expected), exact_integers=False)


class JaxArrayOps(ArrayOps):
    """ArrayOps on JAX arrays, for interventions (``intervene=``).

    JAX arrays never change in place, so :meth:`copy` returns the array and
    ``write_into`` keeps the base class's answer (the edited value). A NumPy
    array (an input a module returned as it was) is edited with NumPy, so
    that the edit keeps it on the host, where the checks of the edit expect it.
    """

    def __init__(self) -> None:
        self.numpy = NumpyArrayOps()

    def zeros_like(self, x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return self.numpy.zeros_like(x)
        import jax.numpy as jnp

        return jnp.zeros_like(x)

    def mean(self, x: Any, axes: tuple[int, ...]) -> Any:
        if isinstance(x, np.ndarray):
            return self.numpy.mean(x, axes)
        import jax.numpy as jnp

        return jnp.mean(x, axis=axes, keepdims=True).astype(x.dtype)  # an integer mean comes back as float

    def sum(self, x: Any, axis: int) -> Any:
        if isinstance(x, np.ndarray):
            return self.numpy.sum(x, axis)
        import jax.numpy as jnp

        return jnp.sum(x, axis=axis, keepdims=True, dtype=x.dtype)

    def total(self, x: Any) -> Any:
        import jax.numpy as jnp

        return jnp.sum(x)  # a NumPy array too: a loss is a JAX scalar, which jax.grad differentiates

    def clip(self, x: Any, low: float | None, high: float | None) -> Any:
        if isinstance(x, np.ndarray):
            return self.numpy.clip(x, low, high)
        import jax.numpy as jnp

        return jnp.clip(x, low, high).astype(x.dtype)  # a float bound would promote an integer array

    def take(self, x: Any, indices: Sequence[int], axis: int) -> Any:
        if isinstance(x, np.ndarray):
            return self.numpy.take(x, indices, axis)
        import jax.numpy as jnp

        return jnp.take(x, jnp.asarray(list(indices), dtype=jnp.int32), axis=axis)

    def from_numpy(self, array: Any, like: Any) -> Any:
        if isinstance(like, np.ndarray):
            return self.numpy.from_numpy(array, like)
        import jax

        return jax.device_put(np.asarray(array, dtype=like.dtype), like.sharding)  # like's device(s)

    def copy(self, x: Any) -> Any:
        return self.numpy.copy(x) if isinstance(x, np.ndarray) else x  # a jax.Array is immutable


ARRAY_OPS = JaxArrayOps()
