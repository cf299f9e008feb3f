"""Walking Python containers (tuple, list, dict, namedtuple, dataclass) without a framework.

Backends describe values as nested Python containers whose leaves are arrays or
plain constants; these helpers map over them and rebuild the same structure.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

Path = tuple[Any, ...]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


# Never containers: answered without the isinstance and dataclass checks (most leaves are these, or arrays).
_SCALARS = frozenset({int, float, complex, bool, str, bytes, type(None)})


def children(obj: Any) -> list[tuple[Any, Any]] | None:
    """The (key, child) pairs of a container, or None for a leaf."""
    t = type(obj)
    if t is tuple or t is list:  # the exact types first: most containers are, and most leaves are not
        return list(enumerate(obj))
    if t is dict:
        return list(obj.items())
    if t in _SCALARS:
        return None
    if isinstance(obj, (tuple, list)):
        return list(enumerate(obj))
    if isinstance(obj, dict):
        return list(obj.items())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(name, getattr(obj, name)) for name in _field_names(t)]
    return None


_FIELD_NAMES: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, read once per class (``dataclasses.fields`` filters every attribute again)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def rebuild(obj: Any, values: list[Any]) -> Any:
    """A container of the same type as ``obj`` holding ``values`` in ``children`` order."""
    t = type(obj)
    if t is tuple or t is list:
        return t(values)
    if t is dict:
        return dict(zip(obj.keys(), values))
    if _is_namedtuple(obj):
        # _make, not the constructor: a subclass's __new__ may check or convert its fields (torch's
        # PackedSequence does), which a template of Refs is not
        return type(obj)._make(values)
    if isinstance(obj, (tuple, list)):
        return t(values)
    if isinstance(obj, dict):  # a dict subclass (a plain dict is answered above)
        items = dict(zip(obj.keys(), values))
        try:
            return t(**items)
        except TypeError:
            return t(items)
    fields = _field_names(t)
    if all(getattr(obj, name) is v for name, v in zip(fields, values)):
        # Unchanged: the object itself. Some dataclasses cannot be rebuilt by keyword (tinygrad's DType
        # takes its fields positionally), and a value object (a dtype, a config) needs no copy.
        return obj
    try:
        return dataclasses.replace(obj, **dict(zip(fields, values)))
    except Exception:  # noqa: BLE001 - an __init__ that takes other arguments than the fields (an equinox
        # module) or checks them (torch_geometric's SelectOutput calls node_index.dim(), which a template's Ref
        # has not): set the fields on a copy instead
        new = copy.copy(obj)
        for name, v in zip(fields, values):
            object.__setattr__(new, name, v)
        return new


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every leaf, keeping the structure."""
    kids = children(obj)
    if kids is None:
        return fn(obj)
    return rebuild(obj, [map_leaves(fn, v) for _, v in kids])


def leaves(obj: Any, is_leaf: Callable[[Any], bool], path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Yield ``(path, leaf)`` for every leaf accepted by ``is_leaf``, depth first, in ``children`` order."""
    # A stack, not recursion: nested generators cost a frame per level for every leaf they pass up.
    stack = [(path, obj)]
    pop, push = stack.pop, stack.extend
    deepest = len(path) + sys.getrecursionlimit()  # where the recursive walk would have failed
    while stack:
        at, node = pop()
        if is_leaf(node):
            yield at, node
            continue
        kids = children(node)
        if kids:
            if len(at) >= deepest:  # a container holding itself would otherwise be walked forever
                raise RecursionError(
                    f"containers nested more than {deepest - len(path)} levels deep (one that "
                    f"holds itself?) at {at[:8]}..."
                )
            push([((*at, key), child) for key, child in reversed(kids)])


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
