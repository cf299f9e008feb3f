"""A small array of each installed backend, for tests that check one behaviour on every backend."""

from __future__ import annotations

from typing import Any

from torchlens_core.backend.manager import backend_infos

BACKENDS = [info.name for info in backend_infos() if info.available]


def array(backend: str, values: list[list[float]]) -> Any:
    """``values`` as a float32 array of ``backend`` (the framework is imported here, never at collection)."""
    if backend == "torch":
        import torch

        return torch.tensor(values)
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.asarray(values, dtype=jnp.float32)
    if backend == "tf":
        import tensorflow as tf

        return tf.constant(values, dtype=tf.float32)
    if backend == "paddle":
        import paddle

        return paddle.to_tensor(values, dtype="float32")
    if backend == "tinygrad":
        from tinygrad import Tensor

        return Tensor(values)
    if backend == "numpy":
        import numpy as np

        return np.asarray(values, dtype=np.float32)
    raise LookupError(f"no test array for backend {backend!r}")


def numpy_of(value: Any) -> Any:
    import numpy as np

    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
