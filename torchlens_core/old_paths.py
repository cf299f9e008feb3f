"""The module paths of TorchLens 0.1, kept as aliases for this release.

Plugins written before the core was grouped into layers import, say,
``torchlens_core.builder`` or ``torchlens_core.records``. Each such path is
an alias of the module's new home: importing it gives that very module (one
module object, so ``isinstance`` checks and module state are shared) and a
``DeprecationWarning`` naming the new path. ``torchlens_core.backend`` and
``torchlens_core.replay`` need no alias: they are packages now that export
what the modules did.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# 0.1 path -> where the module lives now
MOVED = {
    "errors": "ir.errors",
    "tree": "ir.tree",
    "records": "ir.records",
    "trace": "ir.trace",
    "hookspecs": "backend.hookspecs",
    "plugins": "backend.manager",
    "arrays": "backend.arrays",
    "conformance": "backend.cases",
    "api": "capture.api",
    "builder": "capture.builder",
    "policy": "capture.policy",
    "selectors": "capture.selectors",
    "branches": "capture.branches",
    "sites": "capture.sites",
    "audit": "replay.audit",
    "summary": "views.summary",
    "draw": "views.draw",
    "tables": "views.tables",
    "metadata": "views.metadata",
    "flops": "views.flops",
    "hashing": "views.hashing",
    "saving": "store.saving",
    "encoding": "store.encoding",
    "activations": "store.activations",
    "extract": "store.extract",
}
_PREFIX = "torchlens_core."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torchlens_core.<old>`` and loads it as the module at its new path."""

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec | None] = {}  # the moved modules' own specs

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PREFIX) or fullname[len(_PREFIX) :] not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _PREFIX + MOVED[spec.name[len(_PREFIX) :]]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes away in the next release", DeprecationWarning, stacklevel=2
        )
        module = importlib.import_module(new)
        self.specs[new] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran when it was imported at its new path. The import system has just
        # set its __spec__ to the alias's; give it back its own, or reload() and
        # importlib.resources would look for it under the old name.
        module.__spec__ = self.specs[module.__name__]


_ALIAS = _Alias()


def install() -> None:
    if _ALIAS not in sys.meta_path:
        sys.meta_path.append(_ALIAS)
