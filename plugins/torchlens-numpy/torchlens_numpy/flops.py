"""FLOP formulas for the NumPy functions this plugin records, built on the formula builders of torchlens.backend."""

from __future__ import annotations

from torchlens.backend import (
    Count,
    Formula,
    OpCall,
    contraction,
    einsum_count,
    elementwise,
    matmul_macs,
    reduction,
    zero,
)


def _matmul(call: OpCall) -> Count:
    a, b = call.inputs[:2]
    return contraction(matmul_macs(a.shape, b.shape))


def _einsum(call: OpCall) -> Count:
    return einsum_count(call.arg(0), [a.shape for a in call.inputs])


def _convolve(call: OpCall) -> Count:  # 1-D: every output element is a dot product over the shorter input
    a, v = call.inputs[:2]
    return contraction(call.out_numel * min(a.numel, v.numel))


FORMULAS: dict[str, Formula] = {"matmul": _matmul, "dot": _matmul, "einsum": _einsum, "convolve": _convolve}
for _name in (
    "add subtract multiply divide true_divide power negative absolute maximum minimum exp log sqrt square "
    "tanh sin cos less greater equal less_equal greater_equal not_equal clip"
).split():
    FORMULAS[_name] = elementwise(1)
for _name, _per in (("sum", 1), ("mean", 1), ("max", 1), ("min", 1), ("prod", 1), ("var", 3), ("std", 3)):
    FORMULAS[_name] = reduction(_per)
for _name in (
    "getitem setitem transpose reshape concatenate stack vstack hstack split copy where "
    "sliding_window_view rand randn zeros ones sort array"
).split():
    FORMULAS[_name] = zero
