"""FLOP formulas for torch ops, by the names the torch backend records (``conv2d``, ``add_``...).

Conventions are those of :mod:`torchlens_core.views.flops`. Transcendental functions
(exp, tanh, erf...) count one FLOP each; activations count the arithmetic of
their textbook definition. Formulas read shapes and constants only.
"""

from __future__ import annotations

import math

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


def _conv(call: OpCall) -> Count:
    weight: ArraySpec = call.arg(1, "weight")
    macs = conv_macs(call.out_shape, weight.numel, weight.shape[0])
    bias = call.arg(2, "bias")
    return contraction(macs, call.out_numel if isinstance(bias, ArraySpec) else 0)


def _conv_transpose(call: OpCall) -> Count:
    # Every input element meets (out_channels / groups) * prod(kernel) weights: weight is (in, out/groups, *k).
    x: ArraySpec = call.arg(0, "input")
    weight: ArraySpec = call.arg(1, "weight")
    macs = x.numel * weight.numel // weight.shape[0]
    bias = call.arg(2, "bias")
    return contraction(macs, call.out_numel if isinstance(bias, ArraySpec) else 0)


def _linear(call: OpCall) -> Count:
    weight: ArraySpec = call.arg(1, "weight")
    bias = call.arg(2, "bias")
    return contraction(call.out_numel * weight.shape[-1], call.out_numel if isinstance(bias, ArraySpec) else 0)


def _matmul(call: OpCall) -> Count:
    a, b = call.inputs[:2]
    return contraction(matmul_macs(a.shape, b.shape))


def _addmm(call: OpCall) -> Count:  # addmm(bias, a, b), baddbmm(bias, a, b): a product plus a scaled bias
    _, a, b = call.inputs[:3]
    return contraction(matmul_macs(a.shape, b.shape), 2 * call.out_numel)


def _einsum(call: OpCall) -> Count:
    operands = call.arg(1)
    arrays = operands if isinstance(operands, (list, tuple)) else call.args[1:]
    return einsum_count(call.arg(0, "equation"), [a.shape for a in arrays])


def _attention(call: OpCall) -> Count:
    q, k, v = call.inputs[:3]
    batch = math.prod(q.shape[:-2])
    L, E, S, Ev = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    macs = batch * L * S * (E + Ev)  # q @ k^T, then weights @ v
    return contraction(macs, 4 * batch * L * S)  # scale, softmax (exp, sum, divide)


def _multi_head_attention(call: OpCall) -> Count:
    # multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight, ...): (L, N, E)
    q, k = call.inputs[:2]
    E = call.arg(3, "embed_dim_to_check")
    L, S = q.shape[0], k.shape[0]
    N = q.numel // (L * E)
    macs = N * (L * E * E + 2 * S * E * E)  # input projections
    macs += N * L * S * 2 * E  # scores and weighted values, over all heads
    macs += N * L * E * E  # output projection
    return contraction(macs, 4 * N * L * S * call.arg(4, "num_heads") + 4 * N * L * E)


def _recurrent(gates: int) -> Formula:
    def formula(call: OpCall) -> Count | None:
        # lstm/gru/rnn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        x = call.arg(0)
        if not isinstance(x, ArraySpec) or not isinstance(call.arg(8), bool):
            return None  # the packed-sequence form: lengths are not in the shapes
        steps = x.shape[0] * x.shape[1] if len(x.shape) == 3 else x.shape[0]  # time steps x batch
        weights = [p for p in call.arg(2) if isinstance(p, ArraySpec)]
        group = 4 if call.arg(3) else 2  # per layer and direction: w_ih, w_hh[, b_ih, b_hh]
        macs = extra = 0
        for i in range(0, len(weights) - group + 1, group):
            w_ih, w_hh, *biases = weights[i : i + group]
            macs += steps * (w_ih.numel + w_hh.numel)
            extra += steps * (gates * w_hh.shape[1] + sum(b.numel for b in biases))
        return contraction(macs, extra)

    return formula


def _pool(call: OpCall) -> Count:
    kernel = call.arg(1, "kernel_size")
    size = math.prod(kernel) if isinstance(kernel, (tuple, list)) else kernel ** (len(call.out_shape) - 2)
    return size * call.out_numel, 0


def _adaptive_pool(call: OpCall) -> Count:
    return call.inputs[0].numel + call.out_numel, 0


def _batch_norm(call: OpCall) -> Count:
    training = call.arg(5, "training")
    affine = isinstance(call.arg(3, "weight"), ArraySpec)
    return (2 + 2 * affine + 3 * bool(training)) * call.out_numel, 0


def _norm(call: OpCall) -> Count:  # layer/group/instance/rms norm: statistics, normalize, affine
    affine = isinstance(call.arg(2, "weight"), ArraySpec) or isinstance(call.kwargs.get("weight"), ArraySpec)
    return (5 + 2 * affine) * call.out_numel, 0


def _dropout(call: OpCall) -> Count:
    return (call.out_numel if call.arg(2, "training", True) else 0), 0


def _interpolate(call: OpCall) -> Count:
    mode = call.arg(3, "mode", "nearest")
    corners = {"linear": 2, "bilinear": 4, "trilinear": 8, "bicubic": 16}.get(mode, 0)
    return 2 * corners * call.out_numel, 0  # a weight and an add per sampled corner; nearest copies


FORMULAS: dict[str, Formula] = {
    **COMMON,  # elementwise and reduction conventions shared by every backend
    "conv1d": _conv,
    "conv2d": _conv,
    "conv3d": _conv,
    "conv_transpose1d": _conv_transpose,
    "conv_transpose2d": _conv_transpose,
    "conv_transpose3d": _conv_transpose,
    "linear": _linear,
    "matmul": _matmul,
    "mm": _matmul,
    "bmm": _matmul,
    "mv": _matmul,
    "dot": _matmul,
    "addmm": _addmm,
    "baddbmm": _addmm,
    "addbmm": _addmm,
    "addmv": _addmm,
    "einsum": _einsum,
    "scaled_dot_product_attention": _attention,
    "multi_head_attention_forward": _multi_head_attention,
    "lstm": _recurrent(10),
    "gru": _recurrent(8),
    "rnn_tanh": _recurrent(1),
    "rnn_relu": _recurrent(1),
    "batch_norm": _batch_norm,
    "layer_norm": _norm,
    "group_norm": _norm,
    "instance_norm": _norm,
    "rms_norm": _norm,
    "max_pool1d": _pool,
    "max_pool2d": _pool,
    "max_pool3d": _pool,
    "max_pool2d_with_indices": _pool,
    "avg_pool1d": _pool,
    "avg_pool2d": _pool,
    "avg_pool3d": _pool,
    "adaptive_avg_pool1d": _adaptive_pool,
    "adaptive_avg_pool2d": _adaptive_pool,
    "adaptive_avg_pool3d": _adaptive_pool,
    "adaptive_max_pool1d": _adaptive_pool,
    "adaptive_max_pool2d": _adaptive_pool,
    "adaptive_max_pool3d": _adaptive_pool,
    "dropout": _dropout,
    "dropout1d": _dropout,
    "dropout2d": _dropout,
    "dropout3d": _dropout,
    "alpha_dropout": _dropout,
    "feature_alpha_dropout": _dropout,
    "softmax": reduction(3),
    "log_softmax": reduction(3),
    "softmin": reduction(4),
    "diff": reduction(1),
    "norm": reduction(2),
    "std": reduction(3),
    "var": reduction(3),
    "std_mean": reduction(3),
    "var_mean": reduction(3),
    "count_nonzero": reduction(1),
    "interpolate": _interpolate,
    "upsample": _interpolate,
}

# Elementwise ops beyond the shared ones: FLOPs per output element.
_ELEMENTWISE: dict[float, tuple[str, ...]] = {
    1: ("erfc", "frac", "clamp_min", "clamp_max", "threshold", "addcmul", "addcdiv", "hypot"),
    2: ("tanhshrink",),
    3: ("log_sigmoid",),
    4: ("glu",),
}
for _per, _names in _ELEMENTWISE.items():
    for _name in _names:
        FORMULAS[_name] = elementwise(_per)

# Ops that view, move, gather or create data: zero arithmetic.
for _name in (
    "view",
    "view_as",
    "reshape",
    "reshape_as",
    "permute",
    "transpose",
    "t",
    "swapaxes",
    "movedim",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "expand",
    "expand_as",
    "broadcast_to",
    "contiguous",
    "clone",
    "detach",
    "cat",
    "concat",
    "concatenate",
    "stack",
    "hstack",
    "vstack",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "tensor_split",
    "narrow",
    "select",
    "getitem",
    "setitem",
    "index_select",
    "gather",
    "scatter",
    "take",
    "take_along_dim",
    "masked_select",
    "masked_fill",
    "where",
    "index",
    "index_put",
    "index_copy",
    "roll",
    "flip",
    "fliplr",
    "flipud",
    "rot90",
    "repeat",
    "repeat_interleave",
    "tile",
    "pad",
    "constant_pad_nd",
    "tril",
    "triu",
    "diagonal",
    "diag",
    "diag_embed",
    "unfold",
    "as_strided",
    "to",
    "type",
    "type_as",
    "float",
    "double",
    "half",
    "bfloat16",
    "int",
    "long",
    "bool",
    "byte",
    "char",
    "short",
    "cpu",
    "cuda",
    "copy",
    "embedding",
    "one_hot",
    "identity",
    "zeros",
    "ones",
    "full",
    "empty",
    "eye",
    "arange",
    "linspace",
    "logspace",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "new_tensor",
    "tensor",
    "as_tensor",
    "rand",
    "randn",
    "randint",
    "rand_like",
    "randn_like",
    "randint_like",
    "randperm",
    "bernoulli",
    "multinomial",
    "normal",
    "uniform",
    "pixel_shuffle",
    "pixel_unshuffle",
    "channel_shuffle",
    "native_channel_shuffle",
    "meshgrid",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "ravel",
    "nonzero",
    "argwhere",
    "sort",
    "argsort",
    "fill",
    "zero",
    "masked_scatter",
    "interpolate_nearest",
    "real",
    "imag",
    "view_as_real",
    "view_as_complex",
    "detach_copy",
    "lift_fresh",
):
    FORMULAS[_name] = zero

# In-place variants (``add_``, ``relu_``) cost what their out-of-place forms do.
FORMULAS.update({f"{name}_": f for name, f in list(FORMULAS.items()) if not name.endswith("_")})
