"""The Paddle menagerie: every ``paddle.vision.models`` builder, and transformer and recurrent blocks of ``paddle.nn``.

The vision builders are enumerated from ``paddle.vision.models.__all__`` (the
lower-case names are the builders), so a model Paddle adds joins by itself.
The blocks are what PaddleNLP's models are made of: ``paddle.nn``'s encoder,
decoder and full transformer layers, multi-head attention, and the recurrent
layers, at small sizes. Weights are random (``paddle.seed(0)``), inputs small,
nothing is downloaded; every model is in eval mode.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from bench.menagerie.entries import Built, Entry

# Builders whose classifier is a fixed-size layer after fixed pooling: they need the 224x224 input they were made for.
_FULL_SIZE = {"alexnet": 224, "googlenet": 224}


def entries() -> list[Entry]:
    return _vision() + _blocks()


def _vision() -> list[Entry]:
    import paddle.vision.models as pvm

    found = []
    for name in pvm.__all__:
        if not name[0].islower():
            continue  # the classes; their builders are the lower-case names
        family = re.match(r"[a-z]+(?:_v\d)?", name).group(0)
        found.append(
            Entry(
                "paddle",
                f"paddle.vision/{name}",
                "paddle.vision",
                f"paddle.vision.{family}",
                functools.partial(_build_vision, name),
            )
        )
    return found


def _build_vision(name: str) -> Built:
    import paddle
    import paddle.vision.models as pvm

    paddle.seed(0)
    model = getattr(pvm, name)()
    model.eval()
    size = _FULL_SIZE.get(name, 64)
    return model, (paddle.randn([1, 3, size, size]),), {}


# -- paddle.nn blocks -----------------------------------------------------------------------------------------------
def _blocks() -> list[Entry]:
    return [
        Entry("paddle", f"paddle.nn/{name}", "paddle.nn", f"paddle.nn.{family}", functools.partial(_build_block, name))
        for name, family in _BLOCKS.items()
    ]


_BLOCKS = {
    "transformer_encoder_layer": "transformer",
    "transformer_encoder_layer_prenorm": "transformer",
    "transformer_encoder": "transformer",
    "transformer_decoder_layer": "transformer",
    "transformer": "transformer",
    "multi_head_attention_masked": "attention",
    "lstm_bidirectional": "recurrent",
    "gru_two_layers": "recurrent",
    "simple_rnn": "recurrent",
    "bert_style_encoder": "transformer",
}


def _build_block(name: str) -> Built:
    import paddle
    from paddle import nn

    paddle.seed(0)
    d, heads, seq = 32, 4, 6
    x = paddle.randn([2, seq, d])
    model: Any
    args: tuple[Any, ...] = (x,)
    kwargs: dict[str, Any] = {}
    if name == "transformer_encoder_layer":
        model = nn.TransformerEncoderLayer(d, heads, 64, dropout=0.0)
    elif name == "transformer_encoder_layer_prenorm":
        model = nn.TransformerEncoderLayer(d, heads, 64, dropout=0.0, normalize_before=True, activation="gelu")
    elif name == "transformer_encoder":
        model = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, 64, dropout=0.0), 2)
    elif name == "transformer_decoder_layer":
        model = nn.TransformerDecoderLayer(d, heads, 64, dropout=0.0)
        args = (x, paddle.randn([2, seq + 2, d]))
    elif name == "transformer":
        model = nn.Transformer(d, heads, 1, 1, 64, dropout=0.0)
        args = (x, paddle.randn([2, seq - 2, d]))
    elif name == "multi_head_attention_masked":
        model = nn.MultiHeadAttention(d, heads)
        causal = paddle.triu(paddle.full([seq, seq], float("-inf")), diagonal=1)
        args, kwargs = (x, x, x), {"attn_mask": causal}
    elif name == "lstm_bidirectional":
        model = nn.LSTM(d, 16, direction="bidirect")
    elif name == "gru_two_layers":
        model = nn.GRU(d, 16, num_layers=2)
    elif name == "simple_rnn":
        model = nn.SimpleRNN(d, 16)
    elif name == "bert_style_encoder":
        model = _bert_style()(d, heads)
        args = (paddle.randint(0, 100, [2, seq]),)
    else:
        raise KeyError(name)
    model.eval()
    return model, args, kwargs


def _bert_style() -> type:
    from paddle import nn

    class BertStyle(nn.Layer):
        """Token and position embeddings, layer norm, a two-layer encoder and a pooler: a PaddleNLP BERT's shape."""

        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.tokens = nn.Embedding(100, d)
            self.positions = nn.Embedding(16, d)
            self.norm = nn.LayerNorm(d)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0), 2)
            self.pooler = nn.Linear(d, d)

        def forward(self, ids: Any) -> Any:
            import paddle

            positions = paddle.arange(ids.shape[1]).unsqueeze(0)
            h = self.encoder(self.norm(self.tokens(ids) + self.positions(positions)))
            return h, paddle.tanh(self.pooler(h[:, 0]))

    return BertStyle
