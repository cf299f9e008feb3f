"""The reference side: the cnn and the block in PyTorch, traced and saved (``python build_torch.py OUT_DIR``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import weights
from output import build_all
from torch import nn

import torchlens as tl


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(weights.FLAT, weights.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(weights.WIDTH, eps=weights.LN_EPS)
        self.q, self.k, self.v, self.out = (nn.Linear(weights.WIDTH, weights.WIDTH) for _ in range(4))
        self.norm2 = nn.LayerNorm(weights.WIDTH, eps=weights.LN_EPS)
        self.up = nn.Linear(weights.WIDTH, weights.HIDDEN)
        self.drop = nn.Dropout(weights.DROPOUT)
        self.down = nn.Linear(weights.HIDDEN, weights.WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        attention = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(weights.WIDTH), dim=-1)
        x = x + self.out(attention @ v)
        return x + self.down(self.drop(F.gelu(self.up(self.norm2(x)))))


class Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(weights.DEPTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build(arch: str, variant: str) -> tuple[Any, np.ndarray]:
    assert variant == "correct", variant  # torch is the reference: the bugs are in the ports
    model = {"cnn": CNN, "block": Block, "deep": Deep}[arch]()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.state_dict(arch).items()}, strict=True)
    model.eval()
    x = torch.from_numpy(weights.model_input(arch))
    with torch.no_grad():
        plain = model(x).numpy()
        trace = tl.trace(model, x, backend="torch")
    return trace, plain


if __name__ == "__main__":
    build_all("torch", build)
