"""The torch backend's hook implementations. Importing this module does not import torch."""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core.hookspecs import hookimpl
from torchlens_core.plugins import BackendInfo

NAME = "torch"


@hookimpl
def torchlens_backend_info() -> BackendInfo:
    return BackendInfo(name=NAME, framework="torch", install="pip install 'torchlens[torch]'", aliases=("pytorch",),
                       capabilities=frozenset({"modules", "functions", "in_place", "random", "control_flow"}))


@hookimpl
def torchlens_claim(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(target, torch.nn.Module):
        return NAME
    from torchlens_core import tree

    found = next(tree.leaves((args, kwargs), lambda v: isinstance(v, torch.Tensor)), None)
    return NAME if found is not None else None


@hookimpl
def torchlens_capture(backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if backend != NAME:
        return None
    from torchlens_torch.capture import capture

    return capture(target, args, kwargs)


@hookimpl
def torchlens_replay_graph(backend: str, trace: Any, observe: Any) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_torch.replay import replay_graph

    return replay_graph(trace, observe)


@hookimpl
def torchlens_replay_op(backend: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if backend != NAME:
        return None
    from torchlens_torch.replay import run_op

    return run_op(op, args, kwargs)


@hookimpl
def torchlens_array_info(backend: str, value: Any) -> Any:
    if backend != NAME or "torch" not in sys.modules:
        return None
    from torchlens_torch.arrays import array_info

    return array_info(value)


@hookimpl
def torchlens_to_numpy(backend: str, value: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_torch.arrays import to_numpy

    return to_numpy(value)


@hookimpl
def torchlens_array_error(backend: str, actual: Any, expected: Any) -> float | None:
    if backend != NAME:
        return None
    from torchlens_torch.arrays import array_error

    return array_error(actual, expected)


@hookimpl
def torchlens_conformance_cases(backend: str) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_torch.zoo import cases

    return cases()


@hookimpl
def torchlens_observe_module_outputs(backend: str, target: Any, args: tuple[Any, ...],
                                     kwargs: dict[str, Any]) -> dict[str, Any] | None:
    if backend != NAME:
        return None
    from torchlens_torch.observe import observe_module_outputs

    return observe_module_outputs(target, args, kwargs)
