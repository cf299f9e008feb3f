"""Keras 3 layers, named the same way on every backend Keras runs on (TensorFlow, JAX, torch).

Keras lowers one model source to three frameworks; a comparison of the three
captures pairs ops by module path, so the paths must not depend on the
backend. This module reads Keras objects by duck typing and never imports
Keras (or a framework): it is handed objects that already exist.

Paths. A layer's path is the chain of Keras layer names from the traced
model down to it, joined by dots, as torch joins attribute names: ``fc1``,
``encoder.dense_1``, ``conv_pw_3_bn``. Children are what Keras itself tracks
(``layer._flatten_layers(recursive=False)``: sublayers held in attributes,
lists and dicts of a subclassed layer; the layers of a Sequential or
functional model). ``InputLayer`` placeholders are left out: they never run.
A layer reachable along several routes keeps its first path; two siblings
with the same name are told apart by the attribute that holds the second
(or ``name_2``). The traced model itself is the root, not a module.

Variables are named ``<layer path>.<variable name>`` (``fc1.kernel``,
``bn.moving_mean``); a layer's seed-generator states by position
(``dropout.seed_generator.state``), since Keras numbers seed generators
globally and the number would differ between two builds of one model.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterator
from typing import Any

# A bound on the layers walked: Keras models have thousands at most; a cycle of tracked layers cannot hang a capture.
MAX_LAYERS = 100_000


def keras_module() -> Any:
    """Keras 3, if something imported it (never imported here)."""
    return sys.modules.get("keras")


def is_keras_object(obj: Any) -> bool:
    """Whether ``obj``'s class comes from Keras (a layer, a model, or a user's subclass of one)."""
    return any(getattr(cls, "__module__", "").startswith("keras.") for cls in type(obj).__mro__)


def is_keras_layer(obj: Any) -> bool:
    keras = keras_module()
    if keras is None:
        return False
    try:
        return isinstance(obj, keras.layers.Layer)
    except AttributeError:  # a partly imported keras
        return False


def sanitize(name: Any) -> str:
    """A layer or variable name as one path segment: no dots, colons, slashes or spaces."""
    return _sanitized(str(name))


@functools.lru_cache(maxsize=4096)  # every capture names the same layers and variables again
def _sanitized(name: str) -> str:
    return _SEPARATORS.sub("_", name) or "layer"


_SEPARATORS = re.compile(r"[.:/\s]+")


def children(layer: Any) -> list[Any]:
    """The layers ``layer`` tracks directly, input placeholders left out."""
    keras = keras_module()
    flatten = getattr(layer, "_flatten_layers", None)
    if keras is None or not callable(flatten):
        return []
    return [
        child
        for child in flatten(include_self=False, recursive=False)
        if not isinstance(child, keras.layers.InputLayer)
    ]


def layer_paths(root: Any, path: str = "", seen: set[int] | None = None) -> list[tuple[str, Any]]:
    """``(path, layer)`` of every layer under ``root`` (itself excluded), parents before children.

    ``path`` prefixes the paths (a layer found in a function's globals is a
    root named by its Python name); ``seen`` holds layers already named
    elsewhere, and receives these.
    """
    seen = set() if seen is None else seen
    seen.add(id(root))
    out: list[tuple[str, Any]] = []
    # Depth first, children in Keras's order: a stack of iterators keeps the order without recursion.
    pending: list[Iterator[tuple[str, Any]]] = [iter(_named_children(root, path, seen))]
    while pending and len(out) < MAX_LAYERS:
        child = next(pending[-1], None)
        if child is None:
            pending.pop()
            continue
        out.append(child)
        pending.append(iter(_named_children(child[1], child[0], seen)))
    return out


def _named_children(layer: Any, path: str, seen: set[int]) -> list[tuple[str, Any]]:
    used: set[str] = set()
    attr_names: dict[int, str] | None = None
    named = []
    for child in children(layer):
        if id(child) in seen:
            continue
        seen.add(id(child))
        segment = sanitize(child.name)
        if segment in used:
            if attr_names is None:
                attr_names = _attribute_names(layer)
            segment = sanitize(attr_names.get(id(child), segment))
            k, base = 2, segment
            while segment in used:
                segment, k = f"{base}_{k}", k + 1
        used.add(segment)
        named.append((f"{path}.{segment}" if path else segment, child))
    return named


def _attribute_names(layer: Any) -> dict[int, str]:
    names: dict[int, str] = {}
    for key, value in vars(layer).items():
        if key.startswith("_") or id(value) in names:
            continue
        if is_keras_layer(value):
            names[id(value)] = key
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if is_keras_layer(item):
                    names.setdefault(id(item), f"{key}_{i}")
    return names


def layer_variables(layer: Any, path: str) -> Iterator[tuple[str, Any, bool, bool]]:
    """``(name, variable, trainable, is_buffer)`` of the Keras variables ``layer`` holds directly."""
    prefix = f"{path}." if path else ""
    for v in list(layer._trainable_variables) + list(layer._non_trainable_variables):
        yield prefix + sanitize(v.name), v, bool(v.trainable), False
    for k, sg in enumerate(getattr(layer, "_seed_generators", ())):
        state = getattr(sg, "state", None)
        if state is not None:
            yield prefix + ("seed_generator" if k == 0 else f"seed_generator_{k + 1}") + ".state", state, False, True


def variable_names(root: Any, layers: list[tuple[str, Any]]) -> dict[int, tuple[str, str, bool, bool]]:
    """``id(variable) -> (name, owning layer path, trainable, is_buffer)`` for every variable of ``root``
    and ``layers`` (its :func:`layer_paths`): each variable once, under the first layer holding it; a
    variable Keras knows of that no listed layer holds directly is named by its Keras path, as a buffer."""
    found: dict[int, tuple[str, str, bool, bool]] = {}
    taken: set[str] = set()

    def add(name: str, v: Any, module: str, trainable: bool, is_buffer: bool) -> None:
        if id(v) in found:
            return
        base, k = name, 2
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        found[id(v)] = (name, module, trainable, is_buffer)

    for path, layer in [("", root), *layers]:
        for name, v, trainable, is_buffer in layer_variables(layer, path):
            add(name, v, path, trainable, is_buffer)
    for v in root.variables:
        add(sanitize(v.path), v, "", bool(v.trainable), True)
    return found
