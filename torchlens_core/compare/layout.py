"""How one side's array is laid out against the other's: NCHW vs NHWC, and what a flatten carries along.

Two ports of one model hold the same numbers in different orders: PyTorch's
activations are channels-first, JAX's and Keras's channels-last; a flatten
after a channels-last map orders its features differently from one after a
channels-first map. A :class:`Layout` maps ``a``'s value into ``b``'s order,
so that values are compared element for element and a layout difference is
reported as a layout, not as a divergence:

- ``same``: the shapes are equal and so is the order;
- ``permuted``: ``b`` is ``a`` with its axes permuted (``perm``, as
  ``numpy.transpose`` takes it), found from the shapes and, where several
  permutations fit (a square feature map), from the values;
- ``carried``: the arrays have the same size but no axis permutation relates
  them: ``a`` is reshaped to the shape an earlier aligned pair had, permuted
  as that pair was, and reshaped to ``b``'s shape (``via`` names the pair).
  This is the flatten after a permuted layout.
- ``reshaped``: the arrays differ by axes of size 1 (``jnp.matmul`` drops a
  batch of one that ``torch.matmul`` keeps): ``a`` without its unit axes
  (``via_shape``), permuted by ``perm``, reshaped to ``b``'s shape.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import attrs

MAX_PERMUTED_RANK = 6  # 720 permutations: more is never a layout change


@attrs.frozen
class Layout:
    """``apply(a)`` puts ``a``'s value in ``b``'s order."""

    kind: str  # "same" | "permuted" | "carried" | "reshaped" | "none" (sizes differ: nothing maps one onto the other)
    perm: tuple[int, ...] | None = None
    via_shape: tuple[int, ...] | None = None  # permuted: a's shape; carried: the shape a is reshaped to first
    via: str | None = None  # carried: the aligned pair the layout comes from
    b_shape: tuple[int, ...] | None = None

    def apply(self, a: Any) -> Any:
        if self.kind == "same":
            return a
        if self.kind == "permuted":
            return a.transpose(self.perm)
        if self.kind in ("carried", "reshaped"):
            return a.reshape(self.via_shape).transpose(self.perm).reshape(self.b_shape)
        raise ValueError("arrays of different sizes have no layout to apply")

    def __str__(self) -> str:
        if self.kind == "permuted":
            return f"axes {self.perm}"
        if self.kind == "carried":
            return f"axes {self.perm} of {self.via_shape}, from {self.via}"
        if self.kind == "reshaped":
            identity = self.perm == tuple(range(len(self.perm)))
            return "unit axes" if identity else f"unit axes, axes {self.perm}"
        return self.kind


SAME = Layout("same")
NONE = Layout("none")


def permutations(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every non-identity axis permutation ``p`` with ``b_shape == a_shape[p]``."""
    if len(a_shape) != len(b_shape) or sorted(a_shape) != sorted(b_shape) or len(a_shape) > MAX_PERMUTED_RANK:
        return []
    identity = tuple(range(len(a_shape)))
    return [p for p in itertools.permutations(identity)
            if p != identity and all(a_shape[k] == b_shape[i] for i, k in enumerate(p))]


def candidates(a_shape: tuple[int, ...], b_shape: tuple[int, ...],
               carried: list[tuple[Layout, str]]) -> list[Layout]:
    """Layouts that could relate arrays of these shapes, the likeliest first.

    ``carried`` holds the layouts of earlier aligned pairs (nearest first) with
    their names: a permutation one of them used is preferred among several
    that fit, and one that reshapes through them is tried when none fits.
    """
    if math.prod(a_shape) != math.prod(b_shape):
        return [NONE]
    # An earlier pair's permutation first (a square feature map fits several, and the identity), then the
    # identity, then the other permutations that fit.
    perms = permutations(tuple(a_shape), tuple(b_shape))
    seen = [layout.perm for layout, _ in carried if layout.kind == "permuted"]
    perms.sort(key=lambda p: seen.index(p) if p in seen else len(seen))
    found = [permuted(p, a_shape, b_shape) for p in perms if p in seen]
    if tuple(a_shape) == tuple(b_shape):
        found.append(SAME)
    found += [permuted(p, a_shape, b_shape) for p in perms if p not in seen]
    squeezed_a, squeezed_b = tuple(d for d in a_shape if d != 1), tuple(d for d in b_shape if d != 1)
    if not found and (len(squeezed_a) != len(a_shape) or len(squeezed_b) != len(b_shape)):
        identity = tuple(range(len(squeezed_a)))
        moves = ([identity] if squeezed_a == squeezed_b else []) + permutations(squeezed_a, squeezed_b)
        found += [Layout("reshaped", p, squeezed_a, None, tuple(b_shape)) for p in moves
                  if tuple(a_shape) != tuple(b_shape) or p != identity]
    for layout, name in carried:
        if layout.kind == "permuted" and math.prod(layout.via_shape or ()) == math.prod(a_shape):
            option = Layout("carried", layout.perm, layout.via_shape, name, tuple(b_shape))
            if option not in found and tuple(layout.via_shape) != tuple(a_shape):
                found.append(option)
    return found or [NONE]


def permuted(perm: tuple[int, ...], a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> Layout:
    """A ``permuted`` layout; it keeps ``a``'s shape, so that a later pair can carry it through a reshape."""
    return Layout("permuted", tuple(perm), tuple(a_shape), None, tuple(b_shape))
