"""``torch.compile`` and the other execution modes a capture meets.

A compiled region (``torch.compile(model)``, a compiled submodule, a function
decorated with ``@torch.compile``) runs code Dynamo generated, which the
recorder's function mode cannot see into: Dynamo fails on the mode, or would
trace it into its graph. While the model runs under capture, torch's own
compiler stance is ``"force_eager"``: every compiled region runs its original
Python, so it is recorded like any other code; nothing is compiled or
recompiled, and the compiled caches are untouched, so the model runs compiled
again after the capture. The stance is process-wide in torch, so it is held
once for all overlapping captures (counted): while any thread captures, other
threads' compiled calls run eagerly too (the same numbers, more slowly).

``torch.compile(m)`` wraps ``m`` in an ``OptimizedModule`` holding it as
``_orig_mod``. The wrapper is not a module of the model: the capture runs it,
but names modules, parameters and buffers as ``m`` has them (``layer1.0.conv1``,
not ``_orig_mod.layer1.0.conv1``), so a trace of ``torch.compile(m)`` is the
trace of ``m``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from torchlens_core.ir.errors import UnsupportedError
from torchlens_torch.restore import until_done

WRAPPED = "_orig_mod"  # the attribute an OptimizedModule holds the compiled module under


def _optimized_module_type() -> type | None:
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # a torch without Dynamo
        return None
    return OptimizedModule


OPTIMIZED_MODULE = _optimized_module_type()


def is_compiled_wrapper(module: Any) -> bool:
    return OPTIMIZED_MODULE is not None and isinstance(module, OPTIMIZED_MODULE)


def public_path(path: str) -> str:
    """A module, parameter or buffer path with the compile wrappers' ``_orig_mod`` segments left out."""
    if WRAPPED not in path:
        return path
    return ".".join(part for part in path.split(".") if part != WRAPPED)


def refuse_unrunnable(model: Any) -> None:
    """Models whose forward does not run as Python: a typed error saying what to trace instead."""
    if isinstance(model, torch.jit.ScriptModule | torch.jit.ScriptFunction):
        raise UnsupportedError(
            "TorchScript modules do not run as Python, so their ops cannot be seen: trace the eager nn.Module instead"
        )
    exported = getattr(getattr(torch, "export", None), "ExportedProgram", None)
    if exported is not None and isinstance(model, exported):
        raise UnsupportedError(
            "a torch.export ExportedProgram is a graph, not a forward that runs as Python: "
            "trace ep.module() instead (a GraphModule whose ops are recorded)"
        )


class _EagerStance:
    """torch's compiler stance ``"force_eager"``, held while at least one capture runs (counted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._held: Any = None  # the stance's context manager, entered by the first user
        self._put_back = self._restore  # bound once: the finally that calls it must not need to allocate it

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
        if set_stance is None:  # torch < 2.6: no stance to take; compiled regions are refused where found
            yield
            return
        with self._lock:
            if not self._users:
                stance = set_stance("force_eager")
                stance.__enter__()
                self._held = stance
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if not self._users:
                    until_done(self._put_back)  # a MemoryError must not leave "force_eager" on for the process

    def _restore(self) -> None:
        """Back to the stance from before the first capture (idempotent: retried after a MemoryError)."""
        held = self._held
        if held is not None:
            held.__exit__(None, None, None)
            self._held = None


eager_stance = _EagerStance()


def check_compiled_support(model: Any) -> None:
    """On a torch without ``set_stance`` a compiled module cannot be made to run its Python: refuse it."""
    if hasattr(getattr(torch, "compiler", None), "set_stance") or OPTIMIZED_MODULE is None:
        return
    modules = model.modules() if isinstance(model, torch.nn.Module) else ()
    if any(is_compiled_wrapper(m) for m in modules):
        raise UnsupportedError(
            f"torch {torch.__version__} has no torch.compiler.set_stance, so a compiled "
            f"module's ops cannot be recorded: trace the module it wraps (model._orig_mod), "
            f"or use torch >= 2.6"
        )
