"""torchlens_core: the framework-neutral heart of TorchLens. It never imports a framework.

Layered bottom to top; each layer imports only the ones below it:

    ir/        the data a trace is: records, Trace, tree helpers, typed errors
    backend/   the contract with framework plugins: hook specs, plugin manager, Backend base class
    capture/   tl.trace / tl.record / tl.pluck, the TraceBuilder, save= / halt= policy, selectors
    replay/    the evaluator and the audit
    views/     summary, drawing, tables, metadata, FLOPs, hashing: read-only views of a trace
    store/     tl.save / tl.load and dataset extraction

The names below load their layer on first use, so that importing one layer
(``import torchlens_core.ir``) loads nothing above it. Users import
``torchlens``; plugin authors import from ``torchlens_core.backend`` and
``torchlens_core.capture``.
"""

from __future__ import annotations

import importlib
from typing import Any

from torchlens_core import old_paths

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(
        (
            "ArchitectureChanged",
            "BackendNotFoundError",
            "CaptureError",
            "ExtractError",
            "GraphvizNotFoundError",
            "LabelNotFoundError",
            "ReplayError",
            "TorchLensError",
            "TraceFileError",
            "UnsupportedError",
        ),
        "torchlens_core.ir.errors",
    ),
    **dict.fromkeys(
        ("CodeLocation", "ModulePass", "ModuleRecord", "OpRecord", "ParamRecord", "ParamRef", "Ref"),
        "torchlens_core.ir.records",
    ),
    "Trace": "torchlens_core.ir.trace",
    "Backend": "torchlens_core.backend.base",
    "BackendInfo": "torchlens_core.backend.manager",
    "backends": "torchlens_core.backend.manager",
    "hookimpl": "torchlens_core.backend.hookspecs",
    "Case": "torchlens_core.backend.cases",
    **dict.fromkeys(("Recording", "TraceBuilder"), "torchlens_core.capture.builder"),
    **dict.fromkeys(
        ("Selector", "followed_by", "func", "in_module", "label", "module", "preceded_by", "where"),
        "torchlens_core.capture.selectors",
    ),
    **dict.fromkeys(("AuditReport", "Finding"), "torchlens_core.replay.audit"),
    "register_flops": "torchlens_core.views.flops",
    **dict.fromkeys(("assert_unchanged", "structural_hash"), "torchlens_core.views.hashing"),
    **dict.fromkeys(("load", "save"), "torchlens_core.store.saving"),
    **dict.fromkeys(("Activations", "extract_dataset"), "torchlens_core.store.extract"),
}

__all__ = sorted(_EXPORTS)

old_paths.install()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchlens_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once; later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
