"""Paddle's own view of layer outputs: plain forward post-hooks, for the conformance suite."""

from __future__ import annotations

from typing import Any

import paddle

from torchlens_core.ir import tree
from torchlens_paddle.arrays import snapshot


def observe_module_outputs(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run ``model`` once with a forward post-hook on every sublayer; ``{"path:pass": copy of output}``."""
    if not isinstance(model, paddle.nn.Layer):
        return {}
    seen: dict[str, Any] = {}
    counts: dict[str, int] = {}
    handles = []

    def hook_for(path: str) -> Any:
        def hook(layer: Any, inputs: Any, output: Any) -> None:
            counts[path] = n = counts.get(path, 0) + 1
            seen[f"{path}:{n}"] = tree.map_leaves(lambda v: snapshot(v) if isinstance(v, paddle.Tensor) else v, output)

        return hook

    try:
        for path, layer in model.named_sublayers():
            handles.append(layer.register_forward_post_hook(hook_for(path)))
        model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen
