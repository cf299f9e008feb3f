"""Before an op of a loaded trace runs, Paddle's own shape inference on it: arguments that disagree are refused.

A file can be hand-made with hashes to match, and an allow-listed C op is not
safe with any arguments: a ``conv2d`` given strides of another length or a
``reshape`` given other sizes reaches the eager op, whose InferMeta is the only
thing between the arguments and the kernel. So the op is first built in a
scratch static program (PIR) on ``paddle.static.data`` placeholders of its
tensor arguments' shapes and dtypes: building a static op runs the op's
InferMeta and no kernel. If InferMeta refuses the arguments, or the output's
shape is not the recorded one, the op is refused with a :class:`ReplayError`
before the eager op sees them.

Static building needs this thread out of dygraph mode. ``paddle.enable_static``
would also set the module-level tracer every thread started later copies, so
the switch here is made on this thread's own state alone (its thread-local
``global_var`` and C++ tracer) and undone in a ``finally``: other threads keep
running eagerly. The scratch program does go through Paddle's process-wide
current program and insertion point; the checks take a lock around them, and a
thread building a static program of its own (``paddle.jit.to_static``) at the
same moment is not guarded against.

Only loaded traces are checked: a live trace's ops ran with these very
arguments in the model's forward. Not checked, and run as before
(LIMITATIONS.md): ops without a static version (``linear``, ``_legacy_C_ops``),
Tensor methods other than the operators (``clone``, ``to``, ``copy_``...),
calls with no dense tensor argument, ints past int64 (Paddle's parser leaves
an ``OverflowError`` pending, which crashes a static build), errors static
inference gives other than its argument checks (a type it cannot take, an op
it cannot build), and the output dimensions it leaves unknown (``nonzero``,
boolean-mask indexing). Static inference is also more lenient than the
runtime one in places (``conv2d``'s ``groups``): those arguments still meet
the eager op's own InferMeta.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import paddle
from paddle import Tensor
from paddle.base import core, framework

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord
from torchlens_core.replay.checked import PassedChecks, from_file, refused, wrong_shape
from torchlens_paddle.capture import drop_scratch
from torchlens_paddle.intercept import TENSOR_DUNDERS


def check_loaded(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse ``op``'s call with these arguments when its trace was loaded and static inference disagrees."""
    if from_file(op):
        check(op, args, kwargs)


def check(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Build ``op.call`` in a scratch static program; ReplayError if InferMeta refuses it or gives another shape.

    A call already seen to pass (the same op, the same argument shapes and dtypes, the same constants of
    the same types, the same recorded shape) passes again without a program: static inference sees
    nothing else, and a model repeats the same calls in each of its blocks.
    """
    builder = _static_twin(_unwrapped(op.call))
    if builder is None:
        return
    _PASSED.run(_signature(op, args, kwargs), lambda: _check(op, builder, args, kwargs))


_PASSED = PassedChecks()  # calls that passed, by signature (see check)
_LOCK = threading.Lock()  # one scratch program at a time: Paddle's current program is process-wide
_CONSTANTS = frozenset({int, float, bool, str, type(None), complex})
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _unwrapped(call: Any) -> Any:
    """The C op itself: a loaded trace's C ops are wrapped, one wrapper per op, in an argument count check."""
    return getattr(call, "__wrapped__", call)


@functools.cache
def _static_ops() -> frozenset[str]:
    """The C ops that have a static (PIR) version: only these can be built in a scratch program."""
    import paddle._pir_ops as pir_ops

    return frozenset(n for n in dir(pir_ops) if not n.startswith("_"))


@functools.cache
def _static_twin(call: Any) -> Callable[..., Any] | None:
    """What builds ``call`` in a static program: the C op itself (it dispatches on the thread's mode), the
    ``pir.Value`` operator of a Tensor operator; None where there is none."""
    name = getattr(call, "__name__", None)
    if not isinstance(name, str):
        return None
    if name in _static_ops() and _unwrapped(getattr(paddle._C_ops, name, None)) is call:
        return call
    if name in TENSOR_DUNDERS and _unwrapped(Tensor.__dict__.get(name)) is call:
        return getattr(paddle.pir.Value, name, None)
    return None


def _signature(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What static inference depends on, hashable; None where some argument is not plain enough to say."""

    def describe(v: Any) -> Any:
        t = type(v)
        if isinstance(v, Tensor):
            if not v.is_dense():
                raise TypeError
            return ("tensor", tuple(v.shape), str(v.dtype))
        if t in _CONSTANTS or isinstance(v, paddle.dtype):
            return (t, v)  # the type too: True == 1 == 1.0, but an attribute's kind may take them apart
        if isinstance(v, core.Place):
            return (core.Place, str(v))
        if t is tuple or t is list:
            return (t, tuple(describe(x) for x in v))
        if t is dict:
            return (t, tuple((k, describe(x)) for k, x in v.items()))
        if t is slice:  # an index (x[:, 1:4])
            return (t, describe(v.start), describe(v.stop), describe(v.step))
        if v is Ellipsis:
            return (t, v)
        raise TypeError

    try:
        key = (_unwrapped(op.call), op.shape, op.meta.get("scratch"), describe(args), describe(kwargs))
        hash(key)
    except TypeError:
        return None
    return key


@contextmanager
def _static_on_this_thread() -> Iterator[None]:
    """This thread out of dygraph mode, no other: its thread-local tracer unset, the module-level one kept.

    ``global_var`` is a ``threading.local``, and the C++ tracer ``_switch_tracer`` sets is the thread's own;
    assigning ``global_var._dygraph_tracer_`` would also set the module-level tracer that threads started
    meanwhile copy, so the thread-local attribute is written directly.
    """
    state = framework.global_var
    tracer = state._dygraph_tracer_
    state.__dict__["_dygraph_tracer_"] = None
    core._switch_tracer(None)
    try:
        yield
    finally:
        state.__dict__["_dygraph_tracer_"] = tracer
        core._switch_tracer(tracer)


def _check(op: OpRecord, builder: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Static inference itself: returns where it cannot be made, raises ReplayError where it disagrees."""
    tensors: list[Tensor] = []

    def collect(v: Any) -> Any:
        if isinstance(v, Tensor):
            if not v.is_dense():
                raise _Unchecked
            tensors.append(v)
        elif type(v) is int and not _INT64[0] <= v <= _INT64[1]:
            # Paddle's argument parser takes such an int as -1 and leaves Python's OverflowError set; the eager op
            # then fails on the -1, but building a static op calls back into Python to record the call stack, and
            # with the error pending that crashes the process (SIGSEGV)
            raise _Unchecked
        return v

    try:
        tree.map_leaves(collect, (args, kwargs))
    except _Unchecked:
        return  # sparse or distributed tensors: no placeholder for them; ints past int64
    if not tensors or not framework.global_var._use_pir_api_:
        return  # a factory (paddle.zeros); or the old static IR, whose ops C functions do not build
    with _LOCK, _static_on_this_thread():
        main = paddle.static.Program()
        with paddle.static.program_guard(main, paddle.static.Program()):
            made: dict[int, Any] = {}  # one placeholder per tensor, however often it is passed (x * x)

            def placeholder(v: Any) -> Any:
                if not isinstance(v, Tensor):
                    return v
                if id(v) not in made:
                    made[id(v)] = paddle.static.data(f"arg{len(made)}", list(v.shape), v.dtype)
                return made[id(v)]

            try:
                # without an out= tensor: static ops ignore it (Paddle logs a warning), and infer the same shape
                static_args = tree.map_leaves(placeholder, args)
                static_kwargs = tree.map_leaves(placeholder, {k: v for k, v in kwargs.items() if k != "out"})
            except Exception:  # noqa: BLE001 - a dtype static placeholders cannot take: run as before
                return
            try:
                out = builder(*static_args, **static_kwargs)
            except (ValueError, IndexError) as exc:  # Paddle's InvalidArgument and OutOfRange
                text = str(exc)
                if "(position " in text:
                    return  # the binding's own argument conversion: the eager call makes it too, before any kernel
                raise refused(
                    op, f"its recorded arguments do not fit together ({type(exc).__name__}: {text[:300]})"
                ) from None
            except Exception:  # noqa: BLE001 - what static building cannot do (a type, an op): run as before
                return
            scratch = op.meta.get("scratch")
            if scratch and isinstance(out, (tuple, list)):
                out = drop_scratch(out, scratch)
            # read inside the guard: a Value outlives its program only as a dangling pointer
            got = _shape(out)
    if got is not None and op.shape is not None and not _fits(got, tuple(op.shape)):
        raise wrong_shape(op, tuple(got) if isinstance(got, list) else got, "arguments")


class _Unchecked(Exception):
    """An argument static building cannot take: a tensor with no placeholder (sparse, distributed), an int
    past int64."""


def _shape(value: Any) -> Any:
    """``value``'s shape as an op records it, -1 for a dimension static inference leaves unknown; a list for a
    structure (one entry per element, None for no Value); None: no Value at all."""
    if isinstance(value, paddle.pir.Value):
        return tuple(value.shape)
    kids = tree.children(value)
    if not kids:
        return None
    return [tuple(v.shape) if isinstance(v, paddle.pir.Value) else None for _, v in kids]


def _fits(got: Any, recorded: tuple[Any, ...]) -> bool:
    """Does the inferred shape fit the recorded one: the same rank, and every dimension it knows the same.
    One Value where a structure was recorded, or the reverse, or a structure of another length, is left to
    the check after the call (a static op may return more, or otherwise, than the eager one)."""
    structure = any(r is None or isinstance(r, (tuple, list)) for r in recorded)
    if isinstance(got, list):
        if not structure or len(got) != len(recorded):
            return True
        return all(g is None or r is None or _fits(g, tuple(r)) for g, r in zip(got, recorded))
    if structure:
        return True
    return len(got) == len(recorded) and all(g == -1 or g == r for g, r in zip(got, recorded))
