"""Loading JAX values for ``tl.load``; calls are not saved.

A JAX op's call is a primitive with its equation parameters, which include
jaxprs, shardings and dimension-number classes that JSON cannot carry without
a per-primitive codec. So a loaded JAX trace has every value (as JAX arrays)
and supports lookup, summary, tables and drawing, but cannot be replayed:
``replay()`` raises UnsupportedError naming the ops. Importing this module does
not import JAX.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.errors import UnsupportedError

# dtype name ``key<...>`` -> the PRNG implementation's name (an unknown one loads as its raw key data)
_KEY_IMPLS = {"fry": "threefry2x32", "rbg": "rbg", "urbg": "unsafe_rbg"}


def encode_call(op: Any) -> Any:
    raise UnsupportedError(f"JAX primitive {op.func_name!r} is saved without its parameters (jaxprs, shardings, "
                           "dimension numbers), so a loaded JAX trace cannot be replayed")


def from_numpy(array: Any, dtype: str, device: str) -> Any:
    import jax
    import jax.numpy as jnp

    if dtype.startswith("key<"):  # typed PRNG keys were saved as their key data
        impl = _KEY_IMPLS.get(dtype[4:-1])
        return jnp.asarray(array) if impl is None else jax.random.wrap_key_data(jnp.asarray(array), impl=impl)
    if dtype != array.dtype.name:
        array = array.view(jnp.dtype(dtype))  # bfloat16 and friends: their raw bits
    return jnp.asarray(array)
