"""Jitted targets: ``jax.jit(f)``, ``nnx.jit(f)``, ``equinox.filter_jit(f)``, and what they run.

A capture traces the function a jit wrapper runs, never the wrapper: JAX
keeps the trace of a jitted function from an earlier call with the same
shapes, made without the capture's hooks (so without its module calls), and
a wrapper of a model (``nnx.jit(model)``, ``eqx.filter_jit(model)``) is traced
as that model, with its parameters and submodules. The wrapper is still the
target the user gave: the plain call for ``model_output`` and
``audit(untraced=True)`` run it.

Passing a jitted target also accepts jit's contract, which the capture cache
(:mod:`torchlens_jax.capture_cache`) relies on: the function is traced once
per input signature, and what it reads besides its arguments (globals,
closures, a closed-over model's weights) is baked into that trace.
"""

from __future__ import annotations

import functools
import sys
from typing import Any


def jit_inner(target: Any) -> Any | None:
    """The function (or module) a jit wrapper runs; None when ``target`` is no jit wrapper.

    ``jax.jit``, ``flax.nnx.jit`` and ``equinox.filter_jit``; a
    ``functools.partial`` of one is the partial of what it runs.
    """
    if isinstance(target, functools.partial):
        inner = jit_inner(target.func)
        return None if inner is None else functools.partial(inner, *target.args, **target.keywords)
    if _wrapper_kind(target) is None:
        return None
    return target.__wrapped__  # each keeps what it wraps there (equinox's own ``fn`` is only its name)


def unjitted(target: Any) -> Any:
    """What ``target`` runs once every jit wrapper around it is taken off (``target`` itself if none)."""
    while True:
        inner = jit_inner(target)
        if inner is None:
            return target
        target = inner


def is_jitted(target: Any) -> bool:
    """Is ``target`` a jit wrapper (or a partial of one)? Cheaper than :func:`jit_inner`: equinox rebuilds
    the function it wraps each time it is asked for it."""
    while isinstance(target, functools.partial):
        target = target.func
    return _wrapper_kind(target) is not None


def is_frozen_wrapper(target: Any) -> bool:
    """Is ``target`` a jit wrapper that cannot change after it is made (``equinox.filter_jit``'s, an equinox
    Module holding the function it runs as arrays and static parts)? Not a partial."""
    return _wrapper_kind(target) == "equinox"


def _wrapper_kind(target: Any) -> str | None:
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    global _PJIT
    if _PJIT is None:
        _PJIT = type(jax.jit(_identity))  # jaxlib's PjitFunction, which has no public name
    if isinstance(target, _PJIT):
        return "jax"
    nnx = sys.modules.get("flax.nnx.transforms.compilation")
    if nnx is not None and isinstance(target, getattr(nnx, "JitWrapped", ())):
        return "nnx"
    eqx_jit = sys.modules.get("equinox._jit")
    if eqx_jit is not None and isinstance(target, getattr(eqx_jit, "_JitWrapper", ())):
        return "equinox"
    return None


_PJIT: type | None = None


def _identity(x: Any) -> Any:
    return x
