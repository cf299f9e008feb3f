"""Influence geometry over the executed graph: per-op rules composed along every path.

A region is a span per dim of one op's value (None: the whole dim). Going
back from a target (receptive field), each op in reverse execution order maps
the region of its output through each :class:`~torchlens_core.fields.geometry.Link`
to a region of the parent; going forward (projective field), each op maps
its parents' regions to its own. Regions reaching one value by several paths
(a ResNet's skip and main branch, a U-Net's concatenation) are merged into
their hull, so every executed path counts: the geometry follows the graph
that ran, not a list of layers.

Spans are exact sets while they stay arithmetic progressions: an interval,
or every ``step``-th position (what a strided 1x1 convolution reads). The
rules are applied to a span's positions, not to a formula, so padding,
strides, dilation and transposed convolutions come out exact; when paths
merge into a set that is neither, the hull stands for it, and an op mapping
that hull gives a bound: the status becomes ``bounded``, naming the op. A
spatial dim read whole (flatten, a dense layer, global pooling, an op the
backend has no rule for) makes it ``not_windowed``.
"""

from __future__ import annotations

from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.fields.geometry import Geometry, Intervals, Link, Window, identity_link
from torchlens_core.fields.records import BOUNDED, NOT_WINDOWED, FieldStatus
from torchlens_core.ir.records import OpRecord, Ref, refs_in, shape_at
from torchlens_core.ir.trace import Trace

Key = tuple[int, tuple[Any, ...]]
_BRUTE_LIMIT = 2_000_000  # positions x taps beyond which a span is mapped by its ends (and called a bound)


@attrs.frozen(slots=True)
class Span:
    """Positions ``lo, lo + step, ... hi`` (real ones) and ``[raw_lo, raw_hi]``, the hull before any clipping.

    ``step`` 1: every position of ``[lo, hi]``; 0: a hull with gaps in no
    regular pattern (mapping it gives a bound).
    """

    lo: int
    hi: int
    raw_lo: int
    raw_hi: int
    step: int = 1

    @property
    def dense(self) -> bool:
        return self.step == 1

    def positions(self) -> range:
        return range(self.lo, self.hi + 1, self.step or 1)

    def __contains__(self, i: int) -> bool:
        return self.lo <= i <= self.hi and (self.step == 0 or (i - self.lo) % self.step == 0)


Spans = tuple[Span | None, ...]


@attrs.define(slots=True)
class Region:
    spans: list[Span | None]
    status: FieldStatus


class Graph:
    """A trace with its ops' geometry and spatial dims, worked out once."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._geometry: dict[int, Geometry | None] = {}
        self._spatial: dict[Key, set[int]] | None = None

    def geometry(self, op: OpRecord) -> Geometry | None:
        if op.index not in self._geometry:
            self._geometry[op.index] = self._find_geometry(op)
        return self._geometry[op.index]

    def _find_geometry(self, op: OpRecord) -> Geometry | None:
        if op.kind == "input":
            return Geometry("input")
        if op.kind == "output":  # an output node is its array, unchanged
            refs = refs_in(op.args)
            shape = self.shape((op.index, ()))
            return Geometry("output", (identity_link(refs[0], len(shape)),)) if len(refs) == 1 and shape else None
        return backend_named(self.trace.backend, missing_ok=True).geometry(self.trace, op)

    def shape(self, key: Key) -> tuple[int, ...] | None:
        shape = shape_at(self.trace.ops[key[0]].shape, key[1])
        return shape if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape) else None

    def leaves(self, op: OpRecord) -> list[Key]:
        """The keys of an op's array outputs."""
        if op.shape is None or all(isinstance(d, int) for d in op.shape):
            return [(op.index, ())]
        return [(op.index, (i,)) for i, s in enumerate(op.shape) if isinstance(s, tuple)]

    def spatial(self, key: Key) -> list[int]:
        """The spatial dims of a value: those a windowed op declares, carried along every link both ways."""
        if self._spatial is None:
            self._spatial = self._find_spatial()
        return sorted(self._spatial.get(key, ()))

    def _find_spatial(self) -> dict[Key, set[int]]:
        found: dict[Key, set[int]] = {}
        edges = []
        for op in self.trace.ops:
            geom = self.geometry(op)
            if geom is None:
                continue
            for link in geom.links:
                out, parent = (op.index, link.out_path), (link.parent.index, link.parent.path)
                pairs = [(od, pd) for od, (pd, _) in link.dims.items()]
                edges.append((out, parent, pairs))
                if geom.spatial:
                    found.setdefault(out, set()).update(geom.spatial)
        changed = True
        while changed:
            changed = False
            for out, parent, pairs in edges:
                o, p = found.setdefault(out, set()), found.setdefault(parent, set())
                for od, pd in pairs:
                    if od in o and pd not in p:
                        p.add(pd)
                        changed = True
                    elif pd in p and od not in o:
                        o.add(od)
                        changed = True
        return found


# -- receptive: from an op back toward the inputs -----------------------------------------
def backward(graph: Graph, start: Key, spans: Spans) -> dict[Key, Region]:
    """The region of every value ``spans`` of ``start`` reads, by every path (keyed by (op index, leaf path))."""
    regions: dict[Key, Region] = {start: Region(list(spans), FieldStatus())}
    for op in reversed(graph.trace.ops[: start[0] + 1]):
        mine = {k[1]: r for k, r in regions.items() if k[0] == op.index}
        if not mine:
            continue
        geom = graph.geometry(op)
        named = set()
        if geom is not None:
            for link in geom.links:
                named.add(link.parent)
                region = mine.get(link.out_path)
                if region is not None:
                    _merge(regions, (link.parent.index, link.parent.path), _back_link(graph, op, geom, link, region))
        status = FieldStatus()
        for region in mine.values():
            status = status.worst(region.status)
        narrow = any(_restricts(graph, (op.index, path), region) for path, region in mine.items())
        for ref in refs_in((op.args, op.kwargs)):
            if ref not in named:
                _merge(regions, (ref.index, ref.path), _whole(graph, op, geom, ref, status, narrow))
    return regions


def _back_link(graph: Graph, op: OpRecord, geom: Geometry, link: Link, region: Region) -> Region | None:
    key = (link.parent.index, link.parent.path)
    shape = graph.shape(key)
    if shape is None:
        return None
    for od, (lo, hi) in link.out_fixed.items():
        span = region.spans[od] if od < len(region.spans) else None
        if span is not None and (span.hi < lo or span.lo > hi):
            return None  # this parent feeds none of the positions asked about
    status = region.status
    if not link.exact:
        status = status.worst(FieldStatus(BOUNDED, op.label, f"the {geom.kind} rule only bounds the positions read"))
    spans: list[Span | None] = [None] * len(shape)
    for od, (pd, rule) in link.dims.items():
        span = region.spans[od] if od < len(region.spans) else None
        if span is None:
            continue
        mapped = _back_rule(rule, span, shape[pd])
        if mapped is None:
            return None  # the positions asked about read only padding of this parent
        if span.step == 0 and not (isinstance(rule, Window) and rule.is_identity):
            status = status.worst(FieldStatus(BOUNDED, op.label, f"a {geom.kind} maps a span with gaps"))
        spans[pd] = mapped
    for pd, (lo, hi) in link.fixed.items():
        spans[pd] = Span(lo, hi, lo, hi)
    mapped_dims = {pd for pd, _ in link.dims.values()} | set(link.fixed)
    spatial = graph.spatial(key)
    whole = [pd for pd in range(len(shape)) if pd not in mapped_dims and pd in spatial]
    if whole:
        status = status.worst(
            FieldStatus(
                NOT_WINDOWED,
                op.label,
                f"{op.func_name} ({geom.kind}) reads spatial dim {whole[0]} of {graph.trace.ops[key[0]].label} whole",
            )
        )
    return Region(spans, status)


def _restricts(graph: Graph, key: Key, region: Region) -> bool:
    """Does ``region`` leave out part of some dim of ``key``'s value?"""
    shape = graph.shape(key)
    return shape is not None and any(s is not None and (s.lo > 0 or s.hi < n - 1) for s, n in zip(region.spans, shape))


def _whole(
    graph: Graph, op: OpRecord, geom: Geometry | None, ref: Ref, status: FieldStatus, narrow: bool
) -> Region | None:
    """A parent the geometry does not relate position by position: read whole.

    That ends the windowed path when the parent has spatial dims, or, for an
    op with no rule (past which the spatial dims cannot be followed), when the
    positions asked about are only part of its output (``narrow``).
    """
    key = (ref.index, ref.path)
    shape = graph.shape(key)
    if shape is None:
        return None
    if (geom is None and narrow) or graph.spatial(key):
        why = (
            f"no geometry rule for {op.func_name}"
            if geom is None
            else f"{op.func_name} ({geom.kind}) reads {graph.trace.ops[ref.index].label} whole"
        )
        status = status.worst(FieldStatus(NOT_WINDOWED, op.label, why))
    return Region([None] * len(shape), status)


def _back_rule(rule: Window | Intervals, span: Span, size: int) -> Span | None:
    """The parent positions ``span``'s positions read under ``rule`` (None: only padding)."""
    if isinstance(rule, Intervals):
        lo, hi = max(span.lo, 0), min(span.hi, len(rule.starts) - 1)
        if lo > hi:
            return None
        hits: set[int] = set()
        for o in span.positions():
            if lo <= o <= hi:
                hits.update(range(rule.starts[o], rule.stops[o]))
        return _span(hits, min(hits), max(hits), size) if hits else None
    k, s, p, d, lhs = rule.kernel, rule.stride, rule.padding, rule.dilation, rule.lhs_dilation
    raw_lo = -((-(s * span.raw_lo - p)) // lhs)
    raw_hi = (s * span.raw_hi - p + d * (k - 1)) // lhs
    if lhs == 1 and d == 1 and span.dense and (k >= s or span.lo == span.hi):
        lo, hi = max(s * span.lo - p, 0), min(s * span.hi - p + k - 1, size - 1)
        return Span(lo, hi, raw_lo, raw_hi) if lo <= hi else None
    if len(span.positions()) * k > _BRUTE_LIMIT:
        lo, hi = max(raw_lo, 0), min(raw_hi, size - 1)
        return Span(lo, hi, raw_lo, raw_hi, 0) if lo <= hi else None
    hits = set()
    for o in span.positions():
        for j in range(k):
            v = s * o - p + d * j
            if v % lhs == 0 and 0 <= v // lhs < size:
                hits.add(v // lhs)
    return _span(hits, raw_lo, raw_hi, size) if hits else None


def _span(hits: set[int], raw_lo: int, raw_hi: int, size: int) -> Span:
    """The span of a set of positions: its step if they are a progression, else 0."""
    ordered = sorted(hits)
    gaps = {b - a for a, b in zip(ordered, ordered[1:])}
    step = gaps.pop() if len(gaps) == 1 else (1 if not gaps else 0)
    return Span(ordered[0], ordered[-1], min(raw_lo, ordered[0]), max(raw_hi, ordered[-1]), step)


def _merge(regions: dict[Key, Region], key: Key, new: Region | None) -> None:
    """Add ``new`` to the region of ``key``: the hull of both, dense where dense parts cover it.

    Two progressions of one step in phase stay one; anything else with gaps
    becomes step 0.
    """
    if new is None:
        return
    old = regions.get(key)
    if old is None:
        regions[key] = new
        return
    spans: list[Span | None] = []
    for a, b in zip(old.spans, new.spans):
        if a is None or b is None:
            spans.append(None)
            continue
        lo, hi = min(a.lo, b.lo), max(a.hi, b.hi)
        dense_parts = sorted((x.lo, x.hi) for x in (a, b) if x.dense)
        covered, reach = bool(dense_parts) and dense_parts[0][0] == lo, lo - 1
        for x_lo, x_hi in dense_parts:
            covered = covered and x_lo <= reach + 1
            reach = max(reach, x_hi)
        if covered and reach >= hi:
            step = 1
        elif a.step == b.step and a.step > 1 and (a.lo - b.lo) % a.step == 0:
            step = a.step
        else:
            step = 0
        spans.append(Span(lo, hi, min(a.raw_lo, b.raw_lo), max(a.raw_hi, b.raw_hi), step))
    regions[key] = Region(spans, old.status.worst(new.status))


# -- projective: from an op forward toward the outputs ------------------------------------
def forward(graph: Graph, start: Key, spans: Spans, stop: int) -> dict[Key, Region]:
    """The region of every value (up to op ``stop``) that ``spans`` of ``start`` reaches, by every path."""
    regions: dict[Key, Region] = {start: Region(list(spans), FieldStatus())}
    for op in graph.trace.ops[start[0] + 1 : stop + 1]:
        refs = [r for r in refs_in((op.args, op.kwargs)) if (r.index, r.path) in regions]
        if not refs:
            continue
        geom = graph.geometry(op)
        named = set()
        if geom is not None:
            for link in geom.links:
                named.add(link.parent)
                region = regions.get((link.parent.index, link.parent.path))
                if region is not None:
                    _merge(regions, (op.index, link.out_path), _fwd_link(graph, op, geom, link, region))
        for ref in refs:
            if ref in named:
                continue
            region = regions[(ref.index, ref.path)]
            status = region.status
            if _restricts(graph, (ref.index, ref.path), region):
                why = (
                    f"no geometry rule for {op.func_name}"
                    if geom is None
                    else f"{op.func_name} ({geom.kind}) reads {graph.trace.ops[ref.index].label} whole"
                )
                status = status.worst(FieldStatus(NOT_WINDOWED, op.label, why))
            for key in graph.leaves(op):
                shape = graph.shape(key)
                if shape is not None:
                    _merge(regions, key, Region([None] * len(shape), status))
    return regions


def _fwd_link(graph: Graph, op: OpRecord, geom: Geometry, link: Link, region: Region) -> Region | None:
    parent_key = (link.parent.index, link.parent.path)
    shape = graph.shape((op.index, link.out_path))
    if shape is None:
        return None
    for pd, (lo, hi) in link.fixed.items():
        span = region.spans[pd]
        if span is not None and (span.hi < lo or span.lo > hi):
            return None
    status = region.status
    if not link.exact:
        status = status.worst(FieldStatus(BOUNDED, op.label, f"the {geom.kind} rule only bounds the positions read"))
    mapped_dims = {pd for pd, _ in link.dims.values()} | set(link.fixed)
    restricted = [pd for pd in graph.spatial(parent_key) if pd not in mapped_dims and region.spans[pd] is not None]
    if restricted:
        status = status.worst(
            FieldStatus(
                NOT_WINDOWED,
                op.label,
                f"{op.func_name} ({geom.kind}) reads spatial dim {restricted[0]} of "
                f"{graph.trace.ops[parent_key[0]].label} whole",
            )
        )
    spans: list[Span | None] = [None] * len(shape)
    for od, (pd, rule) in link.dims.items():
        span = region.spans[pd]
        if span is None:
            continue
        mapped = _fwd_rule(rule, span, shape[od])
        if mapped is None:
            return None
        if span.step == 0 and not (isinstance(rule, Window) and rule.is_identity):
            status = status.worst(FieldStatus(BOUNDED, op.label, f"a {geom.kind} maps a span with gaps"))
        spans[od] = mapped
    for od, (lo, hi) in link.out_fixed.items():
        spans[od] = Span(lo, hi, lo, hi)
    return Region(spans, status)


def _fwd_rule(rule: Window | Intervals, span: Span, size: int) -> Span | None:
    """The output positions (of ``size``) that read any of ``span``'s positions under ``rule``."""
    if isinstance(rule, Intervals):
        hits = {o for o in range(len(rule.starts)) if any(i in span for i in range(rule.starts[o], rule.stops[o]))}
        return _span(hits, min(hits), max(hits), size) if hits else None
    k, s, p, d, lhs = rule.kernel, rule.stride, rule.padding, rule.dilation, rule.lhs_dilation
    if lhs == 1 and d == 1 and span.dense:  # o reads [s*o - p, s*o - p + k - 1]
        lo, hi = max(-((-(span.lo + p - k + 1)) // s), 0), min((span.hi + p) // s, size - 1)
        return Span(lo, hi, lo, hi) if lo <= hi else None
    if size * k > _BRUTE_LIMIT:
        lo = max(-((-(lhs * span.lo + p - d * (k - 1))) // s), 0)
        hi = min((lhs * span.hi + p) // s, size - 1)
        return Span(lo, hi, lo, hi, 0) if lo <= hi else None
    hits = set()
    for o in range(size):
        for j in range(k):
            v = s * o - p + d * j
            if v % lhs == 0 and v // lhs in span:
                hits.add(o)
                break
    return _span(hits, min(hits), max(hits), size) if hits else None
