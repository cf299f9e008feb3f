"""The Paddle port (NCHW, like torch): ``python build_paddle.py OUT_DIR``.

Conversions from the torch weights: conv weights keep their layout
``[out, in, kh, kw]``; a Linear weight ``[out, in]`` becomes Paddle's
``[in, out]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F
import weights
from output import build_all
from paddle import nn

import torchlens as tl


class CNN(nn.Layer):
    def __init__(self, variant: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2D(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2D(8, 16, 3, padding=0 if variant == "lost_padding" else 1)
        self.fc = nn.Linear(weights.fc_inputs(variant), weights.CLASSES)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.fc(paddle.flatten(x, 1))


class Block(nn.Layer):
    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        self.norm1 = nn.LayerNorm(weights.WIDTH, epsilon=weights.norm1_eps(variant))
        self.q, self.k, self.v, self.out = (nn.Linear(weights.WIDTH, weights.WIDTH) for _ in range(4))
        self.norm2 = nn.LayerNorm(weights.WIDTH, epsilon=weights.LN_EPS)
        self.up = nn.Linear(weights.WIDTH, weights.HIDDEN)
        self.drop = nn.Dropout(weights.DROPOUT)
        self.down = nn.Linear(weights.HIDDEN, weights.WIDTH)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        h = self.norm1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        attention = F.softmax(q @ k.transpose([0, 2, 1]) / math.sqrt(weights.WIDTH), axis=-1)
        x = x + self.out(attention @ v)
        h = F.gelu(self.up(self.norm2(x)), approximate=self.variant == "gelu_tanh")
        return x + self.down(self.drop(h))


class Deep(nn.Layer):
    def __init__(self, variant: str) -> None:
        super().__init__()
        self.blocks = nn.LayerList([Block(variant) for _ in range(weights.DEPTH)])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _load(model: nn.Layer, arch: str, variant: str) -> None:
    for name, value in weights.state_dict(arch).items():
        *path, layer_name, kind = name.split(".")
        layer = getattr(_submodule(model, path), layer_name)
        if isinstance(layer, nn.Linear) and kind == "weight":
            # the transposed_weight bug: torch's [out, in] q weight used as Paddle's [in, out] unchanged
            if not (variant == "transposed_weight" and layer_name == "q"):
                value = value.T
            if variant == "lost_padding" and layer_name == "fc":
                value = value[: weights.FLAT_UNPADDED]  # the first inputs: keeps the model runnable
        getattr(layer, kind).set_value(np.ascontiguousarray(value))


def _submodule(model: Any, path: list[str]) -> Any:
    for part in path:
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def build(arch: str, variant: str) -> tuple[Any, np.ndarray]:
    paddle.seed(0)
    model = {"cnn": CNN, "block": Block, "deep": Deep}[arch](variant)
    _load(model, arch, variant)
    model.eval()
    if variant == "dropout_train":
        model.drop.train()  # the bug: dropout left in training mode
    x = paddle.to_tensor(weights.model_input(arch))
    with paddle.no_grad():
        plain = model(x).numpy()
        trace = tl.trace(model, x, backend="paddle")
    return trace, plain


if __name__ == "__main__":
    build_all("paddle", build)
