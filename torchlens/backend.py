"""What a backend plugin imports: the one namespace for plugin authors (``from torchlens.backend import ...``).

Users import ``torchlens``; a framework plugin, built in or third party,
needs the names below and nothing else from TorchLens. They live in the
private package ``torchlens_core``, whose module paths may move between
versions: these names do not without a CHANGELOG entry ("For plugin
authors") and a version of warnings first (the plugin contract,
``CONTRACT_VERSION``). docs/writing-a-backend.md builds a backend from zero
on them, and ``plugins/torchlens-numpy`` is written on them alone.

The contract
    ``Backend`` (the base class whose methods a plugin implements),
    ``BackendInfo`` (what it says about itself), ``CAPABILITIES`` (the
    capability names it may declare), ``CONTRACT_VERSION``, ``lazy`` (a
    method imported on first use, so the plugin module never imports its
    framework), ``hooks_of`` (an instance's methods as a module's hooks),
    ``backend_named`` (the backend called a name, whose methods the core
    calls), ``hookimpl`` (for plugins written as plain pluggy hooks), ``Case`` (a
    model and inputs of the conformance zoo).
Recording
    ``TraceBuilder`` (what a capture hands each op to; ``Recording``, what it
    gives under ``tl.record``), ``CaptureOptions``,
    ``HaltCapture``, ``Recorder`` (the per-op duties every backend shares:
    module passes, pass-throughs, copies before in-place writes, edits),
    ``WrappedRecorder`` with ``dispatch`` and ``plain_leaf`` (for
    frameworks whose arrays can be subclassed or wrapped),
    ``Conversions`` and ``PythonValue`` (the Python conversions of a
    wrapper array, and the call of an op whose value is a Python number),
    ``PassThroughs`` (values a module returned without computing them),
    ``BranchTracker`` (data-dependent branches),
    ``CallSites`` (the user's code sites), ``MethodCall``, ``CallNames``,
    ``identifier`` and ``replay_written`` (names of recorded calls and the
    replay of a call that wrote into an argument), ``Routed`` (a patched
    function that records only inside its own capture).
Records
    ``Trace``, ``OpRecord``, ``ParamRecord``, ``ModuleRecord``,
    ``ModulePass``, ``Ref`` and ``ParamRef`` (what an op's arguments point
    at), ``tree`` (mapping over nested arguments).
Replay and arrays
    ``Observe`` and ``interpret`` (op-by-op replay), ``ArrayOps`` and
    ``NumpyArrayOps`` (the array operations interventions need),
    ``numpy_error`` and ``max_error`` (comparing replayed values).
FLOPs
    ``OpCall``, ``Count``, ``Formula`` and the formula builders
    ``elementwise``, ``reduction``, ``zero``, ``contraction``,
    ``matmul_macs``, ``conv_macs``, ``einsum_count``, ``pool``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker sees; at run time each name is imported when first used
    from torchlens_core.backend.array_ops import ArrayOps, NumpyArrayOps
    from torchlens_core.backend.arrays import max_error, numpy_error
    from torchlens_core.backend.base import Backend, hooks_of, lazy
    from torchlens_core.backend.cases import Case
    from torchlens_core.backend.hookspecs import hookimpl
    from torchlens_core.backend.manager import CAPABILITIES, CONTRACT_VERSION, BackendInfo, backend_named
    from torchlens_core.capture.branches import BranchTracker
    from torchlens_core.capture.builder import Recording, TraceBuilder
    from torchlens_core.capture.calls import CallNames, MethodCall, identifier, replay_written
    from torchlens_core.capture.conversions import Conversions, PythonValue
    from torchlens_core.capture.edits import PassThroughs
    from torchlens_core.capture.policy import CaptureOptions, HaltCapture
    from torchlens_core.capture.recorder import Recorder
    from torchlens_core.capture.routed import Routed
    from torchlens_core.capture.sites import CallSites
    from torchlens_core.capture.wrapped import WrappedRecorder, dispatch, plain_leaf
    from torchlens_core.ir import tree
    from torchlens_core.ir.records import ModulePass, ModuleRecord, OpRecord, ParamRecord, ParamRef, Ref
    from torchlens_core.ir.trace import Trace
    from torchlens_core.replay.evaluator import Observe, interpret
    from torchlens_core.views.flops import (
        Count,
        Formula,
        OpCall,
        contraction,
        conv_macs,
        einsum_count,
        elementwise,
        matmul_macs,
        pool,
        reduction,
        zero,
    )

# name -> the module that defines it: a plugin module imports only what it uses (never NumPy, say, with
# `from torchlens.backend import Backend, lazy`: the plugin module must stay cheap to load)
_HOMES = {
    "ArrayOps": "torchlens_core.backend.array_ops",
    "NumpyArrayOps": "torchlens_core.backend.array_ops",
    "max_error": "torchlens_core.backend.arrays",
    "numpy_error": "torchlens_core.backend.arrays",
    "Backend": "torchlens_core.backend.base",
    "hooks_of": "torchlens_core.backend.base",
    "lazy": "torchlens_core.backend.base",
    "Case": "torchlens_core.backend.cases",
    "hookimpl": "torchlens_core.backend.hookspecs",
    "BackendInfo": "torchlens_core.backend.manager",
    "CAPABILITIES": "torchlens_core.backend.manager",
    "CONTRACT_VERSION": "torchlens_core.backend.manager",
    "backend_named": "torchlens_core.backend.manager",
    "BranchTracker": "torchlens_core.capture.branches",
    "Recording": "torchlens_core.capture.builder",
    "TraceBuilder": "torchlens_core.capture.builder",
    "CallNames": "torchlens_core.capture.calls",
    "MethodCall": "torchlens_core.capture.calls",
    "identifier": "torchlens_core.capture.calls",
    "replay_written": "torchlens_core.capture.calls",
    "Conversions": "torchlens_core.capture.conversions",
    "PythonValue": "torchlens_core.capture.conversions",
    "PassThroughs": "torchlens_core.capture.edits",
    "CaptureOptions": "torchlens_core.capture.policy",
    "HaltCapture": "torchlens_core.capture.policy",
    "Recorder": "torchlens_core.capture.recorder",
    "Routed": "torchlens_core.capture.routed",
    "CallSites": "torchlens_core.capture.sites",
    "WrappedRecorder": "torchlens_core.capture.wrapped",
    "dispatch": "torchlens_core.capture.wrapped",
    "plain_leaf": "torchlens_core.capture.wrapped",
    "tree": "torchlens_core.ir.tree",  # the module itself
    "ModulePass": "torchlens_core.ir.records",
    "ModuleRecord": "torchlens_core.ir.records",
    "OpRecord": "torchlens_core.ir.records",
    "ParamRecord": "torchlens_core.ir.records",
    "ParamRef": "torchlens_core.ir.records",
    "Ref": "torchlens_core.ir.records",
    "Trace": "torchlens_core.ir.trace",
    "Observe": "torchlens_core.replay.evaluator",
    "interpret": "torchlens_core.replay.evaluator",
    "Count": "torchlens_core.views.flops",
    "Formula": "torchlens_core.views.flops",
    "OpCall": "torchlens_core.views.flops",
    "contraction": "torchlens_core.views.flops",
    "conv_macs": "torchlens_core.views.flops",
    "einsum_count": "torchlens_core.views.flops",
    "elementwise": "torchlens_core.views.flops",
    "matmul_macs": "torchlens_core.views.flops",
    "pool": "torchlens_core.views.flops",
    "reduction": "torchlens_core.views.flops",
    "zero": "torchlens_core.views.flops",
}

__all__ = [
    "CAPABILITIES",
    "CONTRACT_VERSION",
    "ArrayOps",
    "Backend",
    "BackendInfo",
    "backend_named",
    "BranchTracker",
    "CallNames",
    "CallSites",
    "CaptureOptions",
    "Case",
    "Conversions",
    "Count",
    "Formula",
    "HaltCapture",
    "MethodCall",
    "ModulePass",
    "ModuleRecord",
    "NumpyArrayOps",
    "Observe",
    "OpCall",
    "OpRecord",
    "PassThroughs",
    "ParamRecord",
    "ParamRef",
    "PythonValue",
    "Recorder",
    "Recording",
    "Ref",
    "Routed",
    "Trace",
    "TraceBuilder",
    "WrappedRecorder",
    "contraction",
    "conv_macs",
    "dispatch",
    "einsum_count",
    "elementwise",
    "hookimpl",
    "hooks_of",
    "identifier",
    "interpret",
    "lazy",
    "matmul_macs",
    "max_error",
    "numpy_error",
    "plain_leaf",
    "pool",
    "reduction",
    "replay_written",
    "tree",
    "zero",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'torchlens.backend' has no attribute {name!r}")
    module = importlib.import_module(home)
    value = module if home.endswith("." + name) else getattr(module, name)
    globals()[name] = value  # found once; later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
