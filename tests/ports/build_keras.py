"""The Keras 3 port (TensorFlow backend, channels-last): ``python build_keras.py OUT_DIR``.

Conversions from the torch weights: a conv kernel ``[out, in, kh, kw]``
becomes ``[kh, kw, in, out]``, a Linear weight ``[out, in]`` becomes a Dense
kernel ``[in, out]``; the image goes in NHWC. The correct cnn transposes its
last feature map back to NCHW before the flatten, so that the torch
``fc.weight`` applies unpermuted; the ``nhwc_flatten`` bug leaves that
transpose out.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import math
from typing import Any

import keras
import numpy as np
import weights
from keras import ops
from output import build_all

import torchlens as tl


class CNN(keras.Model):
    def __init__(self, variant: str) -> None:
        super().__init__(name="CNN")
        self.variant = variant
        self.conv1 = keras.layers.Conv2D(8, 3, padding="same", name="conv1")
        self.conv2 = keras.layers.Conv2D(16, 3, padding="valid" if variant == "lost_padding" else "same", name="conv2")
        self.fc = keras.layers.Dense(weights.CLASSES, name="fc")

    def call(self, x: Any) -> Any:
        x = ops.max_pool(ops.relu(self.conv1(x)), 2, 2)
        x = ops.relu(self.conv2(x))
        if self.variant != "nhwc_flatten":
            x = ops.transpose(x, (0, 3, 1, 2))  # NCHW, the order torch's fc.weight expects
        return self.fc(ops.reshape(x, (x.shape[0], -1)))


class Block(keras.Model):
    def __init__(self, variant: str, name: str = "Block") -> None:
        super().__init__(name=name)
        self.variant = variant
        self.norm1 = keras.layers.LayerNormalization(epsilon=weights.norm1_eps(variant), name="norm1")
        self.q, self.k, self.v, self.out = (keras.layers.Dense(weights.WIDTH, name=n) for n in ("q", "k", "v", "out"))
        self.norm2 = keras.layers.LayerNormalization(epsilon=weights.LN_EPS, name="norm2")
        self.up = keras.layers.Dense(weights.HIDDEN, name="up")
        self.drop = keras.layers.Dropout(weights.DROPOUT, name="drop")
        self.down = keras.layers.Dense(weights.WIDTH, name="down")

    def call(self, x: Any) -> Any:
        h = self.norm1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        attention = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 2, 1))) / math.sqrt(weights.WIDTH), axis=-1)
        x = x + self.out(ops.matmul(attention, v))
        # keras.ops.gelu defaults to the tanh approximation; torch's F.gelu is the exact (erf) form.
        h = ops.gelu(self.up(self.norm2(x)), approximate=self.variant == "gelu_tanh")
        # the dropout_train bug: the layer called in training mode
        return x + self.down(self.drop(h, training=self.variant == "dropout_train"))


class Deep(keras.Model):
    def __init__(self, variant: str) -> None:
        super().__init__(name="Deep")
        self.blocks = [Block(variant, name=f"blocks_{n}") for n in range(weights.DEPTH)]

    def call(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return x


def _load(model: keras.Model, arch: str, variant: str) -> None:
    for name, value in weights.state_dict(arch).items():
        *path, layer_name, kind = name.split(".")
        layer = getattr(_submodule(model, path), layer_name)
        if isinstance(layer, keras.layers.LayerNormalization):
            (layer.gamma if kind == "weight" else layer.beta).assign(value)
        elif kind == "bias":
            layer.bias.assign(value)
        elif value.ndim == 4:
            layer.kernel.assign(value.transpose(2, 3, 1, 0))
        else:
            if variant == "transposed_weight" and layer_name == "q":
                kernel = value  # the bug: torch's [out, in] weight used as the [in, out] kernel
            else:
                kernel = value.T
            if variant == "lost_padding" and layer_name == "fc":
                kernel = kernel[: weights.FLAT_UNPADDED]  # the first inputs: keeps the model runnable
            layer.kernel.assign(kernel)


def _submodule(model: Any, path: list[str]) -> Any:
    for part in path:
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def build(arch: str, variant: str) -> tuple[Any, np.ndarray]:
    keras.utils.set_random_seed(0)
    model = {"cnn": CNN, "block": Block, "deep": Deep}[arch](variant)
    x = weights.model_input(arch)
    x = ops.convert_to_tensor(x.transpose(0, 2, 3, 1) if arch == "cnn" else x)
    model(x)  # builds the weights
    _load(model, arch, variant)
    plain = np.asarray(model(x))
    return tl.trace(model, x, backend="tf"), plain


if __name__ == "__main__":
    build_all("keras", build)
