"""What the core needs to know about JAX arrays: shape, dtype, device, NumPy copies, distance.

NumPy arrays count too, because users pass them as inputs and jaxprs carry
them as constants. Nothing here imports JAX unless JAX is already imported.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from torchlens_core.backend.arrays import numpy_error


def is_jax_array(value: Any) -> bool:
    """A jax.Array (tracers included), without importing JAX."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.Array)


def is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or is_jax_array(value)


def device_name(value: Any) -> str:
    """"cpu" for host memory; "gpu:1", "tpu:0"... for accelerators (the platform and device id)."""
    if isinstance(value, np.ndarray):
        return "cpu"
    try:
        device = value.device
        if not hasattr(device, "platform"):  # a sharding over several devices
            device = next(iter(value.devices()))
    except Exception:  # a tracer, or an array already deleted
        return "unknown"
    return "cpu" if device.platform == "cpu" else f"{device.platform}:{device.id}"


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not is_array(value):
        return None
    return tuple(int(d) for d in value.shape), str(value.dtype), device_name(value)


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
