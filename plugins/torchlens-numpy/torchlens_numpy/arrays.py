"""Array adapters: what the core may ask of a NumPy value (an ndarray, or a NumPy scalar)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not isinstance(value, (np.ndarray, np.generic)):
        return None
    return tuple(np.shape(value)), value.dtype.name, "cpu"


def to_numpy(value: Any) -> np.ndarray:
    return np.array(value, copy=True)


def array_error(actual: Any, expected: Any) -> float:
    """max |a - e| / (1 + |e|); inf for a shape or dtype mismatch or NaNs in other places."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape or a.dtype != e.dtype:
        return math.inf
    if a.dtype.kind not in "fc":  # ints, bools, strings...: equal or not
        return 0.0 if np.array_equal(a, e) else math.inf
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    a, e = a.astype(wide), e.astype(wide)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        return math.inf
    if a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        same = (a == e) | nan_a  # equal infinities and NaNs in the same places count as equal
        diff = np.where(same, 0.0, np.abs(a - e) / (1 + np.abs(e)))
    return float(diff.max())
