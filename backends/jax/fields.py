"""Receptive-field geometry of JAX primitives (the ``torchlens_geometry`` hook; see docs/fields.md).

A JAX trace records primitives, whose parameters name every dim: the layout
(channels-last ``NHWC`` for Flax, or any other) comes from a convolution's
``dimension_numbers`` and a pooling's per-dim window, not from a convention.
``conv_general_dilated`` is a window per spatial dim (its ``lhs_dilation`` is
a transposed convolution's stride), ``reduce_window_*`` one per dim whose
window is not trivial, ``pad`` and ``slice`` windows of kernel 1. Other
primitives are elementwise, broadcasts, reshapes, transposes,
concatenations, reductions or contractions; any other gets None (read whole).
"""

from __future__ import annotations

from typing import Any

from torchlens_core.fields.geometry import (
    AxisRule,
    Geometry,
    Link,
    Window,
    concat,
    permute,
    pointwise,
    reduce,
    reshape,
    windowed,
)
from torchlens_core.ir.records import OpRecord, ParamRef, Ref, shape_at
from torchlens_core.ir.trace import Trace

POINTWISE = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "rem",
        "pow",
        "integer_pow",
        "max",
        "min",
        "neg",
        "abs",
        "sign",
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "sqrt",
        "rsqrt",
        "cbrt",
        "erf",
        "erfc",
        "erf_inv",
        "square",
        "sin",
        "cos",
        "select_n",
        "convert_element_type",
        "copy",
        "copy_p",
        "stop_gradient",
        "reduce_precision",
        "clamp",
        "nextafter",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "and",
        "or",
        "not",
        "is_finite",
        "floor",
        "ceil",
        "round",
        "atan2",
        "add_any",
    }
)
_REDUCE = frozenset(
    {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "argmax", "argmin"}
)


def geometry(trace: Trace, op: OpRecord) -> Geometry | None:
    """The primitive's geometry, or None when no rule here knows it."""
    out = _ints(op.shape)
    if out is None:
        return None
    name = op.func_name
    if name == "conv_general_dilated":
        return _conv(trace, op)
    if name.startswith("reduce_window"):
        return _reduce_window(trace, op)
    if name in POINTWISE:
        parents = [(r, s) for r in _refs(op) if (s := _ints(_shape(trace, r))) is not None]
        return pointwise(parents, out)
    if name == "broadcast_in_dim":
        return _broadcast(trace, op, out)
    if name in ("reshape", "squeeze", "expand_dims"):
        parent = _first(trace, op)
        return reshape(parent[0], parent[1], out) if parent else None
    if name == "transpose":
        parent = _first(trace, op)
        perm = op.kwargs.get("permutation")
        return permute(parent[0], tuple(perm)) if parent and perm is not None else None
    if name == "concatenate":
        operands = []
        for a in op.args:
            s = _ints(_shape(trace, a))
            if not isinstance(a, Ref) or s is None:
                return None  # a constant operand's stretch would be unaccounted for
            operands.append((a, s))
        return concat(operands, op.kwargs["dimension"])
    if name in _REDUCE:
        parent = _first(trace, op)
        axes = op.kwargs.get("axes")
        return reduce(parent[0], parent[1], tuple(axes), False, len(out)) if parent and axes is not None else None
    if name == "dot_general":
        return _dot(trace, op)
    if name == "pad":
        return _pad(trace, op)
    if name == "slice":
        return _slice(trace, op)
    return None


def _ints(shape: Any) -> tuple[int, ...] | None:
    return tuple(shape) if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape) else None


def _shape(trace: Trace, ref: Any) -> Any:
    if isinstance(ref, Ref):
        return shape_at(trace.ops[ref.index].shape, ref.path)
    if isinstance(ref, ParamRef) and ref.name in trace.params:
        return tuple(trace.params[ref.name].shape)
    return getattr(ref, "shape", None)


def _refs(op: OpRecord) -> list[Ref]:
    return [a for a in op.args if isinstance(a, Ref)]


def _first(trace: Trace, op: OpRecord) -> tuple[Ref, tuple[int, ...]] | None:
    ref = op.args[0] if op.args else None
    shape = _ints(_shape(trace, ref))
    return (ref, shape) if isinstance(ref, Ref) and shape is not None else None


def _conv(trace: Trace, op: OpRecord) -> Geometry | None:
    """``conv_general_dilated``: output spatial dim ``out_spec[2+i]`` windows input dim ``lhs_spec[2+i]``."""
    parent = _first(trace, op)
    rhs = _ints(_shape(trace, op.args[1] if len(op.args) > 1 else None))
    numbers = op.kwargs.get("dimension_numbers")
    padding = op.kwargs.get("padding")
    if parent is None or rhs is None or numbers is None or padding is None or isinstance(padding, str):
        return None
    lhs_spec, rhs_spec, out_spec = numbers.lhs_spec, numbers.rhs_spec, numbers.out_spec
    n = len(lhs_spec) - 2
    strides = op.kwargs.get("window_strides") or (1,) * n
    lhs_dil = op.kwargs.get("lhs_dilation") or (1,) * n
    rhs_dil = op.kwargs.get("rhs_dilation") or (1,) * n
    windows = {
        lhs_spec[2 + i]: Window(rhs[rhs_spec[2 + i]], strides[i], padding[i][0], rhs_dil[i], lhs_dil[i])
        for i in range(n)
    }
    dim_map = {lhs_spec[2 + i]: out_spec[2 + i] for i in range(n)}
    keep: tuple[int, ...] = ()
    if op.kwargs.get("batch_group_count", 1) == 1:
        dim_map[lhs_spec[0]] = out_spec[0]
        keep = (lhs_spec[0],)
    return windowed(parent[0], windows, "convolution", dim_map=dim_map, keep=keep)


def _reduce_window(trace: Trace, op: OpRecord) -> Geometry | None:
    """Pooling: a window on every dim; those with a non-trivial one are spatial."""
    parent = _first(trace, op)
    dims = op.kwargs.get("window_dimensions")
    if parent is None or dims is None:
        return None
    n = len(dims)
    strides = op.kwargs.get("window_strides") or (1,) * n
    padding = op.kwargs.get("padding") or ((0, 0),) * n
    base = op.kwargs.get("base_dilation") or (1,) * n
    dilation = op.kwargs.get("window_dilation") or (1,) * n
    if isinstance(padding, str):
        return None
    all_windows = [Window(dims[d], strides[d], padding[d][0], dilation[d], base[d]) for d in range(n)]
    windows = {d: w for d, w in enumerate(all_windows) if not w.is_identity}
    keep = tuple(d for d, w in enumerate(all_windows) if w.is_identity)
    return windowed(parent[0], windows, "pool", keep=keep)


def _broadcast(trace: Trace, op: OpRecord, out: tuple[int, ...]) -> Geometry | None:
    parent = _first(trace, op)
    where = op.kwargs.get("broadcast_dimensions")
    if parent is None or where is None:
        return None
    ref, shape = parent
    dims: dict[int, tuple[int, Any]] = {}
    fixed: dict[int, tuple[int, int]] = {}
    for pd, od in enumerate(where):
        if shape[pd] == out[od]:
            dims[od] = (pd, Window())
        else:
            fixed[pd] = (0, 0)  # a size-1 dim broadcast
    return Geometry("broadcast", (Link(ref, dims, fixed),))


def _dot(trace: Trace, op: OpRecord) -> Geometry | None:
    """``dot_general``: batch dims kept, free dims carried in order, contracting dims read whole."""
    numbers = op.kwargs.get("dimension_numbers")
    if numbers is None or len(op.args) != 2:
        return None
    (lc, rc), (lb, rb) = numbers
    shapes = [_ints(_shape(trace, a)) for a in op.args]
    if any(s is None for s in shapes):
        return None
    links = []
    free_start = len(lb)
    lhs_free = [d for d in range(len(shapes[0])) if d not in lc and d not in lb]  # type: ignore[arg-type]
    rhs_free = [d for d in range(len(shapes[1])) if d not in rc and d not in rb]  # type: ignore[arg-type]
    for ref, batch, free, offset in (
        (op.args[0], lb, lhs_free, free_start),
        (op.args[1], rb, rhs_free, free_start + len(lhs_free)),
    ):
        if not isinstance(ref, Ref):
            continue
        dims: dict[int, tuple[int, AxisRule]] = {i: (d, Window()) for i, d in enumerate(batch)}
        dims.update({offset + i: (d, Window()) for i, d in enumerate(free)})
        links.append(Link(ref, dims))
    return Geometry("dense", tuple(links))


def _pad(trace: Trace, op: OpRecord) -> Geometry | None:
    """``pad``: (low, high, interior) per dim is a window of kernel 1 over the input dilated by interior + 1."""
    parent = _first(trace, op)
    config = op.kwargs.get("padding_config")
    if parent is None or config is None:
        return None
    dims: dict[int, tuple[int, AxisRule]] = {
        d: (d, Window(padding=lo, lhs_dilation=interior + 1)) for d, (lo, _, interior) in enumerate(config)
    }
    return Geometry("pad", (Link(parent[0], dims),))


def _slice(trace: Trace, op: OpRecord) -> Geometry | None:
    parent = _first(trace, op)
    starts = op.kwargs.get("start_indices")
    if parent is None or starts is None:
        return None
    strides = op.kwargs.get("strides") or (1,) * len(starts)
    dims: dict[int, tuple[int, AxisRule]] = {
        d: (d, Window(stride=strides[d], padding=-starts[d])) for d in range(len(starts))
    }
    return Geometry("slice", (Link(parent[0], dims),))
