"""The TensorFlow backend plugin. Importing this module imports neither TensorFlow nor Keras."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

from torchlens_core import tree
from torchlens_core.backend import Backend
from torchlens_core.plugins import BackendInfo

# TensorFlow ships under several distribution names; the first installed one is the framework.
_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly",
                  "tf-nightly-cpu")


def _distribution() -> str:
    for name in _DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return name
    return "tensorflow"


class TFBackend(Backend):
    name = "tf"

    def info(self) -> BackendInfo:
        # "modules": Keras layers by path and pass. "control_flow": eager Python control flow, as it ran.
        # "in_place": variable writes are recorded as ops; tensors are immutable, so saved values stay as
        # they ran. "random": stateless and tf.random.Generator ops replay exactly; legacy stateful random
        # ops (tf.random.normal) replay their recorded values. "save"/"halt": capture holds no tensor the
        # builder dropped, and a halt (from the op callback or a layer call) leaves nothing installed.
        # "branches": EagerTensor.__bool__, numpy()... on a recorded tensor tell the branch tracker.
        return BackendInfo(name=self.name, framework=_distribution(), install="pip install 'torchlens[tf]'",
                           aliases=("tensorflow",),
                           capabilities=frozenset({"modules", "functions", "in_place", "random", "control_flow",
                                                   "save", "halt", "branches"}))

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        tf = sys.modules.get("tensorflow")
        if tf is None:
            return False
        owner = getattr(target, "__self__", target)
        keras = sys.modules.get("keras")
        if keras is not None and isinstance(owner, keras.layers.Layer):
            # Keras 3 on another backend belongs to that backend (a torch-backed layer is a torch module).
            return keras.backend.backend() == "tensorflow"
        if isinstance(owner, tf.Module) or isinstance(target, tf.types.experimental.PolymorphicFunction):
            return True
        found = tree.leaves((args, kwargs), lambda v: isinstance(v, (tf.Tensor, tf.Variable)))
        return next(found, None) is not None

    def capture(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Any:
        from torchlens_tf.capture import capture

        return capture(target, args, kwargs, options)

    def replay_graph(self, trace: Any, observe: Any) -> list[Any]:
        from torchlens_tf.replay import replay_graph

        return replay_graph(trace, observe)

    def replay_op(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torchlens_tf.replay import run_op

        return run_op(op, args, kwargs)

    def array_info(self, value: Any) -> Any:
        from torchlens_tf.arrays import array_info

        return array_info(value)

    def to_numpy(self, value: Any) -> Any:
        from torchlens_tf.arrays import to_numpy

        return to_numpy(value)

    def array_error(self, actual: Any, expected: Any) -> float:
        from torchlens_tf.arrays import array_error

        return array_error(actual, expected)

    def from_numpy(self, array: Any, dtype: str, device: str) -> Any:
        from torchlens_tf.saving import from_numpy

        return from_numpy(array, dtype, device)

    def encode_value(self, value: Any) -> Any:
        from torchlens_tf.saving import encode_value

        return encode_value(value)

    def decode_value(self, data: Any) -> Any:
        from torchlens_tf.saving import decode_value

        return decode_value(data)

    def encode_call(self, op: Any) -> Any:
        from torchlens_tf.saving import encode_call

        return encode_call(op.call)

    def decode_call(self, data: Any) -> Any:
        from torchlens_tf.saving import decode_call

        return decode_call(data)

    def conformance_cases(self) -> list[Any]:
        from torchlens_tf.zoo import cases

        return cases()

    def observe_module_outputs(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        from torchlens_tf.observe import observe_module_outputs

        return observe_module_outputs(target, args, kwargs)

    def flop_formulas(self) -> dict[str, Any]:
        from torchlens_tf.flops import FORMULAS

        return FORMULAS


backend = TFBackend()
