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
    ``other_inputs(args, kwargs)`` gives a second, different set of inputs for
    the replay-on-new-inputs check; left out, the suite perturbs the float
    arrays slightly and shuffles the integer ones (token ids stay valid ids).
    """

    name: str
    build: Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]
    rtol: float = 1e-5
    check_modules: bool = True
    slow: bool = False
    reset: Callable[[], None] | None = None
    other_inputs: Callable[[tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]] | None = None
