"""The plugin manager, and finding backends by name.

Backends, the built-in ones included, are found through the entry-point group
``torchlens.backends``; nothing here knows any framework by name.
"""

from __future__ import annotations

import functools
import importlib.metadata
import warnings
from typing import Any

import attrs
import pluggy

from torchlens_core.backend import hookspecs
from torchlens_core.ir.errors import BackendNotFoundError

ENTRY_POINT_GROUP = "torchlens.backends"

# Capability names a backend may declare (BackendInfo.capabilities):
#   "modules"      module containment and passes are recorded
#   "functions"    plain functions can be traced
#   "in_place"     in-place ops are recorded and saved values protected from them
#   "random"       random ops replay exactly (RNG state is recorded)
#   "control_flow" data-dependent branches and loops are recorded as they ran
#   "save"         honours save=: holds no reference to a value the builder dropped
#   "halt"         honours halt=: lets HaltCapture through, cleaning up on the way
#   "branches"     ops inside data-dependent branches name the values that decided them (op.conditions)
#   "timing"       ops record the time their call took (op.elapsed)
#   "intervene"    honours intervene=: op outputs (and module outputs, with "modules") edited live,
#                  the edited value what later ops see; answers torchlens_array_ops
#   "splice"       tl.splice_module: a module call replaced by another callable
#   "new_inputs"   every conversion of a recorded value to a Python value is reported (TraceBuilder.to_python),
#                  so trace.replay(*new_inputs) can check the graph still holds
#   "gradients"    honours save_grads= and answers torchlens_backward: trace.log_backward(loss) gives the loss's
#                  gradient at each selected op's output, the inputs and the parameters
#   "escape_detector"  honours escape_detector="shadow": the framework's kernels are watched beside the capture,
#                  and compute no recorded op accounts for is listed in trace.notes["escapes"]
CAPABILITIES = (
    "modules",
    "functions",
    "in_place",
    "random",
    "control_flow",
    "save",
    "halt",
    "branches",
    "timing",
    "intervene",
    "splice",
    "new_inputs",
    "gradients",
    "escape_detector",
)


@attrs.frozen
class BackendInfo:
    """What a backend plugin says about itself."""

    name: str
    framework: str
    install: str  # the command that installs this backend and its framework
    aliases: tuple[str, ...] = ()
    capabilities: frozenset[str] = frozenset()
    # The version of the plugin contract the backend is written for (CONTRACT_VERSION when it was written):
    # a rule added in a later version warns (PluginContractWarning) until the plugin declares that version.
    contract: int = 1

    @property
    def framework_version(self) -> str | None:
        """Installed version of the framework (read from package metadata, no import)."""
        return _installed_version(self.framework)

    @property
    def available(self) -> bool:
        return self.framework_version is not None


@functools.cache
def _installed_version(distribution: str) -> str | None:
    # Metadata lookups cost about 0.1 ms each; every tl.trace resolves a backend.
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# Entry points that failed to load, with the reason: one broken plugin must not
# take the other backends down with it.
broken_plugins: dict[str, str] = {}


# The plugin contract's version: what TorchLens holds a backend to (CHANGELOG.md, "For plugin authors").
#   1: the hooks, TraceBuilder and the conformance suite as in TorchLens 0.1.
#   2: TraceBuilder refuses (CaptureError) a record tl.load would refuse; under contract 1 it warns and
#      tl.save refuses the trace, so that a trace that saves always loads.
#   3: the conformance suite checks the behaviours every backend with a capability must have (interventions'
#      helpers, module sites, splices, refusals and array operations; gradients of selected ops, of loaded traces
#      and through edits; replay's refusals and loaded traces on new inputs; FLOP coverage). Under an earlier
#      contract a failure of those checks warns (PluginContractWarning) and is reported xfailed.
CONTRACT_VERSION = 3


def contract_of(name: str) -> int:
    """The contract version backend ``name`` declares (1 for a name no installed plugin has)."""
    return next((info.contract for info in backend_infos() if info.name == name), 1)


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every installed backend loaded."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None:
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except MemoryError:
            # Transient: this function's result is cached for the life of the process, and a manager
            # cached without the backend would refuse every later capture, memory or not. Raising
            # leaves nothing cached, so the next call loads every plugin again.
            raise
        except Exception as exc:  # noqa: BLE001 - reported, not hidden
            broken_plugins[ep.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"TorchLens backend plugin {ep.name!r} ({ep.value}) failed to load: {exc}", RuntimeWarning, stacklevel=2
            )
    pm.check_pending()
    return pm


def hook() -> Any:
    return plugin_manager().hook


# The registered plugins and what they said: every tl.trace resolves a backend, and asking each plugin again
# cost about 20 µs of a small jitted model's capture. A plugin registered or unregistered later is a new list.
_INFOS: tuple[list[tuple[str, Any]], tuple[BackendInfo, ...]] | None = None


def backend_infos() -> list[BackendInfo]:
    """Every registered backend, available or not, sorted by name."""
    global _INFOS
    pm = plugin_manager()
    registered = pm.list_name_plugin()
    known = _INFOS
    if known is None or not _same_plugins(known[0], registered):
        known = _INFOS = (registered, tuple(sorted(pm.hook.torchlens_backend_info(), key=lambda info: info.name)))
    return list(known[1])


def _same_plugins(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] is y[1] for x, y in zip(a, b))


def backends() -> list[dict[str, Any]]:
    """Installed backends: name, framework and its version, availability, capabilities."""
    return [
        {
            "name": i.name,
            "aliases": list(i.aliases),
            "framework": i.framework,
            "version": i.framework_version,
            "available": i.available,
            "capabilities": sorted(i.capabilities),
            "install": i.install,
        }
        for i in backend_infos()
    ]


def resolve_backend(name: str) -> BackendInfo:
    """The backend called ``name`` (or one of its aliases), with its framework installed."""
    infos = backend_infos()
    for info in infos:
        if name == info.name or name in info.aliases:
            if not info.available:
                raise BackendNotFoundError(
                    f"backend {info.name!r} needs {info.framework}, which is not installed: {info.install}"
                )
            return info
    if name in broken_plugins:
        raise BackendNotFoundError(f"backend plugin {name!r} is installed but failed to load: {broken_plugins[name]}")
    listed = ", ".join(f"{i.name} ({'ready' if i.available else i.install})" for i in infos) or "none"
    raise BackendNotFoundError(
        f"no backend named {name!r}. Registered backends: {listed}. A third-party backend "
        f"registers itself under the entry-point group {ENTRY_POINT_GROUP!r}."
    )


def claim_backend(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The backend that claims ``target`` (first claim wins), or None."""
    return hook().torchlens_claim(target=target, args=args, kwargs=kwargs)
