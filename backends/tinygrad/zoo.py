"""The tinygrad conformance zoo: small models from ``tinygrad.nn`` layers and Tensor ops, random weights.

This module imports without tinygrad installed: the model classes are defined
by :func:`_models`, a cached factory that imports tinygrad on first use (they
are reachable as module attributes too, ``zoo.MLP``). Every ``build()`` seeds
tinygrad's RNG and realizes the weights and inputs it makes, so a case is the
same each time it is built. Sizes are tiny: every distinct kernel is compiled
by clang the first time it runs (then cached on disk), and that, not the
arithmetic, is what the zoo's run time is made of.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torchlens_core.backend.cases import Case

__all__ = ["cases"]

Built = tuple[Any, tuple[Any, ...], dict[str, Any]]


@functools.cache
def _models() -> dict[str, Any]:
    """Define the zoo's model classes and functions (importing tinygrad) and return them by name."""
    from tinygrad import Tensor, nn
    from tinygrad.helpers import Context

    class MLP:
        def __init__(self) -> None:
            self.fc1 = nn.Linear(6, 16)
            self.fc2 = nn.Linear(16, 16)
            self.head = nn.Linear(16, 3)

        def __call__(self, x: Tensor) -> Tensor:
            h = self.fc1(x).relu()
            h = self.fc2(h).gelu()
            return self.head(h).log_softmax()

    class ConvBN:
        """Conv2d, BatchNorm (eval: running statistics) and ReLU."""

        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn = nn.BatchNorm(cout)

        def __call__(self, x: Tensor) -> Tensor:
            return self.bn(self.conv(x)).relu()

    class CNN:
        def __init__(self) -> None:
            self.features = [ConvBN(3, 4), ConvBN(4, 8, stride=2)]
            self.head = nn.Linear(8, 5)

        def __call__(self, x: Tensor) -> Tensor:
            for block in self.features:
                x = block(x)
            x = x.max_pool2d(2)
            return self.head(x.mean(axis=(2, 3)))

    class ResidualBlock:
        """Two conv-BN pairs and a 1x1 projection shortcut, added and passed through ReLU."""

        def __init__(self, cin: int = 3, cout: int = 6) -> None:
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm(cout)
            self.shortcut = nn.Conv2d(cin, cout, 1, bias=False)

        def __call__(self, x: Tensor) -> Tensor:
            h = self.bn1(self.conv1(x)).relu()
            h = self.bn2(self.conv2(h))
            return (h + self.shortcut(x)).relu()

    class LSTMCellOps:
        """An LSTM cell written with Tensor ops, holding its own weights."""

        def __init__(self, n_in: int, n_hidden: int) -> None:
            self.w_ih = Tensor.uniform(n_in, 4 * n_hidden, low=-0.5, high=0.5)
            self.w_hh = Tensor.uniform(n_hidden, 4 * n_hidden, low=-0.5, high=0.5)
            self.bias = Tensor.zeros(4 * n_hidden).contiguous()

        def __call__(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
            gates = x @ self.w_ih + h @ self.w_hh + self.bias
            i, f, g, o = gates.chunk(4, dim=1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            return o.sigmoid() * c.tanh(), c

    class LSTMSequence:
        """The cell unrolled over the sequence (one module, a pass per step), then a linear head."""

        def __init__(self, n_in: int = 4, n_hidden: int = 6) -> None:
            self.n_hidden = n_hidden
            self.cell = LSTMCellOps(n_in, n_hidden)
            self.head = nn.Linear(n_hidden, 2)

        def __call__(self, xs: Tensor) -> Tensor:
            h = c = Tensor.zeros(xs.shape[0], self.n_hidden)
            for t in range(xs.shape[1]):
                h, c = self.cell(xs[:, t], h, c)
            return self.head(h)

    class TransformerBlock:
        """Pre-norm attention (scaled_dot_product_attention, causal) and a GELU MLP, with residuals."""

        def __init__(self, dim: int = 8, heads: int = 2) -> None:
            self.heads = heads
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = [nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)]

        def __call__(self, x: Tensor) -> Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
            q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
            att = q.scaled_dot_product_attention(k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp[1](self.mlp[0](self.ln2(x)).gelu())

    class SimpleRecurrent:
        """The seeds' recurrent loop: one Linear applied four times."""

        def __init__(self) -> None:
            self.fc = nn.Linear(5, 5)

        def __call__(self, x: Tensor) -> Tensor:
            for _ in range(4):
                x = self.fc(x)
                x = x + 1
                x = x * 2
            return x

    class MultiOutput:
        """Returns a dict holding a tuple: logits, probabilities and the hidden state."""

        def __init__(self) -> None:
            self.encoder = nn.Linear(6, 8)
            self.head = nn.Linear(8, 3)

        def __call__(self, x: Tensor) -> dict[str, Any]:
            h = self.encoder(x).tanh()
            logits = self.head(h)
            return {"out": (logits, logits.softmax()), "hidden": h}

    class InPlaceOps:
        """+=, __setitem__ and assign on a layer's output, with views read before and after the writes."""

        def __init__(self) -> None:
            self.fc1 = nn.Linear(6, 6)
            self.fc2 = nn.Linear(6, 6)

        def __call__(self, x: Tensor, y: Tensor) -> Tensor:
            h = self.fc1(x)
            col = h.T.sum(axis=1)  # reads a view of h's buffer before the writes
            h += y  # each write leaves the saved values of fc1, T and sum as they ran
            h[:, 0] = 0.0
            flat = h.reshape(-1)  # a view taken between writes keeps the value it had, as in a plain run
            h.assign(h.relu() * 2)
            return self.fc2(h) + col + flat.reshape(h.shape)

    class TrainDropout:
        """Dropout under TRAINING=1: random, replayed with the recorded RNG state."""

        def __init__(self) -> None:
            self.fc1 = nn.Linear(8, 16)
            self.fc2 = nn.Linear(16, 4)

        def __call__(self, x: Tensor) -> Tensor:
            with Context(TRAINING=1):
                return self.fc2(self.fc1(x).relu().dropout(0.5))

    def branch(x: Tensor, w: Tensor) -> Tensor:
        """A data-dependent Python branch on the sign of x.sum().

        The test reads a bool (tinygrad has no ``Tensor.__bool__``), not the sum
        itself: the graph holds for any input of that sign, as replay on other
        inputs checks; ``x.sum().item() > 0`` would fix the sum's exact value.
        """
        h = x @ w
        if (x.sum() > 0).item():
            return h.relu() * 2
        return h.tanh() - 1

    def mlp_function(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor) -> Tensor:
        """A plain function on Tensors, weights passed in (the seeds' ``tl.trace(tg_fn, inputs)``)."""
        return ((x @ w1 + b1).relu() @ w2).sigmoid()

    found = {k: v for k, v in locals().items() if isinstance(v, type) or k in ("branch", "mlp_function")}
    for name, obj in found.items():
        obj.__qualname__ = name  # so pickle finds them through this module's __getattr__
    return found


def __getattr__(name: str) -> Any:
    # PEP 562: the model classes are module attributes once tinygrad is importable.
    if not name.startswith("_"):
        models = _models()
        if name in models:
            return models[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _seed() -> None:
    from tinygrad import Tensor

    Tensor.manual_seed(0)


def _ready(model: Any, *args: Any) -> Built:
    """Realize the model's weights and the inputs, so that every run starts from the same values."""
    from tinygrad import Tensor
    from tinygrad.nn.state import get_parameters

    tensors = [t for t in (*get_parameters(model), *args) if isinstance(t, Tensor)]
    Tensor.realize(*tensors)
    return model, tuple(args), {}


def _randn(*shape: int) -> Any:
    from tinygrad import Tensor

    return Tensor.randn(*shape)


def _model(name: str, *shapes: tuple[int, ...], seed: int = 0) -> Callable[[], Built]:
    def build() -> Built:
        from tinygrad import Tensor

        Tensor.manual_seed(seed)
        model = _models()[name]()
        return _ready(model, *(_randn(*s) for s in shapes))

    build.__name__ = f"build_{name}"
    return build


def _branch(sign: float) -> Callable[[], Built]:
    def build() -> Built:
        from tinygrad import Tensor

        Tensor.manual_seed(3)
        x = Tensor.rand(2, 4) + 0.1
        return _ready(_models()["branch"], x * sign, _randn(4, 3))

    build.__name__ = "build_branch_" + ("positive" if sign > 0 else "negative")
    return build


def _mlp_function() -> Built:
    from tinygrad import Tensor

    Tensor.manual_seed(4)
    return _ready(_models()["mlp_function"], _randn(3, 4), _randn(4, 8), _randn(8), _randn(8, 2))


def cases() -> list[Case]:
    """Every case of the tinygrad zoo."""
    return [
        Case("mlp", _model("MLP", (4, 6))),
        Case("cnn_batchnorm", _model("CNN", (2, 3, 8, 8))),
        Case("residual_block", _model("ResidualBlock", (2, 3, 6, 6))),
        Case("lstm_cell_ops", _model("LSTMSequence", (2, 3, 4))),
        Case("transformer_block", _model("TransformerBlock", (2, 4, 8))),
        Case("layer_reuse_loop", _model("SimpleRecurrent", (6, 5))),
        Case("branch_positive", _branch(1.0), check_modules=False),
        Case("branch_negative", _branch(-1.0), check_modules=False),
        Case("multi_output", _model("MultiOutput", (3, 6))),
        Case("inplace_ops", _model("InPlaceOps", (3, 6), (3, 6))),
        Case("train_dropout", _model("TrainDropout", (4, 8)), reset=_seed),
        Case("functional_mlp", _mlp_function, check_modules=False),
    ]
