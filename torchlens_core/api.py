"""tl.trace() and tl.backends(): the entry points users call."""

from __future__ import annotations

import gc
from typing import Any

from torchlens_core.errors import CaptureError, UnsupportedError
from torchlens_core.plugins import backends, claim_backend, hook, resolve_backend
from torchlens_core.trace import Trace

__all__ = ["backends", "trace"]


def trace(model: Any, *args: Any, backend: str | None = None, **kwargs: Any) -> Trace:
    """Run ``model(*args, **kwargs)`` once and record every operation it executes.

    Positional and keyword inputs go to the model exactly as given. ``backend``
    names the framework (``"torch"``, ``"jax"``, ...); left out, the backend whose
    framework owns the model or its inputs is used.
    """
    if not callable(model):
        raise UnsupportedError(f"tl.trace needs a model or function to call, got {type(model).__name__}")
    if backend is None:
        backend = claim_backend(model, args, kwargs)
        if backend is None:
            raise UnsupportedError(
                f"no installed backend recognises {type(model).__name__} or its inputs; pass backend= "
                f"(installed: {', '.join(b['name'] for b in backends() if b['available']) or 'none'})")
    info = resolve_backend(backend)
    # Capture allocates many small, acyclic records; the cyclic GC walking the
    # whole heap over and over while they pile up cost more than the capture.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = hook().torchlens_capture(backend=info.name, target=model, args=args, kwargs=kwargs)
    finally:
        if gc_was_enabled:
            gc.enable()
    if result is None:
        raise CaptureError(f"backend {info.name!r} registered no capture hook")
    return result
