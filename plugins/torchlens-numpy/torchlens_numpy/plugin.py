"""The numpy backend's hook implementations. Importing this module does not import NumPy.

Registered by this distribution's entry point ``torchlens.backends: numpy``,
exactly as any third-party backend is; it uses only TorchLens's public core.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.backend.hookspecs import hookimpl
from torchlens_core.backend.manager import BackendInfo

NAME = "numpy"


@hookimpl
def torchlens_backend_info() -> BackendInfo:
    # NumPy is a dependency of torchlens itself; this plugin is its own distribution.
    return BackendInfo(name=NAME, framework="numpy", install="pip install torchlens-numpy",
                       # "intervene" at op sites; no "splice": plain functions have no module calls to replace.
                       # "new_inputs": every conversion of a Tracked array to a Python value is reported.
                       capabilities=frozenset({"functions", "in_place", "random", "control_flow", "save", "halt",
                                               "timing", "intervene", "new_inputs"}))


@hookimpl
def torchlens_op_classes(backend: str) -> dict[str, list[str]] | None:
    # NumPy's names that tl.compare's built-in equivalence table does not know.
    if backend != NAME:
        return None
    return {"matmul": ["vdot", "inner"], "concat": ["hstack", "vstack", "dstack"]}


@hookimpl
def torchlens_claim(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    # Never: every framework's users pass NumPy arrays around, so owning a call because
    # its inputs are ndarrays would steal it from the backend that should trace it.
    # Ask for this backend by name: tl.trace(fn, x, backend="numpy").
    return None


@hookimpl
def torchlens_capture(backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      options: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.capture import capture

    return capture(target, args, kwargs, options)


@hookimpl
def torchlens_flop_formulas(backend: str) -> dict[str, Any] | None:
    if backend != NAME:
        return None
    from torchlens_numpy.flops import FORMULAS

    return FORMULAS


@hookimpl
def torchlens_replay_graph(backend: str, trace: Any, observe: Any) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_numpy.replay import replay_graph

    return replay_graph(trace, observe)


@hookimpl
def torchlens_replay_op(backend: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.replay import run_op

    return run_op(op, args, kwargs)


@hookimpl
def torchlens_array_info(backend: str, value: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import array_info

    return array_info(value)


@hookimpl
def torchlens_to_numpy(backend: str, value: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import to_numpy

    return to_numpy(value)


@hookimpl
def torchlens_array_error(backend: str, actual: Any, expected: Any) -> float | None:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import array_error

    return array_error(actual, expected)


@hookimpl
def torchlens_array_ops(backend: str) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.arrays import ARRAY_OPS

    return ARRAY_OPS


@hookimpl
def torchlens_conformance_cases(backend: str) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_numpy.zoo import cases

    return cases()


@hookimpl
def torchlens_observe_module_outputs(backend: str, target: Any, args: tuple[Any, ...],
                                     kwargs: dict[str, Any]) -> dict[str, Any] | None:
    if backend != NAME:
        return None
    return {}  # plain functions have no modules


@hookimpl
def torchlens_encode_call(backend: str, op: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.saving import encode_call

    return encode_call(op.call)


@hookimpl
def torchlens_decode_call(backend: str, data: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_numpy.saving import decode_call

    return decode_call(data)
