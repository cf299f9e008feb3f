"""The JAX backend plugin. Importing this module does not import JAX, flax or equinox."""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core.backend import Backend
from torchlens_core.plugins import BackendInfo


class JaxBackend(Backend):
    name = "jax"

    def info(self) -> BackendInfo:
        # "modules": nnx, equinox and linen (model.apply) submodules, by path and pass.
        # "control_flow": scan/while iterations and the cond branch taken are recorded as they ran.
        # "random": JAX's RNG is explicit (keys are inputs or parameters), so random ops replay exactly.
        # Not "in_place": JAX arrays are immutable, so there is nothing to protect.
        return BackendInfo(name=self.name, framework="jax", install="pip install 'torchlens[jax]'",
                           capabilities=frozenset({"modules", "functions", "control_flow", "random", "save", "halt",
                                                   "branches", "timing"}))

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        jax = sys.modules.get("jax")
        if jax is None:
            return False
        from torchlens_jax.modules import framework_of

        if framework_of(getattr(target, "__self__", target)) is not None:  # a module, or a bound method of one
            return True
        if type(target).__module__.startswith(("jax.", "jaxlib.")):  # jax.jit-wrapped functions
            return True
        return any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves((args, kwargs)))

    def capture(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Any:
        from torchlens_jax.capture import capture

        return capture(target, args, kwargs, options)

    def replay_graph(self, trace: Any, observe: Any) -> list[Any]:
        from torchlens_jax.replay import replay_graph

        return replay_graph(trace, observe)

    def replay_op(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torchlens_jax.replay import replay_op

        return replay_op(op, args, kwargs)

    def array_info(self, value: Any) -> Any:
        from torchlens_jax.arrays import array_info

        return array_info(value)

    def to_numpy(self, value: Any) -> Any:
        from torchlens_jax.arrays import to_numpy

        return to_numpy(value)

    def array_error(self, actual: Any, expected: Any) -> float:
        from torchlens_jax.arrays import array_error

        return array_error(actual, expected)

    def from_numpy(self, array: Any, dtype: str, device: str) -> Any:
        from torchlens_jax.saving import from_numpy

        return from_numpy(array, dtype, device)

    def encode_call(self, op: Any) -> Any:
        from torchlens_jax.saving import encode_call

        return encode_call(op)

    def decode_call(self, data: Any) -> Any:
        from torchlens_jax.saving import decode_call

        return decode_call(data)

    def encode_value(self, value: Any) -> Any:
        from torchlens_jax.saving import encode_value

        return encode_value(value)

    def decode_value(self, data: Any) -> Any:
        from torchlens_jax.saving import decode_value

        return decode_value(data)

    def conformance_cases(self) -> list[Any]:
        from torchlens_jax.zoo import cases

        return cases()

    def observe_module_outputs(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        from torchlens_jax.modules import observe_module_outputs

        return observe_module_outputs(target, args, kwargs)

    def flop_formulas(self) -> dict[str, Any]:
        from torchlens_jax.flops import FORMULAS

        return FORMULAS


backend = JaxBackend()
