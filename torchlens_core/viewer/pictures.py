"""Small pictures of saved values, worked out from NumPy at export time (every backend, loaded traces too).

A picture is plain data the page draws on a canvas when an op is clicked: a
histogram (bin edges and counts over the finite values) and, for a value of two
or more dimensions, heatmaps of its last two axes, one per index of the axes in
front (a row of a batch, a channel of NCHW...), up to ``MAX_SLICES`` of them,
each averaged down to at most ``HEATMAP_SIDE`` pixels a side and quantized to a
byte between the slice's own minimum and maximum.

A trace's pictures are worked out together (:func:`pictures`): its small
values, most ops of a large model, are stacked by shape and dtype and pictured
by one NumPy call per step for the whole stack, the same numbers as
:func:`picture` gives each one (NumPy's per-call cost, not the counting, is
what a small value's picture spends).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from typing import Any

from torchlens_core.backend.arrays import array_info_of
from torchlens_core.backend.manager import hook
from torchlens_core.ir import tree

HISTOGRAM_BINS = 32
HEATMAP_SIDE = 32
MAX_SLICES = 8
# Values of up to this many elements are pictured stacked with the others of their shape and dtype; a larger
# one on its own (its own counting outweighs NumPy's per-call cost). Small values are stacked from windows of
# consecutive ops of about STACK_ELEMENTS elements (16 MB as float64).
STACK_MAX_SIZE = 4096
STACK_ELEMENTS = 1 << 21


def as_array(value: Any, backend: str) -> Any:
    """``value`` as a NumPy array, or None when it is not an array this backend (or NumPy) knows."""
    return converter(backend)(value)


def converter(backend: str) -> Callable[[Any], Any]:
    """:func:`as_array` for one backend as a one-argument function, for the many values of a trace.

    Each hook call walks every plugin through pluggy, twice a value (is it an array, its NumPy copy): most of
    a small value's cost. As :func:`torchlens_core.backend.arrays.array_info_of` does, the function calls the
    backend's own ``to_numpy`` directly when it is the only plugin that can answer (built-in-style backends of
    other names answer for their own only), else the hook.
    """
    import numpy as np

    from torchlens_core.backend.base import Backend

    info = array_info_of(backend)
    caller = hook().torchlens_to_numpy
    direct = None
    impls = caller.get_hookimpls()
    if not any(getattr(impl, "hookwrapper", False) or getattr(impl, "wrapper", False) for impl in impls):
        own = [
            impl.plugin
            for impl in impls
            if isinstance(impl.plugin, Backend) and type(impl.plugin).torchlens_to_numpy is Backend.torchlens_to_numpy
        ]
        if len(own) == len(impls):  # no plugin but backends answering for their own name
            mine = [plugin for plugin in own if plugin.name == backend]
            if len(mine) <= 1:
                direct = mine[0].to_numpy if mine else (lambda value: None)
    to_numpy = direct or (lambda value: caller(backend=backend, value=value))

    def convert(value: Any) -> Any:
        if isinstance(value, (np.ndarray, np.generic)):
            return np.asarray(value)
        if info(value) is None:
            return None
        found = to_numpy(value)
        return None if found is None else np.asarray(found)

    return convert


def first_array(value: Any, backend: str, convert: Callable[[Any], Any] | None = None) -> tuple[Any, Any]:
    """(path, NumPy array) of the first array leaf of an op's output; (None, None) when it has none.

    An op with several outputs (``split``, an LSTM) is pictured by its first one; the panel says which.
    ``convert`` is :func:`converter`'s function for ``backend`` (made here when not given).
    """
    convert = convert or converter(backend)
    if _is_leaf(value):  # most ops: one array, no walk
        array = convert(value)
        return ((), array) if array is not None else (None, None)
    for path, leaf in tree.leaves(value, _is_leaf):
        array = convert(leaf)
        if array is not None:
            return path, array
    return None, None


def _is_leaf(value: Any) -> bool:
    return value is not None and hasattr(value, "shape")


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
        out["stats"] = {
            "min": float(finite.min()),
            "max": float(finite.max()),
            "mean": float(finite.mean()),
            "std": float(finite.std()),
        }
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
        scaled = (
            np.zeros(small.shape)
            if hi == lo
            else (np.nan_to_num(small, nan=lo, posinf=hi, neginf=lo) - lo) / (hi - lo) * 255
        )
        pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
        slices.append({"lo": lo, "hi": hi, "data": base64.b64encode(pixels.tobytes()).decode("ascii")})
    return {
        "rows": int(small.shape[0]),
        "cols": int(small.shape[1]),
        "of_rows": int(rows),
        "of_cols": int(cols),
        "lead_shape": list(values.shape[:-2]),
        "count": int(stack.shape[0]),
        "slices": slices,
    }


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


def pictures(found: Iterable[tuple[Any, Any, Any]], heatmap_budget: int) -> dict[Any, dict[str, Any]]:
    """Pictures of many values: ``(key, path, array)`` in order in, ``{key: picture}`` out (keys with no picture
    left out), each as :func:`picture` gives it plus ``"path"`` (the leaf's path, when not empty).

    Heatmaps are made, in order, while the heatmap bytes so far are under ``heatmap_budget`` (histograms go
    on). Small values are pictured a stack at a time (:class:`_Stacked`): the same numbers, one NumPy call per
    step for a whole stack rather than per value. ``found`` is read as it goes: at most STACK_ELEMENTS
    elements of small values, or one large value, are held at once.
    """
    out: dict[Any, dict[str, Any]] = {}
    spent, window, held = 0, [], 0
    for key, path, array in found:
        if array.dtype.kind in "biuf" and 0 < array.size <= STACK_MAX_SIZE:
            window.append((key, path, array))
            held += array.size
            if held >= STACK_ELEMENTS:
                spent, window, held = _pictured(window, out, spent, heatmap_budget), [], 0
        else:
            spent, window, held = _pictured(window, out, spent, heatmap_budget), [], 0
            spent = _kept(out, key, path, picture(array, spent < heatmap_budget), spent)
    _pictured(window, out, spent, heatmap_budget)
    return out


def _pictured(window: list[tuple[Any, Any, Any]], out: dict[Any, dict[str, Any]], spent: int, budget: int) -> int:
    """Picture small values, stacked by shape and dtype, into ``out`` in order; returns the heatmap bytes spent."""
    import numpy as np

    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (_, _, array) in enumerate(window):
        groups.setdefault((array.shape, array.dtype.str), []).append(i)
    rows: dict[int, _Row] = {}
    for members in groups.values():
        stack = _Stacked(np.stack([window[i][2] for i in members]))
        for row, i in enumerate(members):
            if stack.ok[row]:
                rows[i] = _Row(stack, row)
    for i, (key, path, array) in enumerate(window):
        row = rows.get(i)
        made = row.picture(spent < budget) if row is not None else picture(array, spent < budget)
        spent = _kept(out, key, path, made, spent)
    return spent


def _kept(out: dict[Any, dict[str, Any]], key: Any, path: Any, made: dict[str, Any] | None, spent: int) -> int:
    if made is not None:
        if path:
            made["path"] = list(map(str, path))
        spent += sum(len(s["data"]) for s in made.get("heatmaps", {}).get("slices", []))
        out[key] = made
    return spent


class _Stacked:
    """Values of one shape and dtype stacked, pictured together: the histogram and statistics of every row at
    once, and the heatmaps of the stack when the first row needs them.

    Each step is :func:`picture`'s for one value, by the same NumPy operations along the stack's rows (a
    reduction along a contiguous row adds in the order one over the row alone does), so every number is the
    same. A row that takes a path :func:`picture` handles apart (a non-finite value, a spread too narrow for
    the bins, a denormal bin width) is not ``ok`` and is pictured on its own.
    """

    __slots__ = ("values", "shape", "ok", "hist", "stats", "maps")

    def __init__(self, stack: Any) -> None:
        import numpy as np

        self.shape = stack.shape[1:]
        self.values = flat = stack.astype(np.float64).reshape(len(stack), -1)
        bins = HISTOGRAM_BINS
        ok = np.isfinite(flat).all(axis=1)
        lo, hi = flat.min(axis=1), flat.max(axis=1)
        mean, std = flat.mean(axis=1), flat.std(axis=1)
        # histogram(): equal lo and hi widened by a half, edges as np.linspace(lo, hi, bins + 1) makes them.
        same = lo == hi
        left, right = np.where(same, lo - 0.5, lo), np.where(same, hi + 0.5, hi)
        with np.errstate(invalid="ignore", over="ignore"):
            step = (right - left) / bins
            edges = np.arange(bins + 1, dtype=np.float64)[None, :] * step[:, None] + left[:, None]
            edges[:, -1] = right
            ok &= (step != 0) & (edges[:, :-1] < edges[:, 1:]).all(axis=1)
            ok &= np.isfinite(step)
            good = np.flatnonzero(ok)
            flat_ok, left_ok, right_ok, edges_ok = flat[good], left[good], right[good], edges[good]
            indices = ((flat_ok - left_ok[:, None]) / (right_ok - left_ok)[:, None] * bins).astype(np.intp)
        indices[indices == bins] -= 1
        indices[flat_ok < np.take_along_axis(edges_ok, indices, axis=1)] -= 1
        indices[(flat_ok >= np.take_along_axis(edges_ok, indices + 1, axis=1)) & (indices != bins - 1)] += 1
        indices += (np.arange(len(good)) * bins)[:, None]
        counts = np.bincount(indices.ravel(), minlength=len(good) * bins).reshape(len(good), bins)
        self.ok = ok.tolist()
        self.hist: dict[int, tuple[list[int], float, float]] = {
            int(r): (c, e0, e1)
            for r, c, e0, e1 in zip(good.tolist(), counts.tolist(), edges_ok[:, 0].tolist(), edges_ok[:, -1].tolist())
        }
        self.stats = list(zip(lo.tolist(), hi.tolist(), mean.tolist(), std.tolist()))
        self.maps: list[Any] | None = None

    def heatmaps(self, row: int) -> dict[str, Any]:
        if self.maps is None:
            self.maps = self._heatmaps()
        if self.maps[row] is None:  # blocks to average (a side over HEATMAP_SIDE): on its own, as picture() does
            return _heatmaps(self.values[row].reshape(self.shape))
        return self.maps[row]

    def _heatmaps(self) -> list[Any]:
        """_heatmaps() of every row at once when no side needs shrinking (else a list of None)."""
        import numpy as np

        rows, cols = self.shape[-2:]
        if rows > HEATMAP_SIDE or cols > HEATMAP_SIDE:
            return [None] * len(self.values)
        count = len(self.values[0]) // (rows * cols)
        images = self.values.reshape(len(self.values), count, rows, cols)[:, :MAX_SLICES]
        lo, hi = images.min(axis=(2, 3)), images.max(axis=(2, 3))  # every value finite: rows not ok are apart
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # rows not ok: unused here
            scaled = (images - lo[:, :, None, None]) / (hi - lo)[:, :, None, None] * 255
            scaled[lo == hi] = 0
            pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
        slices = len(images[0])
        found = []
        for r, (los, his) in enumerate(zip(lo.tolist(), hi.tolist())):
            data = [base64.b64encode(pixels[r, j].tobytes()).decode("ascii") for j in range(slices)]
            found.append(
                {
                    "rows": rows,
                    "cols": cols,
                    "of_rows": rows,
                    "of_cols": cols,
                    "lead_shape": list(self.shape[:-2]),
                    "count": count,
                    "slices": [{"lo": a, "hi": b, "data": d} for a, b, d in zip(los, his, data)],
                }
            )
        return found


class _Row:
    """One value of a stack."""

    __slots__ = ("stack", "row")

    def __init__(self, stack: _Stacked, row: int) -> None:
        self.stack, self.row = stack, row

    def picture(self, with_heatmap: bool) -> dict[str, Any]:
        counts, lo, hi = self.stack.hist[self.row]
        low, high, mean, std = self.stack.stats[self.row]
        out: dict[str, Any] = {
            "nonfinite": 0,
            "hist": {"counts": counts, "lo": lo, "hi": hi},
            "stats": {"min": low, "max": high, "mean": mean, "std": std},
        }
        if with_heatmap and len(self.stack.shape) >= 2:
            out["heatmaps"] = self.stack.heatmaps(self.row)
        return out
