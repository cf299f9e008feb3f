"""What a backend's conformance zoo is made of (the suite itself lives in ``conformance/``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class Case:
    """One model of a backend's zoo.

    ``build()`` returns ``(model, args, kwargs)`` with random weights and nothing
    downloaded; it is called afresh for each test. ``rtol`` bounds the relative
    error allowed between the trace's output and the model's own.
    """

    name: str
    build: Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]
    rtol: float = 1e-5
    check_modules: bool = True
    slow: bool = False
    reset: Callable[[], None] | None = None
