"""Before a primitive of a loaded trace is bound, its abstract evaluation: parameters that disagree are refused.

A file can be hand-made with hashes to match, and an allow-listed primitive is
not safe with any parameters: a ``conv_general_dilated`` given other window
strides, a ``dot_general`` other contracting dimensions or a ``reshape`` other
sizes reach the compiler, which fails with an untyped error deep inside
lowering, or gives a value of another shape. So the primitive is first bound
under :func:`jax.eval_shape`, with a ``jax.ShapeDtypeStruct`` for each array
argument: JAX's own shape rules run there (the ones the real bind runs too),
on shapes and dtypes alone, and compile nothing. If they raise, or the output's
shape is not the recorded one, the op is refused with a :class:`ReplayError`
before anything is compiled or run.

Only loaded traces are checked: a live trace's primitives were bound with
these very parameters in the model's forward.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord
from torchlens_core.replay.checked import PassedChecks, from_file, refused, wrong_shape


def check_loaded(op: OpRecord, args: tuple[Any, ...]) -> None:
    """Refuse ``op``'s bind with these arguments when its trace was loaded and abstract evaluation disagrees."""
    if from_file(op):
        check(op, args)


def check(op: OpRecord, args: tuple[Any, ...]) -> None:
    """Bind ``op.call`` under ``jax.eval_shape``; ReplayError if its shape rule raises or gives another shape.

    A call already seen to pass (the same primitive and parameters, the same argument shapes and dtypes,
    the same recorded shape) passes again without tracing: abstract evaluation sees nothing else, and a
    model repeats the same calls in each of its blocks.
    """
    _PASSED.run(_signature(op, args), lambda: _check(op, args))


_PASSED = PassedChecks()  # calls that passed, by signature (see check)


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


def _weak(value: Any) -> bool:
    """Is ``value`` weakly typed (a Python scalar made an array): dtype promotion and output types depend on it."""
    return bool(getattr(jax.typeof(value), "weak_type", False))


def _signature(op: OpRecord, args: tuple[Any, ...]) -> Any:
    """What the abstract evaluation depends on, hashable; None where some argument or parameter is not."""
    primitive, params = op.call

    def describe(v: Any) -> Any:
        if _is_array(v):
            return ("array", tuple(v.shape), str(v.dtype), _weak(v))
        if type(v) is tuple:
            return (tuple, tuple(describe(x) for x in v))
        return (type(v), v)  # the type too: True == 1 == 1.0, but a shape rule may take them apart

    try:
        key = (
            primitive,
            tuple((k, describe(p)) for k, p in params.items()),
            tuple(describe(a) for a in args),
            op.shape,
        )
        hash(key)
    except TypeError:
        return None
    return key


def _check(op: OpRecord, args: tuple[Any, ...]) -> None:
    """The abstract evaluation itself: raises ReplayError where it disagrees with the arguments or the record."""
    primitive, params = op.call
    where = [i for i, a in enumerate(args) if _is_array(a)]
    specs = [jax.ShapeDtypeStruct(args[i].shape, args[i].dtype, weak_type=_weak(args[i])) for i in where]

    def bind(*arrays: Any) -> Any:
        full = list(args)
        for i, a in zip(where, arrays):
            full[i] = a
        return primitive.bind(*full, **params)

    try:
        out = jax.eval_shape(bind, *specs)
    except Exception as exc:  # noqa: BLE001 - JAX's shape rules raise TypeError, ValueError, IndexError...
        raise refused(
            op, f"its recorded parameters do not fit its arguments ({type(exc).__name__}: {str(exc)[:300]})"
        ) from None
    got = _shape(tuple(out) if primitive.multiple_results else out)
    if got is not None and op.shape is not None and got != tuple(op.shape):
        raise wrong_shape(op, got, "parameters")


def _shape(value: Any) -> Any:
    """``value``'s shape as an op records it (see :func:`torchlens_core.replay.checked.value_shape`); None: no array."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return tuple(value.shape)
    kids = tree.children(value)
    if not kids:
        return None
    return tuple(tuple(v.shape) if isinstance(v, jax.ShapeDtypeStruct) else None for _, v in kids)
