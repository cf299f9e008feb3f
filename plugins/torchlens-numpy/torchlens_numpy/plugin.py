"""The numpy backend's hook implementations. Importing this module does not import NumPy.

Registered by this distribution's entry point ``torchlens.backends: numpy``,
exactly as any third-party backend is; it uses only TorchLens's public core.

This plugin is the template for a new backend (docs/writing-a-backend.md):
copy the distribution, rename the package and ``NAME`` (here and in
capture.py), and replace the NumPy parts. Each hook below says what it is
for. Every hook that acts on one backend receives its name and must return
None for any other (pluggy asks every plugin; the first answer wins), and
imports its framework only inside: TorchLens imports this module for every
listing of backends, with or without the framework installed.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.backend.hookspecs import hookimpl
from torchlens_core.backend.manager import BackendInfo

NAME = "numpy"  # the name users pass as backend= (rename it in capture.py too)


# Who this backend is: its name, the distribution whose installed version makes it available (read from
# package metadata, nothing imported), the command that installs it, and what it honours (tl.trace refuses
# an option, save= or intervene= say, whose capability is not declared; manager.CAPABILITIES lists them all).
@hookimpl
def torchlens_backend_info() -> BackendInfo:
    # NumPy is a dependency of torchlens itself; this plugin is its own distribution.
    return BackendInfo(contract=2, name=NAME, framework="numpy", install="pip install torchlens-numpy",
                       # "intervene" at op sites; no "splice": plain functions have no module calls to replace.
                       # "new_inputs": every conversion of a Tracked array to a Python value is reported.
                       capabilities=frozenset({"functions", "in_place", "random", "control_flow", "save", "halt",
                                               "timing", "intervene", "new_inputs"}))


# tl.compare: this framework's op names that the built-in equivalence table lacks. Optional.
@hookimpl
def torchlens_op_classes(backend: str) -> dict[str, list[str]] | None:
    # NumPy's names that tl.compare's built-in equivalence table does not know.
    if backend != NAME:
        return None
    return {"matmul": ["vdot", "inner"], "concat": ["hstack", "vstack", "dstack"]}


# tl.trace(model, x) without backend=: say whether the target or its inputs belong to this framework,
# from sys.modules and types only (a framework not imported yet cannot own anything).
@hookimpl
def torchlens_claim(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    # Never: every framework's users pass NumPy arrays around, so owning a call because
    # its inputs are ndarrays would steal it from the backend that should trace it.
    # Ask for this backend by name: tl.trace(fn, x, backend="numpy").
    return None


# tl.trace: run the model once, recording every op into a TraceBuilder, and return builder.finish().
# Leave nothing patched, whatever happens (capture.py's finally). The heart of a backend.
@hookimpl
def torchlens_capture(backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      options: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.capture import capture

    return capture(target, args, kwargs, options)


# op.flops / op.macs: {func_name: formula} over shapes and constants. Optional (unknown without).
@hookimpl
def torchlens_flop_formulas(backend: str) -> dict[str, Any] | None:
    if backend != NAME:
        return None
    from torchlens_numpy.flops import FORMULAS

    return FORMULAS


# trace.replay() and trace.audit(): every op's value again, by index. interpret() walks the graph and calls
# run_op per op; a backend sets up its framework around it (here: copies of the inputs, the RNG put back).
@hookimpl
def torchlens_replay_graph(backend: str, trace: Any, observe: Any) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_numpy.replay import replay_graph

    return replay_graph(trace, observe)


# One recorded op run on resolved arguments: the fallback when torchlens_replay_graph answers None.
@hookimpl
def torchlens_replay_op(backend: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.replay import run_op

    return run_op(op, args, kwargs)


# (shape, dtype name, device name) of one of this framework's arrays, None for anything else. Everything that
# reads values (the audit, tables, saving) asks this first.
@hookimpl
def torchlens_array_info(backend: str, value: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import array_info

    return array_info(value)


# A NumPy copy of one array, for comparisons, metrics and the audit's lost-edge check.
@hookimpl
def torchlens_to_numpy(backend: str, value: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import to_numpy

    return to_numpy(value)


# max |a - e| / (1 + |e|) between two arrays (inf for another shape or dtype): how every parity check compares.
@hookimpl
def torchlens_array_error(backend: str, actual: Any, expected: Any) -> float | None:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import array_error

    return array_error(actual, expected)


# With the "intervene" capability: the array operations the steering helpers use (zeros, means, copies...).
@hookimpl
def torchlens_array_ops(backend: str) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import ARRAY_OPS

    return ARRAY_OPS


# The model zoo the conformance suite runs (pytest --torchlens-backend numpy): a list of Case (zoo.py).
@hookimpl
def torchlens_conformance_cases(backend: str) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_numpy.zoo import cases

    return cases()


# With the "modules" capability: run the model with the framework's own module hooks, independently of the
# capture, and return {"path:pass": output copy}; the suite compares them with the trace's module outputs.
@hookimpl
def torchlens_observe_module_outputs(backend: str, target: Any, args: tuple[Any, ...],
                                     kwargs: dict[str, Any]) -> dict[str, Any] | None:
    if backend != NAME:
        return None
    return {}  # plain functions have no modules


# tl.save: JSON naming op.call, so that a loaded trace can replay (None: the op loads as not replayable).
@hookimpl
def torchlens_encode_call(backend: str, op: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.saving import encode_call

    return encode_call(op.call)


# tl.extract_dataset: one batch from same-shaped unbatched samples, stacked along a new leading axis. The core
# checks shapes and dtypes first; the other frameworks' samples a dataset yields (a NumPy array for a JAX model)
# reach the model through torchlens_from_numpy, so here every sample is already an ndarray.
@hookimpl
def torchlens_stack(backend: str, samples: list[Any]) -> Any:
    if backend != NAME:
        return None
    import numpy as np

    return np.stack(samples)


# tl.load: the call encode_call named, looked up among allow-listed namespaces only (the file may be hostile).
# Not implemented here, because NumPy arrays need no conversion: torchlens_encode_array / torchlens_from_numpy
# (arrays of another framework in a file), torchlens_encode_value / torchlens_decode_value (framework constants
# such as dtypes in calls), torchlens_detach (autograd), and the optional
# torchlens_geometry, torchlens_facets, torchlens_compat, torchlens_backward, torchlens_reference_grads:
# docs/writing-a-backend.md lists them all, with what each needs.
@hookimpl
def torchlens_decode_call(backend: str, data: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.saving import decode_call

    return decode_call(data)
