"""The tinygrad backend plugin. Importing this module does not import tinygrad."""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core import tree
from torchlens_core.backend import Backend
from torchlens_core.plugins import BackendInfo


class TinygradBackend(Backend):
    name = "tinygrad"

    def info(self) -> BackendInfo:
        # "modules": layers found by attribute path (as get_state_dict names parameters), passes per call.
        # "in_place": assign, __setitem__ and += are recorded; saved values are copied before a write.
        # "random": the RNG state (seed and counters) is recorded before each random op.
        # "save" / "halt": the TraceBuilder applies them; capture keeps no reference to a dropped value and
        # lets HaltCapture through with everything put back.
        # "branches": item, tolist, numpy and data on a recorded tensor tell the branch tracker.
        return BackendInfo(name=self.name, framework="tinygrad", install="pip install 'torchlens[tinygrad]'",
                           capabilities=frozenset({"modules", "functions", "in_place", "random", "control_flow",
                                                   "save", "halt", "timing", "branches"}))

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        tinygrad = sys.modules.get("tinygrad")
        tensor = getattr(tinygrad, "Tensor", None)
        if tensor is None:
            return False
        owner = getattr(target, "__self__", target)
        if isinstance(owner, tensor) or type(owner).__module__.startswith("tinygrad."):  # nn layers, TinyJit
            return True
        attributes = getattr(owner, "__dict__", None)
        if isinstance(attributes, dict) and not isinstance(owner, type) and any(
                isinstance(v, tensor) or type(v).__module__.startswith("tinygrad.") for v in attributes.values()):
            return True
        return next(tree.leaves((args, kwargs), lambda v: isinstance(v, tensor)), None) is not None

    def capture(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any = None) -> Any:
        from torchlens_tinygrad.capture import capture

        return capture(target, args, kwargs, options)

    def replay_graph(self, trace: Any, observe: Any) -> list[Any]:
        from torchlens_tinygrad.replay import replay_graph

        return replay_graph(trace, observe)

    def replay_op(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torchlens_tinygrad.replay import run_op

        return run_op(op, args, kwargs)

    def array_info(self, value: Any) -> Any:
        tinygrad = sys.modules.get("tinygrad")
        if tinygrad is None or not isinstance(value, tinygrad.Tensor):
            return None
        from torchlens_tinygrad.arrays import array_info

        return array_info(value)

    def to_numpy(self, value: Any) -> Any:
        from torchlens_tinygrad.arrays import to_numpy

        return to_numpy(value)

    def array_error(self, actual: Any, expected: Any) -> float:
        from torchlens_tinygrad.arrays import array_error

        return array_error(actual, expected)

    def stack(self, samples: list[Any]) -> Any:
        """Same-shaped samples stacked along a new leading axis, realized (for ``tl.extract_dataset``)."""
        return samples[0].stack(*samples[1:], dim=0).realize()

    def flop_formulas(self) -> dict[str, Any]:
        from torchlens_tinygrad.flops import FORMULAS

        return FORMULAS

    def from_numpy(self, array: Any, dtype: str, device: str) -> Any:
        from torchlens_tinygrad.saving import from_numpy

        return from_numpy(array, dtype, device)

    def encode_value(self, value: Any) -> Any:
        from torchlens_tinygrad.saving import encode_value

        return encode_value(value)

    def decode_value(self, data: Any) -> Any:
        from torchlens_tinygrad.saving import decode_value

        return decode_value(data)

    def encode_call(self, op: Any) -> Any:
        from torchlens_tinygrad.saving import encode_call

        return encode_call(op.call)

    def decode_call(self, data: Any) -> Any:
        from torchlens_tinygrad.saving import decode_call

        return decode_call(data)

    def conformance_cases(self) -> list[Any]:
        from torchlens_tinygrad.zoo import cases

        return cases()

    def observe_module_outputs(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        from torchlens_tinygrad.observe import observe_module_outputs

        return observe_module_outputs(target, args, kwargs)


backend = TinygradBackend()
