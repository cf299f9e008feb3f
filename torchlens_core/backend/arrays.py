"""Comparing values of any backend, through its array hooks."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torchlens_core.backend.manager import hook
from torchlens_core.ir import tree


def array_info_of(backend: str) -> Callable[[Any], Any]:
    """``torchlens_array_info(backend=backend, value=...)`` as a one-argument function, for calls over many leaves.

    The hook call walks every plugin through pluggy, a few microseconds a value, which a capture pays on every
    leaf of the model's arguments (a linen model's variables are hundreds). The function calls the same
    implementations in the hook's order, first answer wins, but leaves out the built-in-style plugins that
    answer for another backend only (a :class:`~torchlens_core.backend.base.Backend` of another name, with the
    base class's hook) and calls a matching one's ``array_info`` directly. A hook wrapper, if any plugin
    registered one, gets the plain hook call.
    """
    from torchlens_core.backend.base import Backend

    caller = hook().torchlens_array_info
    impls = list(reversed(caller.get_hookimpls()))  # pluggy calls the last registered first
    if any(getattr(impl, "hookwrapper", False) or getattr(impl, "wrapper", False) for impl in impls):
        return lambda value: caller(backend=backend, value=value)
    answering: list[Callable[[Any], Any]] = []
    for impl in impls:
        plugin = impl.plugin
        if isinstance(plugin, Backend) and type(plugin).torchlens_array_info is Backend.torchlens_array_info:
            if plugin.name == backend:
                answering.append(plugin.array_info)
            continue
        answering.append(_keyword_call(impl.function, impl.argnames, backend))
    if len(answering) == 1:
        return answering[0]

    def first(value: Any) -> Any:
        for answer in answering:
            found = answer(value)
            if found is not None:
                return found
        return None

    return first


def _keyword_call(function: Callable[..., Any], argnames: tuple[str, ...], backend: str) -> Callable[[Any], Any]:
    """A raw hook implementation called as pluggy would, with the arguments it declares."""
    fixed = {"backend": backend} if "backend" in argnames else {}
    if "value" in argnames:
        return lambda value: function(value=value, **fixed)
    return lambda value: function(**fixed)


def is_array_of(backend: str) -> Callable[[Any], bool]:
    """A predicate: is a value an array of ``backend``?"""
    info = array_info_of(backend)
    return lambda value: info(value) is not None


def max_error(backend: str, actual: Any, expected: Any) -> float:
    """Largest ``|a - e| / (1 + |e|)`` over the array leaves of two structures; inf if they differ in form."""
    is_array = is_array_of(backend)
    a = [v for _, v in tree.leaves(actual, is_array)]
    e = [v for _, v in tree.leaves(expected, is_array)]
    if len(a) != len(e):
        return math.inf
    error = hook().torchlens_array_error
    return max((error(backend=backend, actual=x, expected=y) for x, y in zip(a, e)), default=0.0)


def numpy_error(a: Any, e: Any, exact_integers: bool = True) -> float:
    """``max |a - e| / (1 + |e|)`` of two NumPy arrays of one shape and dtype, for array_error hooks.

    Booleans and strings are equal or not (0 or inf), and so are integers
    unless ``exact_integers`` is False. Floats (and those integers) are widened
    to float64 first (no overflow or unsigned wrap-around; bfloat16 and other
    extension types become a type NumPy computes with), complex stays complex.
    NaNs must sit in the same places, and equal infinities count as equal.
    """
    import numpy as np  # not at import: loading a backend plugin must not load NumPy

    if a.dtype.kind in ("biuOSUmM" if exact_integers else "bOSUmM"):
        return 0.0 if np.array_equal(a, e) else math.inf
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    a, e = a.astype(wide), e.astype(wide)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        return math.inf
    if a.size == 0:
        return 0.0
    same = (a == e) | nan_a
    if same.all():
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(same, 0.0, np.abs(a - e) / (1.0 + np.abs(e)))
    worst = float(np.max(err))
    return worst if not math.isnan(worst) else math.inf
