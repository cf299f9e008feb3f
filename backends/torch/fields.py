"""Receptive-field geometry of torch ops (the ``torchlens_geometry`` hook; see docs/fields.md).

torch is channels-first: a convolution or pooling over ``n`` spatial dims
reads the last ``n`` dims of its input (``N, C, *spatial``, or ``C, *spatial``
unbatched). Each rule reads the call's arguments by name, whether they were
passed by position or keyword. Ops not listed here get None: the core then
reads their parents whole, so a field through them is ``not_windowed``.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.fields.geometry import (
    Geometry,
    Intervals,
    Link,
    Window,
    adaptive,
    concat,
    mixing,
    permute,
    pointwise,
    reduce,
    reshape,
    stack,
    transposed,
    windowed,
)
from torchlens_core.ir.records import OpRecord, ParamRef, Ref, shape_at
from torchlens_core.ir.trace import Trace

_CONV = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_T = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
_MAX_POOL = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_AVG_POOL = ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")

# Each output position reads the same position of every array argument (broadcast).
POINTWISE = frozenset(
    {
        "add",
        "sub",
        "rsub",
        "mul",
        "div",
        "true_divide",
        "floor_divide",
        "remainder",
        "pow",
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "relu",
        "relu6",
        "leaky_relu",
        "elu",
        "selu",
        "celu",
        "gelu",
        "silu",
        "mish",
        "sigmoid",
        "tanh",
        "hardtanh",
        "hardswish",
        "hardsigmoid",
        "softplus",
        "clamp",
        "clip",
        "maximum",
        "minimum",
        "where",
        "dropout",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "alpha_dropout",
        "feature_alpha_dropout",
        "contiguous",
        "clone",
        "detach",
        "to",
        "float",
        "double",
        "half",
        "type_as",
        "square",
        "reciprocal",
        "sign",
        "erf",
        "iadd",
        "isub",
        "imul",
        "itruediv",
        "truediv",
        "radd",
        "rmul",
        "rtruediv",
        "prelu",
    }
)
_RESHAPES = frozenset({"flatten", "view", "reshape", "unsqueeze", "squeeze", "unflatten", "view_as", "reshape_as"})


def geometry(trace: Trace, op: OpRecord) -> Geometry | None:
    """The op's geometry, or None when no rule here knows it."""
    name = op.func_name.strip("_")
    if name.startswith("i") and name[1:] in POINTWISE and name not in POINTWISE:  # __iadd__ and friends
        name = name[1:]
    out = _shape(trace, op.shape)
    if out is None:
        return _pool_with_indices(trace, op, name)
    if name in ("conv1d", "conv2d", "conv3d"):
        return _conv(trace, op, int(name[-2]))
    if name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
        return _conv_transpose(trace, op, int(name[-2]))
    if name in ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d"):
        return _pool(trace, op, int(name[-2]), name.startswith("max"), out)
    if name.startswith(("adaptive_avg_pool", "adaptive_max_pool")) and name[-2:] in ("1d", "2d", "3d"):
        return _adaptive(trace, op, int(name[-2]), out)
    if name in POINTWISE or (name == "batch_norm" and not _arg(op, _BN, "training", False)):
        parents = [(r, s) for r in _array_refs(op) if (s := _shape(trace, _ref_shape(trace, r))) is not None]
        return pointwise(parents, out, "pointwise" if name != "batch_norm" else "batch norm (inference)")
    if name in _RESHAPES:
        parent = _first(trace, op)
        return reshape(parent[0], parent[1], out) if parent else None
    if name in ("permute", "transpose", "swapaxes", "t"):
        return _permute(trace, op)
    if name in ("cat", "concat", "concatenate"):
        return _cat(trace, op)
    if name == "stack":
        tensors = _arg(op, ("tensors", "dim"), "tensors", [])
        refs = [r for r in tensors if isinstance(r, Ref)]
        parent = _first(trace, op)
        if len(refs) != len(tensors) or parent is None:
            return None
        return stack(refs, len(parent[1]), _arg(op, ("tensors", "dim"), "dim", 0))
    if name in ("mean", "sum", "amax", "amin", "max", "min", "prod", "std", "var", "logsumexp", "norm"):
        return _reduce(trace, op, out)
    if name in ("softmax", "log_softmax"):
        parent = _first(trace, op)
        return mixing(parent[0], parent[1], (_arg(op, ("input", "dim"), "dim", -1),), name) if parent else None
    if name in ("linear", "matmul", "mm", "bmm", "addmm"):
        return _dense(trace, op, out)
    if name == "batch_norm":  # training: batch statistics over every position of each channel
        parent = _first(trace, op)
        dims = tuple(d for d in range(len(parent[1])) if d != 1) if parent else ()
        return mixing(parent[0], parent[1], dims, "batch norm (training)") if parent else None
    if name in ("layer_norm", "group_norm", "instance_norm"):
        return _norm(trace, op, name)
    if name == "interpolate":
        return _interpolate(trace, op, out)
    if name == "pad":
        return _pad(trace, op, out)
    return None


# -- arguments --------------------------------------------------------------------------------
_BN = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")


def _arg(op: OpRecord, names: tuple[str, ...], name: str, default: Any = None) -> Any:
    """Argument ``name`` of the call, passed by position (in ``names`` order) or keyword."""
    if name in op.kwargs:
        return op.kwargs[name]
    i = names.index(name)
    return op.args[i] if i < len(op.args) else default


def _shape(trace: Trace, shape: Any) -> tuple[int, ...] | None:
    return shape if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape) else None


def _ref_shape(trace: Trace, ref: Any) -> Any:
    if isinstance(ref, Ref):
        return shape_at(trace.ops[ref.index].shape, ref.path)
    if isinstance(ref, ParamRef) and ref.name in trace.params:
        return tuple(trace.params[ref.name].shape)
    return None


def _array_refs(op: OpRecord) -> list[Ref]:
    from torchlens_core.ir.records import refs_in

    return refs_in((op.args, op.kwargs))


def _first(trace: Trace, op: OpRecord) -> tuple[Ref, tuple[int, ...]] | None:
    """The op's first argument when it is a traced array, with its shape."""
    ref = op.args[0] if op.args else op.kwargs.get("input")
    shape = _shape(trace, _ref_shape(trace, ref))
    return (ref, shape) if isinstance(ref, Ref) and shape is not None else None


def _per_dim(value: Any, n: int, default: int) -> tuple[int, ...] | None:
    if value is None or (isinstance(value, (tuple, list)) and len(value) == 0):
        return (default,) * n
    if isinstance(value, int):
        return (value,) * n
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        return tuple(value) if len(value) == n else (tuple(value) * n if len(value) == 1 else None)
    return None


# -- windowed ops -------------------------------------------------------------------------------
def _conv(trace: Trace, op: OpRecord, n: int) -> Geometry | None:
    parent = _first(trace, op)
    weight = _shape(trace, _ref_shape(trace, _arg(op, _CONV, "weight")))
    if parent is None or weight is None or len(weight) != n + 2:
        return None
    ref, shape = parent
    kernel = weight[2:]
    stride = _per_dim(_arg(op, _CONV, "stride", 1), n, 1)
    dilation = _per_dim(_arg(op, _CONV, "dilation", 1), n, 1)
    pad = _arg(op, _CONV, "padding", 0)
    if stride is None or dilation is None:
        return None
    if pad == "valid":
        padding: tuple[int, ...] | None = (0,) * n
    elif pad == "same":  # torch pads the extra position of an odd total after the input
        padding = tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilation))
    else:
        padding = _per_dim(pad, n, 0)
    if padding is None:
        return None
    first = len(shape) - n
    windows = {first + i: Window(kernel[i], stride[i], padding[i], dilation[i]) for i in range(n)}
    return windowed(ref, windows, "convolution", keep=tuple(range(first - 1)))


def _conv_transpose(trace: Trace, op: OpRecord, n: int) -> Geometry | None:
    parent = _first(trace, op)
    weight = _shape(trace, _ref_shape(trace, _arg(op, _CONV_T, "weight")))
    if parent is None or weight is None or len(weight) != n + 2:
        return None
    ref, shape = parent
    stride = _per_dim(_arg(op, _CONV_T, "stride", 1), n, 1)
    padding = _per_dim(_arg(op, _CONV_T, "padding", 0), n, 0)
    dilation = _per_dim(_arg(op, _CONV_T, "dilation", 1), n, 1)
    if stride is None or padding is None or dilation is None:
        return None
    first = len(shape) - n
    windows = {first + i: transposed(weight[2 + i], stride[i], padding[i], dilation[i]) for i in range(n)}
    return windowed(ref, windows, "transposed convolution", keep=tuple(range(first - 1)))


def _pool(trace: Trace, op: OpRecord, n: int, is_max: bool, out: tuple[int, ...]) -> Geometry | None:
    names = _MAX_POOL if is_max else _AVG_POOL
    parent = _first(trace, op)
    kernel = _per_dim(_arg(op, names, "kernel_size"), n, 1)
    if parent is None or kernel is None:
        return None
    stride = _per_dim(_arg(op, names, "stride"), n, 0)
    stride = kernel if stride is None or 0 in stride else stride
    padding = _per_dim(_arg(op, names, "padding", 0), n, 0)
    dilation = _per_dim(_arg(op, names, "dilation", 1), n, 1) if is_max else (1,) * n
    if padding is None or dilation is None:
        return None
    ref, shape = parent
    first = len(shape) - n
    windows = {first + i: Window(kernel[i], stride[i], padding[i], dilation[i]) for i in range(n)}
    return windowed(ref, windows, "max pool" if is_max else "average pool", keep=tuple(range(first)))


def _pool_with_indices(trace: Trace, op: OpRecord, name: str) -> Geometry | None:
    """``max_pool2d(..., return_indices=True)``: both outputs are windows of the input."""
    if not name.startswith("max_pool") or not _arg(op, _MAX_POOL, "return_indices", False):
        return None
    shapes = op.shape if isinstance(op.shape, (tuple, list)) else ()
    out = _shape(trace, shapes[0]) if shapes else None
    plain = _pool(trace, op, int(name[-2]), True, out) if out is not None else None
    if plain is None:
        return None
    link = plain.links[0]
    links = (Link(link.parent, link.dims, out_path=(0,)), Link(link.parent, link.dims, out_path=(1,)))
    return Geometry(plain.kind, links, plain.spatial)


def _adaptive(trace: Trace, op: OpRecord, n: int, out: tuple[int, ...]) -> Geometry | None:
    """Adaptive pooling: windows from the sizes; a dim pooled to one position is global pooling."""
    parent = _first(trace, op)
    if parent is None:
        return None
    ref, shape = parent
    first = len(shape) - n
    spatial = range(first, len(shape))
    if any(out[d] == 1 and shape[d] > 1 for d in spatial):
        return mixing(ref, shape, tuple(spatial), "global pool")
    windows: dict[int, Any] = {d: adaptive(shape[d], out[d]) for d in spatial}
    return windowed(ref, windows, "adaptive pool", keep=tuple(range(first)))


def _interpolate(trace: Trace, op: OpRecord, out: tuple[int, ...]) -> Geometry | None:
    """Nearest-neighbour resizing: output ``o`` reads ``floor(o * in / out)`` (exact for whole-number ratios)."""
    parent = _first(trace, op)
    mode = op.kwargs.get("mode", op.args[3] if len(op.args) > 3 else "nearest")
    if parent is None or mode != "nearest":
        return None
    ref, shape = parent
    windows: dict[int, Any] = {}
    exact = True
    for d in range(2, len(shape)):
        starts = tuple((o * shape[d]) // out[d] for o in range(out[d]))
        windows[d] = Intervals(starts, tuple(s + 1 for s in starts))
        exact = exact and (out[d] % shape[d] == 0 or shape[d] % out[d] == 0)
    geom = windowed(ref, windows, "nearest resize", keep=(0, 1))
    if exact:
        return geom
    return Geometry(geom.kind, (Link(ref, geom.links[0].dims, exact=False),), geom.spatial)


def _pad(trace: Trace, op: OpRecord, out: tuple[int, ...]) -> Geometry | None:
    """Constant padding: ``pad`` gives (before, after) per dim from the last; a window of kernel 1."""
    parent = _first(trace, op)
    pad = op.args[1] if len(op.args) > 1 else op.kwargs.get("pad")
    mode = op.kwargs.get("mode", op.args[2] if len(op.args) > 2 else "constant")
    if parent is None or mode != "constant" or not isinstance(pad, (tuple, list)):
        return None
    ref, shape = parent
    dims: dict[int, tuple[int, Any]] = {d: (d, Window()) for d in range(len(shape))}
    for i in range(len(pad) // 2):
        d = len(shape) - 1 - i
        dims[d] = (d, Window(padding=pad[2 * i]))
    return Geometry("pad", (Link(ref, dims),))


# -- the rest ---------------------------------------------------------------------------------
def _permute(trace: Trace, op: OpRecord) -> Geometry | None:
    parent = _first(trace, op)
    if parent is None:
        return None
    ref, shape = parent
    n = len(shape)
    if op.func_name.strip("_") == "permute":
        dims = (
            op.args[1:]
            if len(op.args) > 2 or (len(op.args) == 2 and isinstance(op.args[1], int))
            else (op.args[1] if len(op.args) > 1 else op.kwargs.get("dims"))
        )
        return permute(ref, tuple(dims)) if dims is not None and len(dims) == n else None
    a: object
    b: object
    if op.func_name.strip("_") == "t":
        a, b = 0, n - 1
    else:
        a, b = (op.args[1], op.args[2]) if len(op.args) > 2 else (None, None)
    if not isinstance(a, int) or not isinstance(b, int):
        return None
    perm = list(range(n))
    perm[a % n], perm[b % n] = perm[b % n], perm[a % n]
    return permute(ref, tuple(perm))


def _cat(trace: Trace, op: OpRecord) -> Geometry | None:
    tensors = op.args[0] if op.args else op.kwargs.get("tensors")
    dim = _arg(op, ("tensors", "dim"), "dim", 0)
    if not isinstance(tensors, (list, tuple)) or not isinstance(dim, int):
        return None
    parents = []
    for ref in tensors:
        shape = _shape(trace, _ref_shape(trace, ref))
        if not isinstance(ref, Ref) or shape is None:
            return None  # an array the trace did not record as an op: its stretch would be unaccounted for
        parents.append((ref, shape))
    return concat(parents, dim)


def _reduce(trace: Trace, op: OpRecord, out: tuple[int, ...]) -> Geometry | None:
    parent = _first(trace, op)
    if parent is None:
        return None
    ref, shape = parent
    axes = op.args[1] if len(op.args) > 1 else op.kwargs.get("dim")
    if isinstance(axes, int):
        axes = (axes,)
    if axes is not None and not (isinstance(axes, (tuple, list)) and all(isinstance(a, int) for a in axes)):
        return None
    keepdim = bool(op.args[2] if len(op.args) > 2 else op.kwargs.get("keepdim", False))
    try:
        return reduce(ref, shape, None if axes is None else tuple(axes), keepdim, len(out))
    except ValueError:  # max(x, y) and friends are pointwise, with another output rank
        return None


def _dense(trace: Trace, op: OpRecord, out: tuple[int, ...]) -> Geometry | None:
    """A dense layer / matrix product: every output reads its input's whole last dim (the batch dims kept)."""
    ref = op.args[1] if op.func_name.strip("_") == "addmm" and len(op.args) > 1 else (op.args[0] if op.args else None)
    shape = _shape(trace, _ref_shape(trace, ref))
    if not isinstance(ref, Ref) or shape is None or len(shape) != len(out):
        return None
    return mixing(ref, shape, (-1,), "dense")


def _norm(trace: Trace, op: OpRecord, name: str) -> Geometry | None:
    parent = _first(trace, op)
    if parent is None:
        return None
    ref, shape = parent
    if name == "layer_norm":
        normalized = op.args[1] if len(op.args) > 1 else op.kwargs.get("normalized_shape")
        count = len(normalized) if isinstance(normalized, (tuple, list)) else 1
        return mixing(ref, shape, tuple(range(len(shape) - count, len(shape))), "layer norm")
    if name == "group_norm":  # statistics over a group of channels and every position
        return mixing(ref, shape, tuple(range(1, len(shape))), "group norm")
    return mixing(ref, shape, tuple(range(2, len(shape))), "instance norm")
