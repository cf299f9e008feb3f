"""The paddle backend plugin. Importing this module does not import Paddle."""

from __future__ import annotations

import functools
import importlib.metadata
import sys
from typing import Any

from torchlens_core.backend.base import Backend, lazy
from torchlens_core.backend.manager import BackendInfo
from torchlens_core.ir import tree

# Paddle ships as "paddlepaddle" (CPU, the pinned one) or "paddlepaddle-gpu"; the first installed is the framework.
_DISTRIBUTIONS = ("paddlepaddle", "paddlepaddle-gpu")


@functools.cache  # metadata lookups cost about 0.1 ms each, and every tl.trace asks every backend
def _distribution() -> str:
    for name in _DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
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
        # "new_inputs": those conversions are each reported (TraceBuilder.to_python), so replay on new inputs or
        # with a fork's edits checks that they still give what the recorded graph holds.
        # "intervene": edited values are handed to the model as ops and layer calls return (depth paused for
        # the helpers); "splice": a layer a splice names gets an instance-level forward for the capture.
        # "gradients": trace.log_backward replays the graph under autograd, hooking each wanted op (grads.py).
        return BackendInfo(
            contract=4,
            name=self.name,
            framework=_distribution(),
            install="pip install 'torchlens[paddle]'",
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
        paddle = sys.modules.get("paddle")
        if paddle is None or not hasattr(paddle, "Tensor") or not hasattr(paddle, "nn"):
            return False  # not (yet) fully imported
        if isinstance(target, paddle.nn.Layer):
            return True
        if type(target).__module__.startswith("paddle."):  # to_static functions: refused with a typed error
            return True
        return next(tree.leaves((args, kwargs), lambda v: isinstance(v, paddle.Tensor)), None) is not None

    capture = lazy("torchlens_paddle.capture:capture")
    compat = lazy("torchlens_paddle.capture:compat_rows")
    replay_graph = lazy("torchlens_paddle.replay:replay_graph")
    replay_op = lazy("torchlens_paddle.replay:run_op")
    array_info = lazy("torchlens_paddle.arrays:array_info")
    to_numpy = lazy("torchlens_paddle.arrays:to_numpy")

    def batched_loader(self, dataset: Any) -> str | None:
        paddle = sys.modules.get("paddle")
        io = getattr(paddle, "io", None)
        if io is None or not isinstance(dataset, io.DataLoader) or getattr(dataset, "batch_sampler", None) is None:
            return None  # not a loader, or one made with batch_size=None (it yields samples)
        size = getattr(dataset, "batch_size", None) or getattr(dataset.batch_sampler, "batch_size", None)
        return (
            f"a Paddle DataLoader yields batches, and tl.extract_dataset makes its own from unbatched samples: "
            f"pass the loader's dataset and batch size, tl.extract_dataset(model, loader.dataset, layers, "
            f"batch_size={size or '...'}, ...) (a labelled dataset mapped to its inputs first), or a DataLoader "
            f"made with batch_size=None"
        )

    def stack(self, samples: list[Any]) -> Any:
        """Same-shaped samples stacked along a new leading axis (for ``tl.extract_dataset``)."""
        import paddle

        return paddle.stack(samples)

    detach = lazy("torchlens_paddle.arrays:detach")
    array_error = lazy("torchlens_paddle.arrays:array_error")
    array_ops = lazy("torchlens_paddle.arrays:ARRAY_OPS")
    backward = lazy("torchlens_paddle.grads:backward")
    reference_grads = lazy("torchlens_paddle.grads:reference_grads")
    flop_formulas = lazy("torchlens_paddle.flops:FORMULAS")
    encode_array = lazy("torchlens_paddle.saving:encode_array")
    from_numpy = lazy("torchlens_paddle.saving:from_numpy")
    encode_value = lazy("torchlens_paddle.saving:encode_value")
    decode_value = lazy("torchlens_paddle.saving:decode_value")
    encode_call = lazy("torchlens_paddle.saving:encode_call")
    decode_call = lazy("torchlens_paddle.saving:decode_call")
    conformance_cases = lazy("torchlens_paddle.zoo:cases")
    observe_module_outputs = lazy("torchlens_paddle.observe:observe_module_outputs")


backend = PaddleBackend()
