"""FLOPs and MACs of Paddle's ops, from shapes and constants only (never imports Paddle).

Ops are recorded under their ``paddle._C_ops`` names (``conv2d``, ``matmul``,
``batch_norm``...) with the arguments as the Python API passed them, or under
the names ``intercept.TENSOR_DUNDERS`` and ``TENSOR_METHODS`` give Tensor
operators (``add``, ``getitem``...). Conventions are the core's
(:mod:`torchlens_core.views.flops`): one MAC is two FLOPs, MACs only for
contractions; a transcendental (exp, tanh, erf...) counts one FLOP and an
activation the arithmetic of its textbook definition, per output element;
views, copies and creation count zero. The per-element counts are the torch
backend's (backends/torch/flops.py), so that one model counts alike on both.
A bias added by a separate ``add`` (Paddle's convolutions) is counted there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torchlens_core.views.flops import (
    COMMON,
    ArraySpec,
    Count,
    Formula,
    OpCall,
    contraction,
    conv_macs,
    einsum_count,
    elementwise,
    matmul_macs,
    reduction,
    zero,
)

__all__ = ["FORMULAS"]


# -- contractions ---------------------------------------------------------------------------
def _conv(call: OpCall) -> Count:
    # weight is [C_out, C_in / groups, *kernel]: each output element takes weight.numel / C_out MACs
    # (depthwise and grouped convolutions included).
    weight = call.arg(1, "weight")
    return contraction(conv_macs(call.first_out_shape, weight.numel, weight.shape[0]))


def _conv_transpose(call: OpCall) -> Count:
    # weight is [C_in, C_out / groups, *kernel]: each input element is scattered over weight.numel / C_in outputs.
    x, weight = call.arg(0, "x"), call.arg(1, "weight")
    return contraction(x.numel * weight.numel // weight.shape[0])


def _matmul(call: OpCall) -> Count:
    x, y = call.arg(0, "x"), call.arg(1, "y")
    a, b = list(x.shape), list(y.shape)
    if call.arg(2, "transpose_x", False) and len(a) > 1:
        a[-2:] = a[:-3:-1]
    if call.arg(3, "transpose_y", False) and len(b) > 1:
        b[-2:] = b[:-3:-1]
    return contraction(matmul_macs(a, b))


def _rmatmul(call: OpCall) -> Count:  # Tensor.__rmatmul__(self, other) is other @ self
    return contraction(matmul_macs(call.args[1].shape, call.args[0].shape))


def _linear(call: OpCall) -> Count:
    # weight is [in, out]; the bias adds one FLOP per output element.
    x, weight, bias = call.arg(0, "x"), call.arg(1, "weight"), call.arg(2, "bias")
    out = call.first_out_shape
    return contraction(matmul_macs(x.shape, weight.shape), math.prod(out) if bias is not None else 0)


def _addmm(call: OpCall) -> Count:  # beta * input + alpha * (x @ y): a product plus a scaled input
    return contraction(matmul_macs(call.arg(1, "x").shape, call.arg(2, "y").shape), 2 * call.out_numel)


def _dot(call: OpCall) -> Count:  # row-wise dot products: one MAC per element of x
    return contraction(call.arg(0, "x").numel)


def _bilinear(call: OpCall) -> Count:
    # out[b, o] = x1[b] @ W[o] @ x2[b] + bias[o]: W[o] @ x2 (in1 * in2 MACs), then x1 @ that (in1 MACs).
    x1, weight, bias = call.arg(0, "x"), call.arg(2, "weight"), call.arg(3, "bias")
    out_f, in1, in2 = weight.shape
    batch = x1.numel // in1
    return contraction(batch * out_f * (in1 * in2 + in1), batch * out_f if bias is not None else 0)


def _einsum(call: OpCall) -> Count:  # _C_ops.einsum(operands, equation)
    return einsum_count(call.arg(1, "equation"), [a.shape for a in call.arg(0, "x")])


def _flash_attn(call: OpCall) -> Count:
    # q [B, L, H, D], k [B, S, Hk, D], v [B, S, Hk, Dv]: Q @ K^T and P @ V per head, plus the softmax
    # and the scale on the [B, H, L, S] scores. A causal mask still counts the full square.
    q, k, v = call.arg(0, "q"), call.arg(1, "k"), call.arg(2, "v")
    b, length, heads, d = q.shape[-4:]
    scores = b * heads * length * k.shape[-3]
    return contraction(scores * (d + v.shape[-1]), (_SOFTMAX + 1) * scores)


# FLOPs per hidden unit per step past the matmuls and biases: the gates' adds and activations, the state update.
_RNN_CELL = {"LSTM": 10, "GRU": 8, "RNN_TANH": 1, "RNN_RELU": 1}


def _rnn(call: OpCall) -> Count | None:
    # _C_ops.rnn(x [T, B, in], states, weights, seq_len, dropout_state, p, bidirec, in, hidden, layers, mode, ...):
    # every step multiplies each [gates * hidden, k] weight by a vector and adds each bias; the cell then
    # costs _RNN_CELL per hidden unit.
    x, weights, mode = call.arg(0), call.arg(2), call.arg(10)
    if mode not in _RNN_CELL:
        return None
    steps = x.shape[0] * x.shape[1]
    matrices = [w for w in weights if len(w.shape) == 2]
    macs = steps * sum(w.numel for w in matrices)
    biases = sum(w.numel for w in weights if len(w.shape) == 1)
    units = call.arg(8) * call.arg(9) * (2 if call.arg(6) else 1)
    return contraction(macs, steps * (biases + _RNN_CELL[mode] * units))


# -- normalizations, softmax, pooling ---------------------------------------------------------
# Statistics over the normalized axes: mean, subtract, square, sum, then scale by 1/std: five per element.
_STATISTICS = 5
# Softmax: exp, sum, divide (log_softmax: a log and a subtract in place of the divide).
_SOFTMAX = 3


def _affine(params: Sequence[Any]) -> int:
    """One FLOP per element for each of weight and bias given."""
    return sum(p is not None for p in params)


def _batch_norm(call: OpCall) -> Count:
    # (x, running_mean, running_var, weight, bias, is_test, ...): subtract the mean and divide by the std
    # (two per element), the weight and bias; in training, working out the statistics adds three.
    x = call.arg(0, "x")
    training = not call.arg(5, "is_test", False)
    return x.numel * (2 + _affine((call.arg(3, "scale"), call.arg(4, "bias"))) + 3 * training), 0


def _norm(call: OpCall) -> Count:  # layer_norm / group_norm / instance_norm (x, weight, bias, ...)
    x = call.arg(0, "x")
    return x.numel * (_STATISTICS + _affine((call.arg(1, "scale"), call.arg(2, "bias")))), 0


def _rms_norm(call: OpCall) -> Count:  # square, sum, scale by 1/rms: three per element, and the weight
    x = call.arg(0, "x")
    return x.numel * (3 + (call.arg(1, "weight") is not None)), 0


def _window_sum(n_in: int, n_out: int) -> int:
    """Elements read along one axis by adaptive pooling: window i spans [floor(i*n/m), ceil((i+1)*n/m))."""
    return sum(-(-(i + 1) * n_in // n_out) - i * n_in // n_out for i in range(n_out))


def _pooled(
    x: ArraySpec, out: tuple[int, ...], kernel: Any, is_global: bool, adaptive: bool, channels_last: bool
) -> Count:
    """One FLOP per element of each window (max or average)."""
    if is_global:
        return x.numel, 0
    if adaptive:  # kernel is the output size; windows differ in size, so add them up exactly
        spatial_in = x.shape[1:-1] if channels_last else x.shape[2:]
        spatial_out = out[1:-1] if channels_last else out[2:]
        windows = math.prod(_window_sum(i, o) for i, o in zip(spatial_in, spatial_out, strict=True))
        return math.prod(out) // math.prod(spatial_out) * windows, 0
    return math.prod(kernel) * math.prod(out), 0


def _pool(call: OpCall) -> Count:
    # pool2d / pool3d (x, kernel, strides, paddings, ceil_mode, exclusive, data_format, type, global, adaptive, ...)
    return _pooled(
        call.arg(0, "x"),
        call.first_out_shape,
        call.arg(1, "kernel_size"),
        call.arg(8, "global_pooling", False),
        call.arg(9, "adaptive", False),
        str(call.arg(6, "data_format", "NCHW")).endswith("C"),
    )


def _pool_with_index(call: OpCall) -> Count:
    # max_pool2d_with_index / max_pool3d_with_index (x, kernel, strides, paddings, global, adaptive, ceil_mode)
    return _pooled(
        call.arg(0, "x"),
        call.first_out_shape,
        call.arg(1, "kernel_size"),
        call.arg(4, "global_pooling", False),
        call.arg(5, "adaptive", False),
        False,
    )


def _interp(points: int) -> Formula:
    """Interpolation: a weighted sum of ``points`` inputs per output element, a multiply and an add each."""
    return lambda call: (2 * points * math.prod(call.first_out_shape), 0)


def _dropout(call: OpCall) -> Count:
    # (x, seed, p, is_test, mode, ...): in inference "upscale_in_train" is the identity and
    # "downscale_in_infer" scales; in training the input is multiplied by the (scaled) mask.
    if call.arg(3, "is_test", False) and call.arg(4, "mode", "upscale_in_train") == "upscale_in_train":
        return 0, 0
    return call.arg(0, "x").numel, 0


def _add_n(call: OpCall) -> Count:  # n inputs, n - 1 additions per element
    return (len(call.arg(0, "inputs")) - 1) * call.out_numel, 0


def _per_input(per_element: float) -> Formula:
    """``per_element`` FLOPs for each element of the first input, whatever the output (loss ops)."""
    return lambda call: (per_element * call.inputs[0].numel, 0)


ONE = elementwise(1)

FORMULAS: dict[str, Formula] = {
    **COMMON,  # elementwise and reduction conventions shared by every backend
    # convolutions (a bias comes as a separate add, or in the *_bias variants)
    "conv2d": _conv,
    "conv3d": _conv,
    "depthwise_conv2d": _conv,
    "conv2d_transpose": _conv_transpose,
    "conv3d_transpose": _conv_transpose,
    "depthwise_conv2d_transpose": _conv_transpose,
    # matrix products and attention
    "matmul": _matmul,
    "rmatmul": _rmatmul,
    "bmm": _matmul,
    "mv": _matmul,
    "linear": _linear,
    "addmm": _addmm,
    "dot": _dot,
    "bilinear": _bilinear,
    "einsum": _einsum,
    "flash_attn": _flash_attn,
    "rnn": _rnn,
    # normalizations
    "batch_norm": _batch_norm,
    "sync_batch_norm_": _batch_norm,
    "layer_norm": _norm,
    "group_norm": _norm,
    "instance_norm": _norm,
    "rms_norm": _rms_norm,
    # softmax and losses built on it (picking the label's entry is data movement)
    "softmax": elementwise(_SOFTMAX),
    "log_softmax": elementwise(_SOFTMAX),
    "cross_entropy_with_softmax": _per_input(_SOFTMAX),
    # pooling and resampling ("nearest" only gathers)
    "pool2d": _pool,
    "pool3d": _pool,
    "max_pool2d_with_index": _pool_with_index,
    "max_pool3d_with_index": _pool_with_index,
    "nearest_interp": zero,
    "linear_interp": _interp(2),
    "bilinear_interp": _interp(4),
    "trilinear_interp": _interp(8),
    "bicubic_interp": _interp(16),
    "dropout": _dropout,
    "add_n": _add_n,
    # elementwise binary: _C_ops names, then Tensor operator names
    "elementwise_pow": ONE,
    "fmax": ONE,
    "fmin": ONE,
    "heaviside": ONE,
    "swiglu": elementwise(6),  # silu(x) * y
    "rdiv": ONE,
    "floordiv": ONE,
    "rfloordiv": ONE,
    "rmod": ONE,
    "rpow": ONE,
    # comparisons and logic
    "equal": ONE,
    "not_equal": ONE,
    "less_than": ONE,
    "less_equal": ONE,
    "greater_than": ONE,
    "greater_equal": ONE,
    # elementwise unary and activations (by their textbook arithmetic)
    "scale": ONE,
    "erfinv": ONE,
    "thresholded_relu": ONE,
    "rrelu": ONE,
    "tanh_shrink": elementwise(2),
    "logsigmoid": elementwise(3),
    # reductions: one FLOP per input element; a norm squares (or takes |x|^p) and sums: two
    "mean_all": reduction(1),
    "p_norm": reduction(2),
    "frobenius_norm": reduction(2),
    "squared_l2_norm": reduction(2),
    "norm": reduction(2),
    # data movement, views, copies, casts and creation: zero
    "reshape": zero,
    "transpose": zero,
    "flatten": zero,
    "squeeze": zero,
    "unsqueeze": zero,
    "view_shape": zero,
    "view_dtype": zero,
    "view_slice": zero,
    "as_strided": zero,
    "concat": zero,
    "stack": zero,
    "unstack": zero,
    "split": zero,
    "unbind": zero,
    "slice": zero,
    "strided_slice": zero,
    "getitem": zero,
    "setitem": zero,
    "set_value": zero,
    "set_value_with_tensor": zero,
    "index_elementwise_get": zero,
    "index_elementwise_put": zero,
    "gather": zero,
    "gather_nd": zero,
    "index_select": zero,
    "index_sample": zero,
    "take_along_axis": zero,
    "put_along_axis": zero,
    "scatter": zero,
    "index_put": zero,
    "masked_select": zero,
    "where": zero,
    "masked_fill": zero,
    "embedding": zero,
    "one_hot": zero,
    "expand": zero,
    "expand_as": zero,
    "tile": zero,
    "repeat_interleave": zero,
    "flip": zero,
    "roll": zero,
    "pad": zero,
    "pad3d": zero,
    "tril": zero,
    "triu": zero,
    "diag": zero,
    "unfold": zero,
    "pixel_shuffle": zero,
    "pixel_unshuffle": zero,
    "channel_shuffle": zero,
    "cast": zero,
    "assign": zero,
    "assign_out_": zero,
    "assign_value_": zero,
    "share_data": zero,
    "clone": zero,
    "detach": zero,
    "contiguous": zero,
    "copy_": zero,
    "copy_to": zero,
    "cpu": zero,
    "cuda": zero,
    "to": zero,
    "pos": zero,
    "full": zero,
    "full_like": zero,
    "full_int_array": zero,
    "full_with_tensor": zero,
    "arange": zero,
    "linspace": zero,
    "eye": zero,
    "empty": zero,
    "empty_like": zero,
    "tril_indices": zero,
    "uniform": zero,
    "gaussian": zero,
    "randint": zero,
    "randperm": zero,
    "bernoulli": zero,
    "shape": zero,
    "numel": zero,
    "nonzero": zero,
}

# In-place variants (add_, relu_, scale_, reshape_...) cost what their out-of-place op costs.
FORMULAS.update({name + "_": f for name, f in list(FORMULAS.items()) if not name.endswith("_")})
