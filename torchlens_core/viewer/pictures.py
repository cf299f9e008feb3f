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
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torchlens_core.backend.arrays import array_info_of
from torchlens_core.backend.base import direct
from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree

HISTOGRAM_BINS = 32
HEATMAP_SIDE = 32
MAX_SLICES = 8
# Values of up to this many elements are pictured stacked with the others of their shape and dtype; a larger
# one on its own (its own counting outweighs NumPy's per-call cost). Small values are stacked from windows of
# consecutive ops of about STACK_ELEMENTS elements (16 MB as float64).
STACK_MAX_SIZE = 4096
STACK_ELEMENTS = 1 << 21


def numpy_leaves(found: Iterable[tuple[Any, Any]], backend: str) -> Iterator[tuple[Any, Any, Any]]:
    """``(key, path, NumPy array)`` of the first array leaf of each ``(key, value)``, in order; a value with no
    array leaf (or one its backend does not convert) is left out.

    An op with several outputs (``split``, an LSTM) is pictured by its first one; the panel says which. Small
    values (up to STACK_MAX_SIZE elements) of one shape, dtype and device are converted together, a window of
    about STACK_ELEMENTS elements at a time, by the backend's ``to_numpy_stacked`` where it has one (one call,
    not one per value: most of what a small value's conversion costs); any other value on its own, when its
    turn comes (a large value is never held beside others).
    """
    import numpy as np

    handle = backend_named(backend, missing_ok=True)
    info, to_numpy, to_stacked = array_info_of(backend), direct(handle.to_numpy), direct(handle.to_numpy_stacked)
    window: list[tuple[Any, Any, Any]] = []
    groups: dict[Any, list[int]] = {}  # (shape, dtype, device) -> positions in the window
    held = 0
    for key, value in found:
        path, leaf, described = _first_leaf(value, info)
        if leaf is None:
            continue
        size = _size(described[0]) if described is not None else None
        if size is None or not 0 < size <= STACK_MAX_SIZE:  # NumPy already, or large: on its own, in turn
            yield from _converted(window, groups, to_numpy, to_stacked)
            window, groups, held = [], {}, 0
            array = leaf if described is None else to_numpy(leaf)
            if array is not None:
                yield key, path, np.asarray(array)
            continue
        groups.setdefault(described, []).append(len(window))
        window.append((key, path, leaf))
        held += size
        if held >= STACK_ELEMENTS:
            yield from _converted(window, groups, to_numpy, to_stacked)
            window, groups, held = [], {}, 0
    yield from _converted(window, groups, to_numpy, to_stacked)


def _first_leaf(value: Any, info: Callable[[Any], Any]) -> tuple[Any, Any, Any]:
    """(path, leaf, the backend's array_info of it: None for a NumPy array) of the first array leaf."""
    import numpy as np

    leaves: Iterable[tuple[Any, Any]] = [((), value)] if _is_leaf(value) else tree.leaves(value, _is_leaf)
    for path, leaf in leaves:  # most ops: one array, no walk
        if isinstance(leaf, (np.ndarray, np.generic)):
            return path, leaf, None
        described = info(leaf)
        if described is not None:
            return path, leaf, described
    return None, None, None


def _size(shape: Any) -> int | None:
    try:
        return math.prod(shape)
    except TypeError:  # a dimension that is not a number
        return None


def _converted(
    window: list[tuple[Any, Any, Any]], groups: dict[Any, list[int]], to_numpy: Any, to_stacked: Any
) -> Iterator[tuple[Any, Any, Any]]:
    """The window's values as NumPy arrays, in order: each group of more than one in one stacked conversion
    where the backend has one (and it gave the shape asked for), any other one by one."""
    import numpy as np

    rows: dict[int, Any] = {}
    for (shape, _, _), members in groups.items():
        if len(members) < 2:
            continue
        stack = to_stacked([window[i][2] for i in members])
        if stack is None or tuple(np.shape(stack)) != (len(members), *shape):
            continue  # not stacked: converted one by one
        stack = np.asarray(stack)
        for row, i in enumerate(members):
            rows[i] = stack[row]
    for i, (key, path, leaf) in enumerate(window):
        array = rows.get(i)
        if array is None:
            array = to_numpy(leaf)
            if array is None:
                continue
        yield key, path, np.asarray(array)


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
    return {key: _dict(made) for key, made in pictured(found, heatmap_budget).items()}


def pictured(found: Iterable[tuple[Any, Any, Any]], heatmap_budget: int) -> dict[Any, Any]:
    """:func:`pictures`, a stacked value's picture left as its row of the stack (a :class:`_Row`):
    :func:`picture_block` reads the numbers of a block's rows from their stacks' arrays, no dict per value."""
    out: dict[Any, Any] = {}
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


def _pictured(window: list[tuple[Any, Any, Any]], out: dict[Any, Any], spent: int, budget: int) -> int:
    """Picture small values, stacked by shape and dtype, into ``out`` in order; returns the heatmap bytes spent."""
    import numpy as np

    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (_, _, array) in enumerate(window):
        groups.setdefault((array.shape, array.dtype.str), []).append(i)
    rows: dict[int, tuple[_Stacked, int]] = {}
    for members in groups.values():
        stack = _Stacked(np.stack([window[i][2] for i in members]))
        for row, i in enumerate(members):
            if stack.ok[row]:
                rows[i] = (stack, row)
    for i, (key, path, array) in enumerate(window):
        found = rows.get(i)
        if found is None:
            spent = _kept(out, key, path, picture(array, spent < budget), spent)
            continue
        stack, row = found
        heat = spent < budget and stack.heat_bytes > 0
        if heat:
            spent += stack.heat_bytes
        out[key] = _Row(stack, row, heat, list(map(str, path)) if path else None)
    return spent


def _kept(out: dict[Any, Any], key: Any, path: Any, made: dict[str, Any] | None, spent: int) -> int:
    if made is not None:
        if path:
            made["path"] = list(map(str, path))
        spent += sum(len(s["data"]) for s in made.get("heatmaps", {}).get("slices", []))
        out[key] = made
    return spent


def _b64_length(size: int) -> int:
    return 4 * -(-size // 3)


class _Stacked:
    """Values of one shape and dtype stacked, pictured together: the histogram and statistics of every row at
    once, and the heatmaps of the stack when the first row needs them.

    Each step is :func:`picture`'s for one value, by the same NumPy operations along the stack's rows (a
    reduction along a contiguous row adds in the order one over the row alone does), so every number is the
    same. A row that takes a path :func:`picture` handles apart (a non-finite value, a spread too narrow for
    the bins, a denormal bin width) is not ``ok`` and is pictured on its own. The numbers stay in arrays
    (``counts``, ``numbers``: lo, hi, min, max, mean, std; ``at``: a row's place in them, -1 when not ok).
    """

    __slots__ = ("values", "shape", "ok", "at", "counts", "numbers", "heat_bytes", "head", "maps")

    def __init__(self, stack: Any) -> None:
        import numpy as np

        self.shape = stack.shape[1:]
        self.values = flat = stack.astype(np.float64).reshape(len(stack), -1)
        bins = HISTOGRAM_BINS
        ok = np.isfinite(flat).all(axis=1)
        lo, hi = flat.min(axis=1), flat.max(axis=1)
        with np.errstate(invalid="ignore", over="ignore"):  # rows with inf or NaN: not ok, pictured apart
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
        self.counts = np.bincount(indices.ravel(), minlength=len(good) * bins).reshape(len(good), bins)
        self.numbers = np.stack([edges_ok[:, 0], edges_ok[:, -1], lo[good], hi[good], mean[good], std[good]], axis=1)
        self.ok = ok.tolist()
        self.at = np.full(len(stack), -1)
        self.at[good] = np.arange(len(good))
        self.maps: list[Any] | None = None
        # The heatmaps' header (rows, cols, of_rows, of_cols, count, lead_shape, slices) and base64 bytes, which
        # depend on the shape only: _heatmaps() shrinks each side to at most HEATMAP_SIDE.
        self.head: list[Any] | None = None
        self.heat_bytes = 0
        if len(self.shape) >= 2:
            rows, cols = self.shape[-2:]
            small = [-(-n // -(-n // HEATMAP_SIDE)) for n in (rows, cols)]
            count = int(np.prod(self.shape[:-2], dtype=np.int64))
            slices = min(count, MAX_SLICES)
            self.head = [*small, int(rows), int(cols), count, list(self.shape[:-2]), slices]
            self.heat_bytes = slices * _b64_length(small[0] * small[1])

    @property
    def shrinks(self) -> bool:
        """Whether the heatmaps average blocks (a side over HEATMAP_SIDE): made one value at a time then."""
        return self.head is not None and (self.head[0] < self.head[2] or self.head[1] < self.head[3])

    def pixels(self) -> tuple[Any, Any]:
        """(the heatmaps' ends, rows x slices x 2; their pixels, rows x slices x rows x cols, uint8) of every
        row at once, worked out when first asked (rows not ok hold garbage, unused)."""
        import numpy as np

        if self.maps is None:
            rows, cols = self.shape[-2:]
            count = len(self.values[0]) // (rows * cols)
            images = self.values.reshape(len(self.values), count, rows, cols)[:, :MAX_SLICES]
            lo, hi = images.min(axis=(2, 3)), images.max(axis=(2, 3))  # every value finite: rows not ok are apart
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # rows not ok: unused here
                scaled = (images - lo[:, :, None, None]) / (hi - lo)[:, :, None, None] * 255
                scaled[lo == hi] = 0
                pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
            self.maps = [np.stack([lo, hi], axis=2), pixels]
        return self.maps[0], self.maps[1]

    def heatmaps(self, row: int) -> dict[str, Any]:
        """_heatmaps() of one row, as :func:`picture` gives it."""
        if self.shrinks:
            return _heatmaps(self.values[row].reshape(self.shape))
        ends, pixels = self.pixels()
        rows, cols, of_rows, of_cols, count, lead, slices = self.head  # type: ignore[misc]
        return {
            "rows": rows,
            "cols": cols,
            "of_rows": of_rows,
            "of_cols": of_cols,
            "lead_shape": list(lead),
            "count": count,
            "slices": [
                {"lo": lo, "hi": hi, "data": base64.b64encode(pixels[row, j].tobytes()).decode("ascii")}
                for j, (lo, hi) in enumerate(ends[row].tolist())
            ],
        }


class _Row:
    """One value of a stack: its row, whether its picture has heatmaps, the leaf's path (None: the output)."""

    __slots__ = ("stack", "row", "heat", "path")

    def __init__(self, stack: _Stacked, row: int, heat: bool, path: list[str] | None) -> None:
        self.stack, self.row, self.heat, self.path = stack, row, heat, path

    def picture(self) -> dict[str, Any]:
        at = self.stack.at[self.row]
        lo, hi, low, high, mean, std = self.stack.numbers[at].tolist()
        out: dict[str, Any] = {
            "nonfinite": 0,
            "hist": {"counts": self.stack.counts[at].tolist(), "lo": lo, "hi": hi},
            "stats": {"min": low, "max": high, "mean": mean, "std": std},
        }
        if self.heat:
            out["heatmaps"] = self.stack.heatmaps(self.row)
        if self.path:
            out["path"] = self.path
        return out


def picture_block(found: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """The pictures of ops ``start`` to ``stop - 1`` (``found`` as :func:`pictured` gives it, by op index as a
    string) as one block of columns, which the page's ``pictureOf()`` reads back as :func:`picture`'s dicts,
    only for the op shown.

    A picture of the usual form (HISTOGRAM_BINS counts, finite numbers) is a row: ``at`` (the op's position
    in the block) and ``nonfinite``; its counts in ``counts`` (``bits`` wide) and its histogram's ends and
    statistics (lo, hi, min, max, mean, std) in ``numbers``, little-endian arrays in base64. Rows with
    heatmaps are listed in ``heat`` as (row, position of its header in ``heads``: rows, cols, of_rows,
    of_cols, count, lead_shape, slices); their slices' ends are in ``ranges`` (float64) and pixels in
    ``pixels`` (bytes), in order. Leaf paths are in ``paths`` by row. Any other picture (no finite value, one
    bin, a number out of range) is in ``other`` by position, as :func:`picture` made it. Base64 and short
    lists of integers are many times faster to write (and to read) than every picture's floats and dicts.
    """
    import numpy as np

    at: list[int] = []
    nonfinite: list[int] = []
    stacked: dict[int, tuple[_Stacked, list[int], list[int]]] = {}  # id -> (stack, its rows, their block rows)
    made_rows: list[int] = []  # block rows of pictures made as dicts
    made: list[dict[str, Any]] = []
    heat: list[list[int]] = []
    heads: dict[str, int] = {}
    head_list: list[list[Any]] = []
    sources: dict[int, Any] = {}  # id -> (stack, its rows, their heatmaps, [its header's position])
    made_maps: list[tuple[int, dict[str, Any]]] = []  # (heatmap, heatmaps dict) of pictures made as dicts
    paths: dict[int, list[str]] = {}
    other: dict[int, dict[str, Any]] = {}
    get = found.get
    for index in range(start, stop):
        entry = get(str(index))
        if entry is None:
            continue
        if isinstance(entry, _Row) and entry.heat and entry.stack.shrinks:
            entry = entry.picture()
        if isinstance(entry, _Row):
            row = len(at)
            at.append(index - start)
            nonfinite.append(0)
            group = stacked.get(id(entry.stack))
            if group is None:
                group = stacked[id(entry.stack)] = (entry.stack, [], [])
            group[1].append(entry.row)
            group[2].append(row)
            if entry.heat:
                source = sources.get(id(entry.stack))
                if source is None:
                    begun: tuple[_Stacked, list[int], list[int], list[int]] = (entry.stack, [], [], [])
                    source = sources[id(entry.stack)] = begun
                    source[3].append(_head(heads, head_list, entry.stack.head))  # one header a stack
                source[1].append(entry.row)
                source[2].append(len(heat))
                heat.append([row, source[3][0]])
            if entry.path:
                paths[row] = entry.path
            continue
        hist, stats = entry.get("hist"), entry.get("stats")
        if (
            hist is None
            or stats is None
            or len(hist["counts"]) != HISTOGRAM_BINS
            or not all(map(np.isfinite, (hist["lo"], hist["hi"], *stats.values())))
        ):
            other[index - start] = entry
            continue
        row = len(at)
        at.append(index - start)
        nonfinite.append(entry["nonfinite"])
        made_rows.append(row)
        made.append(entry)
        maps = entry.get("heatmaps")
        if maps is not None:
            head = [maps[k] for k in ("rows", "cols", "of_rows", "of_cols", "count", "lead_shape")]
            made_maps.append((len(heat), maps))
            heat.append([row, _head(heads, head_list, [*head, len(maps["slices"])])])
        if "path" in entry:
            paths[row] = entry["path"]
    counts = np.zeros((len(at), HISTOGRAM_BINS), dtype=np.int64)
    numbers = np.zeros((len(at), 6), dtype=np.float64)
    for stack, rows, places in stacked.values():
        where = stack.at[rows]
        counts[places] = stack.counts[where]
        numbers[places] = stack.numbers[where]
    for row, entry in zip(made_rows, made):
        hist, stats = entry["hist"], entry["stats"]
        counts[row] = hist["counts"]
        numbers[row] = (hist["lo"], hist["hi"], stats["min"], stats["max"], stats["mean"], stats["std"])
    ranges, pixels = _heat_columns(heat, head_list, sources, made_maps)
    top = int(counts.max()) if counts.size else 0
    if top >= 1 << 32:  # four billion values in one bin: every picture as a dict
        entries = ((i - start, found.get(str(i))) for i in range(start, stop))
        return {"at": [], "other": {at: _dict(entry) for at, entry in entries if entry is not None}}
    width = 8 if top < 1 << 8 else 16 if top < 1 << 16 else 32
    return {
        "at": at,
        "nonfinite": nonfinite,
        "bits": width,
        "counts": _b64(counts.astype(f"<u{width // 8}")),
        "numbers": _b64(numbers.astype("<f8")),
        "heat": heat,
        "heads": head_list,
        "ranges": _b64(ranges.astype("<f8")),
        "pixels": _b64(pixels),
        "paths": paths,
        "other": other,
    }


def _head(heads: dict[str, int], head_list: list[list[Any]], head: Any) -> int:
    """The position of a heatmap header in the block's list of them (most of a block's share one)."""
    key = repr(head)
    found = heads.get(key)
    if found is None:
        found = heads[key] = len(head_list)
        head_list.append(list(head))
    return found


def _heat_columns(
    heat: list[list[int]],
    head_list: list[list[Any]],
    sources: dict[int, Any],
    made_maps: list[tuple[int, dict[str, Any]]],
) -> tuple[Any, Any]:
    """(every slice's lo and hi, every slice's pixels), heatmap after heatmap in ``heat``'s order, copied from
    the stacks' arrays a stack at a time."""
    import numpy as np

    slices = np.array([head_list[h][6] for _, h in heat], dtype=np.int64)
    sizes = slices * np.array([head_list[h][0] * head_list[h][1] for _, h in heat], dtype=np.int64)
    first_slice = np.concatenate([[0], np.cumsum(slices)]).astype(np.int64)
    first_pixel = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ranges = np.zeros(2 * int(first_slice[-1]), dtype=np.float64)
    pixels = np.zeros(int(first_pixel[-1]), dtype=np.uint8)
    for stack, rows, maps, _ in sources.values():
        ends, images = stack.pixels()
        maps_at = np.array(maps, dtype=np.int64)
        span = ends.shape[1] * 2
        ranges[(2 * first_slice[maps_at])[:, None] + np.arange(span)] = ends[rows].reshape(len(rows), span)
        span = images[0].size
        pixels[first_pixel[maps_at][:, None] + np.arange(span)] = images[rows].reshape(len(rows), span)
    for k, maps in made_maps:
        for j, s in enumerate(maps["slices"]):
            ranges[2 * (first_slice[k] + j) : 2 * (first_slice[k] + j) + 2] = (s["lo"], s["hi"])
            data = np.frombuffer(base64.b64decode(s["data"]), dtype=np.uint8)
            at = first_pixel[k] + j * data.size
            pixels[at : at + data.size] = data
    return ranges, pixels


def _dict(entry: Any) -> dict[str, Any]:
    return entry if isinstance(entry, dict) else entry.picture()


def _b64(array: Any) -> str:
    return base64.b64encode(array.tobytes()).decode("ascii")
