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

from torchlens_core.backend.manager import backend_named
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
    elif backend is not None and backend_named(backend, missing_ok=True).array_info(value) is not None:
        array = np.asarray(backend_named(backend, missing_ok=True).to_numpy(value))
    else:
        raise UnsupportedError(f"cannot compare a {type(value).__name__}: it is not an array of the {backend} backend")
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


# dtype -> (mantissa bits, rtol, atol): the precision a value of that dtype holds, and how far apart two values
# may be and still agree. bfloat16 keeps 8 bits of precision, so it agrees far more loosely than float32.
PRECISION = {
    "float64": (52, 1e-9, 1e-12),
    "float32": (23, 1e-4, 1e-6),
    "float16": (10, 2e-3, 1e-4),
    "bfloat16": (7, 2e-2, 1e-3),
}


@attrs.frozen
class Tolerance:
    """Elements agree when ``|a - b| <= atol + rtol * (|b| + rms(b))``: relative, and to ``b``'s own scale near 0."""

    rtol: float
    atol: float


def dtype_name(dtype: Any) -> str | None:
    """``float32`` for ``torch.float32``, ``<dtype: 'float32'>``, ``paddle.float32``...; None when not a float."""
    text = str(dtype).lower()
    for name in ("bfloat16", "float16", "float64", "float32"):
        if name in text:
            return name
    if "half" in text:
        return "float16"
    if "double" in text:
        return "float64"
    return None


def least_precise(*dtypes: Any) -> str | None:
    """The float dtype of ``dtypes`` with the fewest mantissa bits (``PRECISION``'s name); None if none is a float."""
    names = [n for n in map(dtype_name, dtypes) if n is not None]
    return min(names, key=lambda n: PRECISION[n][0]) if names else None


def tolerance_for(*dtypes: Any, rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """The tolerance of the least precise of ``dtypes`` (float32's when none is a float); overrides win."""
    _, default_rtol, default_atol = PRECISION[least_precise(*dtypes) or "float32"]
    return Tolerance(default_rtol if rtol is None else rtol, default_atol if atol is None else atol)


# Attention masks are filled with -inf, the dtype's minimum, -1e9 or BERT's -1e4, by the implementer's taste:
# two fills at one place mean the same thing. A fill is at most -SENTINEL and far below the array's own values.
SENTINEL = 1e4
EXACT = Tolerance(0.0, 0.0)  # integer and boolean values: positions, indices, masks agree exactly or not at all


def mask_fills(x: Any) -> Any:
    """Where ``x`` (float64) holds a mask fill: at most -SENTINEL and a thousand times below its typical value."""
    import numpy as np

    low = np.isneginf(x) | (x <= -SENTINEL)
    if not low.any():
        return low
    rest = np.abs(x[~low & np.isfinite(x)])
    typical = float(np.median(rest)) if rest.size else 0.0
    return low & (x <= -max(SENTINEL, 1e3 * typical)) if typical * 1e3 > SENTINEL else low


@attrs.frozen
class Agreement:
    """How ``a`` (put in ``b``'s layout) agrees with ``b``.

    ``max_rel`` is the largest ``|a - b| / |b|`` over elements where ``b`` is
    not 0; ``ulp`` the largest distance in units in the last place of the
    least precise dtype; ``within`` the fraction of elements inside the
    tolerance. ``ok`` is True when every element is.
    """

    max_abs: float
    max_rel: float
    mean_abs: float
    cosine: float | None
    ulp: float
    within: float
    tolerance: Tolerance
    scale: float = 0.0  # the largest magnitude of b's value

    @property
    def ok(self) -> bool:
        return self.within == 1.0

    @property
    def relative(self) -> float:
        """The largest difference over the largest magnitude of ``b``'s value."""
        return self.max_abs / self.scale if self.scale > 0 else (0.0 if self.max_abs == 0 else math.inf)


def agreement(a: Any, b: Any, tolerance: Tolerance, ulp_dtype: str | None = None) -> Agreement:
    """The :class:`Agreement` of two float64 NumPy arrays of one shape."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.size == 0:
        return Agreement(0.0, 0.0, 0.0, None, 0.0, 1.0, tolerance)
    with np.errstate(invalid="ignore"):  # inf - inf: handled below
        diff = np.abs(a - b)
    masked = None
    with np.errstate(invalid="ignore"):
        filled = bool(np.nanmin(a, initial=0.0) <= -SENTINEL or np.nanmin(b, initial=0.0) <= -SENTINEL)
    if filled or not np.isfinite(diff).all():
        # Mask fills agree with each other whatever their value (-inf, the dtype's minimum, -1e9, -1e4); equal
        # infinities and NaN against NaN agree; NaN on one side is worst.
        ma, mb = mask_fills(a), mask_fills(b)
        masked = ma & mb
        agree = masked | (np.isnan(a) & np.isnan(b)) | ((a == b) & np.isinf(a))
        diff = np.where(agree, 0.0, np.where(np.isnan(diff) | (ma != mb), np.inf, diff))
        a, b = np.where(ma, 0.0, a), np.where(mb, 0.0, b)  # fills say nothing of the value's scale
    magnitude = np.abs(b)
    largest = float(np.max(magnitude[np.isfinite(magnitude)], initial=0.0))
    finite = magnitude[np.isfinite(magnitude)] if not np.isfinite(magnitude).all() else magnitude
    # sums, not BLAS dot products: those start a thread pool per call, slow on a busy machine
    scale = float(np.sqrt(np.sum(finite * finite) / finite.size)) if finite.size else 0.0
    inside = diff <= tolerance.atol + tolerance.rtol * (magnitude + scale)
    if masked is not None:
        inside |= masked
    max_abs = float(diff.max())
    if max_abs == 0.0:
        max_rel = ulp = 0.0
    else:
        nonzero = magnitude > 0
        max_rel = float(np.max(diff[nonzero] / magnitude[nonzero])) if nonzero.any() else math.inf
        # the spacing of the least precise dtype at b's magnitude (bfloat16: float32's, 16 bits coarser)
        name = ulp_dtype or "float32"
        spacing = np.spacing(magnitude.astype({"float64": np.float64, "float16": np.float16}.get(name, np.float32)))
        spacing = spacing.astype(np.float64) * (65536.0 if name == "bfloat16" else 1.0)
        ulp = float(np.max(diff / spacing))
    norm_a, norm_b = math.sqrt(float(np.sum(a * a))), math.sqrt(float(np.sum(b * b)))
    cosine = None
    if norm_a > 0 and norm_b > 0 and math.isfinite(norm_a) and math.isfinite(norm_b):
        cosine = float(np.sum(a * b)) / (norm_a * norm_b)
    return Agreement(
        max_abs, max_rel, float(diff.mean()), cosine, ulp, float(np.count_nonzero(inside)) / a.size, tolerance, largest
    )
