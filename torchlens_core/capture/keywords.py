"""Keywords of ``tl.trace``: TorchLens's own options, and those that would otherwise reach the model.

``tl.trace(model, x, **kwargs)`` hands every keyword it does not know to the
model, so a TorchLens option it does not take, or a misspelt one
(``sav=``), would surface as the model's ``TypeError: forward() got an
unexpected keyword argument``. :func:`check_model_keywords` catches that
before the forward runs: a keyword the model cannot take that is, or is
close to, a TorchLens option is a typed error naming the option.
"""

from __future__ import annotations

import difflib
import inspect
import threading
import warnings
from typing import Any

import attrs

from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.ir.errors import ArgumentTypeError, shown

# Every keyword tl.trace takes for itself (the rest go to the model).
TRACE_OPTIONS = (
    "backend",
    "save",
    "halt",
    "lookback",
    "lookback_payload_policy",
    "intervene",
    "intervention_ready",
    "save_grads",
    "capture",
    "escape_detector",
    "save_to",
    "patch_policy",
)
RECORD_OPTIONS = ("backend", "save", "halt")


def _accepted(model: Any) -> tuple[set[str], bool] | None:
    """The keywords ``model(...)`` takes, and whether it takes any (``**kwargs``); None when unknown."""
    target = getattr(model, "forward", model) if not inspect.isfunction(model) else model
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # builtins, C extensions: the model will say
        return None
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind == p.VAR_KEYWORD for p in parameters)


def check_model_keywords(
    model: Any, kwargs: dict[str, Any], entry: str = "tl.trace", taken: tuple[str, ...] = TRACE_OPTIONS
) -> None:
    """Refuse a keyword the model does not take that is (or looks like) a TorchLens option."""
    if not kwargs:
        return
    accepted = _accepted(model)
    if accepted is None or accepted[1]:
        return
    for name in kwargs:
        if name in accepted[0]:
            continue
        if name in TRACE_OPTIONS:  # an option this entry point does not take
            raise ArgumentTypeError(
                f"{entry} does not take {name}= (a tl.trace option), and the model does not "
                f"either; use tl.trace(model, *inputs, {name}=...)"
            )
        close = difflib.get_close_matches(name, taken, n=1, cutoff=0.7)
        if close:
            raise ArgumentTypeError(
                f"{name}= is not an option of {entry}, and the model does not take it (it would "
                f"have gone to the model): did you mean {entry}'s {close[0]}=? Keywords "
                f"{entry} does not know are passed to the model"
            )


def merged_options(keywords: CaptureOptions, given: CaptureOptions | None) -> CaptureOptions:
    """``capture=`` and the plain keywords together: each option from whichever set it; both, only if equal."""
    if given is None:
        return keywords
    if not isinstance(given, CaptureOptions):
        raise ArgumentTypeError(
            f"capture= takes a tl.options.CaptureOptions, not {type(given).__name__} ({shown(given)})"
        )
    defaults = CaptureOptions()
    changes: dict[str, Any] = {}
    for field in attrs.fields(CaptureOptions):
        mine, theirs = getattr(keywords, field.name), getattr(given, field.name)
        if mine == getattr(defaults, field.name) or mine == theirs:
            continue
        if theirs != getattr(defaults, field.name):
            raise ArgumentTypeError(
                f"{field.name}= is given twice, as a keyword ({shown(mine)}) and in capture= "
                f"({shown(theirs)}): give it once"
            )
        changes[field.name] = mine
    return attrs.evolve(given, **changes) if changes else given


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """A DeprecationWarning shown once per process (options kept for old scripts that do nothing now)."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, DeprecationWarning, stacklevel=3)


PATCH_POLICY = (
    "patch_policy= is accepted and ignored: the torch backend intercepts through a function mode, which "
    "sees every call (names bound before the capture, `from torch import relu`, included) without "
    "patching torch, and the other backends choose their interception themselves"
)
