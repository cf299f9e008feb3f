"""FLOP formulas for TensorFlow ops, by the names the TF backend records (``conv2d``, ``matmul``, ``bias_add``...).

Conventions are those of :mod:`torchlens_core.views.flops`. An op's attributes are
its keyword arguments (``transpose_a``, ``ksize``, ``equation``...). Keras 3
runs Dense as ``matmul`` + ``bias_add`` and normalizations as ``mean``, ``sub``,
``rsqrt``... ops, each counted on its own. Transcendental functions (exp,
tanh, erf...) count one FLOP per element and activations the arithmetic of
their textbook definition, as for torch.
"""

from __future__ import annotations

import math

from torchlens_core.views.flops import (
    ArraySpec,
    Count,
    Formula,
    OpCall,
    contraction,
    conv_macs,
    einsum_count,
    elementwise,
    reduction,
    zero,
)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _conv(call: OpCall) -> Count:
    # Conv2D/Conv3D/Conv: filter (*kernel, in_channels / groups, out_channels), whatever the data_format.
    w: ArraySpec = call.arg(1)
    return contraction(conv_macs(call.out_shape, w.numel, w.shape[-1]))


def _depthwise(call: OpCall) -> Count:
    # filter (kh, kw, in_channels, multiplier): each of the in * multiplier outputs sees one input channel.
    w: ArraySpec = call.arg(1)
    return contraction(conv_macs(call.out_shape, w.numel, w.shape[-2] * w.shape[-1]))


def _conv_transpose(call: OpCall) -> Count:
    # Conv2DBackpropInput(input_sizes, filter (*kernel, out, in), x): as torch counts conv_transpose,
    # every input element meets out_channels * prod(kernel) weights.
    w: ArraySpec = call.arg(1)
    x: ArraySpec = call.arg(2)
    return contraction(x.numel * w.numel // w.shape[-1])


def _matmul(call: OpCall) -> Count:
    a: ArraySpec = call.arg(0)
    k = a.shape[0] if call.kwargs.get("transpose_a") else a.shape[1]
    return contraction(call.out_numel * k)


def _batch_matmul(call: OpCall) -> Count:
    a: ArraySpec = call.arg(0)
    k = a.shape[-2] if call.kwargs.get("adj_x") else a.shape[-1]
    return contraction(call.out_numel * k)


def _einsum(call: OpCall) -> Count:
    return einsum_count(_text(call.kwargs["equation"]), [a.shape for a in call.inputs])


def _pool(call: OpCall) -> Count | None:
    ksize = call.kwargs.get("ksize")  # MaxPoolV2 passes it as a tensor, whose value a formula never sees
    return None if ksize is None else (math.prod(ksize) * call.out_numel, 0)


def _batch_norm(call: OpCall) -> Count:
    # FusedBatchNorm(x, scale, offset, mean, variance): subtract, divide, scale, shift; batch statistics
    # (mean, variance) on top when training. Counted on x: the op also returns its statistics.
    x: ArraySpec = call.arg(0)
    return (4 + 3 * bool(call.kwargs.get("is_training"))) * x.numel, 0


def _add_n(call: OpCall) -> Count:
    return (len(call.inputs) - 1) * call.out_numel, 0


FORMULAS: dict[str, Formula] = {
    "conv2d": _conv,
    "conv3d": _conv,
    "conv1d": _conv,
    "conv": _conv,
    "depthwise_conv2d": _depthwise,
    "conv2d_transpose": _conv_transpose,
    "conv3d_transpose": _conv_transpose,
    "matmul": _matmul,
    "batch_matmul": _batch_matmul,
    "einsum": _einsum,
    "max_pool": _pool,
    "avg_pool": _pool,
    "max_pool3d": _pool,
    "avg_pool3d": _pool,
    "max_pool_with_argmax": _pool,
    "batch_norm": _batch_norm,
    "add_n": _add_n,
    "resize_bilinear": elementwise(8),
    "resize_bicubic": elementwise(32),  # a weight and an add per corner
}

# Reductions, scans and softmax: FLOPs per element of the (first) input.
_REDUCTIONS: dict[float, tuple[str, ...]] = {
    1: ("sum", "mean", "max", "min", "prod", "all", "any", "arg_max", "arg_min", "cumsum", "cumprod"),
    2: ("euclidean_norm", "l2_loss"),  # square, sum
    3: ("softmax", "log_softmax", "cumulative_logsumexp"),  # exp, sum, divide (or log)
}
for _per, _names in _REDUCTIONS.items():
    for _name in _names:
        FORMULAS[_name] = reduction(_per)

# Elementwise: FLOPs per output element.
_ELEMENTWISE: dict[float, tuple[str, ...]] = {
    1: (
        "add",
        "sub",
        "mul",
        "div",
        "div_no_nan",
        "mul_no_nan",
        "floor_div",
        "floor_mod",
        "truncate_div",
        "truncate_mod",
        "mod",
        "pow",
        "maximum",
        "minimum",
        "atan2",
        "xdivy",
        "xlogy",
        "xlog1py",
        "bias_add",
        "assign_add",
        "assign_sub",
        "neg",
        "abs",
        "sign",
        "exp",
        "expm1",
        "log",
        "log1p",
        "sqrt",
        "rsqrt",
        "square",
        "reciprocal",
        "inv",
        "floor",
        "ceil",
        "round",
        "rint",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "erfc",
        "erfinv",
        "ndtri",
        "lgamma",
        "digamma",
        "clip_by_value",
        "relu",
        "relu6",
        "leaky_relu",
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
        "approximate_equal",
        "logical_and",
        "logical_or",
        "logical_not",
        "is_nan",
        "is_inf",
        "is_finite",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "invert",
        "left_shift",
        "right_shift",
        "conj",
        "complex_abs",
    ),
    2: ("squared_difference",),
    3: ("elu", "selu", "softplus", "softsign"),
    4: ("sigmoid",),  # 1 / (1 + exp(-x))
}
for _per, _names in _ELEMENTWISE.items():
    for _name in _names:
        FORMULAS[_name] = elementwise(_per)

# Ops that view, move, select, convert, read or create data (random numbers included): zero arithmetic.
for _name in (
    "reshape",
    "transpose",
    "conjugate_transpose",
    "squeeze",
    "expand_dims",
    "concat",
    "stack",
    "unstack",
    "split",
    "split_v",
    "slice",
    "strided_slice",
    "gather",
    "gather_nd",
    "pad",
    "mirror_pad",
    "tile",
    "broadcast_to",
    "reverse",
    "select",
    "where",
    "one_hot",
    "top_k",
    "identity",
    "identity_n",
    "stop_gradient",
    "prevent_gradient",
    "snapshot",
    "ensure_shape",
    "check_numerics",
    "placeholder_with_default",
    "cast",
    "bitcast",
    "shape",
    "shape_n",
    "size",
    "rank",
    "broadcast_args",
    "broadcast_gradient_args",
    "fill",
    "zeros_like",
    "ones_like",
    "range",
    "lin_space",
    "read_variable",
    "assign",
    "space_to_depth",
    "depth_to_space",
    "space_to_batch_nd",
    "batch_to_space_nd",
    "resize_nearest_neighbor",
    "tensor_scatter_update",
    "scatter_nd",
    "matrix_band_part",
    "random_uniform",
    "random_uniform_int",
    "random_standard_normal",
    "truncated_normal",
    "stateless_random_uniform",
    "stateless_random_uniform_int",
    "stateless_random_uniform_full_int",
    "stateless_random_normal",
    "stateless_truncated_normal",
    "stateless_random_get_key_counter",
    "stateless_random_get_key_counter_alg",
    "stateless_random_get_alg",
    "stateful_uniform",
    "stateful_uniform_int",
    "stateful_standard_normal",
    "stateful_truncated_normal",
    "rng_read_and_skip",
    "rng_skip",
    "real",
    "imag",
    "complex",
):
    FORMULAS[_name] = zero
