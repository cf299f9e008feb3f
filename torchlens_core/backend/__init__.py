"""The contract between the core and a framework plugin.

The hook specs (:mod:`.hookspecs`, every hook documented where it is
declared), the plugin manager that finds backends through the
``torchlens.backends`` entry-point group (:mod:`.manager`), the
:class:`Backend` base class that turns plain methods into hooks
(:mod:`.base`), array helpers that dispatch through the hooks
(:mod:`.arrays`) and the conformance :class:`Case` (:mod:`.cases`).
A third-party backend needs nothing else from the core but the
:class:`~torchlens_core.capture.builder.TraceBuilder`.
"""

from torchlens_core.backend.arrays import max_error, numpy_error
from torchlens_core.backend.base import Backend, lazy
from torchlens_core.backend.cases import Case
from torchlens_core.backend.hookspecs import hookimpl
from torchlens_core.backend.manager import BackendInfo, backends, hook

__all__ = ["Backend", "BackendInfo", "Case", "backends", "hook", "hookimpl", "lazy", "max_error", "numpy_error"]
