"""The PyTorch conformance zoo: real models with random weights, nothing downloaded.

This module imports without torch installed. ``torch``, ``torchvision`` and
``transformers`` are imported only inside the build functions, and the small
hand-written models are defined by :func:`_models`, a cached factory that
imports torch on first use. The classes are still reachable as attributes of
this module (``zoo.SimpleRecurrent``) through the module-level ``__getattr__``,
so they pickle by reference like ordinary module-level classes.

Every ``build()`` seeds torch's global RNG with 0 first so that a case's
weights and inputs are the same each time it is built. Inputs are kept tiny
(batch 1 or 2, 64x64 images where the architecture allows) so that the whole
zoo runs quickly on CPU. Every model is in ``eval()`` mode except
``train_mode_dropout``, whose forward uses the RNG (the suite seeds the RNG
identically before the plain and the traced forward).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torchlens_core.backend.cases import Case

__all__ = ["cases"]

Built = tuple[Any, tuple[Any, ...], dict[str, Any]]


def _seed() -> None:
    import torch

    torch.manual_seed(0)


# ---------------------------------------------------------------------------
# Small hand-written models
# ---------------------------------------------------------------------------


@functools.cache
def _models() -> dict[str, Any]:
    """Define the hand-written models (importing torch) and return them by name."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class SimpleRecurrent(nn.Module):
        """The seeds' recurrent loop: one Linear applied four times."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(in_features=5, out_features=5)

        def forward(self, x):
            for _ in range(4):
                x = self.fc(x)
                x = x + 1
                x = x * 2
            return x

    class LSTMClassifier(nn.Module):
        def __init__(self, input_size=8, hidden_size=16, num_layers=2, num_classes=4):
            super().__init__()
            self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers, batch_first=True)
            self.head = nn.Linear(hidden_size, num_classes)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.head(out[:, -1])

    class GRUClassifier(nn.Module):
        def __init__(self, input_size=8, hidden_size=16, num_layers=2, num_classes=4):
            super().__init__()
            self.gru = nn.GRU(input_size, hidden_size, num_layers=num_layers, batch_first=True)
            self.head = nn.Linear(hidden_size, num_classes)

        def forward(self, x):
            out, h = self.gru(x)
            return self.head(out[:, -1])

    class InPlaceOps(nn.Module):
        """In-place ops, all on intermediates (the caller's inputs are never mutated)."""

        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 6)
            self.fc2 = nn.Linear(6, 6)

        def forward(self, x, y):
            h = self.fc1(x)
            h += y  # in-place add of another input
            h.relu_()
            h.mul_(2)
            h[:, 0] = 0  # setitem
            g = self.fc2(h)
            g = F.relu(g, inplace=True)
            v = g.view(-1)  # a view of g ...
            v[1:3].add_(1.0)  # ... mutated in place through a view of the view
            g.t().mul_(0.5)  # mutate through a transposed view
            return g + h

    class DataDependentBranch(nn.Module):
        """Takes one of two paths depending on ``x.sum() > 0``."""

        def __init__(self):
            super().__init__()
            self.pos = nn.Linear(4, 3)
            self.neg = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

        def forward(self, x):
            if x.sum() > 0:
                return self.pos(x).relu()
            return self.neg(x) - 1

    class EarlyExit(nn.Module):
        """Returns after the first block: ``block2`` and ``head`` never run."""

        def __init__(self):
            super().__init__()
            self.block1 = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
            self.block2 = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
            self.head = nn.Linear(8, 2)
            self.exit_after = 1

        def forward(self, x):
            h = self.block1(x)
            if self.exit_after == 1:
                return h * 3
            h = self.block2(h)
            return self.head(h)

    class ModuleReuse(nn.Module):
        """One Linear and one ReLU module called several times in a forward."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.ReLU()
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            h = self.act(self.fc(x))
            h = self.act(self.fc(h))
            h = self.act(self.fc(h) + x)
            return self.out(h)

    class KeywordInputs(nn.Module):
        """An optional ``mask`` and a keyword-only ``scale``."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x, mask=None, *, scale=1.0):
            h = self.fc(x) * scale
            if mask is not None:
                h = h.masked_fill(~mask, 0.0)
            return h.sum(dim=-1)

    class TupleInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.fa = nn.Linear(4, 6)
            self.fb = nn.Linear(5, 6)

        def forward(self, pair):
            a, b = pair
            return self.fa(a) * self.fb(b)

    class DictInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 6)
            self.proj = nn.Linear(6, 3)

        def forward(self, batch):
            h = self.embed(batch["features"]) + batch["bias"]
            return self.proj(torch.tanh(h))

    class TupleOutput(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.head = nn.Linear(6, 2)

        def forward(self, x):
            h = torch.relu(self.fc(x))
            return self.head(h), h

    class DictOutput(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.head = nn.Linear(6, 2)

        def forward(self, x):
            h = torch.sigmoid(self.fc(x))
            return {"logits": self.head(h), "hidden": h}

    class PassThrough(nn.Module):
        """A custom module whose forward returns its input object unchanged."""

        def forward(self, x):
            return x

    class IdentityInside(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Identity()
            self.fc = nn.Linear(6, 6)
            self.mid = nn.Identity()
            self.passthrough = PassThrough()

        def forward(self, x):
            x = self.pre(x)  # returns the very input tensor
            h = self.mid(self.fc(x))
            h = self.passthrough(h)
            return h + x

    class TransformerEncoderModel(nn.Module):
        """A TransformerEncoderLayer in eval mode, eligible for the native fast path."""

        def __init__(self, d_model=32, nhead=4):
            super().__init__()
            self.embed = nn.Linear(8, d_model)
            self.layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=64, dropout=0.1, batch_first=True)
            self.head = nn.Linear(d_model, 3)

        def forward(self, x):
            h = self.layer(self.embed(x))
            return self.head(h.mean(dim=1))

    class SelfAttention(nn.Module):
        """nn.MultiheadAttention alone, self-attention with a padding mask: fused when frozen in eval mode."""

        def __init__(self, d_model=32, nhead=4):
            super().__init__()
            self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)

        def forward(self, x, key_padding_mask=None):
            return self.attn(x, x, x, key_padding_mask=key_padding_mask)

    class GPT2LikeStack(nn.Module):
        """Token and position embeddings, pre-norm GELU encoder layers under a causal mask, an LM head."""

        def __init__(self, vocab=50, d_model=32, nhead=4, layers=2, max_len=16):
            super().__init__()
            self.tokens = nn.Embedding(vocab, d_model)
            self.positions = nn.Embedding(max_len, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model, nhead, dim_feedforward=64, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, ids):
            positions = torch.arange(ids.shape[1], device=ids.device)
            h = self.tokens(ids) + self.positions(positions)
            causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
            h = self.blocks(h, mask=causal, is_causal=True)
            return self.head(self.norm(h))

    class BertLikeStack(nn.Module):
        """Embeddings, post-norm GELU encoder layers that skip padded tokens, a pooled head."""

        def __init__(self, vocab=50, d_model=32, nhead=4, layers=2):
            super().__init__()
            self.tokens = nn.Embedding(vocab, d_model)
            self.norm = nn.LayerNorm(d_model)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=64, activation="gelu", batch_first=True)
                for _ in range(layers)
            )
            self.pool = nn.Linear(d_model, d_model)

        def forward(self, ids, attention_mask):
            h = self.norm(self.tokens(ids))
            padding = attention_mask == 0
            for layer in self.layers:
                h = layer(h, src_key_padding_mask=padding)
            return h, torch.tanh(self.pool(h[:, 0]))

    class SplitChunk(nn.Module):
        """Multi-output ops: split, chunk, unbind."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 12)

        def forward(self, x):
            h = self.fc(x)
            a, b, c = torch.split(h, [3, 4, 5], dim=1)
            p, q = h.chunk(2, dim=1)
            r0, r1 = torch.unbind(h[:2], dim=0)
            pooled = torch.cat([a.sum(1, keepdim=True), b.mean(1, keepdim=True), c.amax(1, keepdim=True)], dim=1)
            return pooled, p * q, r0 - r1

    class TensorCreation(nn.Module):
        """Creates fresh tensors inside forward (zeros, arange, ones_like, full, eye)."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            h = self.fc(x)
            pos = torch.arange(h.shape[1], dtype=h.dtype, device=h.device)
            z = torch.zeros(h.shape[0], 1, device=h.device)
            o = torch.ones_like(h)
            f = torch.full((1, h.shape[1]), 0.5)
            e = torch.eye(h.shape[1])
            return torch.cat([h + pos, z], dim=1), (h * o + f) @ e

    class TensorAttribute(nn.Module):
        """Uses a plain tensor attribute that is neither a parameter nor a buffer."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.scale = torch.linspace(0.5, 1.5, 6)  # plain attribute: not in state_dict
            self.offset = torch.randn(6)

        def forward(self, x):
            return self.fc(x) * self.scale + self.offset

    class TrainDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.drop = nn.Dropout(p=0.5)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(self.drop(torch.relu(self.fc1(x))))

    def relu_matmul_plus_one(x, w):
        """A plain function, not an nn.Module."""
        return torch.relu(x @ w) + 1

    found = {k: v for k, v in locals().items() if isinstance(v, type) or k == "relu_matmul_plus_one"}
    for name, obj in found.items():
        obj.__qualname__ = name  # so pickle finds them through this module's __getattr__
    return found


def __getattr__(name: str) -> Any:
    # PEP 562: the hand-written models are module attributes once torch is importable.
    if not name.startswith("_"):
        models = _models()
        if name in models:
            return models[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------
# Build functions
# ---------------------------------------------------------------------------


def _tv(name: str, size: int = 64, batch: int = 1, train: bool = False, **kwargs: Any) -> Callable[[], Built]:
    """A torchvision classifier with random weights and a small image input."""

    def build() -> Built:
        import torch
        import torchvision

        _seed()
        model = getattr(torchvision.models, name)(weights=None, **kwargs).train(train)
        return model, (torch.randn(batch, 3, size, size),), {}

    build.__name__ = f"build_{name}"
    return build


def _hand(
    cls_name: str, make_inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]], train: bool = False
) -> Callable[[], Built]:
    """A hand-written model from :func:`_models` with inputs from ``make_inputs``."""

    def build() -> Built:
        _seed()
        model = _models()[cls_name]()
        model.train(train)
        args, kwargs = make_inputs()
        return model, args, kwargs

    build.__name__ = f"build_{cls_name}"
    return build


def _randn(*shapes: tuple[int, ...]) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def make() -> tuple[tuple[Any, ...], dict[str, Any]]:
        import torch

        return tuple(torch.randn(*s) for s in shapes), {}

    return make


def _build_gpt2() -> Built:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    _seed()
    config = GPT2Config(
        vocab_size=100,
        n_positions=32,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=99,
        eos_token_id=99,
        use_cache=False,  # keep the output a ModelOutput of tensors (no Cache object)
    )
    model = GPT2LMHeadModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (1, 8))
    return model, (), {"input_ids": input_ids}


def _build_bert() -> Built:
    import torch
    from transformers import BertConfig, BertModel

    _seed()
    config = BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
    )
    model = BertModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (2, 8))
    attention_mask = torch.ones(2, 8, dtype=torch.long)
    attention_mask[1, 6:] = 0  # padding in the second sequence
    return model, (), {"input_ids": input_ids, "attention_mask": attention_mask}


def _build_functional() -> Built:
    import torch

    _seed()
    return _models()["relu_matmul_plus_one"], (torch.randn(3, 4), torch.randn(4, 5)), {}


def _build_transformer_encoder_layer() -> Built:
    import torch

    _seed()
    model = _models()["TransformerEncoderModel"]().eval()
    # Frozen weights and a no-grad input let the plain forward take the native
    # fast path (torch._transformer_encoder_layer_fwd) even with grad enabled;
    # the capture records that kernel (torchlens_torch.fastpath).
    model.requires_grad_(False)
    return model, (torch.randn(2, 5, 8),), {}


def _fused(cls_name: str, make_inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]) -> Callable[[], Built]:
    """A model whose attention takes PyTorch's fused inference kernels when it runs untraced.

    Eval mode and frozen weights are enough for them, even with autograd on.
    """

    def build() -> Built:
        _seed()
        model = _models()[cls_name]().eval().requires_grad_(False)
        args, kwargs = make_inputs()
        return model, args, kwargs

    build.__name__ = f"build_{cls_name}"
    return build


def _inputs_attention():
    import torch

    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True
    return (torch.randn(2, 6, 32),), {"key_padding_mask": padding}


def _inputs_gpt2_like():
    import torch

    return (torch.randint(0, 50, (2, 8)),), {}


def _inputs_bert_like():
    import torch

    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    return (torch.randint(0, 50, (2, 8)), mask), {}


def _inputs_inplace():
    import torch

    return (torch.randn(3, 6), torch.randn(3, 6)), {}


def _inputs_branch_positive():
    import torch

    return (torch.rand(2, 4) + 0.1,), {}


def _inputs_branch_negative():
    import torch

    return (-(torch.rand(2, 4) + 0.1),), {}


def _inputs_keywords():
    import torch

    x = torch.randn(2, 8)
    mask = torch.rand(2, 8) > 0.3
    return (x,), {"mask": mask, "scale": 0.5}


def _inputs_keywords_default():
    import torch

    return (torch.randn(2, 8),), {}


def _inputs_tuple():
    import torch

    return ((torch.randn(2, 4), torch.randn(2, 5)),), {}


def _inputs_dict():
    import torch

    return ({"features": torch.randn(2, 4), "bias": torch.randn(6)},), {}


# ---------------------------------------------------------------------------
# The zoo
# ---------------------------------------------------------------------------


def cases() -> list[Case]:
    """Every case of the PyTorch zoo."""
    return [
        # torchvision, weights=None, eval mode, small inputs
        Case("resnet18", _tv("resnet18")),
        # training mode: BatchNorm uses batch statistics and writes its buffers in place
        Case("resnet18_train", _tv("resnet18", batch=2, train=True)),
        Case("alexnet", _tv("alexnet")),
        Case("vgg11", _tv("vgg11")),
        Case("mobilenet_v3_small", _tv("mobilenet_v3_small")),
        Case("efficientnet_b0", _tv("efficientnet_b0")),
        Case("densenet121", _tv("densenet121")),
        Case("squeezenet1_0", _tv("squeezenet1_0")),
        Case("shufflenet_v2_x0_5", _tv("shufflenet_v2_x0_5")),
        Case("regnet_x_400mf", _tv("regnet_x_400mf")),
        Case("convnext_tiny", _tv("convnext_tiny")),
        Case("vit_b_16", _tv("vit_b_16", size=32, image_size=32)),
        Case("swin_t", _tv("swin_t")),
        # recurrent
        Case("lstm_classifier", _hand("LSTMClassifier", _randn((2, 5, 8)))),
        Case("gru_classifier", _hand("GRUClassifier", _randn((2, 5, 8)))),
        Case("simple_recurrent", _hand("SimpleRecurrent", _randn((6, 5)))),
        # transformers, from small configs, keyword inputs, ModelOutput returned
        Case("gpt2_tiny", _build_gpt2),
        Case("bert_tiny", _build_bert),
        # hand-written edge cases
        Case("inplace_ops", _hand("InPlaceOps", _inputs_inplace)),
        Case("branch_positive", _hand("DataDependentBranch", _inputs_branch_positive)),
        Case("branch_negative", _hand("DataDependentBranch", _inputs_branch_negative)),
        Case("early_exit", _hand("EarlyExit", _randn((2, 8)))),
        Case("module_reuse", _hand("ModuleReuse", _randn((2, 8)))),
        Case("keyword_inputs", _hand("KeywordInputs", _inputs_keywords)),
        Case("keyword_inputs_default", _hand("KeywordInputs", _inputs_keywords_default)),
        Case("tuple_input", _hand("TupleInput", _inputs_tuple)),
        Case("dict_input", _hand("DictInput", _inputs_dict)),
        Case("tuple_output", _hand("TupleOutput", _randn((2, 6)))),
        Case("dict_output", _hand("DictOutput", _randn((2, 6)))),
        Case("identity_inside", _hand("IdentityInside", _randn((2, 6)))),
        Case("functional_relu_matmul", _build_functional, check_modules=False),
        # PyTorch's fused inference paths: recorded as the kernels they run untraced, so exactly equal
        Case("transformer_encoder_layer", _build_transformer_encoder_layer, rtol=0.0),
        Case("self_attention_fused", _fused("SelfAttention", _inputs_attention), rtol=0.0),
        Case("gpt2_like_encoder_stack", _fused("GPT2LikeStack", _inputs_gpt2_like), rtol=0.0),
        Case("bert_like_encoder_stack", _fused("BertLikeStack", _inputs_bert_like), rtol=0.0),
        Case("split_chunk", _hand("SplitChunk", _randn((3, 12)))),
        Case("tensor_creation", _hand("TensorCreation", _randn((2, 6)))),
        Case("tensor_attribute", _hand("TensorAttribute", _randn((2, 6)))),
        Case("train_mode_dropout", _hand("TrainDropout", _randn((4, 8)), train=True), reset=_seed),
    ]
