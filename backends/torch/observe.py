"""The framework's own view of module outputs: plain forward hooks, for the conformance suite."""

from __future__ import annotations

from typing import Any

import torch

from torchlens_core.ir import tree


def observe_module_outputs(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run ``model`` once with a forward hook seeing every submodule; ``{"path:pass": copy of output}``.

    One global hook, not a hook per module: ``nn.TransformerEncoderLayer`` leaves
    its fused inference path when a module of it has hooks of its own, and the
    observation must see the forward that runs unobserved.
    """
    if not isinstance(model, torch.nn.Module):
        return {}
    from torch.nn.modules import module as nn_module

    paths = {id(module): path for path, module in model.named_modules() if path}
    seen: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def hook(module: Any, inputs: Any, output: Any) -> None:
        path = paths.get(id(module))
        if path is None:
            return
        counts[path] = n = counts.get(path, 0) + 1
        seen[f"{path}:{n}"] = tree.map_leaves(
            lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, output
        )

    handle = nn_module.register_module_forward_hook(hook)
    try:
        model(*args, **kwargs)
    finally:
        handle.remove()
    return seen
