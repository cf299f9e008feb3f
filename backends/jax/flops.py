"""FLOP formulas for JAX ops: jaxpr primitives (``dot_general``, ``conv_general_dilated``, ``add``...).

Conventions are those of :mod:`torchlens_core.views.flops`. A primitive's params
are the op's keyword arguments (``dimension_numbers``, ``window_dimensions``...).
Layers (Dense, Conv, LayerNorm, softmax, attention) reach the walk already
lowered to primitives, so the table needs no layer-level formulas: a flax
LayerNorm is its ``reduce_sum``, ``sub``, ``rsqrt``... each counted on its own.
Transcendental functions (exp, tanh, erf...) count one FLOP per element, as
for torch; ``logistic`` (sigmoid) counts its textbook four.
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
    elementwise,
    reduction,
    zero,
)


def _dot_general(call: OpCall) -> Count:
    # dimension_numbers = ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)): every output
    # element is one dot product over the contracting dimensions.
    lhs: ArraySpec = call.arg(0)
    (contracting, _), _ = call.kwargs["dimension_numbers"]
    return contraction(call.out_numel * math.prod(lhs.shape[d] for d in contracting))


def _conv(call: OpCall) -> Count:
    lhs: ArraySpec = call.arg(0)
    rhs: ArraySpec = call.arg(1)
    # ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec), read by position: a loaded trace has a plain tuple.
    # rhs_spec is (out_feature_dim, in_feature_dim, *spatial_dims).
    rhs_spec = call.kwargs["dimension_numbers"][1]
    out_ch, in_ch = rhs.shape[rhs_spec[0]], rhs.shape[rhs_spec[1]]
    if any(d > 1 for d in call.kwargs.get("lhs_dilation") or ()):
        # A transposed convolution: counting output taps would count the zeros dilation inserts.
        # Count as torch does: every input element meets (out_channels / groups) * prod(kernel) weights.
        groups = call.kwargs.get("feature_group_count", 1)
        return contraction(lhs.numel * rhs.numel // (in_ch * groups))
    return contraction(conv_macs(call.out_shape, rhs.numel, out_ch))


def _window(call: OpCall) -> Count:
    # reduce_window_max/sum (max and average pooling): one FLOP per window element per output.
    return math.prod(call.kwargs["window_dimensions"]) * call.out_numel, 0


def _scatter_combine(call: OpCall) -> Count:
    # scatter_add(operand, indices, updates): one FLOP per update element combined into the operand.
    return call.arg(2).numel, 0


FORMULAS: dict[str, Formula] = {
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "reduce_window_max": _window,
    "reduce_window_min": _window,
    "reduce_window_sum": _window,
    "reduce_window": _window,
    "scatter-add": _scatter_combine,
    "scatter_add": _scatter_combine,
    "scatter-mul": _scatter_combine,
    "scatter_mul": _scatter_combine,
    "scatter-min": _scatter_combine,
    "scatter_min": _scatter_combine,
    "scatter-max": _scatter_combine,
    "scatter_max": _scatter_combine,
}

# Reductions and scans: FLOPs per element of the (first) input.
for _name in (
    "reduce_sum",
    "reduce_max",
    "reduce_min",
    "reduce_prod",
    "reduce_and",
    "reduce_or",
    "reduce_xor",
    "argmax",
    "argmin",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
):
    FORMULAS[_name] = reduction(1)
FORMULAS["cumlogsumexp"] = reduction(3)  # exp, add, log

# Elementwise: FLOPs per output element.
_ELEMENTWISE: dict[float, tuple[str, ...]] = {
    1: (
        "add",
        "add_any",
        "sub",
        "mul",
        "div",
        "rem",
        "pow",
        "integer_pow",
        "max",
        "min",
        "neg",
        "abs",
        "sign",
        "floor",
        "ceil",
        "round",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log1p",
        "sqrt",
        "rsqrt",
        "cbrt",
        "square",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
        "igamma",
        "igammac",
        "polygamma",
        "zeta",
        "bessel_i0e",
        "bessel_i1e",
        "regularized_incomplete_beta",
        "nextafter",
        "clamp",
        "is_finite",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "not",
        "and",
        "or",
        "xor",
        "shift_left",
        "shift_right_logical",
        "shift_right_arithmetic",
        "population_count",
        "clz",
        "conj",
    ),
    4: ("logistic",),  # 1 / (1 + exp(-x))
}
for _per, _names in _ELEMENTWISE.items():
    for _name in _names:
        FORMULAS[_name] = elementwise(_per)

# Ops that view, move, select, convert or create data (random bits included): zero arithmetic.
for _name in (
    "reshape",
    "broadcast_in_dim",
    "transpose",
    "squeeze",
    "expand_dims",
    "slice",
    "dynamic_slice",
    "dynamic_update_slice",
    "concatenate",
    "stack",
    "split",
    "pad",
    "rev",
    "gather",
    "scatter",
    "select_n",
    "iota",
    "convert_element_type",
    "bitcast_convert_type",
    "reduce_precision",
    "copy",
    "copy_p",
    "device_put",
    "stop_gradient",
    "optimization_barrier",
    "sharding_constraint",
    "sort",
    "top_k",
    "random_bits",
    "random_seed",
    "random_wrap",
    "random_unwrap",
    "random_fold_in",
    "random_split",
    "threefry2x32",
    "rng_bit_generator",
    "rng_uniform",
    "real",
    "imag",
    "complex",
):
    FORMULAS[_name] = zero
