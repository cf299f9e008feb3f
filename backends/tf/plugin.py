"""The TensorFlow backend plugin. Importing this module imports neither TensorFlow nor Keras."""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from typing import Any

from torchlens_core.backend.base import Backend, lazy
from torchlens_core.backend.manager import BackendInfo
from torchlens_core.ir import tree

# TensorFlow ships under several distribution names; the first installed one is the framework.
_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-macos",
    "tensorflow-intel",
    "tf-nightly",
    "tf-nightly-cpu",
)


@functools.cache  # metadata lookups cost about 0.1 ms each, and every tl.trace asks every backend
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
        # "intervene": edited outputs go into the list the op callback is given, which the op's call returns;
        # layer outputs are edited in the Layer.__call__ wrapper. "splice": that wrapper runs the replacement.
        # "new_inputs": every EagerTensor method that makes a Python value of a recorded tensor reports it
        # (torchlens_tf.conversions); reads through the buffer protocol (np.asarray(t)) are not seen.
        # "gradients": the graph replayed under a GradientTape, a zero added at each wanted op (torchlens_tf.grads).
        return BackendInfo(
            contract=4,
            name=self.name,
            framework=_distribution(),
            install="pip install 'torchlens[tf]'",
            aliases=("tensorflow",),
            capabilities=frozenset(
                {
                    "modules",
                    "functions",
                    "in_place",
                    "random",
                    "control_flow",
                    "save",
                    "halt",
                    "branches",
                    "intervene",
                    "splice",
                    "new_inputs",
                    "gradients",
                }
            ),
        )

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

    capture = lazy("torchlens_tf.capture:capture")
    compat = lazy("torchlens_tf.capture:compat_rows")
    replay_graph = lazy("torchlens_tf.replay:replay_graph")
    replay_op = lazy("torchlens_tf.replay:run_op")
    array_info = lazy("torchlens_tf.arrays:array_info")
    to_numpy = lazy("torchlens_tf.arrays:to_numpy")

    def batched_loader(self, dataset: Any) -> str | None:
        tf = sys.modules.get("tensorflow")
        data = getattr(tf, "data", None)
        if data is None or not isinstance(dataset, data.Dataset):
            return None
        node = dataset
        while node is not None:  # the chain of transformations, last first: a batch not undone by an unbatch
            name = type(node).__name__.lower()
            if "unbatch" in name:
                return None
            if "batch" in name:
                return (
                    "this tf.data.Dataset is batched, and tl.extract_dataset makes its own batches from "
                    "unbatched elements: pass dataset.unbatch() (and batch_size= for the batches you want)"
                )
            node = getattr(node, "_input_dataset", None)
        return None

    def stack(self, samples: list[Any]) -> Any:
        """Same-shaped samples stacked along a new leading axis (for ``tl.extract_dataset``)."""
        import tensorflow as tf

        return tf.stack(samples)

    array_error = lazy("torchlens_tf.arrays:array_error")
    array_ops = lazy("torchlens_tf.arrays:ARRAY_OPS")
    from_numpy = lazy("torchlens_tf.saving:from_numpy")
    encode_value = lazy("torchlens_tf.saving:encode_value")
    decode_value = lazy("torchlens_tf.saving:decode_value")
    encode_call = lazy("torchlens_tf.saving:encode_call")
    decode_call = lazy("torchlens_tf.saving:decode_call")
    conformance_cases = lazy("torchlens_tf.zoo:cases")
    observe_module_outputs = lazy("torchlens_tf.observe:observe_module_outputs")
    flop_formulas = lazy("torchlens_tf.flops:FORMULAS")
    backward = lazy("torchlens_tf.grads:backward")
    reference_grads = lazy("torchlens_tf.grads:reference_grads")


backend = TFBackend()
