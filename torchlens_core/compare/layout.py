"""How one side's array is laid out against the other's: NCHW vs NHWC, merged axes, broadcasts, flattens.

Two ports of one model hold the same numbers in different orders and shapes:
PyTorch's activations are channels-first, JAX's and Keras's channels-last; one
port keeps ``[B, S, 3D]`` where the other merged it into ``[B·S, 3D]``; one
computes a position table once (``[1, S, D]``) and lets the add broadcast it
where the other materializes ``[B, S, D]``. A :class:`Layout` relates ``a``'s
value to ``b``'s, so that values are compared element for element and a layout
difference is reported as a layout, not as a divergence:

- ``same``: the shapes are equal and so is the order;
- ``permuted``: ``b`` is ``a`` with its axes permuted (``perm``, as
  ``numpy.transpose`` takes it), found from the shapes and, where several
  permutations fit (a square feature map), from the values;
- ``reshaped``: ``a``'s axes (without those of size 1: ``via_shape``),
  permuted by ``perm``, then merged or split into ``b``'s shape. Only merges
  and splits of whole axes are offered (``[B·H, S]`` against ``[B, H, S]``),
  never a reshape that cuts an axis across another;
- ``carried``: ``a`` is reshaped to the shape an earlier aligned pair had,
  permuted as that pair was, and reshaped to ``b``'s shape (``via`` names the
  pair): the flatten after a permuted layout;
- ``broadcast``: one side holds an axis of size 1 (or lacks a leading axis)
  where the other repeats the same values: compared after broadcasting the
  smaller side, which also checks that the larger one really repeats them.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import attrs

MAX_PERMUTED_RANK = 6  # 720 permutations: more is never a layout change
MAX_RESHAPE_PERMS = 24  # permutations tried before a merge or split: every one of a rank-4 array


@attrs.frozen
class Layout:
    """``pair(a, b)`` puts the two values in one order; ``apply(a)`` puts ``a``'s value in ``b``'s shape."""

    kind: str  # "same" | "permuted" | "reshaped" | "carried" | "broadcast" | "none" (nothing maps one onto the other)
    perm: tuple[int, ...] | None = None
    via_shape: tuple[int, ...] | None = None  # permuted: a's shape; reshaped, carried: what a is reshaped to first
    via: str | None = None  # carried: the aligned pair the layout comes from
    b_shape: tuple[int, ...] | None = None

    def apply(self, a: Any) -> Any:
        if self.kind == "same":
            return a
        if self.kind == "permuted":
            return a.transpose(self.perm)
        if self.kind in ("carried", "reshaped"):
            return a.reshape(self.via_shape).transpose(self.perm).reshape(self.b_shape)
        if self.kind == "broadcast":
            import numpy as np

            assert self.b_shape is not None
            if a.size <= math.prod(self.b_shape):
                return np.broadcast_to(a.reshape(_padded(a.shape, len(self.b_shape))), self.b_shape)
            # a repeats what b holds once: b's value is a's first slice along the repeated axes
            index = tuple(slice(0, 1) if d == 1 else slice(None) for d in _padded(self.b_shape, a.ndim))
            return a[index].reshape(self.b_shape)
        raise ValueError("arrays of different sizes have no layout to apply")

    def pair(self, a: Any, b: Any) -> tuple[Any, Any]:
        """``a`` and ``b`` in one shape, element for element (a broadcast compares in the larger shape)."""
        import numpy as np

        if self.kind == "broadcast" and a.size > b.size:
            return a, np.broadcast_to(b.reshape(_padded(b.shape, a.ndim)), a.shape)
        return self.apply(a), b

    def __str__(self) -> str:
        if self.kind == "permuted":
            return f"axes {self.perm}"
        if self.kind == "carried":
            return f"axes {self.perm} of {self.via_shape}, from {self.via}"
        if self.kind == "reshaped":
            assert self.perm is not None and self.via_shape is not None and self.b_shape is not None
            identity = self.perm == tuple(range(len(self.perm)))
            if len(self.via_shape) < len(self.b_shape) and _squeezed(self.b_shape) == self.via_shape and identity:
                return "unit axes"
            return (
                "reshape" if identity else f"axes {self.perm}, reshape"
            ) + f" {_fmt(self.via_shape)} to {_fmt(self.b_shape)}"
        if self.kind == "broadcast":
            return f"broadcast to {_fmt(self.b_shape)}"
        return self.kind


SAME = Layout("same")
NONE = Layout("none")


def permutations(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every non-identity axis permutation ``p`` with ``b_shape == a_shape[p]``."""
    if len(a_shape) != len(b_shape) or sorted(a_shape) != sorted(b_shape) or len(a_shape) > MAX_PERMUTED_RANK:
        return []
    if len(set(a_shape)) == len(a_shape) and tuple(a_shape) == tuple(b_shape):
        return []  # distinct sizes in the same order: only the identity maps one onto the other
    identity = tuple(range(len(a_shape)))
    return [
        p
        for p in itertools.permutations(identity)
        if p != identity and all(a_shape[k] == b_shape[i] for i, k in enumerate(p))
    ]


def candidates(a_shape: tuple[int, ...], b_shape: tuple[int, ...], carried: list[tuple[Layout, str]]) -> list[Layout]:
    """Layouts that could relate arrays of these shapes, the likeliest first.

    ``carried`` holds the layouts of earlier aligned pairs (nearest first) with
    their names: a permutation one of them used is preferred among several
    that fit, and one that reshapes through them is tried when none fits.
    """
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if math.prod(a_shape) != math.prod(b_shape):
        return [broadcast(a_shape, b_shape)] if broadcasts(a_shape, b_shape) else [NONE]
    # An earlier pair's permutation first (a square feature map fits several, and the identity), then the
    # identity, then the other permutations that fit.
    perms = permutations(a_shape, b_shape)
    seen = [layout.perm for layout, _ in carried if layout.kind == "permuted"]
    perms.sort(key=lambda p: seen.index(p) if p in seen else len(seen))
    found = [permuted(p, a_shape, b_shape) for p in perms if p in seen]
    if a_shape == b_shape:
        found.append(SAME)
    found += [permuted(p, a_shape, b_shape) for p in perms if p not in seen]
    if a_shape != b_shape:
        found += [option for option in _reshapes(a_shape, b_shape, seen) if option not in found]
    for layout, name in carried:
        if layout.kind == "permuted" and math.prod(layout.via_shape or ()) == math.prod(a_shape):
            option = Layout("carried", layout.perm, layout.via_shape, name, b_shape)
            if option not in found and tuple(layout.via_shape or ()) != a_shape:
                found.append(option)
    return found or [NONE]


def _reshapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...], seen: list[Any]) -> list[Layout]:
    """Merges and splits of whole axes, after a permutation (a carried one first, then the identity)."""
    squeezed = _squeezed(a_shape)
    identity = tuple(range(len(squeezed)))
    orders = [identity]
    if len(squeezed) <= 4:
        orders += [p for p in itertools.permutations(identity) if p != identity][:MAX_RESHAPE_PERMS]
    orders.sort(key=lambda p: 0 if p in seen else 1)  # stable: carried, then the identity, then the rest
    found = []
    for p in orders:
        if mergeable(tuple(squeezed[k] for k in p), b_shape):
            found.append(Layout("reshaped", p, squeezed, None, b_shape))
    # Or split first, then permute: a [B, S, H·D] is b's [B, H, S, D] once split into [B, S, H, D] and permuted.
    if len(b_shape) <= 4:
        for p in itertools.permutations(range(len(b_shape))):
            split = [0] * len(b_shape)
            for i, k in enumerate(p):
                split[k] = b_shape[i]
            option = Layout("reshaped", tuple(p), tuple(split), None, b_shape)
            if tuple(split) != a_shape and mergeable(a_shape, tuple(split)) and option not in found:
                found.append(option)
    return found


def mergeable(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether a C-order reshape from ``a_shape`` to ``b_shape`` only merges or splits whole axes.

    True when the two shapes have a common refinement: the running products of
    both, merged and sorted, each divide the next.
    """
    if math.prod(a_shape) != math.prod(b_shape):
        return False
    bounds = sorted(
        set(itertools.accumulate(a_shape, lambda x, y: x * y)) | set(itertools.accumulate(b_shape, lambda x, y: x * y))
    )
    return all(later % earlier == 0 for earlier, later in zip(bounds, bounds[1:]) if earlier)


def broadcasts(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether one shape broadcasts to the other (numpy's rules, one direction only, sizes differing)."""
    if math.prod(a_shape) == math.prod(b_shape) or not a_shape or not b_shape:
        return False
    rank = max(len(a_shape), len(b_shape))
    small, large = (a_shape, b_shape) if math.prod(a_shape) < math.prod(b_shape) else (b_shape, a_shape)
    if len(small) > len(large):  # [1, S, D] against [S, D] is a unit axis, not a broadcast
        return False
    return all(s == g or s == 1 for s, g in zip(_padded(small, rank), _padded(large, rank)))


def broadcast(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> Layout:
    return Layout("broadcast", None, tuple(a_shape), None, tuple(b_shape))


def permuted(perm: tuple[int, ...], a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> Layout:
    """A ``permuted`` layout; it keeps ``a``'s shape, so that a later pair can carry it through a reshape."""
    return Layout("permuted", tuple(perm), tuple(a_shape), None, tuple(b_shape))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _padded(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _fmt(shape: tuple[int, ...] | None) -> str:
    return "[" + ",".join(str(d) for d in shape or ()) + "]"
