"""The Paddle conformance zoo: real models with random weights, nothing downloaded.

This module imports without Paddle installed: ``paddle`` is imported only
inside the build functions, and the small hand-written models are defined by
:func:`_models`, a cached factory that imports Paddle on first use.

Every ``build()`` seeds Paddle's global RNG with 0 first, so a case's weights
and inputs are the same each time it is built. Inputs are small (one 64x64
image, LeNet's 28x28 digit) so that the zoo runs quickly on CPU. Every model
is in ``eval()`` mode except ``train_mode_dropout``, whose forward draws from
the RNG (its ``reset`` reseeds it before each run).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torchlens_core.backend.cases import Case

__all__ = ["cases"]

Built = tuple[Any, tuple[Any, ...], dict[str, Any]]


def _seed() -> None:
    import paddle

    paddle.seed(0)


# ---------------------------------------------------------------------------
# Small hand-written models
# ---------------------------------------------------------------------------


@functools.cache
def _models() -> dict[str, Any]:
    """Define the hand-written models (importing Paddle) and return them by name."""
    import paddle
    import paddle.nn.functional as F
    from paddle import nn

    class SimpleRecurrent(nn.Layer):
        """The seeds' recurrent loop: one Linear applied four times."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 5)

        def forward(self, x):
            for _ in range(4):
                x = self.fc(x)
                x = x + 1
                x = x * 2
            return x

    class LSTMClassifier(nn.Layer):
        def __init__(self, input_size=8, hidden_size=16, num_layers=2, num_classes=4):
            super().__init__()
            self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers)
            self.head = nn.Linear(hidden_size, num_classes)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.head(out[:, -1])

    class GRUClassifier(nn.Layer):
        def __init__(self, input_size=8, hidden_size=16, num_layers=2, num_classes=4):
            super().__init__()
            self.gru = nn.GRU(input_size, hidden_size, num_layers=num_layers)
            self.head = nn.Linear(hidden_size, num_classes)

        def forward(self, x):
            out, h = self.gru(x)
            return self.head(out[:, -1])

    class TransformerEncoderModel(nn.Layer):
        def __init__(self, d_model=32, nhead=4):
            super().__init__()
            self.embed = nn.Linear(8, d_model)
            self.layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=64, dropout=0.1)
            self.head = nn.Linear(d_model, 3)

        def forward(self, x):
            h = self.layer(self.embed(x))
            return self.head(h.mean(axis=1))

    class InPlaceOps(nn.Layer):
        """In-place ops, all on intermediates (the caller's inputs are never mutated)."""

        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 6)
            self.fc2 = nn.Linear(6, 6)

        def forward(self, x, y):
            h = self.fc1(x)
            h.add_(y)  # in-place add of another input
            F.relu_(h)
            h.scale_(2.0)
            h[:, 0] = 0  # setitem
            g = self.fc2(h)
            v = g.reshape([-1])  # a view of g ...
            v[1:3].add_(paddle.ones([2]))  # ... written through a slice of the view
            paddle.assign(h * 0.5, output=g)  # writes into g
            return g + h

    class DataDependentBranch(nn.Layer):
        """Takes one of two paths depending on ``x.sum() > 0``."""

        def __init__(self):
            super().__init__()
            self.pos = nn.Linear(4, 3)
            self.neg = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

        def forward(self, x):
            if x.sum() > 0:
                return F.relu(self.pos(x))
            return self.neg(x) - 1

    class ModuleReuse(nn.Layer):
        """One Linear and one ReLU layer called several times in a forward."""

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

    class KeywordInputs(nn.Layer):
        """An optional ``mask`` and a keyword-only ``scale``."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x, mask=None, *, scale=1.0):
            h = self.fc(x) * scale
            if mask is not None:
                h = paddle.where(mask, h, paddle.zeros_like(h))
            return h.sum(axis=-1)

    class DictOutput(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.head = nn.Linear(6, 2)

        def forward(self, x):
            h = F.sigmoid(self.fc(x))
            return {"logits": self.head(h), "hidden": h}

    class TupleInputOutput(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fa = nn.Linear(4, 6)
            self.fb = nn.Linear(5, 6)

        def forward(self, pair):
            a, b = pair
            h = self.fa(a) * self.fb(b)
            return h, paddle.tanh(h)

    class PassThrough(nn.Layer):
        """A custom layer whose forward returns its input object unchanged."""

        def forward(self, x):
            return x

    class IdentityInside(nn.Layer):
        def __init__(self):
            super().__init__()
            self.pre = nn.Identity()
            self.fc = nn.Linear(6, 6)
            self.passthrough = PassThrough()

        def forward(self, x):
            x = self.pre(x)  # returns the very input tensor
            h = self.passthrough(self.fc(x))
            return h + x

    class SplitConcat(nn.Layer):
        """Multi-output ops (split, chunk, unbind) and fresh tensors made inside the forward."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 12)
            self.scale = paddle.linspace(0.5, 1.5, 12)  # a tensor attribute: Paddle makes it a buffer

        def forward(self, x):
            h = self.fc(x) * self.scale
            a, b, c = paddle.split(h, [3, 4, 5], axis=1)
            p, q = h.chunk(2, axis=1)
            r0, r1 = paddle.unbind(h[:2], axis=0)
            pos = paddle.arange(h.shape[1], dtype=h.dtype)
            pooled = paddle.concat([a.sum(1, keepdim=True), b.mean(1, keepdim=True), c.max(1, keepdim=True)], axis=1)
            weights = paddle.to_tensor([2.0, 3.0])  # made by the constructor, not an op: a constant
            return pooled, p * q, r0 - r1 + pos[:12], paddle.full([1, 2], 0.5) + pooled[:, :2] * weights

    class TrainDropout(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.drop = nn.Dropout(p=0.5)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(self.drop(F.relu(self.fc1(x))))

    def relu_matmul_plus_one(x, w):
        """A plain function, not a Layer."""
        return F.relu(paddle.matmul(x, w)) + 1

    return {k: v for k, v in locals().items() if isinstance(v, type) or k == "relu_matmul_plus_one"}


# ---------------------------------------------------------------------------
# Build functions
# ---------------------------------------------------------------------------


def _vision(name: str, shape: tuple[int, ...] = (1, 3, 64, 64), **kwargs: Any) -> Callable[[], Built]:
    """A paddle.vision classifier with random weights and a small image input."""

    def build() -> Built:
        import paddle
        import paddle.vision.models as models

        _seed()
        factory = getattr(models, name)
        model = factory(**kwargs) if name == "LeNet" else factory(pretrained=False, **kwargs)
        model.eval()
        return model, (paddle.randn(list(shape)),), {}

    build.__name__ = f"build_{name}"
    return build


def _hand(
    cls_name: str, make_inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]], train: bool = False
) -> Callable[[], Built]:
    """A hand-written model from :func:`_models` with inputs from ``make_inputs``."""

    def build() -> Built:
        _seed()
        model = _models()[cls_name]()
        model.train() if train else model.eval()
        args, kwargs = make_inputs()
        return model, args, kwargs

    build.__name__ = f"build_{cls_name}"
    return build


def _randn(*shapes: tuple[int, ...]) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def make() -> tuple[tuple[Any, ...], dict[str, Any]]:
        import paddle

        return tuple(paddle.randn(list(s)) for s in shapes), {}

    return make


def _inputs_branch_positive() -> tuple[tuple[Any, ...], dict[str, Any]]:
    import paddle

    return (paddle.rand([2, 4]) + 0.1,), {}


def _inputs_branch_negative() -> tuple[tuple[Any, ...], dict[str, Any]]:
    import paddle

    return (-(paddle.rand([2, 4]) + 0.1),), {}


def _inputs_keywords() -> tuple[tuple[Any, ...], dict[str, Any]]:
    import paddle

    return (paddle.randn([2, 8]),), {"mask": paddle.rand([2, 8]) > 0.3, "scale": 0.5}


def _inputs_tuple() -> tuple[tuple[Any, ...], dict[str, Any]]:
    import paddle

    return ((paddle.randn([2, 4]), paddle.randn([2, 5])),), {}


def _build_functional() -> Built:
    import paddle

    _seed()
    return _models()["relu_matmul_plus_one"], (paddle.randn([3, 4]), paddle.randn([4, 5])), {}


# ---------------------------------------------------------------------------
# The zoo
# ---------------------------------------------------------------------------


def cases() -> list[Case]:
    """Every case of the Paddle zoo."""
    return [
        # paddle.vision, pretrained=False, eval mode, small inputs
        Case("resnet18", _vision("resnet18")),
        Case("mobilenet_v2", _vision("mobilenet_v2")),
        Case("vgg11", _vision("vgg11", num_classes=10)),
        Case("squeezenet1_0", _vision("squeezenet1_0")),
        Case("shufflenet_v2_x0_25", _vision("shufflenet_v2_x0_25")),
        Case("densenet121", _vision("densenet121")),
        Case("lenet", _vision("LeNet", shape=(1, 1, 28, 28))),
        # recurrent
        Case("lstm_classifier", _hand("LSTMClassifier", _randn((2, 5, 8)))),
        Case("gru_classifier", _hand("GRUClassifier", _randn((2, 5, 8)))),
        Case("simple_recurrent", _hand("SimpleRecurrent", _randn((6, 5)))),
        # attention
        Case("transformer_encoder_layer", _hand("TransformerEncoderModel", _randn((2, 5, 8))), rtol=1e-4),
        # hand-written edge cases
        Case("inplace_ops", _hand("InPlaceOps", _randn((3, 6), (3, 6)))),
        Case("branch_positive", _hand("DataDependentBranch", _inputs_branch_positive)),
        Case("branch_negative", _hand("DataDependentBranch", _inputs_branch_negative)),
        Case("module_reuse", _hand("ModuleReuse", _randn((2, 8)))),
        Case("keyword_inputs", _hand("KeywordInputs", _inputs_keywords)),
        Case("dict_output", _hand("DictOutput", _randn((2, 6)))),
        Case("tuple_input_output", _hand("TupleInputOutput", _inputs_tuple)),
        Case("identity_inside", _hand("IdentityInside", _randn((2, 6)))),
        Case("split_concat", _hand("SplitConcat", _randn((3, 12)))),
        Case("functional_relu_matmul", _build_functional, check_modules=False),
        Case("train_mode_dropout", _hand("TrainDropout", _randn((4, 8)), train=True), reset=_seed),
    ]
