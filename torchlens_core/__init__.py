"""torchlens_core: the framework-neutral heart of TorchLens. It never imports a framework.

Layered bottom to top (ir, backend, capture, replay, steer, grads, fields,
views, compare, ranks, store, viewer); each layer imports only the ones
below it. docs/concepts.md, "Where things live", is the map of every module.

This package is private: its module paths may move between versions. Users
import ``torchlens``; plugin authors import ``torchlens.backend``. The names
below are the ones this package exported before that namespace existed: each
still loads (its layer on first use) with a ``DeprecationWarning`` naming its
public home, and goes in 0.2 (CHANGELOG.md, "For plugin authors").
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# name this package exported -> the module that defines it
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

__all__: list[str] = []  # private: nothing is exported for `from torchlens_core import *`


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchlens_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    public = importlib.import_module("torchlens.backend")
    home = "torchlens.backend" if getattr(public, name, None) is value else "torchlens"
    # warned on every access (not cached in globals): each old import site is told once per warnings filter
    warnings.warn(
        f"torchlens_core.{name} is private and goes in TorchLens 0.2: import {name} from {home}",
        DeprecationWarning,
        stacklevel=2,
    )
    return value
