"""FLOPs and MACs of Paddle traces: hand-counted small models, published figures.

Every backend's zoo coverage (at most 5% unknown, contractions counted, matrix products by their shapes) is
the conformance suite's (torchlens/conformance/flop_checks.py); tl.register_flops is the core's
(tests/test_flops_core.py).
"""

from __future__ import annotations

import pytest

paddle = pytest.importorskip("paddle")
from paddle import nn  # noqa: E402

import torchlens as tl  # noqa: E402


def ops_of(trace, name):
    return [op for op in trace.ops if op.kind == "op" and op.func_name == name]


def only(trace, name):
    found = ops_of(trace, name)
    assert len(found) == 1, [op.func_name for op in trace.ops]
    return found[0]


class SmallCNN(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2D(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2D(8)
        self.pool = nn.MaxPool2D(2)
        self.gap = nn.AdaptiveAvgPool2D(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = self.pool(paddle.nn.functional.relu(self.bn(self.conv(x))))
        return self.fc(paddle.flatten(self.gap(h), 1))


class Attention(nn.Layer):
    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.attn = nn.MultiHeadAttention(d, heads)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.attn(x, x, x)
        return self.down(paddle.nn.functional.gelu(self.up(h)))


def _trace(model, *inputs):
    paddle.seed(0)
    model.eval()
    return tl.trace(model, *inputs, backend="paddle")


def test_conv_model_by_hand():
    t = _trace(SmallCNN(), paddle.randn([2, 3, 8, 8]))
    conv_out = 2 * 8 * 8 * 8  # N * C_out * H * W (padding 1 keeps 8x8)
    conv_macs = conv_out * 3 * 3 * 3  # each output: C_in * kh * kw
    conv = only(t, "conv2d")
    assert (conv.flops, conv.macs) == (2 * conv_macs, conv_macs)
    # Paddle adds the conv bias as its own op, one FLOP per output element (the linear's bias is inside "linear")
    assert only(t, "add").flops == conv_out
    assert only(t, "batch_norm").flops == 4 * conv_out  # inference: subtract, divide, weight, bias
    assert only(t, "batch_norm").macs == 0
    assert only(t, "relu").flops == conv_out
    pools = ops_of(t, "pool2d")
    assert [p.flops for p in pools] == [2 * 8 * 4 * 4 * 2 * 2, 2 * 8 * 4 * 4]  # max 2x2 per output; adaptive reads all
    fc_macs = 2 * 8 * 4
    assert (only(t, "linear").flops, only(t, "linear").macs) == (2 * fc_macs + 2 * 4, fc_macs)
    assert only(t, "flatten").flops == 0
    assert t.macs == conv_macs + fc_macs
    # conv bias, batch norm and relu (1 + 4 + 1 per conv output), the two pools, the linear
    assert t.flops == 2 * conv_macs + conv_out * 6 + 2 * 8 * 4 * 4 * 4 + 2 * 8 * 4 * 4 + 2 * fc_macs + 2 * 4
    assert t.unknown_flops == []


def test_attention_model_by_hand():
    b, s, d, heads = 2, 5, 16, 2
    t = _trace(Attention(d, heads), paddle.randn([b, s, d]))
    tokens = b * s
    linear_macs = 4 * tokens * d * d + tokens * d * 2 * d + tokens * 2 * d * d  # q, k, v, out; up; down
    linear_bias = 4 * tokens * d + tokens * 2 * d + tokens * d
    score = b * heads * s * s  # attention scores
    head_dim = d // heads
    attn_macs = 2 * score * head_dim  # Q @ K^T and P @ V
    assert sum(op.macs for op in ops_of(t, "linear")) == linear_macs
    assert sum(op.flops for op in ops_of(t, "linear")) == 2 * linear_macs + linear_bias
    assert [op.macs for op in ops_of(t, "matmul")] == [score * head_dim] * 2
    assert only(t, "softmax").flops == 3 * score  # exp, sum, divide
    assert only(t, "gelu").flops == 8 * tokens * 2 * d  # its tanh approximation's arithmetic
    scale = tokens * d  # q is multiplied by head_dim ** -0.5
    assert t.macs == linear_macs + attn_macs
    assert t.flops == 2 * (linear_macs + attn_macs) + linear_bias + 3 * score + 8 * tokens * 2 * d + scale
    for name in ("reshape", "transpose"):
        assert ops_of(t, name) and all(op.flops == 0 and op.macs == 0 for op in ops_of(t, name))


def test_zero_cost_and_unknown_ops():
    def f(x):
        y = paddle.concat([x, x], axis=0).reshape([3, 8]).transpose([1, 0])
        z = y[1:3].astype("float64").expand([2, 2, 3])
        return z, paddle.topk(x, 2)[0]

    t = tl.trace(f, paddle.randn([2, 6]), backend="paddle")
    for name in ("concat", "reshape", "transpose", "getitem", "cast", "expand"):
        op = only(t, name)
        assert (op.flops, op.macs) == (0, 0), name
    topk = only(t, "topk")  # no formula: unknown, never zero
    assert topk.flops is None and topk.macs is None
    assert t.unknown_flops == [topk]


def test_lstm_by_hand():
    steps, hidden, layers = 2 * 5, 16, 2  # batch 2, sequence 5
    t = _trace(nn.LSTM(8, hidden, num_layers=layers), paddle.randn([2, 5, 8]))
    rnn = only(t, "rnn")
    # per step, four gates: W_ih [4h, in] and W_hh [4h, h] for each layer (in = 8, then 16)
    macs = steps * 4 * hidden * ((8 + hidden) + (hidden + hidden))
    biases = 2 * 4 * hidden * layers  # b_ih and b_hh, one FLOP per gate row each
    cell = 10 * hidden * layers  # adding the gates, 3 sigmoids, 2 tanh, c = f*c + i*g, h = o*tanh(c)
    assert (rnn.flops, rnn.macs) == (2 * macs + steps * (biases + cell), macs)


def test_formulas_on_hand_built_calls():
    from torchlens_core.views.flops import ArraySpec, OpCall
    from torchlens_paddle.flops import FORMULAS, einsum_count

    assert einsum_count("...ij,...jk", [(2, 3, 4), (4, 5)]) == (2 * 120, 120)  # b*i*j*k, the ellipsis broadcast
    assert einsum_count("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == (2 * 64, 64)  # (2*3*4) then (2*4*5)
    assert einsum_count("ii", [(3, 3)]) == (9, 0)  # one operand: a sum
    # adaptive average pooling 5 -> 3 reads windows [0, 2), [1, 4), [3, 5) along each axis: 2 + 3 + 2
    call = OpCall(
        "pool2d",
        (ArraySpec((1, 2, 5, 5)), [3, 3], [1, 1], [0, 0], False, True, "NCHW", "avg", False, True, "EXPLICIT"),
        {},
        (1, 2, 3, 3),
    )
    assert FORMULAS["pool2d"](call) == (2 * 7 * 7, 0)
    # a transposed convolution scatters each input element over C_out / groups * kh * kw outputs
    call = OpCall("conv2d_transpose", (ArraySpec((1, 4, 5, 5)), ArraySpec((4, 6, 3, 3))), {}, (1, 6, 11, 11))
    assert FORMULAS["conv2d_transpose"](call) == (2 * 100 * 54, 100 * 54)
    # flash attention, [batch, seq, heads, dim]: two products per score, then the scale and the softmax
    q = ArraySpec((2, 7, 4, 8))
    call = OpCall("flash_attn", (q, ArraySpec((2, 9, 4, 8)), ArraySpec((2, 9, 4, 16))), {}, ((2, 7, 4, 16),))
    scores = 2 * 4 * 7 * 9
    assert FORMULAS["flash_attn"](call) == (2 * scores * 24 + 4 * scores, scores * 24)


def _conv(out: int, cin: int, cout: int, k: int) -> int:
    """MACs of a square convolution with an ``out`` x ``out`` output."""
    return out * out * cout * cin * k * k


def _resnet18_macs() -> int:
    macs = _conv(112, 3, 64, 7)  # stem; its max pool halves 112 to 56
    cin = 64
    for cout, size in ((64, 56), (128, 28), (256, 14), (512, 7)):
        macs += _conv(size, cin, cout, 3) + 3 * _conv(size, cout, cout, 3)  # two basic blocks of two 3x3 convs
        if cout != cin:
            macs += _conv(size, cin, cout, 1)  # the 1x1 stride-2 shortcut
        cin = cout
    return macs + 512 * 1000


def _alexnet_macs() -> int:
    convs = (
        _conv(55, 3, 64, 11)
        + _conv(27, 64, 192, 5)
        + _conv(13, 192, 384, 3)
        + _conv(13, 384, 256, 3)
        + _conv(13, 256, 256, 3)
    )
    return convs + 256 * 6 * 6 * 4096 + 4096 * 4096 + 4096 * 1000


@pytest.mark.parametrize(
    "name, expected, published",
    [
        ("resnet18", _resnet18_macs(), 1.81e9),
        ("alexnet", _alexnet_macs(), 0.71e9),
    ],
)
def test_vision_models_match_published_macs(name, expected, published):
    paddle.seed(0)
    model = getattr(paddle.vision.models, name)()
    t = _trace(model, paddle.randn([1, 3, 224, 224]))
    assert t.macs == pytest.approx(expected, rel=0.01)
    assert t.macs == pytest.approx(published, rel=0.01)
    assert t.unknown_flops == []
    assert t.flops > 2 * t.macs  # the contractions, plus the elementwise ops around them
