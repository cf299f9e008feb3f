"""Module paths for tinygrad models, and temporary per-layer ``__call__`` wrappers.

tinygrad has no module base class: a model is any object whose attributes (and
lists, tuples and dicts of attributes) hold tensors and layers. Paths are the
attribute names joined by dots, exactly as ``tinygrad.nn.state.get_state_dict``
names parameters (``layers.0.weight`` lives in the layer at ``layers.0``). A
layer is any such object with a ``__call__`` of its own: ``tinygrad.nn.Linear``,
``nn.Conv2d``, ``nn.BatchNorm`` or a user class.

Python looks ``__call__`` up on the type, so layers are wrapped at class level:
the class that defines ``__call__`` gets a wrapper that checks the calling
thread and the instance's identity, passes calls of any other thread or
instance straight through, and is put back (the very same object) when the
wrapping ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import Any

from tinygrad import Tensor

_NOT_LAYERS = (
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    functools.partial,
    type,
)


def model_object(target: Any) -> Any:
    """The object holding the layers: the target itself, or the instance a bound method belongs to."""
    owner = getattr(target, "__self__", None)
    if isinstance(target, types.MethodType) and owner is not None and not isinstance(owner, type):
        return None if isinstance(owner, Tensor) else owner
    if isinstance(target, (Tensor, *_NOT_LAYERS)):
        return None
    return target


def _children(obj: Any) -> list[tuple[str, Any]]:
    """The named children that ``get_state_dict`` walks into."""
    if hasattr(obj, "_asdict"):  # namedtuple
        obj = obj._asdict()
    if isinstance(obj, OrderedDict):
        obj = dict(obj)
    if isinstance(obj, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, _NOT_LAYERS):
        return []
    d = getattr(obj, "__dict__", None)
    return list(d.items()) if isinstance(d, dict) else []


def is_layer(obj: Any) -> bool:
    """An object with attributes and a Python ``__call__``: a tinygrad.nn layer or a user's."""
    if isinstance(obj, (Tensor, *_NOT_LAYERS)) or not isinstance(getattr(obj, "__dict__", None), dict):
        return False
    return defining_class(type(obj)) is not None


def defining_class(cls: type) -> type | None:
    """The class whose ``__call__`` (a plain Python function) instances of ``cls`` run."""
    for klass in cls.__mro__:
        call = klass.__dict__.get("__call__")
        if call is not None:
            return klass if isinstance(call, types.FunctionType) else None
    return None


# The walks are module-level generators, not closures over themselves: a nested function that calls itself
# through its own cell is a reference cycle, left for the cyclic GC at every capture.
def named_layers(root: Any) -> Iterator[tuple[str, Any]]:
    """``(path, layer)`` for every layer under ``root`` (not ``root`` itself), first path wins."""
    if root is not None:
        yield from _walk_layers(root, "", {id(root)})


def _walk_layers(obj: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, Any]]:
    for name, child in _children(obj):
        if isinstance(child, Tensor) or id(child) in seen or isinstance(child, (str, bytes, int, float)):
            continue
        if child is None or isinstance(child, _NOT_LAYERS):
            continue
        seen.add(id(child))
        path = f"{prefix}{name}"
        if is_layer(child):
            yield path, child
        yield from _walk_layers(child, path + ".", seen)


def named_tensors(root: Any) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` under ``root``, named as ``get_state_dict`` names them; safe from reference cycles."""
    if root is not None and not isinstance(root, Tensor):
        yield from _walk_tensors(root, "", set())


def _walk_tensors(obj: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for name, child in _children(obj):
        if isinstance(child, Tensor):
            yield f"{prefix}{name}", child
        elif child is not None and not isinstance(child, (str, bytes, int, float, *_NOT_LAYERS)):
            yield from _walk_tensors(child, f"{prefix}{name}.", seen)


# A layer wrapper: ``around(path, layer, call)`` runs ``call()`` (the layer's own
# ``__call__`` with the arguments it was given) and returns its result;
# ``call(replacement)`` runs ``replacement`` on those arguments instead (None: the layer's own).
Around = Callable[[str, Any, Callable[..., Any]], Any]


@contextlib.contextmanager
def wrapped_layers(paths: dict[int, str], layers: list[Any], around: Around) -> Iterator[None]:
    """Route every call of the given layers made by this thread through ``around`` while the block runs.

    A layer whose ``__call__`` calls another class's (``super().__call__``) is
    one call, not two: a call of an instance already running passes through.
    Other threads' calls pass straight through, before that check: another
    thread running the same layer must not hide this thread's call of it.
    """
    classes: dict[type, Any] = {}
    for layer in layers:
        klass = defining_class(type(layer))
        if klass is not None and klass not in classes:
            classes[klass] = klass.__dict__["__call__"]
    running: set[int] = set()
    thread = get_ident()

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if get_ident() != thread:
                return original(self, *args, **kwargs)
            key = id(self)
            path = paths.get(key)
            if path is None or key in running:
                return original(self, *args, **kwargs)
            running.add(key)
            try:
                return around(
                    path,
                    self,
                    lambda replacement=None: (
                        original(self, *args, **kwargs) if replacement is None else replacement(*args, **kwargs)
                    ),
                )
            finally:
                running.discard(key)

        return __call__

    try:
        for klass, original in classes.items():
            type.__setattr__(klass, "__call__", wrap(original))
        yield
    finally:
        for klass, original in classes.items():
            type.__setattr__(klass, "__call__", original)
