"""The records a field answers with: statuses, boxes and the gradient cross-check's report."""

from __future__ import annotations

import attrs

EXACT = "exact"  # the box is exactly the bounding box of the positions the graph connects
BOUNDED = "bounded"  # the box contains them, but may be larger (a gap in a strided path, a rule that only bounds)
NOT_WINDOWED = "not_windowed"  # an op reads a spatial axis whole (flatten, a dense layer, global pooling, no rule)
_RANK = {EXACT: 0, BOUNDED: 1, NOT_WINDOWED: 2}


@attrs.frozen(slots=True)
class FieldStatus:
    """How far a box can be trusted, and the op that decided it (None when every rule on every path is exact)."""

    kind: str = EXACT
    op: str | None = None
    reason: str = ""

    def worst(self, other: FieldStatus) -> FieldStatus:
        """The less certain of two statuses; on a tie the first (the one found nearer the start) stays."""
        return other if _RANK[other.kind] > _RANK[self.kind] else self

    def __str__(self) -> str:
        return self.kind if self.op is None else f"{self.kind} at {self.op}: {self.reason}"


@attrs.frozen(slots=True)
class AxisBox:
    """One spatial axis of a box: positions ``[start, stop)`` of ``axis`` (a dim of the op's array).

    ``pad_before`` / ``pad_after``: how far the field reaches past the array's
    edges, into zero padding (0 for a projective field, whose positions are
    always real ones).
    """

    axis: int
    start: int
    stop: int
    pad_before: int = 0
    pad_after: int = 0

    @property
    def size(self) -> int:
        return self.stop - self.start

    def __str__(self) -> str:
        pad = f" (+{self.pad_before} / +{self.pad_after} padding)" if self.pad_before or self.pad_after else ""
        return f"dim {self.axis}: [{self.start}, {self.stop}){pad}"


@attrs.frozen(slots=True)
class Box:
    """The positions of op ``op`` (its label) that a position of another op reads (receptive) or reaches (projective).

    ``axes`` follow ``op``'s spatial dims in order. ``position`` is the
    position asked about, in the other op's spatial grid.
    """

    op: str
    position: tuple[int, ...]
    axes: tuple[AxisBox, ...]
    status: FieldStatus

    @property
    def slices(self) -> dict[int, slice]:
        """``{dim: slice}``: index the op's array with these to cut the box out."""
        return {a.axis: slice(a.start, a.stop) for a in self.axes}

    @property
    def extent(self) -> tuple[tuple[int, int], ...]:
        """``(start, stop)`` per spatial axis."""
        return tuple((a.start, a.stop) for a in self.axes)

    def __str__(self) -> str:
        return f"{self.op}[{', '.join(map(str, self.axes))}] ({self.status})"


@attrs.frozen(slots=True)
class FieldCheck:
    """A receptive field's box compared with the empirical support of the unit's gradient at the input.

    ``support``: ``(start, stop)`` per spatial axis of the input positions
    where the gradient of ``unit`` is nonzero (None when it is zero
    everywhere). ``contains``: the box holds the whole support, which the
    geometry promises. ``tightness``: support size / box size per axis (1.0:
    the box is as small as it can be; less where zero weights, an inactive
    ReLU or a max pool's unpicked inputs give no gradient). ``equal``: the two
    boxes coincide. Truthy when ``contains``.
    """

    unit: tuple[int, ...]
    box: Box
    support: tuple[tuple[int, int], ...] | None
    contains: bool
    tightness: tuple[float, ...]
    equal: bool

    @property
    def max_gap(self) -> int:
        """The largest distance between a support edge and the matching box edge (0 when ``equal``)."""
        if self.support is None:
            return max((a.size for a in self.box.axes), default=0)
        return max((max(lo - a.start, a.stop - hi) for (lo, hi), a in zip(self.support, self.box.axes)), default=0)

    def __bool__(self) -> bool:
        return self.contains

    def __str__(self) -> str:
        verdict = "equals" if self.equal else ("contains" if self.contains else "MISSES")
        return (
            f"unit {self.unit}: box {self.box.extent} {verdict} gradient support {self.support} "
            f"(tightness {', '.join(f'{t:.2f}' for t in self.tightness)}; {self.box.status})"
        )
