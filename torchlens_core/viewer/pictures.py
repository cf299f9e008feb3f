"""Small pictures of saved values, worked out from NumPy at export time (every backend, loaded traces too).

A picture is plain data the page draws on a canvas when an op is clicked: a
histogram (bin edges and counts over the finite values) and, for a value of two
or more dimensions, heatmaps of its last two axes, one per index of the axes in
front (a row of a batch, a channel of NCHW...), up to ``MAX_SLICES`` of them,
each averaged down to at most ``HEATMAP_SIDE`` pixels a side and quantized to a
byte between the slice's own minimum and maximum.
"""

from __future__ import annotations

import base64
from typing import Any

from torchlens_core.backend.manager import hook
from torchlens_core.ir import tree

HISTOGRAM_BINS = 32
HEATMAP_SIDE = 32
MAX_SLICES = 8


def as_array(value: Any, backend: str) -> Any:
    """``value`` as a NumPy array, or None when it is not an array this backend (or NumPy) knows."""
    import numpy as np

    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        return np.asarray(value)
    if hook().torchlens_array_info(backend=backend, value=value) is None:
        return None
    found = hook().torchlens_to_numpy(backend=backend, value=value)
    return None if found is None else np.asarray(found)


def first_array(value: Any, backend: str) -> tuple[Any, Any]:
    """(path, NumPy array) of the first array leaf of an op's output; (None, None) when it has none.

    An op with several outputs (``split``, an LSTM) is pictured by its first one; the panel says which.
    """
    for path, leaf in tree.leaves(value, lambda v: v is not None and hasattr(v, "shape")):
        array = as_array(leaf, backend)
        if array is not None:
            return path, array
    return None, None


def picture(array: Any, with_heatmap: bool = True) -> dict[str, Any] | None:
    """The histogram and heatmaps of one array, or None for one with no numbers to picture."""
    import numpy as np

    if array.dtype.kind == "c":
        array = np.abs(array)  # the magnitude of a complex value
    if array.dtype.kind not in "biuf" or array.size == 0:
        return None
    values = array.astype(np.float64)
    finite = values[np.isfinite(values)]
    out: dict[str, Any] = {"nonfinite": int(values.size - finite.size)}
    if finite.size:
        try:
            counts, edges = histogram(finite)
        except ValueError:  # a spread too narrow for 32 bins at this magnitude (1.0 and the next float): one bin
            counts, edges = np.array([finite.size]), np.array([finite.min(), finite.max()])
        out["hist"] = {"counts": counts.tolist(), "lo": float(edges[0]), "hi": float(edges[-1])}
        out["stats"] = {"min": float(finite.min()), "max": float(finite.max()),
                        "mean": float(finite.mean()), "std": float(finite.std())}
    if with_heatmap and values.ndim >= 2 and finite.size:
        out["heatmaps"] = _heatmaps(values)
    return out


def histogram(finite: Any) -> tuple[Any, Any]:
    """``np.histogram(finite, bins=HISTOGRAM_BINS)`` of a 1-D float64 array of finite values, the same counts
    and edges by the same steps (numpy's equal-bins path), without its checks and dispatch: those cost more
    than the counting on the small values most ops have (a third of exporting a 50,000-op trace)."""
    import numpy as np

    bins = HISTOGRAM_BINS
    lo, hi = finite.min(), finite.max()
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1, endpoint=True, dtype=np.float64)
    if np.any(edges[:-1] >= edges[1:]):
        raise ValueError(f"Too many bins for data range. Cannot create {bins} finite-sized bins.")
    indices = ((finite - lo) / (hi - lo) * bins).astype(np.intp)
    indices[indices == bins] -= 1
    indices[finite < edges[indices]] -= 1  # the division is within an ulp of an edge: numpy corrects so
    indices[(finite >= edges[indices + 1]) & (indices != bins - 1)] += 1
    return np.bincount(indices, minlength=bins), edges


def _heatmaps(values: Any) -> dict[str, Any]:
    """Heatmaps over the last two axes, for the first MAX_SLICES indices of the flattened axes in front."""
    import numpy as np

    rows, cols = values.shape[-2:]
    stack = values.reshape(-1, rows, cols)
    slices = []
    for image in stack[:MAX_SLICES]:
        small = _shrink(image, HEATMAP_SIDE)
        finite = small[np.isfinite(small)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        scaled = np.zeros(small.shape) if hi == lo else (np.nan_to_num(small, nan=lo, posinf=hi, neginf=lo) - lo) / (
            hi - lo) * 255
        pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
        slices.append({"lo": lo, "hi": hi, "data": base64.b64encode(pixels.tobytes()).decode("ascii")})
    return {"rows": int(small.shape[0]), "cols": int(small.shape[1]), "of_rows": int(rows), "of_cols": int(cols),
            "lead_shape": list(values.shape[:-2]), "count": int(stack.shape[0]), "slices": slices}


def _shrink(image: Any, side: int) -> Any:
    """``image`` averaged over blocks so that neither side exceeds ``side`` (NaN-aware: a block of NaN stays NaN)."""
    import numpy as np

    rows, cols = image.shape
    fr, fc = -(-rows // side), -(-cols // side)  # block sizes, rounded up
    if fr == 1 and fc == 1:
        return image
    padded = np.full((-(-rows // fr) * fr, -(-cols // fc) * fc), np.nan)
    padded[:rows, :cols] = image
    blocks = padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(blocks)
        total = np.where(finite, blocks, 0.0).sum(axis=(1, 3))
        count = finite.sum(axis=(1, 3))
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)
