"""The JAX port (flax.nnx, channels-last): ``python build_jax.py OUT_DIR``.

Conversions from the torch weights: a conv kernel ``[out, in, kh, kw]``
becomes ``[kh, kw, in, out]``, a Linear weight ``[out, in]`` becomes a kernel
``[in, out]``; the image goes in NHWC. The correct cnn transposes its last
feature map back to NCHW before the flatten, so that the torch ``fc.weight``
applies unpermuted; the ``nhwc_flatten`` bug leaves that transpose out.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import weights
from flax import nnx
from output import build_all

import torchlens as tl


class CNN(nnx.Module):
    def __init__(self, variant: str, rngs: nnx.Rngs) -> None:
        self.variant = variant
        self.conv1 = nnx.Conv(3, 8, (3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, (3, 3), padding="VALID" if variant == "lost_padding" else "SAME", rngs=rngs)
        self.fc = nnx.Linear(weights.fc_inputs(variant), weights.CLASSES, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        x = nnx.max_pool(nnx.relu(self.conv1(x)), (2, 2), (2, 2))
        x = nnx.relu(self.conv2(x))
        if self.variant != "nhwc_flatten":
            x = jnp.transpose(x, (0, 3, 1, 2))  # NCHW, the order torch's fc.weight expects
        return self.fc(x.reshape(x.shape[0], -1))


class Block(nnx.Module):
    def __init__(self, variant: str, rngs: nnx.Rngs) -> None:
        self.variant = variant
        self.norm1 = nnx.LayerNorm(weights.WIDTH, epsilon=weights.norm1_eps(variant), rngs=rngs)
        self.q, self.k, self.v, self.out = (nnx.Linear(weights.WIDTH, weights.WIDTH, rngs=rngs) for _ in range(4))
        self.norm2 = nnx.LayerNorm(weights.WIDTH, epsilon=weights.LN_EPS, rngs=rngs)
        self.up = nnx.Linear(weights.WIDTH, weights.HIDDEN, rngs=rngs)
        self.drop = nnx.Dropout(weights.DROPOUT, rngs=rngs)
        self.down = nnx.Linear(weights.HIDDEN, weights.WIDTH, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        h = self.norm1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        attention = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / math.sqrt(weights.WIDTH), axis=-1)
        x = x + self.out(attention @ v)
        # jax.nn.gelu defaults to the tanh approximation; torch's F.gelu is the exact (erf) form.
        h = jax.nn.gelu(self.up(self.norm2(x)), approximate=self.variant == "gelu_tanh")
        return x + self.down(self.drop(h))


class Deep(nnx.Module):
    def __init__(self, variant: str, rngs: nnx.Rngs) -> None:
        self.blocks = nnx.List([Block(variant, rngs) for _ in range(weights.DEPTH)])

    def __call__(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return x


def _load(model: nnx.Module, arch: str, variant: str) -> None:
    for name, value in weights.state_dict(arch).items():
        *path, layer_name, kind = name.split(".")
        layer = getattr(_submodule(model, path), layer_name)
        if kind == "bias":
            layer.bias.value = jnp.asarray(value)
        elif value.ndim == 4:
            layer.kernel.value = jnp.asarray(value.transpose(2, 3, 1, 0))
        elif isinstance(layer, nnx.LayerNorm):
            layer.scale.value = jnp.asarray(value)
        else:
            if variant == "transposed_weight" and layer_name == "q":
                kernel = value  # the bug: torch's [out, in] weight used as the [in, out] kernel
            else:
                kernel = value.T
            if variant == "lost_padding" and layer_name == "fc":
                kernel = kernel[: layer.in_features]  # the first inputs: keeps the model runnable
            layer.kernel.value = jnp.asarray(kernel)


def _submodule(model: Any, path: list[str]) -> Any:
    for part in path:
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def build(arch: str, variant: str) -> tuple[Any, np.ndarray]:
    model = {"cnn": CNN, "block": Block, "deep": Deep}[arch](variant, nnx.Rngs(params=0, dropout=1))
    _load(model, arch, variant)
    model.eval()
    if variant == "dropout_train":
        model.drop.deterministic = False  # the bug: dropout left in training mode
    x = weights.model_input(arch)
    x = jnp.asarray(x.transpose(0, 2, 3, 1) if arch == "cnn" else x)
    plain = np.asarray(model(x))
    return tl.trace(model, x, backend="jax"), plain


if __name__ == "__main__":
    build_all("jax", build)
