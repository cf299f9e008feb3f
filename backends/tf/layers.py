"""Layers and variables of what is traced: their paths, and the interception of layer calls.

Paths and variable names of Keras layers are the ones every backend gives
them (:mod:`torchlens_core.backend.keras_layers`). A plain function's Keras
layers, tf.Modules and variables found in its closure or in the globals it
names are roots named by their Python names; a tf.Module's variables by their
attribute path (``dense.w``). Keras weights (trainable or not) are
parameters; Keras seed-generator states and variables found nowhere else are
buffers.

Layer calls. ``keras.layers.Layer.__call__`` is replaced, while at least one
capture or observation runs, by a wrapper that reports each call of a known
layer with its output, to the :class:`LayerCalls` of the thread making the
call; other threads' calls go straight to the original. Subclasses that
override ``__call__`` reach it through ``super()``. Overlapping captures share
the one replacement, put back by the last one out
(:func:`torchlens_core.capture.threads.shared_patch`). For ``intervene=``,
the wrapper returns the caller what ``leave`` edited, and may run a
replacement instead of the layer's call (``tl.splice_module``).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import Any

import attrs

from torchlens_core.backend.keras_layers import is_keras_layer, keras_module, layer_paths, layer_variables, sanitize
from torchlens_core.capture.threads import shared_patch
from torchlens_core.ir.errors import UnsupportedError
from torchlens_tf.arrays import resource_variable


@attrs.define(slots=True)
class VarInfo:
    name: str
    variable: Any  # the tf.Variable (resource variable) itself
    module: str
    trainable: bool
    is_buffer: bool


@attrs.define(slots=True)
class ModelView:
    """What capture and observation know about a target before it runs."""

    type_name: str
    root: Any  # the Keras layer or tf.Module the target belongs to, or None
    layers: list[tuple[str, Any]]  # (path, layer), parents before children
    variables: list[VarInfo]

    @property
    def paths(self) -> dict[int, str]:
        return {id(layer): path for path, layer in self.layers}


def check_keras_backend() -> None:
    keras = keras_module()
    if keras is not None and keras.backend.backend() != "tensorflow":
        raise UnsupportedError(
            f"this Keras model runs on Keras's {keras.backend.backend()!r} backend; the tf backend traces "
            f"Keras 3 on TensorFlow only. Set KERAS_BACKEND=tensorflow before importing keras, or trace "
            f"the model with TorchLens's backend for {keras.backend.backend()!r}."
        )


def _is_tf_module(obj: Any) -> bool:
    tf = sys.modules["tensorflow"]
    return isinstance(obj, tf.Module)


class _Collector:
    def __init__(self) -> None:
        self.layers: list[tuple[str, Any]] = []
        self.variables: list[VarInfo] = []
        self.seen_layers: set[int] = set()
        self.seen_vars: set[int] = set()
        self.names: set[str] = set()

    def variable(self, name: str, v: Any, module: str, trainable: bool, is_buffer: bool) -> None:
        rv = resource_variable(v)
        if rv is None or id(rv) in self.seen_vars:
            return
        self.seen_vars.add(id(rv))
        base, k = name, 2
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        self.variables.append(VarInfo(name, rv, module, trainable, is_buffer))

    def keras_root(self, layer: Any, path: str) -> None:
        """``layer`` and everything below it; ``path`` "" for the traced model itself."""
        if path:
            if id(layer) in self.seen_layers:
                return
            self.layers.append((path, layer))
        self.seen_layers.add(id(layer))
        start = len(self.layers)
        self.layers.extend(layer_paths(layer, path, self.seen_layers))
        for p, owner in [(path, layer), *self.layers[start:]]:
            for name, v, trainable, is_buffer in layer_variables(owner, p):
                self.variable(name, v, p, trainable, is_buffer)
        # Variables Keras knows of but no tracked layer holds directly (most are known by now: looked up first).
        for v in layer.variables:
            rv = resource_variable(v)
            if rv is not None and id(rv) not in self.seen_vars:
                self.variable((f"{path}." if path else "") + sanitize(v.path), v, path, bool(v.trainable), True)

    def tf_module(self, module: Any, path: str) -> None:
        tf = sys.modules["tensorflow"]
        prefix = f"{path}." if path else ""
        for where, v in module._flatten(predicate=lambda x: isinstance(x, tf.Variable), with_path=True):
            self.variable(prefix + ".".join(sanitize(str(p)) for p in where), v, path, bool(v.trainable), False)

    def anything(self, obj: Any, name: str, depth: int = 0) -> None:
        tf = sys.modules["tensorflow"]
        if is_keras_layer(obj):
            self.keras_root(obj, name)
        elif isinstance(obj, tf.Module):
            self.tf_module(obj, name)
        elif isinstance(obj, tf.Variable) or resource_variable(obj) is not None:
            self.variable(name, obj, "", bool(getattr(obj, "trainable", True)), False)
        elif isinstance(obj, tf.random.Generator):
            self.variable(f"{name}.state", obj.state, "", False, True)
        elif isinstance(obj, (list, tuple)) and len(obj) < 1000 and depth < 3:
            for i, item in enumerate(obj):
                self.anything(item, f"{name}.{i}", depth + 1)
        elif isinstance(obj, dict) and len(obj) < 1000 and depth < 3:
            for key, item in obj.items():
                self.anything(item, f"{name}.{sanitize(str(key))}", depth + 1)


def _function_globals(fn: Any) -> Iterator[tuple[str, Any]]:
    """What a plain function can reach: closure cells, defaults, and the globals it names."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:  # an empty cell
            continue
    for i, value in enumerate(fn.__defaults__ or ()):
        yield f"default_{i}", value
    for name, value in (fn.__kwdefaults__ or {}).items():
        yield name, value
    scope = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in scope:
            yield name, scope[name]


def unwrap(target: Any) -> tuple[Any, Any, str]:
    """``(callable to run, object owning the layers and variables, description)`` for a target.

    A bound method of a layer or tf.Module (a tf.function's Python function
    included) belongs to that object; the target itself is what runs.
    """
    tf = sys.modules["tensorflow"]
    fn = target
    python_function = getattr(target, "python_function", None)
    if isinstance(target, tf.types.experimental.PolymorphicFunction) and python_function is not None:
        fn = python_function
    owner = getattr(fn, "__self__", None)
    if is_keras_layer(target) or _is_tf_module(target):
        return target, target, type(target).__name__
    if owner is not None and (is_keras_layer(owner) or _is_tf_module(owner)):
        return target, owner, f"{type(owner).__name__}.{getattr(fn, '__name__', 'call')}"
    return target, None, getattr(fn, "__name__", type(target).__name__)


def view_model(target: Any) -> ModelView:
    tf = sys.modules["tensorflow"]
    _, owner, type_name = unwrap(target)
    collect = _Collector()
    if owner is not None:
        if is_keras_layer(owner):
            check_keras_backend()
            collect.keras_root(owner, "")
        else:
            collect.tf_module(owner, "")
    else:
        fn = target
        if isinstance(target, tf.types.experimental.PolymorphicFunction):
            fn = getattr(target, "python_function", target)
        if isinstance(fn, (types.FunctionType, types.MethodType)):
            for name, value in _function_globals(getattr(fn, "__func__", fn)):
                if is_keras_layer(value):
                    check_keras_backend()
                collect.anything(value, sanitize(name))
    return ModelView(type_name=type_name, root=owner, layers=collect.layers, variables=collect.variables)


class LayerCalls:
    """Report the calls of known layers made by this thread, from ``install()`` until ``restore()``.

    ``enter(path)`` runs before a known layer's call; ``leave(path, output)``
    after it, with what the layer returned (what it returns, unless None, is
    what the caller gets instead: intervene='s edit); ``failed(path)`` if it
    raised. ``splice(path)``, asked after ``enter``, may give a callable to
    run instead of the layer's ``__call__``, with the same arguments
    (``tl.splice_module``).
    """

    def __init__(
        self,
        paths: dict[int, str],
        enter: Callable[[str], None] | None,
        leave: Callable[[str, Any], Any],
        failed: Callable[[str], None] | None = None,
        splice: Callable[[str], Callable[..., Any] | None] | None = None,
    ) -> None:
        self.paths = paths
        self.enter, self.leave, self.failed, self.splice = enter, leave, failed, splice
        self._installed: contextlib.ExitStack | None = None

    def install(self) -> None:
        keras = keras_module()
        if keras is None or not self.paths:
            return
        stack = contextlib.ExitStack()
        stack.enter_context(shared_patch(keras.layers.Layer, "__call__", _reporting_call).use(self))
        self._installed = stack

    def restore(self) -> None:
        installed, self._installed = self._installed, None
        if installed is not None:
            installed.close()


def _reporting_call(original: Callable[..., Any], handlers: dict[int, LayerCalls]) -> Callable[..., Any]:
    """``Layer.__call__`` reporting known layers' calls to the calling thread's LayerCalls."""
    find = handlers.get

    def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:
        calls = find(get_ident())
        path = calls.paths.get(id(layer)) if calls is not None else None
        if calls is None or path is None:  # another thread, or a layer the capture does not know
            return original(layer, *args, **kwargs)
        if calls.enter is not None:
            calls.enter(path)
        try:
            replacement = calls.splice(path) if calls.splice is not None else None
            out = original(layer, *args, **kwargs) if replacement is None else replacement(*args, **kwargs)
        except BaseException:
            if calls.failed is not None:
                calls.failed(path)
            raise
        edited = calls.leave(path, out)
        return out if edited is None else edited

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    __call__.__torchlens__ = True  # type: ignore[attr-defined]
    return __call__
