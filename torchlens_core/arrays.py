"""Comparing values of any backend, through its array hooks."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torchlens_core import tree
from torchlens_core.plugins import hook


def is_array_of(backend: str) -> Callable[[Any], bool]:
    """A predicate: is a value an array of ``backend``?"""
    info = hook().torchlens_array_info
    return lambda value: info(backend=backend, value=value) is not None


def max_error(backend: str, actual: Any, expected: Any) -> float:
    """Largest ``|a - e| / (1 + |e|)`` over the array leaves of two structures; inf if they differ in form."""
    is_array = is_array_of(backend)
    a = [v for _, v in tree.leaves(actual, is_array)]
    e = [v for _, v in tree.leaves(expected, is_array)]
    if len(a) != len(e):
        return math.inf
    error = hook().torchlens_array_error
    return max((error(backend=backend, actual=x, expected=y) for x, y in zip(a, e)), default=0.0)
