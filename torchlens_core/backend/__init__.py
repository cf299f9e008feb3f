"""The contract between the core and a framework plugin.

The hook specs (:mod:`.hookspecs`, every hook documented where it is
declared), the plugin manager that finds backends through the
``torchlens.backends`` entry-point group (:mod:`.manager`), the
:class:`Backend` base class that turns plain methods into hooks
(:mod:`.base`), :func:`backend_named` (the backend of a name, called through
its typed methods; raw-hook plugins through :mod:`.adapter`), array helpers
(:mod:`.arrays`) and the conformance :class:`Case` (:mod:`.cases`).
A third-party backend needs nothing else from the core but the
:class:`~torchlens_core.capture.builder.TraceBuilder`.
"""

from torchlens_core.backend.arrays import max_error, numpy_error
from torchlens_core.backend.base import Backend, lazy
from torchlens_core.backend.cases import Case
from torchlens_core.backend.hookspecs import hookimpl
from torchlens_core.backend.manager import BackendInfo, backend_named, backends, hook

__all__ = [
    "Backend",
    "BackendInfo",
    "Case",
    "backend_named",
    "backends",
    "hook",
    "hookimpl",
    "lazy",
    "max_error",
    "numpy_error",
]
