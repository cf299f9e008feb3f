"""The paddle backend plugin. Importing this module does not import Paddle."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

from torchlens_core import tree
from torchlens_core.backend import Backend
from torchlens_core.plugins import BackendInfo

# Paddle ships as "paddlepaddle" (CPU, the pinned one) or "paddlepaddle-gpu"; the first installed is the framework.
_DISTRIBUTIONS = ("paddlepaddle", "paddlepaddle-gpu")
_found: list[str] = []


def _distribution() -> str:
    if _found:
        return _found[0]
    for name in _DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        _found.append(name)
        return name
    return _DISTRIBUTIONS[0]


class PaddleBackend(Backend):
    name = "paddle"

    def info(self) -> BackendInfo:
        # "modules": sublayer paths and passes from per-layer forward hooks.
        # "in_place": in-place ops are recorded and saved values copied before a write.
        # "random": random ops record the RNG state and replay exactly.
        # "control_flow": the forward runs eagerly; branches and loops are recorded as they ran.
        # "save": side tables name ops by index, never hold tensors: a value save= drops is freed.
        # "halt": HaltCapture goes through the wrappers and hooks; the same finally takes them down.
        # "branches": Tensor.__bool__, item, numpy... on a recorded tensor tell the branch tracker.
        return BackendInfo(name=self.name, framework=_distribution(), install="pip install 'torchlens[paddle]'",
                           capabilities=frozenset({"modules", "functions", "in_place", "random", "control_flow",
                                                   "save", "halt", "timing", "branches"}))

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        paddle = sys.modules.get("paddle")
        if paddle is None or not hasattr(paddle, "Tensor") or not hasattr(paddle, "nn"):
            return False  # not (yet) fully imported
        if isinstance(target, paddle.nn.Layer):
            return True
        if type(target).__module__.startswith("paddle."):  # to_static functions: refused with a typed error
            return True
        return next(tree.leaves((args, kwargs), lambda v: isinstance(v, paddle.Tensor)), None) is not None

    def capture(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Any:
        from torchlens_paddle.capture import capture

        return capture(target, args, kwargs, options)

    def replay_graph(self, trace: Any, observe: Any) -> list[Any]:
        from torchlens_paddle.replay import replay_graph

        return replay_graph(trace, observe)

    def replay_op(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torchlens_paddle.replay import run_op

        return run_op(op, args, kwargs)

    def array_info(self, value: Any) -> Any:
        from torchlens_paddle.arrays import array_info

        return array_info(value)

    def to_numpy(self, value: Any) -> Any:
        from torchlens_paddle.arrays import to_numpy

        return to_numpy(value)

    def detach(self, value: Any) -> Any:
        from torchlens_paddle.arrays import detach

        return detach(value)

    def array_error(self, actual: Any, expected: Any) -> float:
        from torchlens_paddle.arrays import array_error

        return array_error(actual, expected)

    def flop_formulas(self) -> dict[str, Any]:
        from torchlens_paddle.flops import FORMULAS

        return FORMULAS

    def encode_array(self, value: Any) -> tuple[Any, str]:
        from torchlens_paddle.saving import encode_array

        return encode_array(value)

    def from_numpy(self, array: Any, dtype: str, device: str) -> Any:
        from torchlens_paddle.saving import from_numpy

        return from_numpy(array, dtype, device)

    def encode_value(self, value: Any) -> Any:
        from torchlens_paddle.saving import encode_value

        return encode_value(value)

    def decode_value(self, data: Any) -> Any:
        from torchlens_paddle.saving import decode_value

        return decode_value(data)

    def encode_call(self, op: Any) -> Any:
        from torchlens_paddle.saving import encode_call

        return encode_call(op.call)

    def decode_call(self, data: Any) -> Any:
        from torchlens_paddle.saving import decode_call

        return decode_call(data)

    def conformance_cases(self) -> list[Any]:
        from torchlens_paddle.zoo import cases

        return cases()

    def observe_module_outputs(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        from torchlens_paddle.observe import observe_module_outputs

        return observe_module_outputs(target, args, kwargs)


backend = PaddleBackend()
