"""FLOPs and MACs of tinygrad's ops, from shapes and constants only (never imports tinygrad).

Ops are recorded under their ``Tensor`` method names (``conv2d``, ``linear``,
``relu``...; operators as ``add``, ``mul``, ``getitem``..., in-place ones as
``add_``), self first, the rest as called. Conventions are the core's
(:mod:`torchlens_core.views.flops`): one MAC is two FLOPs, MACs only for
contractions; a transcendental (exp, tanh, erf...) counts one FLOP and an
activation the arithmetic of its textbook definition, per output element;
views, copies and creation count zero. The per-element counts are the torch
backend's (backends/torch/flops.py), so that one model counts alike on both.
"""

from __future__ import annotations

import math
from typing import Any

from torchlens_core.views.flops import (
    COMMON,
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
    # conv2d(x, weight [C_out, C_in / groups, *kernel], bias, groups, stride, dilation, padding):
    # each output element takes weight.numel / C_out MACs, and the bias one FLOP.
    weight, bias = call.arg(1, "weight"), call.arg(2, "bias")
    out = call.first_out_shape
    return contraction(conv_macs(out, weight.numel, weight.shape[0]), math.prod(out) if bias is not None else 0)


def _conv_transpose(call: OpCall) -> Count:
    # weight is [C_in, C_out / groups, *kernel]: each input element is scattered over weight.numel / C_in outputs.
    x, weight, bias = call.arg(0), call.arg(1, "weight"), call.arg(2, "bias")
    macs = x.numel * weight.numel // weight.shape[0]
    return contraction(macs, math.prod(call.first_out_shape) if bias is not None else 0)


def _matmul(call: OpCall) -> Count:  # matmul(self, x, reverse=False) and dot(self, w)
    a, b = call.arg(0).shape, call.arg(1, "x" if call.func_name == "matmul" else "w").shape
    return contraction(matmul_macs(b, a) if call.arg(2, "reverse", False) else matmul_macs(a, b))


def _rmatmul(call: OpCall) -> Count:  # Tensor.__rmatmul__(self, x) is x @ self
    return contraction(matmul_macs(call.args[1].shape, call.args[0].shape))


def _linear(call: OpCall) -> Count:
    # linear(x, weight [in, out], bias): x @ weight, or x * weight for a 1-D weight; the bias adds one per output.
    x, weight, bias = call.arg(0), call.arg(1, "weight"), call.arg(2, "bias")
    out = math.prod(call.first_out_shape)
    extra = out if bias is not None else 0
    if len(weight.shape) == 1:
        return out + extra, 0
    return contraction(matmul_macs(x.shape, weight.shape), extra)


def _einsum(call: OpCall) -> Count:  # Tensor.einsum(formula, *operands), operands possibly one list
    operands: tuple[Any, ...] | list[Any] = call.args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    return einsum_count(call.arg(0, "formula"), [a.shape for a in operands])


# Softmax: exp, sum, divide (log_softmax: a log and a subtract in place of the divide).
_SOFTMAX = 3


def _attention(call: OpCall) -> Count:
    # q [..., H, L, D], k [..., Hk, S, D], v [..., Hk, S, Dv]: Q @ K^T and P @ V for each of q's heads
    # (grouped-query attention repeats k and v), plus the scale and the softmax on the [..., H, L, S]
    # scores. A causal mask still counts the full square.
    q, k, v = call.arg(0), call.arg(1, "key"), call.arg(2, "value")
    scores = math.prod(q.shape[:-1]) * k.shape[-2]
    return contraction(scores * (q.shape[-1] + v.shape[-1]), (_SOFTMAX + 1) * scores)


# -- normalizations, pooling, resampling ----------------------------------------------------
def _kernel(call: OpCall) -> int:
    size = call.arg(1, "kernel_size", (2, 2))
    return size * size if isinstance(size, int) else math.prod(size)


def _pool(call: OpCall) -> Count:  # max_pool2d / avg_pool2d: one FLOP per element of each window
    return _kernel(call) * math.prod(call.first_out_shape), 0


def _interpolate(call: OpCall) -> Count:
    # "linear" on n axes is a weighted sum of 2**n inputs per output element (a multiply and an add each);
    # "nearest" only gathers.
    if call.arg(2, "mode", "linear") != "linear":
        return 0, 0
    return 2 * 2 ** len(call.arg(1, "size")) * math.prod(call.first_out_shape), 0


def _scatter(call: OpCall) -> Count:  # scatter(self, dim, index, src, reduce): a reduce adds or multiplies
    return (0 if call.arg(4, "reduce") is None else math.prod(call.arg(2, "index").shape)), 0


def _batchnorm(call: OpCall) -> Count:
    # batchnorm(x, weight, bias, mean, invstd) is given its statistics: subtract the mean and scale by invstd
    # (two per element), then the weight and the bias where given.
    affine = (call.arg(1, "weight") is not None) + (call.arg(2, "bias") is not None)
    return (2 + affine) * call.arg(0).numel, 0


def _per_input(per_element: float) -> Formula:
    """``per_element`` FLOPs for each element of the first input, whatever the output (losses, norms)."""
    return lambda call: (per_element * call.inputs[0].numel, 0)


ONE = elementwise(1)

FORMULAS: dict[str, Formula] = {
    **COMMON,  # elementwise and reduction conventions shared by every backend
    # convolutions and contractions
    "conv2d": _conv,
    "conv_transpose2d": _conv_transpose,
    "matmul": _matmul,
    "dot": _matmul,
    "rmatmul": _rmatmul,
    "linear": _linear,
    "einsum": _einsum,
    "scaled_dot_product_attention": _attention,
    # normalizations. layernorm: mean, subtract, square, mean, scale by 1/std (tinygrad's nn layers apply the
    # weight and bias as separate ops); normalize: |x|^p, sum, divide.
    "layernorm": _per_input(5),
    "batchnorm": _batchnorm,
    "normalize": _per_input(3),
    # softmax and losses built on it (picking the label's entry is data movement)
    "softmax": elementwise(_SOFTMAX),
    "log_softmax": elementwise(_SOFTMAX),
    "softmin": elementwise(_SOFTMAX + 1),
    # (cross_entropy: times the target and summed; binary cross-entropy: y*log(x) + (1-y)*log(1-x))
    "sparse_categorical_crossentropy": _per_input(_SOFTMAX),
    "cross_entropy": _per_input(_SOFTMAX + 2),
    "nll_loss": _per_input(2),
    "binary_crossentropy": _per_input(7),
    "binary_crossentropy_logits": _per_input(7 + 4),
    # pooling and resampling
    "max_pool2d": _pool,
    "avg_pool2d": _pool,
    "interpolate": _interpolate,
    # dropout multiplies by a scaled mask (in training; outside it the call is a no-op the formula cannot see)
    "dropout": ONE,
    # elementwise binary (methods, then the names operators are recorded under), comparisons and logic
    "logaddexp": elementwise(4),
    "rdiv": ONE,
    "floordiv": ONE,
    "rfloordiv": ONE,
    "rmod": ONE,
    "rpow": ONE,
    "isclose": elementwise(3),
    "lshift": ONE,
    "rshift": ONE,
    "rlshift": ONE,
    "rrshift": ONE,
    # activations, by their textbook arithmetic (quick_gelu: x * sigmoid(1.702x))
    "logsigmoid": elementwise(3),
    "quick_gelu": elementwise(6),
    # reductions: one FLOP per input element; var and std: subtract the mean, square, sum
    "cummax": reduction(1),
    "cummin": reduction(1),
    "var": reduction(3),
    "std": reduction(3),
    "var_mean": reduction(3),
    "std_mean": reduction(3),
    "logcumsumexp": reduction(3),
    # data movement, views, copies, casts and creation: zero
    "reshape": zero,
    "view": zero,
    "permute": zero,
    "transpose": zero,
    "flatten": zero,
    "unflatten": zero,
    "squeeze": zero,
    "unsqueeze": zero,
    "expand": zero,
    "repeat": zero,
    "repeat_interleave": zero,
    "rearrange": zero,
    "pad": zero,
    "pad_to": zero,
    "shrink": zero,
    "shrink_to": zero,
    "flip": zero,
    "roll": zero,
    "cat": zero,
    "stack": zero,
    "split": zero,
    "chunk": zero,
    "getitem": zero,
    "setitem": zero,
    "gather": zero,
    "scatter": _scatter,
    "masked_select": zero,
    "masked_fill": zero,
    "where": zero,
    "one_hot": zero,
    "tril": zero,
    "triu": zero,
    "diag": zero,
    "diagonal": zero,
    "unfold": zero,
    "meshgrid": zero,
    "assign": zero,
    "replace": zero,
    "contiguous": zero,
    "contiguous_backward": zero,
    "clone": zero,
    "detach": zero,
    "cast": zero,
    "bitcast": zero,
    "float": zero,
    "half": zero,
    "double": zero,
    "int": zero,
    "long": zero,
    "short": zero,
    "bool": zero,
    "bfloat16": zero,
    "to": zero,
    "to_": zero,
    "shard": zero,
    "shard_": zero,
    "shard_like": zero,
    "full": zero,
    "full_like": zero,
    "zeros": zero,
    "zeros_like": zero,
    "ones": zero,
    "ones_like": zero,
    "empty": zero,
    "empty_like": zero,
    "arange": zero,
    "linspace": zero,
    "eye": zero,
    "const_like": zero,
    "rand": zero,
    "rand_like": zero,
    "randn": zero,
    "randn_like": zero,
    "randint": zero,
    "normal": zero,
    "uniform": zero,
    "scaled_uniform": zero,
    "glorot_uniform": zero,
    "kaiming_uniform": zero,
    "kaiming_normal": zero,
    "randperm": zero,
}

# In-place operators (x += y is recorded as add_) cost what their out-of-place op costs.
FORMULAS.update({name + "_": f for name, f in list(FORMULAS.items()) if not name.endswith("_")})
