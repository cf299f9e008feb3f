"""The plugin manager, and finding backends by name.

Backends, the built-in ones included, are found through the entry-point group
``torchlens.backends``; nothing here knows any framework by name.

Dispatch: pluggy keeps discovery, registration and the hooks that ask every
plugin (``torchlens_backend_info``, ``torchlens_claim``,
``torchlens_batched_loader``). A request to one backend (every hook taking
``backend=``) goes to :func:`backend_named`, which finds the plugin that
serves that name and returns it as a typed
:class:`~torchlens_core.backend.base.Backend`: the plugin itself when it is a
``Backend`` instance (or a module exporting one's hooks, ``hooks_of``), else a
:class:`~torchlens_core.backend.adapter.HookBackend` calling that plugin's own
raw hook implementations. Nothing is required of plugin authors: the hook
specs, raw-hook plugins and ``Backend`` subclasses work as before; what
changes is that only the plugin serving a name is asked, never every plugin.
"""

from __future__ import annotations

import functools
import importlib.metadata
import warnings
from typing import Any

import attrs
import pluggy

from torchlens_core.backend import hookspecs
from torchlens_core.backend.adapter import HookBackend
from torchlens_core.backend.base import Backend
from torchlens_core.ir.errors import BackendNotFoundError

ENTRY_POINT_GROUP = "torchlens.backends"

# The hooks that act on one backend (they take its name as ``backend=``): the core calls them through
# backend_named, never through pluggy. The others ask every plugin.
PER_BACKEND_HOOKS = frozenset(
    name
    for name in dir(hookspecs)
    if name.startswith("torchlens_") and "backend" in getattr(hookspecs, name).__code__.co_varnames
)

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
#   4: TraceBuilder gives ops their labels when the capture finishes, not at add_op (unless intervene=, save=,
#      halt=, a save_grads= selector or save_to= reads them as the forward runs); a backend that reads a label
#      while capturing calls TraceBuilder.name_ops() first. Under an earlier contract ops are named as they are
#      added, with a PluginContractWarning.
CONTRACT_VERSION = 4


def contract_of(name: str) -> int:
    """The contract version backend ``name`` declares (1 for a name no installed plugin has)."""
    return next((info.contract for info in backend_infos() if info.name == name), 1)


class _PluginManager(pluggy.PluginManager):
    """pluggy's manager, forgetting the backends found by name whenever a plugin comes or goes."""

    def register(self, plugin: object, name: str | None = None) -> str | None:
        try:
            return super().register(plugin, name)
        finally:
            _forget_backends()

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any | None:
        try:
            return super().unregister(plugin, name)
        finally:
            _forget_backends()


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every installed backend loaded."""
    pm = _PluginManager(hookspecs.PROJECT)
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


# What the registered plugins said: every tl.trace resolves a backend, and asking each plugin again cost about
# 20 µs of a small jitted model's capture. Forgotten when a plugin is registered or unregistered (_forget_backends).
_INFOS: tuple[BackendInfo, ...] | None = None


def backend_infos() -> list[BackendInfo]:
    """Every registered backend, available or not, sorted by name."""
    global _INFOS
    known = _INFOS
    if known is None:
        infos = plugin_manager().hook.torchlens_backend_info()
        known = _INFOS = tuple(sorted(infos, key=lambda info: info.name))
    return list(known)


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


# Backends found by name (aliases included), cleared when a plugin is registered or unregistered: a backend is
# looked up for every value some paths touch, and finding one asks every plugin who it is.
_BY_NAME: dict[str, Backend] = {}
_BY_PLUGIN: dict[int, Backend] = {}  # the same object for a backend's name and its aliases
_MISSING: dict[str, Backend] = {}  # backend_named(..., missing_ok=True) of names no plugin serves


def _forget_backends() -> None:
    global _INFOS
    _INFOS = None
    _BY_NAME.clear()
    _BY_PLUGIN.clear()
    _MISSING.clear()


def backend_named(name: str, missing_ok: bool = False) -> Backend:
    """The backend called ``name`` (or one of its aliases), as a typed :class:`Backend`, installed framework or not.

    The plugin whose ``torchlens_backend_info`` names it, else the plugin registered under ``name``.
    A ``Backend`` instance is returned as it is; a plugin of raw hook implementations through a
    :class:`HookBackend`. ``missing_ok``: for a name no plugin serves (a trace loaded from a file
    written where another backend was installed), a backend answering None to everything, as the
    pluggy hooks did, instead of BackendNotFoundError.
    """
    found = _BY_NAME.get(name)
    if found is None:
        plugin = _plugins_by_name().get(name)
        if plugin is None:
            plugin = plugin_manager().get_plugin(name)
        if plugin is None:
            if not missing_ok:
                resolve_backend(name)  # raises, saying what is installed
                raise BackendNotFoundError(f"no backend plugin serves the name {name!r}")
            missing = _MISSING.get(name)
            if missing is None:
                missing = _MISSING[name] = HookBackend(name, {})
            return missing
        found = _BY_PLUGIN.get(id(plugin))
        if found is None:
            found = _BY_PLUGIN[id(plugin)] = _as_backend(name, plugin)
        _BY_NAME[name] = found
    return found


def _plugins_by_name() -> dict[str, object]:
    """Each backend name and alias, to the plugin that said so (a name said twice: the plugin pluggy asks first)."""
    found: dict[str, object] = {}
    # get_hookimpls lists the implementations in the reverse of the order pluggy calls them
    for impl in reversed(plugin_manager().hook.torchlens_backend_info.get_hookimpls()):
        if impl.hookwrapper or impl.wrapper:
            continue
        info = impl.function()
        if isinstance(info, BackendInfo):
            for key in (info.name, *info.aliases):
                found.setdefault(key, impl.plugin)
    return found


def _as_backend(name: str, plugin: object) -> Backend:
    instance = _instance_of(plugin)
    # The base class's hooks only call the method of their name: the instance's methods answer instead (no
    # deprecated shim). A per-backend hook of the plugin's own (a subclass's override, or a module's function
    # beside an instance's hooks) keeps answering: such a plugin is called through the adapter, hook by hook.
    own = {h: impl for h, impl in _impls_of(plugin).items() if instance is None or not _is_base_hook(impl, instance)}
    if instance is not None and not own.keys() & PER_BACKEND_HOOKS:
        return instance
    name = next((info.name for info in backend_infos() if name in (info.name, *info.aliases)), name)
    return HookBackend(name, own, plugin_manager().hook, fallback=instance)


def _is_base_hook(impl: pluggy.HookImpl, instance: Backend) -> bool:
    """Is ``impl`` the base class's hook of ``instance``, which only calls the method of the same name?"""
    function = impl.function
    return getattr(function, "__self__", None) is instance and getattr(function, "__func__", None) is getattr(
        Backend, function.__name__, None
    )


def _instance_of(plugin: object) -> Backend | None:
    """The Backend behind a plugin: the plugin itself, or the instance whose bound hooks a module exports."""
    if isinstance(plugin, Backend):
        return plugin
    bound = getattr(getattr(plugin, "torchlens_backend_info", None), "__self__", None)
    return bound if isinstance(bound, Backend) else None


def _impls_of(plugin: object) -> dict[str, pluggy.HookImpl]:
    """``plugin``'s own implementation of each hook, by hook name."""
    relay = plugin_manager().hook
    found: dict[str, pluggy.HookImpl] = {}
    for hook_name in dir(relay):
        caller = getattr(relay, hook_name)
        if not hook_name.startswith("torchlens_") or not isinstance(caller, pluggy.HookCaller):
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin:
                found[hook_name] = impl
    return found


def claim_backend(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The backend that claims ``target`` (first claim wins), or None."""
    return hook().torchlens_claim(target=target, args=args, kwargs=kwargs)
