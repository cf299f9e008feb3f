"""FLOPs and MACs of JAX traces: hand-counted models, zero-cost and unknown ops.

Every backend's zoo coverage (at most 5% unknown, contractions counted, matrix products by their shapes) is
the conformance suite's (torchlens/conformance/flop_checks.py); tl.register_flops is the core's
(tests/test_flops_core.py).
"""

from __future__ import annotations

import math

import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

import jax.numpy as jnp  # noqa: E402

import torchlens as tl  # noqa: E402


def _x(*shape: int, seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape)


def _by_name(trace: tl.Trace, name: str) -> list:
    return [op for op in trace.ops if op.func_name == name]


class SmallCNN(nnx.Module):
    """Conv, a grouped conv, pooling and a dense head, NHWC, on (2, 16, 16, 3)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(3, 8, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, (3, 3), feature_group_count=4, rngs=rngs)
        self.fc = nnx.Linear(16 * 8 * 8, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.max_pool(nnx.relu(self.conv1(x)), (2, 2), (2, 2))
        x = nnx.relu(self.conv2(x))
        return self.fc(x.reshape(x.shape[0], -1))


def test_cnn_counted_by_hand() -> None:
    trace = tl.trace(SmallCNN(nnx.Rngs(0)), _x(2, 16, 16, 3))
    conv1 = 2 * 16 * 16 * 8 * (3 * 3 * 3)  # output elements x kernel taps x input channels
    conv2 = 2 * 8 * 8 * 16 * (3 * 3 * 8 // 4)  # 4 groups: each output sees 2 of the 8 input channels
    fc = 2 * (16 * 8 * 8) * 10
    assert [op.macs for op in _by_name(trace, "conv_general_dilated")] == [conv1, conv2]
    assert [op.macs for op in _by_name(trace, "dot_general")] == [fc]
    assert trace.macs == conv1 + conv2 + fc
    elementwise = (
        2 * 16 * 16 * 8 * 2  # conv1: bias, relu
        + 2 * 8 * 8 * 8 * 4  # 2x2 max pool: four elements per output
        + 2 * 8 * 8 * 16 * 2  # conv2: bias, relu
        + 2 * 10  # fc bias
    )
    assert trace.flops == 2 * trace.macs + elementwise
    assert not trace.unknown_flops


def test_mlp_counted_by_hand() -> None:
    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.fc1 = nnx.Linear(6, 16, rngs=rngs)
            self.fc2 = nnx.Linear(16, 3, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.fc2(nnx.relu(self.fc1(x)))

    trace = tl.trace(MLP(nnx.Rngs(1)), _x(4, 6))
    macs = 4 * 6 * 16 + 4 * 16 * 3
    assert trace.macs == macs
    assert trace.flops == 2 * macs + 4 * 16 * 2 + 4 * 3  # bias and relu of fc1, bias of fc2


def test_attention_macs_by_hand() -> None:
    batch, length, embed, heads = 2, 5, 16, 4
    attn = nnx.MultiHeadAttention(num_heads=heads, in_features=embed, decode=False, rngs=nnx.Rngs(2))
    trace = tl.trace(attn, _x(batch, length, embed))
    head_dim = embed // heads
    projections = 4 * batch * length * embed * embed  # query, key, value and output
    attention = 2 * batch * heads * length * length * head_dim  # scores, then the weighted values
    assert trace.macs == projections + attention
    contractions = _by_name(trace, "dot_general")
    assert all(op.flops == 2 * op.macs for op in contractions)
    assert trace.flops > 2 * trace.macs  # biases, scaling and the softmax on top
    assert not trace.unknown_flops


def test_transposed_and_depthwise_convs() -> None:
    def f(x: jax.Array, w_t: jax.Array, w_dw: jax.Array) -> jax.Array:
        up = jax.lax.conv_transpose(x, w_t, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.lax.conv_general_dilated(
            up, w_dw, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=5
        )

    x, w_t, w_dw = _x(1, 4, 4, 3), _x(3, 3, 3, 5, seed=1), _x(3, 3, 1, 5, seed=2)
    trace = tl.trace(f, x, w_t, w_dw)
    up, dw = _by_name(trace, "conv_general_dilated")
    assert up.shape == (1, 8, 8, 5)
    assert up.macs == (1 * 4 * 4 * 3) * (3 * 3 * 5)  # every input element meets out_channels x kernel weights
    assert dw.macs == (1 * 8 * 8 * 5) * (3 * 3)  # depthwise: one input channel per output


def test_zero_cost_ops() -> None:
    def f(x: jax.Array) -> jax.Array:
        y = jnp.concatenate([x.T, x.T], axis=0)[1:5].reshape(-1)
        return jnp.broadcast_to(y.astype(jnp.float16), (2, y.size))

    trace = tl.trace(f, _x(3, 4))
    moved = [op for op in trace.ops if op.kind == "op"]
    assert {op.func_name for op in moved} >= {
        "transpose",
        "concatenate",
        "slice",
        "reshape",
        "convert_element_type",
        "broadcast_in_dim",
    }
    assert all(op.flops == 0 and op.macs == 0 for op in moved)


def test_unknown_op_stays_none() -> None:
    trace = tl.trace(lambda x: jnp.abs(jnp.fft.fft(x)), _x(8))
    (fft,) = _by_name(trace, "fft")
    assert fft.flops is None and fft.macs is None
    assert trace.unknown_flops == [fft]
    assert trace.flops == sum(op.flops for op in trace.ops if op is not fft)


class DeeperCNN(nnx.Module):
    """VGG-like, on 32x32: strided, grouped and 1x1 convs, then a dense head."""

    # (in, out, kernel, stride, groups)
    LAYERS = [
        (3, 16, 3, 1, 1),
        (16, 32, 3, 2, 1),
        (32, 32, 3, 1, 8),
        (32, 64, 1, 1, 1),
        (64, 64, 3, 2, 1),
        (64, 128, 3, 2, 4),
    ]

    def __init__(self, rngs: nnx.Rngs) -> None:
        layers = []
        for cin, cout, k, stride, groups in self.LAYERS:
            layers += [nnx.Conv(cin, cout, (k, k), strides=stride, feature_group_count=groups, rngs=rngs), nnx.relu]
        self.features = nnx.Sequential(*layers)
        self.head = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.features(x).mean(axis=(1, 2)))


def test_cnn_macs_match_the_layer_configs() -> None:
    batch, size = 2, 32
    trace = tl.trace(DeeperCNN(nnx.Rngs(3)), _x(batch, size, size, 3))
    expected = 0
    for cin, cout, k, stride, groups in DeeperCNN.LAYERS:
        size = math.ceil(size / stride)  # SAME padding
        expected += batch * size * size * cout * k * k * cin // groups
    expected += batch * 128 * 10
    assert trace.macs == pytest.approx(expected, rel=0.01)
