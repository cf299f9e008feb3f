"""The JAX backend plugin. Importing this module does not import JAX, flax or equinox."""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core.backend.base import Backend, lazy
from torchlens_core.backend.manager import BackendInfo


class JaxBackend(Backend):
    name = "jax"

    def info(self) -> BackendInfo:
        # "modules": nnx, equinox and linen (model.apply) submodules, by path and pass; also those a traced function
        # calls (torchlens_jax.function_modules).
        # "control_flow": scan/while iterations and the cond branch taken are recorded as they ran.
        # "random": JAX's RNG is explicit (keys are inputs or parameters), so random ops replay exactly.
        # Not "in_place": JAX arrays are immutable, so there is nothing to protect.
        # "intervene": the walk hands later equations the edited value; "splice": a module call is replaced
        # while the jaxpr is traced (docs/backend-jax.md, "Interventions").
        # "new_inputs": a jaxpr turns no traced value into a Python one (make_jaxpr refuses it); the walk does,
        # for each cond index and each while condition, and reports every one (docs/backend-jax.md).
        # "gradients": one jax.grad over the replayed graph, a zero added at each wanted op (torchlens_jax.grads).
        return BackendInfo(
            contract=4,
            name=self.name,
            framework="jax",
            install="pip install 'torchlens[jax]'",
            capabilities=frozenset(
                {
                    "modules",
                    "functions",
                    "control_flow",
                    "random",
                    "save",
                    "halt",
                    "branches",
                    "timing",
                    "intervene",
                    "splice",
                    "new_inputs",
                    "gradients",
                }
            ),
        )

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        jax = sys.modules.get("jax")
        if jax is None:
            return False
        from torchlens_jax.modules import framework_of, is_keras_on_jax

        owner = getattr(target, "__self__", target)
        if framework_of(owner) is not None or is_keras_on_jax(owner):  # a module, or a bound method of one
            return True
        if type(target).__module__.startswith(("jax.", "jaxlib.")):  # jax.jit-wrapped functions, custom_jvp...
            return True
        from torchlens_jax.jitted import is_jitted

        if is_jitted(target):  # nnx.jit and equinox.filter_jit wrappers, partials of a jitted function
            return True
        return any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves((args, kwargs)))

    capture = lazy("torchlens_jax.capture:capture")
    replay_graph = lazy("torchlens_jax.replay:replay_graph")
    replay_op = lazy("torchlens_jax.replay:replay_op")
    array_info = lazy("torchlens_jax.arrays:array_info")
    to_numpy = lazy("torchlens_jax.arrays:to_numpy")

    def stack(self, samples: list[Any]) -> Any:
        """Same-shaped samples stacked along a new leading axis (for ``tl.extract_dataset``)."""
        import jax.numpy as jnp

        return jnp.stack(samples)

    array_error = lazy("torchlens_jax.arrays:array_error")
    array_ops = lazy("torchlens_jax.arrays:ARRAY_OPS")
    from_numpy = lazy("torchlens_jax.saving:from_numpy")
    encode_call = lazy("torchlens_jax.saving:encode_call")
    decode_call = lazy("torchlens_jax.saving:decode_call")
    encode_value = lazy("torchlens_jax.saving:encode_value")
    decode_value = lazy("torchlens_jax.saving:decode_value")
    conformance_cases = lazy("torchlens_jax.zoo:cases")
    observe_module_outputs = lazy("torchlens_jax.modules:observe_module_outputs")
    flop_formulas = lazy("torchlens_jax.flops:FORMULAS")
    geometry = lazy("torchlens_jax.fields:geometry")
    backward = lazy("torchlens_jax.grads:backward")
    reference_grads = lazy("torchlens_jax.grads:reference_grads")


backend = JaxBackend()
