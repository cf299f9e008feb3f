"""Per-op geometry: how each position of an op's output relates to positions of its parents.

A backend's ``torchlens_geometry`` hook describes one op as a :class:`Geometry`:
one :class:`Link` per array argument it relates position by position, each
mapping output dimensions to parent dimensions with a per-axis rule. Two rules
cover the ops that move or window values along an axis:

- :class:`Window`: output ``o`` reads input ``i`` when ``lhs_dilation * i ==
  stride * o - padding + dilation * j`` for some tap ``j < kernel``. Convolution
  and pooling (kernel, stride, padding, dilation), transposed convolution
  (``lhs_dilation`` = its stride, see :func:`transposed`), slicing (kernel 1,
  stride = step, padding = -start), constant padding (kernel 1, padding = pad)
  and the identity (the default) are all windows.
- :class:`Intervals`: output ``o`` reads ``[starts[o], stops[o])``, position by
  position (adaptive pooling, interpolation).

What a link does not map is read whole: a parent dimension neither mapped from
an output dimension nor ``fixed`` is one every output position reads all of
(the channels of a convolution, the reduced axes of a mean, the features of a
dense layer). When that dimension is a spatial one, the windowed path ends
there: the field's status becomes ``not_windowed``, naming the op. Array
arguments no link names (a convolution's weight computed by another op) are
read whole too. ``None`` from the hook (an op the backend has no rule for)
reads every argument whole: never a silently wrong box.

The builders below (:func:`pointwise`, :func:`reshape`, :func:`permute`,
:func:`concat`, :func:`split`, :func:`reduce`...) work from shapes only, so a
backend classifies its ops and leaves the dimension bookkeeping here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from torchlens_core.ir.records import Ref


@attrs.frozen(slots=True)
class Window:
    """One axis of a windowed relation: ``lhs_dilation * i == stride * o - padding + dilation * j``, ``j < kernel``."""

    kernel: int = 1
    stride: int = 1
    padding: int = 0  # positions of padding before the input (negative: a crop)
    dilation: int = 1
    lhs_dilation: int = 1  # a transposed convolution's stride: zeros inserted between input positions

    def __attrs_post_init__(self) -> None:
        if self.kernel < 1 or self.stride < 1 or self.lhs_dilation < 1 or self.dilation < 1:
            raise ValueError(f"a window needs kernel, stride, dilation and lhs_dilation >= 1, got {self}")

    @property
    def is_identity(self) -> bool:
        return self == IDENTITY


IDENTITY = Window()


@attrs.frozen(slots=True)
class Intervals:
    """One axis position by position: output ``o`` reads input positions ``[starts[o], stops[o])``."""

    starts: tuple[int, ...]
    stops: tuple[int, ...]


AxisRule = Window | Intervals


@attrs.frozen(slots=True)
class Link:
    """How an op's output (leaf ``out_path``) reads one parent value, dimension by dimension.

    ``dims``: output dim -> (parent dim, rule). ``fixed``: parent dims read at
    fixed positions whatever the output position (``x[:, :, 5]``: dim 2 at
    ``(5, 5)``; a broadcast size-1 dim at ``(0, 0)``), inclusive. ``out_fixed``:
    output dims this parent feeds only at some positions (``stack``'s new dim).
    ``exact``: the rules give exactly the positions read; False when they only
    bound them (the field's status is then ``bounded``).
    """

    parent: Ref
    dims: dict[int, tuple[int, AxisRule]] = attrs.field(factory=dict)
    fixed: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    out_fixed: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    out_path: tuple[Any, ...] = ()
    exact: bool = True


@attrs.frozen(slots=True)
class Geometry:
    """How one op's output positions relate to its parents' (see the module docstring).

    ``kind`` names the rule for statuses and docs (``"window"``,
    ``"transposed window"``, ``"pointwise"``, ``"reshape"``, ``"reduce"``,
    ``"dense"``...). ``spatial``: the output dims a windowed op declares
    spatial (a convolution's H and W); their parent dims, through ``links``,
    are spatial too. Other ops carry spatial dims through their links.
    """

    kind: str
    links: tuple[Link, ...] = ()
    spatial: tuple[int, ...] = ()
    note: str = ""


# -- builders (shapes only) -------------------------------------------------------------
def identity_link(parent: Ref, ndim: int, out_path: tuple[Any, ...] = ()) -> Link:
    return Link(parent, {d: (d, IDENTITY) for d in range(ndim)}, out_path=out_path)


def broadcast_link(
    parent: Ref, parent_shape: tuple[int, ...], out_shape: tuple[int, ...], out_path: tuple[Any, ...] = ()
) -> Link | None:
    """``parent`` broadcast to ``out_shape`` (dims aligned from the right); None if it does not broadcast."""
    offset = len(out_shape) - len(parent_shape)
    if offset < 0:
        return None
    dims: dict[int, tuple[int, AxisRule]] = {}
    fixed: dict[int, tuple[int, int]] = {}
    for pd, size in enumerate(parent_shape):
        od = pd + offset
        if size == out_shape[od]:
            dims[od] = (pd, IDENTITY)
        elif size == 1:
            fixed[pd] = (0, 0)
        else:
            return None
    return Link(parent, dims, fixed, out_path=out_path)


def pointwise(
    parents: list[tuple[Ref, tuple[int, ...]]], out_shape: tuple[int, ...], kind: str = "pointwise"
) -> Geometry | None:
    """Each output position reads the same position of every parent (NumPy broadcasting)."""
    links = []
    for ref, shape in parents:
        link = broadcast_link(ref, shape, out_shape)
        if link is None:
            return None
        links.append(link)
    return Geometry(kind, tuple(links))


def mixing(
    parent: Ref,
    shape: tuple[int, ...],
    mixed: tuple[int, ...],
    kind: str,
    *,
    drop: bool = False,
    out_ndim: int | None = None,
) -> Geometry:
    """Every output position reads the whole of the ``mixed`` dims (softmax, a norm, a reduction).

    ``drop``: the mixed dims are gone from the output (a reduction without
    keepdim); the other dims keep their order.
    """
    mixed_set = {d % len(shape) for d in mixed} if shape else set()
    dims: dict[int, tuple[int, AxisRule]] = {}
    od = 0
    for pd in range(len(shape)):
        if pd in mixed_set:
            if not drop:
                od += 1
            continue
        dims[od] = (pd, IDENTITY)
        od += 1
    if out_ndim is not None and od != out_ndim:
        raise ValueError(f"a {kind} of rank {len(shape)} over {sorted(mixed_set)} gives rank {od}, not {out_ndim}")
    return Geometry(kind, (Link(parent, dims),))


def reduce(parent: Ref, shape: tuple[int, ...], axes: tuple[int, ...] | None, keepdim: bool, out_ndim: int) -> Geometry:
    """A reduction over ``axes`` (None: all of them): those dims are read whole."""
    return mixing(
        parent, shape, tuple(range(len(shape))) if axes is None else axes, "reduce", drop=not keepdim, out_ndim=out_ndim
    )


def reshape(parent: Ref, shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Geometry | None:
    """A reshape: dims kept whole (the same size, between matching groups) map one to one, merged ones do not.

    Groups of consecutive dims with equal products are matched left to right;
    a group of one dim on each side is the same axis. Size-1 dims come and go
    freely. Merged or split axes are read whole: flattening H and W ends the
    windowed path there.
    """
    if math.prod(shape) != math.prod(out_shape) or 0 in shape:
        return None
    ins = [d for d in range(len(shape)) if shape[d] != 1]
    outs = [d for d in range(len(out_shape)) if out_shape[d] != 1]
    dims: dict[int, tuple[int, AxisRule]] = {}
    fixed = {d: (0, 0) for d in range(len(shape)) if shape[d] == 1}
    i = o = 0
    while i < len(ins) and o < len(outs):
        gi, go = [ins[i]], [outs[o]]
        pi, po = shape[ins[i]], out_shape[outs[o]]
        while pi != po:
            if pi < po:
                i += 1
                gi.append(ins[i])
                pi *= shape[ins[i]]
            else:
                o += 1
                go.append(outs[o])
                po *= out_shape[outs[o]]
        if len(gi) == 1 and len(go) == 1:
            dims[go[0]] = (gi[0], IDENTITY)
        i += 1
        o += 1
    return Geometry("reshape", (Link(parent, dims, fixed),))


def permute(parent: Ref, perm: tuple[int, ...]) -> Geometry:
    """Output dim ``k`` is parent dim ``perm[k]``."""
    n = len(perm)
    return Geometry("permute", (Link(parent, {k: (p % n, IDENTITY) for k, p in enumerate(perm)}),))


def concat(parents: list[tuple[Ref, tuple[int, ...]]], axis: int) -> Geometry:
    """Parents laid end to end along ``axis``: each reads its own stretch of it."""
    links = []
    offset = 0
    for ref, shape in parents:
        if not shape:  # torch.cat skips empty 1-d tensors
            continue
        ax = axis % len(shape)
        dims: dict[int, tuple[int, AxisRule]] = {
            d: (d, IDENTITY if d != ax else Window(padding=offset)) for d in range(len(shape))
        }
        links.append(Link(ref, dims))
        offset += shape[ax]
    return Geometry("concat", tuple(links))


def stack(parents: list[Ref], ndim: int, axis: int) -> Geometry:
    """Parents stacked along a new output dim ``axis``: parent ``k`` feeds position ``k`` of it."""
    out_ndim = ndim + 1
    ax = axis % out_ndim
    links = []
    for k, ref in enumerate(parents):
        dims: dict[int, tuple[int, AxisRule]] = {(d if d < ax else d + 1): (d, IDENTITY) for d in range(ndim)}
        links.append(Link(ref, dims, out_fixed={ax: (k, k)}))
    return Geometry("stack", tuple(links))


def split(
    parent: Ref, shape: tuple[int, ...], out_shapes: list[tuple[int, ...]], axis: int, keep_axis: bool = True
) -> Geometry:
    """Output leaf ``k`` is the ``k``-th stretch of ``axis`` (chunk, split), or its ``k``-th position (unbind)."""
    ax = axis % len(shape)
    links = []
    offset = 0
    for k, out_shape in enumerate(out_shapes):
        if keep_axis:
            dims: dict[int, tuple[int, AxisRule]] = {
                d: (d, IDENTITY if d != ax else Window(padding=-offset)) for d in range(len(shape))
            }
            links.append(Link(parent, dims, out_path=(k,)))
            offset += out_shape[ax]
        else:
            dims = {(d if d < ax else d - 1): (d, IDENTITY) for d in range(len(shape)) if d != ax}
            links.append(Link(parent, dims, fixed={ax: (k, k)}, out_path=(k,)))
    return Geometry("split", tuple(links))


def windowed(
    parent: Ref,
    windows: Mapping[int, AxisRule],
    kind: str = "window",
    dim_map: dict[int, int] | None = None,
    keep: tuple[int, ...] = (),
) -> Geometry:
    """A windowed op (convolution, pooling) over ``windows`` (input dim -> window); declares them spatial.

    ``dim_map``: output dim of each windowed input dim (default: the same).
    ``keep``: other input dims mapped one to one (the batch; pooling's
    channels); the rest are read whole (a convolution's input channels).
    """
    dim_map = dim_map or {d: d for d in windows}
    dims: dict[int, tuple[int, AxisRule]] = {dim_map.get(d, d): (d, IDENTITY) for d in keep}
    for d, window in windows.items():
        dims[dim_map[d]] = (d, window)
    spatial = tuple(sorted(dim_map[d] for d in windows))
    return Geometry(kind, (Link(parent, dims),), spatial=spatial)


def transposed(kernel: int, stride: int, padding: int, dilation: int = 1) -> Window:
    """The window of a transposed convolution: output ``stride*i - padding + dilation*j`` reads input ``i``.

    That is ``stride * i == o + padding - dilation * j``; with ``j`` running
    backwards it is a window over the input dilated by ``stride`` and padded by
    ``dilation * (kernel - 1) - padding``.
    """
    return Window(
        kernel=kernel, stride=1, padding=dilation * (kernel - 1) - padding, dilation=dilation, lhs_dilation=stride
    )


def adaptive(in_size: int, out_size: int) -> Intervals:
    """Adaptive pooling's windows: ``[floor(o * n / m), ceil((o + 1) * n / m))``."""
    starts = tuple((o * in_size) // out_size for o in range(out_size))
    stops = tuple(-((-(o + 1) * in_size) // out_size) for o in range(out_size))
    return Intervals(starts, stops)
