"""The tinygrad backend plugin. Importing this module does not import tinygrad."""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core.backend.base import Backend, lazy
from torchlens_core.backend.manager import BackendInfo
from torchlens_core.ir import tree


class TinygradBackend(Backend):
    name = "tinygrad"

    def info(self) -> BackendInfo:
        # "modules": layers found by attribute path (as get_state_dict names parameters), passes per call.
        # "in_place": assign, __setitem__ and += are recorded; saved values are copied before a write.
        # "random": the RNG state (seed and counters) is recorded before each random op.
        # "save" / "halt": the TraceBuilder applies them; capture keeps no reference to a dropped value and
        # lets HaltCapture through with everything put back.
        # "branches": item, tolist, numpy and data on a recorded tensor tell the branch tracker.
        # "new_inputs": those conversions are each reported (TraceBuilder.to_python), so replay on new inputs or
        # with a fork's edits checks that they still give what the recorded graph holds.
        # "intervene": edited values are realized and handed to the model as ops and layer calls return;
        # "splice": the layer's __call__ wrapper runs the replacement on its arguments instead.
        # "gradients": trace.log_backward replays the graph lazily with a zero added at each wanted op (grads.py).
        return BackendInfo(
            contract=4,
            name=self.name,
            framework="tinygrad",
            install="pip install 'torchlens[tinygrad]'",
            capabilities=frozenset(
                {
                    "modules",
                    "functions",
                    "in_place",
                    "random",
                    "control_flow",
                    "save",
                    "halt",
                    "timing",
                    "branches",
                    "intervene",
                    "splice",
                    "new_inputs",
                    "gradients",
                }
            ),
        )

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        tinygrad = sys.modules.get("tinygrad")
        tensor = getattr(tinygrad, "Tensor", None)
        if tensor is None:
            return False
        owner = getattr(target, "__self__", target)
        if isinstance(owner, tensor) or type(owner).__module__.startswith("tinygrad."):  # nn layers, TinyJit
            return True
        attributes = getattr(owner, "__dict__", None)
        if (
            isinstance(attributes, dict)
            and not isinstance(owner, type)
            and any(isinstance(v, tensor) or type(v).__module__.startswith("tinygrad.") for v in attributes.values())
        ):
            return True
        return next(tree.leaves((args, kwargs), lambda v: isinstance(v, tensor)), None) is not None

    capture = lazy("torchlens_tinygrad.capture:capture")
    compat = lazy("torchlens_tinygrad.capture:compat_rows")
    replay_graph = lazy("torchlens_tinygrad.replay:replay_graph")
    replay_op = lazy("torchlens_tinygrad.replay:run_op")

    def array_info(self, value: Any) -> Any:
        tinygrad = sys.modules.get("tinygrad")
        if tinygrad is None or not isinstance(value, tinygrad.Tensor):
            return None
        from torchlens_tinygrad.arrays import array_info

        return array_info(value)

    to_numpy = lazy("torchlens_tinygrad.arrays:to_numpy")
    array_error = lazy("torchlens_tinygrad.arrays:array_error")
    array_ops = lazy("torchlens_tinygrad.arrays:ARRAY_OPS")
    backward = lazy("torchlens_tinygrad.grads:backward")
    reference_grads = lazy("torchlens_tinygrad.grads:reference_grads")

    def stack(self, samples: list[Any]) -> Any:
        """Same-shaped samples stacked along a new leading axis, realized (for ``tl.extract_dataset``)."""
        return samples[0].stack(*samples[1:], dim=0).realize()

    flop_formulas = lazy("torchlens_tinygrad.flops:FORMULAS")
    from_numpy = lazy("torchlens_tinygrad.saving:from_numpy")
    encode_value = lazy("torchlens_tinygrad.saving:encode_value")
    decode_value = lazy("torchlens_tinygrad.saving:decode_value")
    encode_call = lazy("torchlens_tinygrad.saving:encode_call")
    decode_call = lazy("torchlens_tinygrad.saving:decode_call")
    conformance_cases = lazy("torchlens_tinygrad.zoo:cases")
    observe_module_outputs = lazy("torchlens_tinygrad.observe:observe_module_outputs")


backend = TinygradBackend()
