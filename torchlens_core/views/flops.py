"""FLOPs and MACs per op: formulas looked up by backend and function name.

A formula sees an op as an :class:`OpCall` (its arguments with every array
replaced by an :class:`ArraySpec`, and its output shape) and returns
``(flops, macs)``, or None when it cannot tell for this call. An op with no
formula, or whose formula returns None, has unknown FLOPs (None), never zero.

Conventions: a multiply-accumulate is one MAC and two FLOPs; ``macs`` counts
only the multiply-accumulates of contractions (convolutions, matmuls,
attention); elementwise ops, normalizations, pooling and reductions count
FLOPs and no MACs; ops that only move or view data count zero.

Backends supply their tables through the ``torchlens_flop_formulas`` hook.
Users add or override formulas with :func:`register_flops`; a registration
for one backend wins over one for every backend, which wins over the
backend's own table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.ir import tree
from torchlens_core.ir.records import ParamRef, Ref, shape_at

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace


@attrs.frozen(slots=True)
class ArraySpec:
    """An array argument as a formula sees it."""

    shape: tuple[int, ...]
    dtype: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@attrs.frozen(slots=True)
class OpCall:
    """One op's call for a FLOP formula: arrays as ArraySpecs, everything else as it ran."""

    func_name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out_shape: Any

    def arg(self, position: int, name: str | None = None, default: Any = None) -> Any:
        """The argument passed by ``name`` or at ``position``, else ``default``."""
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return self.args[position] if position < len(self.args) else default

    @property
    def inputs(self) -> list[ArraySpec]:
        """Every array argument, positional then keyword, in order."""
        found = tree.leaves((self.args, self.kwargs), lambda x: isinstance(x, ArraySpec))
        return [leaf for _, leaf in found]

    @property
    def first_out_shape(self) -> tuple[int, ...]:
        """The first output's shape, for ops that return several (batch norm with its statistics...)."""
        shapes = _shapes(self.out_shape)
        return shapes[0] if shapes else ()

    @property
    def out_numel(self) -> int:
        """Elements of the output (of every output, for ops returning several)."""
        return sum(math.prod(s) for s in _shapes(self.out_shape))


Count = tuple[float, float]
Formula = Callable[[OpCall], "Count | None"]

_USER: dict[tuple[str | None, str], Formula] = {}
_BACKEND_TABLES: dict[str, dict[str, Formula]] = {}


def register_flops(func_name: str, formula: Formula | None = None, *, backend: str | None = None) -> Any:
    """Register ``formula(call) -> (flops, macs) | None`` for ops named ``func_name``.

    ``backend=None`` applies to every backend. Usable as a decorator::

        @tl.register_flops("my_fused_op", backend="torch")
        def my_fused_op(call):
            return 3 * call.out_numel, 0

    Traces compute FLOPs when first asked, so a formula registered after a
    capture still counts for that trace, unless its counts were already read.
    """
    if not isinstance(func_name, str) or not func_name:
        raise TypeError(f"register_flops needs the op's function name as a string, not {func_name!r}")

    def add(f: Formula) -> Formula:
        if not callable(f):
            raise TypeError(f"a FLOP formula must be callable (call) -> (flops, macs) | None, not {f!r}")
        _USER[(backend, func_name)] = f
        return f

    return add if formula is None else add(formula)


def formula_for(backend: str, func_name: str) -> Formula | None:
    found = _USER.get((backend, func_name)) or _USER.get((None, func_name))
    if found is not None:
        return found
    table = _BACKEND_TABLES.get(backend)
    if table is None:
        from torchlens_core.backend.manager import backend_named

        table = _BACKEND_TABLES[backend] = backend_named(backend, missing_ok=True).flop_formulas() or {}
    return table.get(func_name)


def op_call(trace: Trace, op: OpRecord) -> OpCall:
    """``op`` as a formula sees it: recorded arrays and parameters become ArraySpecs."""

    def spec(leaf: Any) -> Any:
        if isinstance(leaf, Ref):
            src = trace.ops[leaf.index]
            shape = shape_at(src.shape, leaf.path)
            return ArraySpec(tuple(shape), src.dtype) if shape is not None else None
        if isinstance(leaf, ParamRef):
            p = trace.params.get(leaf.name)
            return ArraySpec(tuple(p.shape), p.dtype) if p is not None else None
        shape = getattr(leaf, "shape", None)  # an array from outside the trace, kept as a constant
        if shape is not None and hasattr(leaf, "dtype") and not isinstance(leaf, type):
            try:
                return ArraySpec(tuple(int(d) for d in shape), str(leaf.dtype))
            except (TypeError, ValueError):
                return leaf
        return leaf

    return OpCall(op.func_name, _converted(op.args, spec), _converted(op.kwargs, spec), op.shape)


def _converted(x: Any, spec: Callable[[Any], Any]) -> Any:
    """``x`` with ``spec`` applied to each leaf; plain containers only (arguments are tuples, lists and dicts).
    Module-level: a closure calling itself is a reference cycle, and this one would hold the trace."""
    t = type(x)
    if t is tuple or t is list:
        return t(_converted(v, spec) for v in x)
    if t is dict:
        return {k: _converted(v, spec) for k, v in x.items()}
    return spec(x)


def count(trace: Trace, op: OpRecord) -> tuple[float | None, float | None]:
    """``(flops, macs)`` of one op; ``(None, None)`` when unknown."""
    if op.kind != "op":
        return 0.0, 0.0
    if op.meta.get("identity"):
        return 0.0, 0.0
    formula = formula_for(trace.backend, op.func_name)
    if formula is None:
        return None, None
    # A formula is a function of the call it is shown, and the ops of a model's repeated layers show it the
    # same call: each distinct call is counted once per trace (the key holds the formula, so one registered
    # later is asked anew). A call with an unhashable constant is counted on its own.
    try:
        key = (formula, op.func_name, _key(op.args, trace), _key(op.kwargs, trace), op.shape)
        found = trace._costs.get(key)
    except (TypeError, ValueError):  # not hashable, or not comparable
        return _counted(formula, op_call(trace, op))
    if found is None:
        found = trace._costs[key] = _counted(formula, op_call(trace, op))
    return found


def _counted(formula: Formula, call: OpCall) -> tuple[float | None, float | None]:
    try:
        found = formula(call)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError):
        # A formula meeting a call form it does not know: unknown, not a failed trace.
        return None, None
    if found is None:
        return None, None
    flops, macs = found
    return float(flops), float(macs)


def _key(x: Any, trace: Trace) -> Any:
    """What :func:`op_call` makes of ``x``, as a hashable key: an array as its shape and dtype, a constant as
    its type and itself (``1`` and ``1.0`` are one dict key, and may not be one call to a formula)."""
    t = type(x)
    if t is tuple or t is list:
        return (t, *[_key(v, trace) for v in x])
    if t is dict:
        return (t, *[(k, _key(v, trace)) for k, v in x.items()])
    if t is Ref:
        src = trace.ops[x.index]
        return (t, shape_at(src.shape, x.path), src.dtype)
    if t is ParamRef:
        p = trace.params.get(x.name)
        return (t, None) if p is None else (t, p.shape, p.dtype)
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # an array kept as a constant: op_call's ArraySpec
        raise TypeError("an array constant: counted on its own")
    return (t, x)


# -- building blocks for backend tables -----------------------------------------------------
def _shapes(shape: Any) -> list[tuple[int, ...]]:
    if shape is None:
        return []
    if shape and all(isinstance(d, int) for d in shape) or shape == ():
        return [tuple(shape)]
    return [s for item in shape for s in _shapes(item)]


def zero(call: OpCall) -> Count:
    """Ops that only move, view or create data."""
    return 0, 0


def elementwise(per_element: float = 1) -> Formula:
    """``per_element`` FLOPs for each output element (add, relu, exp...)."""
    return lambda call: (per_element * call.out_numel, 0)


def reduction(per_element: float = 1) -> Formula:
    """``per_element`` FLOPs for each element of the (first) input (sum, mean, max...)."""
    return lambda call: (per_element * call.inputs[0].numel, 0)


def matmul_macs(a: Sequence[int], b: Sequence[int]) -> int:
    """MACs of ``a @ b`` with NumPy's broadcasting and 1-D rules."""
    a, b = tuple(a), tuple(b)
    if len(a) == 1:
        a = (1, *a)
    if len(b) == 1:
        b = (*b, 1)
    batch = _broadcast(a[:-2], b[:-2])
    return math.prod(batch) * a[-2] * a[-1] * b[-1]


def contraction(macs: int, extra_flops: float = 0) -> Count:
    """A contraction of ``macs`` multiply-accumulates, plus ``extra_flops`` (a bias, say)."""
    return 2 * macs + extra_flops, macs


def conv_macs(out_shape: Sequence[int], kernel_numel: int, out_channels: int) -> int:
    """MACs of a convolution: each output element takes ``kernel_numel / out_channels`` of them."""
    return math.prod(out_shape) * kernel_numel // out_channels


def einsum_count(equation: str, shapes: Sequence[Sequence[int]]) -> Count:
    """Contracting operands pairwise, left to right; one operand is a sum (FLOPs, no MACs)."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms: list[str] = []
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), shapes, strict=True):
        if "..." in term:  # the ellipsis' dims, named by their distance from the right so that they broadcast
            head, tail = term.split("...")
            n = len(shape) - len(head) - len(tail)
            term = head + "".join(chr(0x100 + k) for k in reversed(range(n))) + tail
        for label, size in zip(term, shape, strict=True):
            sizes[label] = max(sizes.get(label, 1), size)
        terms.append(term)
    ellipsis = "".join(sorted((c for c in sizes if ord(c) >= 0x100), reverse=True))
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:  # implicit output: the ellipsis, then the labels used once, sorted
        counts = "".join(terms)
        out = ellipsis + "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and ord(c) < 0x100))
    if len(terms) == 1:
        return math.prod(shapes[0]), 0
    macs, current = 0, terms[0]
    for i, term in enumerate(terms[1:], start=1):
        both = set(current) | set(term)
        macs += math.prod(sizes[c] for c in both)
        later = set(out).union(*terms[i + 1 :])
        current = "".join(c for c in both if c in later)
    return contraction(macs)


def pool(kernel: int | Sequence[int]) -> Formula:
    """``prod(kernel)`` FLOPs for each output element (max / average pooling)."""
    k = math.prod(kernel) if isinstance(kernel, Sequence) else kernel
    return lambda call: (k * call.out_numel, 0)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b))


# -- shared conventions ---------------------------------------------------------------------
# FLOPs per element of ops most frameworks name alike: per output element for elementwise ops
# (transcendentals count one; activations their textbook arithmetic: sigmoid = negate, exp, add,
# divide), per input element for reductions. Backend tables start from COMMON, so one model
# counts alike in every framework, and add their own names.
_ELEMENTWISE_COSTS = {
    1: "add sub subtract mul multiply div divide true_divide floor_divide remainder mod fmod pow maximum minimum "
    "atan2 copysign lerp rsub neg abs sign exp exp2 expm1 log log2 log10 log1p sqrt rsqrt square reciprocal "
    "sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh erf floor ceil round trunc clip clamp relu "
    "relu6 hardtanh leaky_relu eq ne lt le gt ge and or xor invert logical_and logical_or logical_xor "
    "logical_not bitwise_and bitwise_or bitwise_xor bitwise_not isnan isinf isfinite",
    2: "prelu hardshrink softshrink logit",
    3: "hardsigmoid elu celu selu softplus softsign",
    4: "sigmoid hardswish",
    5: "silu swish mish",
    8: "gelu",
}
_REDUCTION_COSTS = {
    1: "sum mean max min amax amin prod argmax argmin any all cumsum cumprod",
    3: "logsumexp",
}
COMMON: dict[str, Formula] = {
    **{name: elementwise(cost) for cost, names in _ELEMENTWISE_COSTS.items() for name in names.split()},
    **{name: reduction(cost) for cost, names in _REDUCTION_COSTS.items() for name in names.split()},
}
