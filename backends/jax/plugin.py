"""The JAX backend's hook implementations.

Importing this module must not import JAX, flax or equinox: each hook returns
None for other backends before touching a framework, and imports it inside.
"""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core.hookspecs import hookimpl
from torchlens_core.plugins import BackendInfo

NAME = "jax"


@hookimpl
def torchlens_backend_info() -> BackendInfo:
    # "modules": nnx, equinox and linen (model.apply) submodules, by path and pass. "functions": any JAX function.
    # "control_flow": scan/while iterations and the cond branch taken are recorded as they ran.
    # "random": JAX's RNG is explicit (keys are inputs or parameters), so random ops replay exactly.
    # Not "in_place": JAX arrays are immutable, so there is nothing to protect.
    return BackendInfo(name=NAME, framework="jax", install="pip install 'torchlens[jax]'",
                       capabilities=frozenset({"modules", "functions", "control_flow", "random"}))


@hookimpl
def torchlens_claim(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if "jax" not in sys.modules:
        return None
    from torchlens_jax.modules import framework_of

    if framework_of(getattr(target, "__self__", target)) is not None:  # a module, or a bound method of one
        return NAME
    jax = sys.modules["jax"]
    if type(target).__module__.startswith(("jax.", "jaxlib.")):  # jax.jit-wrapped functions
        return NAME
    return NAME if any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves((args, kwargs))) else None


@hookimpl
def torchlens_capture(backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if backend != NAME:
        return None
    from torchlens_jax.capture import capture

    return capture(target, args, kwargs)


@hookimpl
def torchlens_replay_graph(backend: str, trace: Any, observe: Any) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_jax.replay import replay_graph

    return replay_graph(trace, observe)


@hookimpl
def torchlens_replay_op(backend: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if backend != NAME:
        return None
    from torchlens_jax.replay import replay_op

    return replay_op(op, args, kwargs)


@hookimpl
def torchlens_array_info(backend: str, value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if backend != NAME:
        return None
    from torchlens_jax.arrays import array_info

    return array_info(value)


@hookimpl
def torchlens_to_numpy(backend: str, value: Any) -> Any:
    if backend != NAME:
        return None
    from torchlens_jax.arrays import to_numpy

    return to_numpy(value)


@hookimpl
def torchlens_array_error(backend: str, actual: Any, expected: Any) -> float | None:
    if backend != NAME:
        return None
    from torchlens_jax.arrays import array_error

    return array_error(actual, expected)


@hookimpl
def torchlens_conformance_cases(backend: str) -> list[Any] | None:
    if backend != NAME:
        return None
    from torchlens_jax.zoo import cases

    return cases()


@hookimpl
def torchlens_observe_module_outputs(backend: str, target: Any, args: tuple[Any, ...],
                                     kwargs: dict[str, Any]) -> dict[str, Any] | None:
    if backend != NAME:
        return None
    from torchlens_jax.modules import observe_module_outputs

    return observe_module_outputs(target, args, kwargs)
