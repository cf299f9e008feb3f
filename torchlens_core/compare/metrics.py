"""How far apart two arrays are, the same way for every comparison TorchLens makes.

Values from any backend (or loaded as NumPy) are compared in NumPy, in
float64, so that one number means the same thing for a torch, a JAX and a
Paddle array. Used by ``tl.bundle(...).compare_at`` and by cross-framework
comparison.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from torchlens_core.backend.manager import hook
from torchlens_core.ir.errors import UnsupportedError


@attrs.frozen
class Difference:
    """``actual`` against ``expected``: the largest absolute difference, the relative L2 error, cosine, norms.

    ``rel_l2`` is ``||a - e|| / ||e||`` (inf when ``e`` is all zeros and
    ``a`` is not); ``cosine`` is None when either is all zeros. Arrays of
    different shapes are not compared: ``shape_mismatch`` is then True and
    the numbers are NaN.
    """

    max_abs: float
    rel_l2: float
    cosine: float | None
    norm: float
    expected_norm: float
    shape_mismatch: bool = False

    @property
    def identical(self) -> bool:
        return not self.shape_mismatch and self.max_abs == 0.0


def as_numpy(value: Any, backend: str | None) -> Any:
    """``value`` (an array of ``backend``, or NumPy) as a float64 NumPy array."""
    import numpy as np

    if isinstance(value, np.ndarray) or np.isscalar(value):
        array = np.asarray(value)
    elif backend is not None and hook().torchlens_array_info(backend=backend, value=value) is not None:
        array = np.asarray(hook().torchlens_to_numpy(backend=backend, value=value))
    else:
        raise UnsupportedError(f"cannot compare a {type(value).__name__}: it is not an array of the "
                               f"{backend} backend")
    if array.dtype.kind == "c":
        return array.astype(np.complex128)
    return array.astype(np.float64)


def difference(actual: Any, expected: Any) -> Difference:
    """The :class:`Difference` of two NumPy arrays (see :func:`as_numpy`)."""
    import numpy as np

    a, e = np.asarray(actual), np.asarray(expected)
    norm_a, norm_e = float(np.linalg.norm(a.ravel())), float(np.linalg.norm(e.ravel()))
    if a.shape != e.shape:
        nan = math.nan
        return Difference(nan, nan, None, norm_a, norm_e, shape_mismatch=True)
    if a.size == 0:
        return Difference(0.0, 0.0, None, 0.0, 0.0)
    diff = np.abs(a - e)
    same_inf = np.isinf(a) & (a == e)  # inf - inf is NaN; equal infinities do not differ
    diff = np.where(same_inf | (np.isnan(a) & np.isnan(e)), 0.0, diff)
    max_abs = float(np.max(diff))
    err = float(np.linalg.norm(np.where(same_inf, 0.0, a - e).ravel()))
    rel = err / norm_e if norm_e > 0 else (0.0 if err == 0 else math.inf)
    cosine = None
    if norm_a > 0 and norm_e > 0 and math.isfinite(norm_a) and math.isfinite(norm_e):
        cosine = float(np.real(np.vdot(e.ravel(), a.ravel())) / (norm_a * norm_e))
    return Difference(max_abs, rel, cosine, norm_a, norm_e)
