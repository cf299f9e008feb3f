"""Array adapters: what the core may ask of a NumPy value (an ndarray, or a NumPy scalar).

``ARRAY_OPS`` is what intervention helpers use on this backend (``torchlens_array_ops``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from torchlens.backend import NumpyArrayOps, numpy_error
from torchlens_numpy.capture import plain_leaf


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
    return numpy_error(a, e)


# The core's NumPy ArrayOps, reading a Tracked array (a helper closing over one, or a steering vector that
# escaped a capture) as the plain array it stands for: the answer is a plain value and no op is recorded,
# whichever capture or thread the helper runs in. A NumPy scalar stays a scalar (x.sum() edited is an np.float64).
ARRAY_OPS = NumpyArrayOps(plain=plain_leaf)
