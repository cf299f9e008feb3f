"""The framework's own view of layer outputs, for the conformance suite.

tinygrad has no module hooks: the model runs plainly (lazily, fused as
tinygrad likes) with the same temporary per-layer ``__call__`` wrappers that
capture uses, each keeping a realized copy of what its layer returned.
"""

from __future__ import annotations

from typing import Any

from tinygrad import Tensor

from torchlens_core.ir import tree
from torchlens_tinygrad.arrays import snapshot
from torchlens_tinygrad.modules import model_object, named_layers, wrapped_layers


def observe_module_outputs(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run ``target`` once with every layer wrapped; ``{"path:pass": copy of output}``."""
    layers = list(named_layers(model_object(target)))
    if not layers:
        return {}
    paths = {id(layer): path for path, layer in layers}
    seen: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def around(path: str, layer: Any, call: Any) -> Any:
        out = call()
        counts[path] = n = counts.get(path, 0) + 1
        seen[f"{path}:{n}"] = tree.map_leaves(lambda v: snapshot(v) if isinstance(v, Tensor) else v, out)
        return out

    with wrapped_layers(paths, [layer for _, layer in layers], around):
        target(*args, **kwargs)
    return seen
