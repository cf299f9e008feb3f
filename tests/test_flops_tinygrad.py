"""FLOPs and MACs of tinygrad traces: hand-counted small models.

Every backend's zoo coverage (at most 5% unknown, contractions counted, matrix products by their shapes) is
the conformance suite's (torchlens/conformance/flop_checks.py); tl.register_flops is the core's
(tests/test_flops_core.py).
"""

from __future__ import annotations

import pytest

tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Tensor, nn  # noqa: E402

import torchlens as tl  # noqa: E402


def ops_of(trace, name):
    return [op for op in trace.ops if op.kind == "op" and op.func_name == name]


def only(trace, name):
    found = ops_of(trace, name)
    assert len(found) == 1, [op.func_name for op in trace.ops]
    return found[0]


class SmallCNN:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm(8)
        self.fc = nn.Linear(8, 4)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.bn(self.conv(x)).relu().max_pool2d(2)
        return self.fc(h.mean((2, 3)))


class Attention:
    def __init__(self, d: int = 16, heads: int = 2) -> None:
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def __call__(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        q, k, v = [t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v)]
        h = q.scaled_dot_product_attention(k, v, is_causal=True)
        return x + self.out(h.transpose(1, 2).reshape(b, s, d))


def test_conv_model_by_hand():
    Tensor.manual_seed(0)
    t = tl.trace(SmallCNN(), Tensor.randn(2, 3, 8, 8), backend="tinygrad")
    conv_out = 2 * 8 * 8 * 8  # N * C_out * H * W (padding 1 keeps 8x8)
    conv_macs = conv_out * 3 * 3 * 3  # each output: C_in * kh * kw
    conv = only(t, "conv2d")
    assert (conv.flops, conv.macs) == (2 * conv_macs + conv_out, conv_macs)  # the bias is inside conv2d
    # nn.BatchNorm in inference: running_var + eps and rsqrt per channel, then subtract, scale, weight and bias
    assert only(t, "add").flops == 8 and only(t, "rsqrt").flops == 8
    assert (only(t, "batchnorm").flops, only(t, "batchnorm").macs) == (4 * conv_out, 0)
    assert only(t, "relu").flops == conv_out
    pooled = 2 * 8 * 4 * 4
    assert only(t, "max_pool2d").flops == 2 * 2 * pooled
    assert only(t, "mean").flops == pooled
    fc_macs = 2 * 8 * 4
    assert (only(t, "linear").flops, only(t, "linear").macs) == (2 * fc_macs + 2 * 4, fc_macs)
    assert only(t, "transpose").flops == 0  # nn.Linear's weight.T
    assert t.macs == conv_macs + fc_macs
    assert t.flops == 2 * conv_macs + conv_out * 6 + 16 + 5 * pooled + 2 * fc_macs + 2 * 4
    assert t.unknown_flops == []


def test_attention_model_by_hand():
    b, s, d, heads = 2, 5, 16, 2
    Tensor.manual_seed(0)
    t = tl.trace(Attention(d, heads), Tensor.randn(b, s, d), backend="tinygrad")
    tokens = b * s
    qkv_macs, out_macs = tokens * d * 3 * d, tokens * d * d
    assert [op.macs for op in ops_of(t, "linear")] == [qkv_macs, out_macs]
    assert [op.flops for op in ops_of(t, "linear")] == [2 * qkv_macs + tokens * 3 * d, 2 * out_macs + tokens * d]
    score = b * heads * s * s
    head_dim = d // heads
    attn = only(t, "scaled_dot_product_attention")
    # Q @ K^T and P @ V; the scale and softmax (exp, sum, divide) on every score (a causal mask counts them all)
    assert (attn.flops, attn.macs) == (2 * 2 * score * head_dim + 4 * score, 2 * score * head_dim)
    assert only(t, "layernorm").flops == 5 * tokens * d  # nn.LayerNorm's weight and bias: a separate mul and add
    assert t.macs == qkv_macs + out_macs + 2 * score * head_dim
    residual = tokens * d
    assert t.flops == (
        2 * t.macs + 5 * tokens * d + 2 * tokens * d + tokens * 3 * d + tokens * d + 4 * score + residual
    )
    for name in ("chunk", "reshape", "transpose"):
        assert ops_of(t, name) and all(op.flops == 0 and op.macs == 0 for op in ops_of(t, name))


def test_zero_cost_and_unknown_ops():
    def f(x: Tensor):
        y = x.cat(x, dim=0).reshape(3, 8).permute(1, 0).pad(((0, 1), None))
        z = y[1:3].expand(2, 2, 3).contiguous()
        return z, x.sort()[0]

    t = tl.trace(f, Tensor.randn(2, 6), backend="tinygrad")
    for name in ("cat", "reshape", "permute", "pad", "getitem", "expand", "contiguous"):
        op = only(t, name)
        assert (op.flops, op.macs) == (0, 0), name
    sort = only(t, "sort")  # no formula: unknown, never zero
    assert sort.flops is None and sort.macs is None
    assert t.unknown_flops == [sort]


def test_formulas_on_hand_built_calls():
    from torchlens_core.views.flops import ArraySpec, OpCall
    from torchlens_tinygrad.flops import FORMULAS

    a, b = ArraySpec((2, 3, 4)), ArraySpec((4, 5))
    assert FORMULAS["einsum"](OpCall("einsum", ("...ij,jk", a, b), {}, (2, 3, 5))) == (2 * 120, 120)
    assert FORMULAS["einsum"](OpCall("einsum", ("bij,jk->bik", [a, b]), {}, (2, 3, 5))) == (2 * 120, 120)
    # x @ w with reverse=True is w @ x
    assert FORMULAS["matmul"](OpCall("matmul", (b, a), {"reverse": True}, (2, 3, 5))) == (2 * 120, 120)
    # a 1-D weight is an elementwise product, not a contraction
    assert FORMULAS["linear"](OpCall("linear", (a, ArraySpec((4,)), ArraySpec((4,))), {}, (2, 3, 4))) == (48, 0)
    x = ArraySpec((1, 4, 5, 5))
    call = OpCall("conv_transpose2d", (x, ArraySpec((4, 3, 3, 3))), {"groups": 2, "stride": 2}, (1, 6, 11, 11))
    assert FORMULAS["conv_transpose2d"](call) == (2 * 100 * 27, 100 * 27)  # C_out / groups * kh * kw per input
    assert FORMULAS["avg_pool2d"](OpCall("avg_pool2d", (x, 3), {"stride": 1}, (1, 4, 3, 3))) == (9 * 36, 0)
    # grouped-query attention: 4 query heads over 2 key heads
    q, kv = ArraySpec((1, 4, 6, 8)), ArraySpec((1, 2, 10, 8))
    call = OpCall("scaled_dot_product_attention", (q, kv, kv), {"enable_gqa": True}, (1, 4, 6, 8))
    scores = 4 * 6 * 10
    assert FORMULAS["scaled_dot_product_attention"](call) == (2 * scores * 16 + 4 * scores, scores * 16)
