"""Comparing values of any backend, through its array methods."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torchlens_core.backend.base import direct
from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError


def array_info_of(backend: str) -> Callable[[Any], Any]:
    """``backend``'s ``array_info`` as a one-argument function, for calls over many leaves.

    The backend's own method (:func:`~torchlens_core.backend.manager.backend_named`), called directly: a
    capture pays it on every leaf of the model's arguments (a linen model's variables are hundreds). A name
    no plugin serves answers None, as the hook did.
    """
    return direct(backend_named(backend, missing_ok=True).array_info)


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
    error = backend_named(backend, missing_ok=True).array_error
    worst = 0.0
    for x, y in zip(a, e):
        found = error(x, y)
        if found is None:
            raise UnsupportedError(f"the {backend} backend cannot compare its arrays (it has no array_error)")
        worst = max(worst, found)
    return worst


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
