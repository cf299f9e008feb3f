"""Conformance check of FLOP counts (``op.flops``, ``op.macs``), for every backend.

A rule of plugin contract 3 (see :func:`~torchlens.conformance.support.since_contract`):
a backend's ``torchlens_flop_formulas`` cover its zoo. It reads the case's
trace, captured once for the suite; the reference for a matrix product is
the closed form from the recorded shapes. Collected through
:mod:`torchlens.conformance.checks`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from torchlens.conformance.support import Traced, since_contract
from torchlens_core.compare.classes import op_class
from torchlens_core.views.flops import ArraySpec, matmul_macs, op_call

# An op of these classes (torchlens_core/compare/classes.py) is a contraction, which carries most of a model's FLOPs:
# its count must be known.
CONTRACTIONS = ("matmul", "conv", "attention")
# Ops whose FLOPs no formula knows, as a share of a case's ops: a few a table has not met yet, not a missing table.
UNKNOWN_AT_MOST = 0.05


def _fits_a_product(a: ArraySpec, b: ArraySpec, out: Any) -> bool:
    """Do two operands and the output read as ``a @ b`` (batch dims broadcast, at least two axes each)?"""
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2] or not isinstance(out, tuple):
        return False
    n = max(len(a.shape), len(b.shape)) - 2
    batch = [
        max(x, y)
        for x, y in zip((1,) * (n - len(a.shape) + 2) + a.shape[:-2], (1,) * (n - len(b.shape) + 2) + b.shape[:-2])
    ]
    return out == (*batch, a.shape[-2], b.shape[-1])


@since_contract(3)
def test_flops_are_known(traced: Traced) -> None:
    """At most 5% of the case's ops have unknown FLOPs; every contraction (matmul, convolution, attention) is
    counted, with at least two FLOPs per MAC; a matrix product of two operands has the MACs its shapes give."""
    trace = traced.trace
    ops = [op for op in trace.ops if op.kind == "op"]
    if not ops:
        pytest.skip("the case records no op")
    unknown = Counter(op.func_name for op in ops if op.flops is None)
    assert sum(unknown.values()) <= UNKNOWN_AT_MOST * len(ops), (
        f"{sum(unknown.values())} of {len(ops)} ops have unknown FLOPs (torchlens_flop_formulas): "
        f"{unknown.most_common(8)}"
    )
    for op in ops:
        if op_class(op) not in CONTRACTIONS:
            continue
        assert op.flops is not None, f"{op.label} ({op.func_name}) is a contraction with unknown FLOPs"
        assert op.macs is not None, f"{op.label} ({op.func_name}) is a contraction with FLOPs but unknown MACs"
        assert op.flops >= 2 * op.macs, f"{op.label}: {op.flops} FLOPs for {op.macs} MACs"
        arrays = [a for a in op_call(trace, op).inputs if a is not None]
        if op_class(op) == "matmul" and len(arrays) == 2 and _fits_a_product(arrays[0], arrays[1], op.shape):
            expected = matmul_macs(arrays[0].shape, arrays[1].shape)
            assert op.macs == expected, (
                f"{op.label}: {op.macs} MACs for {arrays[0].shape} @ {arrays[1].shape}, not {expected}"
            )
