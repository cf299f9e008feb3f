"""FLOPs and MACs of TensorFlow traces: hand-counted models, ResNet50, zero-cost and unknown ops.

Every backend's zoo coverage (at most 5% unknown, contractions counted, matrix products by their shapes) is
the conformance suite's (torchlens/conformance/flop_checks.py); tl.register_flops is the core's
(tests/test_flops_core.py).
"""

from __future__ import annotations

import math
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import torchlens as tl  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")


def _x(*shape: int, seed: int = 0) -> tf.Tensor:
    return tf.random.stateless_normal(shape, seed=(seed, 1))


def _by_name(trace: tl.Trace, name: str) -> list:
    return [op for op in trace.ops if op.func_name == name]


def test_cnn_counted_by_hand() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.DepthwiseConv2D(3, padding="same"),
            keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    trace = tl.trace(model, _x(2, 16, 16, 3))
    conv = 2 * 16 * 16 * 8 * (3 * 3 * 3)  # output elements x kernel taps x input channels
    depthwise = 2 * 8 * 8 * 8 * (3 * 3)  # one input channel per output channel
    transpose = (2 * 8 * 8 * 8) * (3 * 3 * 4)  # every input element meets out_channels x kernel weights
    dense = 2 * (16 * 16 * 4) * 10
    assert [op.macs for op in _by_name(trace, "conv2d")] == [conv]
    assert [op.macs for op in _by_name(trace, "depthwise_conv2d")] == [depthwise]
    assert [op.macs for op in _by_name(trace, "conv2d_transpose")] == [transpose]
    assert [op.macs for op in _by_name(trace, "matmul")] == [dense]
    assert trace.macs == conv + depthwise + transpose + dense
    elementwise = (
        2 * 16 * 16 * 8 * 2  # conv: bias, relu
        + 2 * 8 * 8 * 8 * 4  # 2x2 max pool: four elements per output
        + 2 * 8 * 8 * 8  # depthwise bias
        + 2 * 16 * 16 * 4  # transposed conv bias
        + 2 * 10  # dense bias
    )
    assert trace.flops == 2 * trace.macs + elementwise
    assert not trace.unknown_flops


def test_mlp_counted_by_hand() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    trace = tl.trace(model, _x(4, 6))
    macs = 4 * 6 * 16 + 4 * 16 * 3
    assert trace.macs == macs
    assert trace.flops == 2 * macs + 4 * 16 * 2 + 4 * 3  # bias and relu of the first layer, bias of the second


def test_attention_macs_by_hand() -> None:
    batch, length, embed, heads, key_dim = 2, 6, 16, 4, 4
    keras.utils.set_random_seed(0)
    mha = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=key_dim)
    x = _x(batch, length, embed)
    mha(x, x)
    trace = tl.trace(lambda x: mha(x, x), x)
    projections = 4 * batch * length * embed * heads * key_dim  # query, key, value and output
    attention = 2 * batch * heads * length * length * key_dim  # scores, then the weighted values
    assert trace.macs == projections + attention
    assert [op.macs for op in _by_name(trace, "einsum")] == [attention / 2] * 2
    assert trace.flops > 2 * trace.macs  # biases, scaling and the softmax on top
    assert not trace.unknown_flops


def test_matmul_forms() -> None:
    def f(a: tf.Tensor, b: tf.Tensor, c: tf.Tensor) -> tf.Tensor:
        ab = tf.matmul(a, b, transpose_a=True)  # a is (k, m) = (5, 3): (3, 4)
        batched = tf.matmul(c, c, adjoint_a=True)  # (2, 6, 3)^H @ (2, 6, 3): (2, 3, 3)
        return tf.einsum("...ij,jk->...ik", batched, ab)  # (2, 3, 3) @ (3, 4)

    trace = tl.trace(f, _x(5, 3), _x(5, 4, seed=1), _x(2, 6, 3, seed=2))
    assert _by_name(trace, "matmul")[0].macs == 3 * 4 * 5
    assert _by_name(trace, "batch_matmul")[0].macs == 2 * 3 * 3 * 6
    assert [op.macs for op in _by_name(trace, "einsum")] == [2 * 3 * 4 * 3]  # the ellipsis is the batch


def test_zero_cost_ops() -> None:
    def f(x: tf.Tensor) -> tf.Tensor:
        y = tf.concat([tf.transpose(x), tf.transpose(x)], axis=0)[1:5]
        return tf.cast(tf.reshape(tf.expand_dims(y, 0), (-1,)), tf.float16)

    trace = tl.trace(f, _x(3, 4))
    ops = [op for op in trace.ops if op.kind == "op"]
    assert {op.func_name for op in ops} >= {"transpose", "concat", "strided_slice", "reshape", "expand_dims", "cast"}
    assert all(op.flops == 0 and op.macs == 0 for op in ops)


def test_unknown_op_stays_none() -> None:
    trace = tl.trace(lambda x: tf.abs(tf.signal.fft(x)), tf.complex(_x(8), _x(8, seed=1)))
    (fft,) = _by_name(trace, "fft")
    assert fft.flops is None and fft.macs is None
    assert trace.unknown_flops == [fft]
    assert trace.flops == sum(op.flops for op in trace.ops if op is not fft)


def test_resnet50_macs_match_the_layer_configs() -> None:
    # Published figures for ResNet50 at 224x224 run from about 3.86 to 4.1 GMACs (sources differ on what they count).
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    trace = tl.trace(model, _x(1, 224, 224, 3))
    expected = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):  # kernel (kh, kw, in, out): each output position meets it all
            _, height, width, _ = layer.output.shape
            expected += height * width * math.prod(layer.kernel.shape)
        elif isinstance(layer, keras.layers.Dense):
            expected += math.prod(layer.kernel.shape)
    assert 3.8e9 < expected < 4.2e9
    assert trace.macs == pytest.approx(expected, rel=0.01)
    assert not trace.unknown_flops
