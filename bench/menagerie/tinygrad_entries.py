"""The tinygrad menagerie: the architectures tinygrad's examples build, written small with ``tinygrad.nn`` layers.

tinygrad's model definitions (ResNet, ViT, GPT-2, LLaMA, the Stable Diffusion
U-Net) live in its repository's ``extra/`` folder, not in its wheel, so these
follow their structure at toy sizes: every distinct kernel is compiled by
clang the first time it runs, which is what tinygrad's run time is made of
here. Weights are random (``Tensor.manual_seed``), nothing is downloaded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from bench.menagerie.entries import Built, Entry


def entries() -> list[Entry]:
    return [
        Entry(
            "tinygrad", f"tinygrad/{name}", "tinygrad", f"tinygrad.{name}", functools.partial(_build, name), rtol=1e-4
        )
        for name in _BUILDERS
    ]


def _build(name: str) -> Built:
    from tinygrad import Tensor
    from tinygrad.nn.state import get_parameters

    Tensor.manual_seed(0)
    model, args = _BUILDERS[name]()
    Tensor.realize(*get_parameters(model), *args)  # every run starts from the same realized values
    return model, tuple(args), {}


def _resnet() -> tuple[Any, list[Any]]:
    from tinygrad import Tensor, nn

    class BasicBlock:
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = (
                [nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)]
                if stride != 1 or cin != cout
                else []
            )

        def __call__(self, x: Tensor) -> Tensor:
            out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
            return (out + x.sequential(self.downsample)).relu()

    class ResNet:
        def __init__(self) -> None:
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(4)
            self.layer1 = [BasicBlock(4, 4, 1)]
            self.layer2 = [BasicBlock(4, 8, 2)]
            self.fc = nn.Linear(8, 5)

        def __call__(self, x: Tensor) -> Tensor:
            h = self.bn1(self.conv1(x)).relu().max_pool2d()
            h = h.sequential(self.layer1).sequential(self.layer2)
            return self.fc(h.mean((2, 3)))

    return ResNet(), [Tensor.randn(1, 3, 8, 8)]


def _attention(dim: int, heads: int, causal: bool) -> Any:
    from tinygrad import Tensor, nn

    class Attention:
        def __init__(self) -> None:
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def __call__(self, x: Tensor) -> Tensor:
            b, t, _ = x.shape
            q, k, v = [y.reshape(b, t, heads, dim // heads).transpose(1, 2) for y in self.qkv(x).chunk(3, dim=2)]
            h = q.scaled_dot_product_attention(k, v, is_causal=causal)
            return self.proj(h.transpose(1, 2).reshape(b, t, dim))

    return Attention()


def _vit() -> tuple[Any, list[Any]]:
    from tinygrad import Tensor, nn

    class Block:
        def __init__(self) -> None:
            self.norm1, self.norm2 = nn.LayerNorm(8), nn.LayerNorm(8)
            self.attn = _attention(8, 2, causal=False)
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

        def __call__(self, x: Tensor) -> Tensor:
            x = x + self.attn(self.norm1(x))
            return x + self.fc2(self.fc1(self.norm2(x)).gelu())

    class ViT:
        def __init__(self) -> None:
            self.patch = nn.Conv2d(3, 8, 4, stride=4)
            self.cls = Tensor.zeros(1, 1, 8)
            self.pos = Tensor.randn(1, 5, 8) * 0.02
            self.blocks = [Block()]
            self.norm = nn.LayerNorm(8)
            self.head = nn.Linear(8, 5)

        def __call__(self, x: Tensor) -> Tensor:
            p = self.patch(x).flatten(2).transpose(1, 2)
            h = self.cls.expand(p.shape[0], 1, 8).cat(p, dim=1) + self.pos
            return self.head(self.norm(h.sequential(self.blocks))[:, 0])

    return ViT(), [Tensor.randn(1, 3, 8, 8)]


def _gpt2() -> tuple[Any, list[Any]]:
    from tinygrad import Tensor, nn

    class Block:
        def __init__(self) -> None:
            self.ln_1, self.ln_2 = nn.LayerNorm(8), nn.LayerNorm(8)
            self.attn = _attention(8, 2, causal=True)
            self.c_fc, self.c_proj = nn.Linear(8, 32), nn.Linear(32, 8)

        def __call__(self, x: Tensor) -> Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(self.c_fc(self.ln_2(x)).gelu())

    class GPT2:
        def __init__(self) -> None:
            self.wte, self.wpe = nn.Embedding(20, 8), nn.Embedding(8, 8)
            self.h = [Block(), Block()]
            self.ln_f = nn.LayerNorm(8)

        def __call__(self, ids: Tensor) -> Tensor:
            h = self.wte(ids) + self.wpe(Tensor.arange(ids.shape[1]).reshape(1, -1))
            return self.ln_f(h.sequential(self.h)) @ self.wte.weight.T  # tied head, as GPT-2's

    return GPT2(), [Tensor([[1, 5, 7, 2, 19, 3]])]


def _llama() -> tuple[Any, list[Any]]:
    from tinygrad import Tensor, nn

    dim, heads, kv_heads, t = 8, 4, 2, 6
    head = dim // heads

    def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        a, b = x[..., : head // 2], x[..., head // 2 :]
        return (a * cos - b * sin).cat(a * sin + b * cos, dim=-1)

    class Attention:
        def __init__(self) -> None:
            self.wq = nn.Linear(dim, heads * head, bias=False)
            self.wk = nn.Linear(dim, kv_heads * head, bias=False)
            self.wv = nn.Linear(dim, kv_heads * head, bias=False)
            self.wo = nn.Linear(heads * head, dim, bias=False)

        def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
            b = x.shape[0]
            q = rotary(self.wq(x).reshape(b, t, heads, head).transpose(1, 2), cos, sin)
            k = rotary(self.wk(x).reshape(b, t, kv_heads, head).transpose(1, 2), cos, sin)
            v = self.wv(x).reshape(b, t, kv_heads, head).transpose(1, 2)
            k, v = (y.repeat_interleave(heads // kv_heads, dim=1) for y in (k, v))  # grouped-query attention
            return self.wo(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, dim))

    class Block:
        def __init__(self) -> None:
            self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
            self.attention = Attention()
            self.w1, self.w3 = nn.Linear(dim, 16, bias=False), nn.Linear(dim, 16, bias=False)
            self.w2 = nn.Linear(16, dim, bias=False)

        def __call__(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
            x = x + self.attention(self.attention_norm(x), cos, sin)
            h = self.ffn_norm(x)
            return x + self.w2(self.w1(h).silu() * self.w3(h))  # SwiGLU

    class Llama:
        def __init__(self) -> None:
            self.tok_embeddings = nn.Embedding(20, dim)
            self.layers = [Block(), Block()]
            self.norm = nn.RMSNorm(dim)
            self.output = nn.Linear(dim, 20, bias=False)
            freqs = 1.0 / (10000 ** (Tensor.arange(0, head, 2) / head))
            angles = Tensor.arange(t).reshape(t, 1) * freqs.reshape(1, -1)
            self.cos, self.sin = angles.cos().contiguous(), angles.sin().contiguous()

        def __call__(self, ids: Tensor) -> Tensor:
            h = self.tok_embeddings(ids)
            for layer in self.layers:
                h = layer(h, self.cos, self.sin)
            return self.output(self.norm(h))

    return Llama(), [Tensor([[3, 1, 4, 1, 5, 9]])]


def _unet() -> tuple[Any, list[Any]]:
    from tinygrad import Tensor, nn

    class ResBlock:
        def __init__(self, cin: int, cout: int) -> None:
            self.norm1, self.conv1 = nn.GroupNorm(2, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.norm2, self.conv2 = nn.GroupNorm(2, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

        def __call__(self, x: Tensor) -> Tensor:
            h = self.conv2(self.norm2(self.conv1(self.norm1(x).silu())).silu())
            return h + (x if self.skip is None else self.skip(x))

    class UNet:
        def __init__(self) -> None:
            self.inp = nn.Conv2d(2, 4, 3, padding=1)
            self.down = ResBlock(4, 8)
            self.mid = ResBlock(8, 8)
            self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
            self.out_block = ResBlock(8, 4)
            self.out = nn.Conv2d(4, 2, 1)

        def __call__(self, x: Tensor) -> Tensor:
            a = self.inp(x)
            b = self.mid(self.down(a).avg_pool2d())
            return self.out(self.out_block(a.cat(self.up(b), dim=1)))

    return UNet(), [Tensor.randn(1, 2, 8, 8)]


def _lstm() -> tuple[Any, list[Any]]:
    from tinygrad import Tensor, nn

    class LSTM:
        def __init__(self) -> None:
            self.cell = nn.LSTMCell(4, 6)
            self.head = nn.Linear(6, 2)

        def __call__(self, xs: Tensor) -> Tensor:
            state = None
            for step in range(xs.shape[0]):
                state = self.cell(xs[step], state)
            return self.head(state[0])

    return LSTM(), [Tensor.randn(3, 2, 4)]


def _mobilenet() -> tuple[Any, list[Any]]:
    from tinygrad import Tensor, nn

    class InvertedResidual:
        def __init__(self, c: int) -> None:
            self.expand = nn.Conv2d(c, 2 * c, 1, bias=False)
            self.depthwise = nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c, bias=False)
            self.bn = nn.BatchNorm2d(2 * c)
            self.project = nn.Conv2d(2 * c, c, 1, bias=False)

        def __call__(self, x: Tensor) -> Tensor:
            return x + self.project(self.bn(self.depthwise(self.expand(x).relu6())).relu6())

    class MobileNet:
        def __init__(self) -> None:
            self.stem = nn.Conv2d(3, 4, 3, stride=2, padding=1)
            self.block = InvertedResidual(4)
            self.head = nn.Linear(4, 5)

        def __call__(self, x: Tensor) -> Tensor:
            return self.head(self.block(self.stem(x).hardswish()).mean((2, 3)))

    return MobileNet(), [Tensor.randn(1, 3, 8, 8)]


_BUILDERS: dict[str, Callable[[], tuple[Any, list[Any]]]] = {
    "resnet": _resnet,
    "vit": _vit,
    "gpt2": _gpt2,
    "llama": _llama,
    "unet": _unet,
    "lstm": _lstm,
    "mobilenet": _mobilenet,
}
