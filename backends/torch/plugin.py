"""The torch backend plugin. Importing this module does not import torch."""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core import tree
from torchlens_core.backend import Backend
from torchlens_core.plugins import BackendInfo


class TorchBackend(Backend):
    name = "torch"

    def info(self) -> BackendInfo:
        return BackendInfo(name=self.name, framework="torch", install="pip install 'torchlens[torch]'",
                           aliases=("pytorch",),
                           capabilities=frozenset({"modules", "functions", "in_place", "random", "control_flow",
                                                   "save", "halt", "branches", "timing"}))

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        if isinstance(target, torch.nn.Module):
            return True
        return next(tree.leaves((args, kwargs), lambda v: isinstance(v, torch.Tensor)), None) is not None

    def capture(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Any:
        from torchlens_torch.capture import capture

        return capture(target, args, kwargs, options)

    def replay_graph(self, trace: Any, observe: Any) -> list[Any]:
        from torchlens_torch.replay import replay_graph

        return replay_graph(trace, observe)

    def replay_op(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torchlens_torch.replay import run_op

        return run_op(op, args, kwargs)

    def array_info(self, value: Any) -> Any:
        from torchlens_torch.arrays import array_info

        return array_info(value)

    def to_numpy(self, value: Any) -> Any:
        from torchlens_torch.arrays import to_numpy

        return to_numpy(value)

    def stack(self, samples: list[Any]) -> Any:
        import torch

        return torch.stack(samples)

    def detach(self, value: Any) -> Any:
        import torch

        return tree.map_leaves(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value)

    def array_error(self, actual: Any, expected: Any) -> float:
        from torchlens_torch.arrays import array_error

        return array_error(actual, expected)

    def flop_formulas(self) -> dict[str, Any]:
        from torchlens_torch.flops import FORMULAS

        return FORMULAS

    def encode_array(self, value: Any) -> Any:
        from torchlens_torch.saving import encode_array

        return encode_array(value)

    def from_numpy(self, array: Any, dtype: str, device: str) -> Any:
        from torchlens_torch.saving import from_numpy

        return from_numpy(array, dtype, device)

    def encode_value(self, value: Any) -> Any:
        from torchlens_torch.saving import encode_value

        return encode_value(value) if "torch" in sys.modules else None

    def decode_value(self, data: Any) -> Any:
        from torchlens_torch.saving import decode_value

        return decode_value(data)

    def encode_call(self, op: Any) -> Any:
        from torchlens_torch.saving import encode_call

        return encode_call(op.call)

    def decode_call(self, data: Any) -> Any:
        from torchlens_torch.saving import decode_call

        return decode_call(data)

    def conformance_cases(self) -> list[Any]:
        from torchlens_torch.zoo import cases

        return cases()

    def observe_module_outputs(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        from torchlens_torch.observe import observe_module_outputs

        return observe_module_outputs(target, args, kwargs)


backend = TorchBackend()
