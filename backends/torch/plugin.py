"""The torch backend plugin. Importing this module does not import torch."""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core.backend.base import Backend, lazy
from torchlens_core.backend.manager import BackendInfo
from torchlens_core.ir import tree


class TorchBackend(Backend):
    name = "torch"

    def info(self) -> BackendInfo:
        return BackendInfo(
            contract=4,
            name=self.name,
            framework="torch",
            install="pip install 'torchlens[torch]'",
            aliases=("pytorch",),
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
                    "timing",
                    "intervene",
                    "splice",
                    "new_inputs",
                    "gradients",
                    "escape_detector",
                }
            ),
        )

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        if isinstance(target, torch.nn.Module):
            return True
        return next(tree.leaves((args, kwargs), lambda v: isinstance(v, torch.Tensor)), None) is not None

    capture = lazy("torchlens_torch.distributed:capture")  # torchlens_torch.capture, with rank notes while armed
    replay_graph = lazy("torchlens_torch.replay:replay_graph")
    replay_op = lazy("torchlens_torch.replay:run_op")
    array_info = lazy("torchlens_torch.arrays:array_info")
    to_numpy = lazy("torchlens_torch.arrays:to_numpy")
    to_numpy_stacked = lazy("torchlens_torch.arrays:to_numpy_stacked")

    def stack(self, samples: list[Any]) -> Any:
        import torch

        return torch.stack(samples)

    def batched_loader(self, dataset: Any) -> str | None:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(dataset, torch.utils.data.DataLoader):
            return None
        if not getattr(dataset, "_auto_collation", dataset.batch_size is not None):
            return None  # batch_size=None: it yields samples
        size = dataset.batch_size or getattr(dataset.batch_sampler, "batch_size", None)
        return (
            f"a torch DataLoader yields batches, and tl.extract_dataset makes its own from unbatched samples: "
            f"pass the loader's dataset and batch size, tl.extract_dataset(model, loader.dataset, layers, "
            f"batch_size={size or '...'}, ...) (a labelled dataset mapped to its inputs first), or a DataLoader "
            f"made with batch_size=None"
        )

    def detach(self, value: Any) -> Any:
        import torch

        return tree.map_leaves(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value)

    array_error = lazy("torchlens_torch.arrays:array_error")
    array_ops = lazy("torchlens_torch.arrays:ARRAY_OPS")
    backward = lazy("torchlens_torch.grads:backward")
    reference_grads = lazy("torchlens_torch.grads:reference_grads")
    flop_formulas = lazy("torchlens_torch.flops:FORMULAS")
    geometry = lazy("torchlens_torch.fields:geometry")
    facets = lazy("torchlens_torch.facets:facets")
    compat = lazy("torchlens_torch.compat:rows")
    encode_array = lazy("torchlens_torch.saving:encode_array")
    from_numpy = lazy("torchlens_torch.saving:from_numpy")

    def encode_value(self, value: Any) -> Any:
        from torchlens_torch.saving import encode_value

        return encode_value(value) if "torch" in sys.modules else None

    decode_value = lazy("torchlens_torch.saving:decode_value")
    # torchlens_torch.saving's, and the calls of tl.distributed's boundary nodes
    encode_call = lazy("torchlens_torch.distributed:encode_call")
    decode_call = lazy("torchlens_torch.distributed:decode_call")
    conformance_cases = lazy("torchlens_torch.zoo:cases")
    observe_module_outputs = lazy("torchlens_torch.observe:observe_module_outputs")


backend = TorchBackend()
