"""The framework's own view of module outputs: plain forward hooks, for the conformance suite."""

from __future__ import annotations

from typing import Any

import torch

from torchlens_core.ir import tree


def observe_module_outputs(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run ``model`` once with a forward hook on every submodule; ``{"path:pass": copy of output}``."""
    if not isinstance(model, torch.nn.Module):
        return {}
    seen: dict[str, Any] = {}
    counts: dict[str, int] = {}
    handles = []

    def hook_for(path: str) -> Any:
        def hook(module: Any, inputs: Any, output: Any) -> None:
            counts[path] = n = counts.get(path, 0) + 1
            seen[f"{path}:{n}"] = tree.map_leaves(
                lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, output)
        return hook

    try:
        for path, module in model.named_modules():
            if path:
                handles.append(module.register_forward_hook(hook_for(path)))
        model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen
