"""Keras's own view of layer outputs, for the conformance suite.

Keras 3 has no forward hooks; the closest thing is the layer's ``__call__``
itself. This runs the model once, with no op callback installed, with
``keras.layers.Layer.__call__`` wrapped only to keep what each known layer
returned (tensors are immutable: keeping them is keeping copies; a variable
returned is kept as its value then, as the capture keeps it).
"""

from __future__ import annotations

from typing import Any

from torchlens_tf.capture import _call_plan, _inputs_as_tensors, eager_functions, values_now
from torchlens_tf.layers import LayerCalls, is_keras_layer, unwrap, view_model


def observe_module_outputs(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``{"path:pass": output}`` for every call of a known layer during one plain run."""
    fn, args, kwargs, _ = _call_plan(target, args, kwargs)
    run_target, owner, _ = unwrap(fn)
    args, kwargs = _inputs_as_tensors((args, kwargs), convert=owner is not None and is_keras_layer(owner))
    view = view_model(fn)
    seen: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def leave(path: str, output: Any) -> None:
        counts[path] = n = counts.get(path, 0) + 1
        seen[f"{path}:{n}"] = values_now(output)

    def failed(path: str) -> None:  # a call that raised (its caller went on): it ran, with no output
        leave(path, None)

    calls = LayerCalls(view.paths, None, leave, failed)
    try:
        calls.install()
        with eager_functions([]):  # layers inside tf.functions are called as the capture sees them
            run_target(*args, **kwargs)
    finally:
        calls.restore()
    return seen
