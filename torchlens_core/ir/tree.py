"""Walking Python containers (tuple, list, dict, namedtuple, dataclass) without a framework.

Backends describe values as nested Python containers whose leaves are arrays or
plain constants; these helpers map over them and rebuild the same structure.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

Path = tuple[Any, ...]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def children(obj: Any) -> list[tuple[Any, Any]] | None:
    """The (key, child) pairs of a container, or None for a leaf."""
    if isinstance(obj, (tuple, list)):
        return list(enumerate(obj))
    if isinstance(obj, dict):
        return list(obj.items())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return None


def rebuild(obj: Any, values: list[Any]) -> Any:
    """A container of the same type as ``obj`` holding ``values`` in ``children`` order."""
    if _is_namedtuple(obj):
        # _make, not the constructor: a subclass's __new__ may check or convert its fields (torch's
        # PackedSequence does), which a template of Refs is not
        return type(obj)._make(values)
    if isinstance(obj, (tuple, list)):
        return type(obj)(values)
    if isinstance(obj, dict):
        items = dict(zip(obj.keys(), values))
        try:
            return type(obj)(**items) if type(obj) is not dict else items
        except TypeError:
            return type(obj)(items)
    fields = dataclasses.fields(obj)
    if all(getattr(obj, f.name) is v for f, v in zip(fields, values)):
        # Unchanged: the object itself. Some dataclasses cannot be rebuilt by keyword (tinygrad's DType
        # takes its fields positionally), and a value object (a dtype, a config) needs no copy.
        return obj
    try:
        return dataclasses.replace(obj, **{f.name: v for f, v in zip(fields, values)})
    except Exception:  # noqa: BLE001 - an __init__ that takes other arguments than the fields (an equinox
        # module) or checks them (torch_geometric's SelectOutput calls node_index.dim(), which a template's Ref
        # has not): set the fields on a copy instead
        new = copy.copy(obj)
        for f, v in zip(fields, values):
            object.__setattr__(new, f.name, v)
        return new


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every leaf, keeping the structure."""
    kids = children(obj)
    if kids is None:
        return fn(obj)
    return rebuild(obj, [map_leaves(fn, v) for _, v in kids])


def leaves(obj: Any, is_leaf: Callable[[Any], bool], path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Yield ``(path, leaf)`` for every leaf accepted by ``is_leaf``."""
    if is_leaf(obj):
        yield path, obj
        return
    kids = children(obj)
    if kids is None:
        return
    for key, child in kids:
        yield from leaves(child, is_leaf, (*path, key))


def get(obj: Any, path: Path) -> Any:
    """The element of ``obj`` at ``path``."""
    for key in path:
        obj = getattr(obj, key) if isinstance(key, str) and not isinstance(obj, dict) else obj[key]
    return obj


def replace_at(obj: Any, new: dict[Path, Any], path: Path = ()) -> Any:
    """``obj`` with the value at each path of ``new`` replaced (paths as :func:`leaves` gives them)."""
    if path in new:
        return new[path]
    kids = children(obj)
    if kids is None:
        return obj
    return rebuild(obj, [replace_at(v, new, (*path, k)) for k, v in kids])


def leaves_from(obj: Any, at: dict[Path, Any], path: Path = ()) -> Any:
    """``obj``'s structure with each leaf replaced by ``at[its path]`` (None where ``at`` has no entry)."""
    kids = children(obj)
    if kids is None:
        return at.get(path)
    return rebuild(obj, [leaves_from(v, at, (*path, k)) for k, v in kids])
