"""Models: splitting a target into named parameters, finding its submodules, observing their outputs.

A flax.nnx or equinox model (or a bound method of one) is split into a flat
list of parameter arrays and a function that rebuilds the callable from them,
so that parameters become named inputs of the jaxpr. So is a Keras 3 model
run on Keras's JAX backend: its variables become the parameters, and the
model runs in a ``keras.StatelessScope`` that maps each to its jaxpr input. flax.linen's
``model.apply`` takes its variables as first argument: those become the
parameters. Anything else is a plain function, whose array arguments are
inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Container, Mapping
from typing import Any, Final

import attrs

from torchlens_core.backend.keras_layers import is_keras_layer, keras_module, layer_paths, sanitize, variable_names
from torchlens_core.ir.errors import UnsupportedError
from torchlens_jax.arrays import to_numpy
from torchlens_jax.jitted import unjitted
from torchlens_jax.scopes import CallScopes, callable_classes, fill, slot_template, wrapped_calls


@attrs.define
class ParamLeaf:
    name: str
    value: Any
    trainable: bool
    is_buffer: bool


@attrs.define
class ModelView:
    """A target split into parameter arrays and a function that rebuilds the callable from them."""

    kind: str  # "nnx", "equinox", "linen", "keras" or "function"
    target: Any
    type_name: str
    params: list[ParamLeaf]
    rebuild: Callable[[list[Any]], Callable[..., Any]]
    # Leading positional arguments that hold the parameters (linen's variables): not inputs.
    param_args: int = 0
    # Submodules known before the call, (path, object), root excluded (nnx and equinox).
    objects: list[tuple[str, Any]] = attrs.Factory(list)
    # nnx and equinox: where those submodules are (attribute names, indices and keys), for finding them again in
    # a rebuilt copy; None: walk the copy.
    module_paths: tuple[tuple[Any, ...], ...] | None = None

    def objects_of(self, call: Any) -> list[tuple[str, Any]]:
        """The submodules of ``call``, a model (or bound method) that :attr:`rebuild` made: an nnx copy is merged
        from the view's own graph definition, so its submodules are at the view's paths."""
        if self.kind == "keras":  # no copy: the rebuilt call runs the model's own layers
            return self.objects
        if self.module_paths is not None:
            found = _at_paths(call.__self__ if inspect.ismethod(call) else call, self.module_paths, self.kind)
            if found is not None:
                return found
        return submodules(call)

    def call_plain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the model the ordinary way. An nnx model runs as a copy built from the
        same state, so that neither the user's model nor the capture advances the other; a Keras model in a
        stateless scope, so that the call assigns nothing (a dropout's seed, batch statistics in training)."""
        if self.kind in ("nnx", "keras"):
            return self.rebuild([p.value for p in self.params])(*args, **kwargs)
        return self.target(*args, **kwargs)

    def interception(self, scopes: CallScopes) -> contextlib.AbstractContextManager[Any]:
        """What routes submodule calls through ``scopes`` while the jaxpr is traced."""
        if self.kind in ("nnx", "equinox"):
            return wrapped_calls(callable_classes([m for _, m in self.objects]), scopes)
        if self.kind == "keras":  # the user's own layers, which other threads may be calling: this thread's only
            return wrapped_calls(callable_classes([m for _, m in self.objects]), _this_thread(scopes))
        if self.kind == "linen":
            import flax.linen as nn

            return nn.intercept_methods(scopes.linen_interceptor)
        return contextlib.nullcontext()


# -- what the target is ------------------------------------------------------------------------
def framework_of(target: Any) -> str | None:
    """ "nnx", "equinox" or "linen" for module objects of those libraries, without importing them."""
    if "flax.nnx" in sys.modules and isinstance(target, sys.modules["flax.nnx"].Module):
        return "nnx"
    if "equinox" in sys.modules and isinstance(target, sys.modules["equinox"].Module):
        return "equinox"
    if "flax.linen" in sys.modules and isinstance(target, sys.modules["flax.linen"].Module):
        return "linen"
    return None


def view_model(target: Any, args: tuple[Any, ...] = ()) -> ModelView:
    inner = unjitted(target)
    if inner is not target:  # a jit wrapper is viewed as what it runs; its plain call is still the wrapper's
        view = view_model(inner, args)
        view.target = target
        return view
    root, method = target, None
    if inspect.ismethod(target) and framework_of(target.__self__) is not None:
        root, method = target.__self__, target.__func__.__name__
    kind = framework_of(root)
    if kind is None and is_keras_on_jax(root):
        return _view_keras(target, root)
    if kind == "nnx":
        return _view_nnx(target, root, method)
    if kind == "equinox":
        return _view_equinox(target, root, method)
    if kind == "linen" and method == "apply" and args:
        return _view_linen_apply(target, root, args[0])
    if kind == "linen":
        raise UnsupportedError(
            f"{type(root).__name__} is a flax.linen module, which holds no parameters of its own; trace its "
            f"apply function with the variables instead: tl.trace(model.apply, variables, x)"
        )
    name = getattr(target, "__name__", type(target).__name__)
    return ModelView("function", target, name, [], lambda _: target)


def _view_nnx(target: Any, model: Any, method: str | None) -> ModelView:
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)
    paths, objects = _nnx_submodules(model, graphdef)
    treedef = jax.tree_util.tree_structure(state)
    params = []
    for path, var in jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]:
        is_param = isinstance(var, nnx.Param)
        for sub, value in jax.tree_util.tree_flatten_with_path(var)[0]:
            # A Variable keeps its array under ".value": the name is the attribute path alone.
            sub = tuple(k for k in sub if _key_name(k) not in ("value", "raw_value"))
            params.append(ParamLeaf(_dotted(path + sub), value, is_param, not is_param))

    def rebuild(leaves: list[Any]) -> Any:
        copy = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves))
        return getattr(copy, method) if method else copy

    return ModelView("nnx", target, type(model).__name__, params, rebuild, objects=objects, module_paths=paths)


def _view_equinox(target: Any, model: Any, method: str | None) -> ModelView:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    arrays, static = eqx.partition(model, eqx.is_array)
    flat, treedef = jax.tree_util.tree_flatten_with_path(arrays)
    params = [
        ParamLeaf(_dotted(path), value, bool(jnp.issubdtype(value.dtype, jnp.inexact)), False) for path, value in flat
    ]

    def rebuild(leaves: list[Any]) -> Any:
        copy = eqx.combine(jax.tree_util.tree_unflatten(treedef, leaves), static)
        return getattr(copy, method) if method else copy

    found, shared = _equinox_submodules(model)
    # A copy rebuilt from the leaves has its submodules at the same paths; a module reachable by two paths is
    # two modules in the copy (pytrees keep no sharing), so such a model's copies are walked instead.
    paths = None if shared else tuple(path for path, _ in found)
    objects = [(_dotted(path), m) for path, m in found]
    return ModelView("equinox", target, type(model).__name__, params, rebuild, objects=objects, module_paths=paths)


def _view_linen_apply(target: Any, model: Any, variables: Any) -> ModelView:
    """``model.apply(variables, ...)``: the variables are the parameters, named by their path
    inside their collection ("fc1.kernel"; "batch_stats.bn.mean" only if a name would repeat)."""
    import jax

    flat, treedef = jax.tree_util.tree_flatten_with_path(variables)
    params: list[ParamLeaf] = []
    taken: set[str] = set()
    for path, value in flat:
        collection, name = _key_name(path[0]), _dotted(path[1:])
        if name in taken or not name:
            name = _dotted(path)
        taken.add(name)
        params.append(ParamLeaf(name, value, collection == "params", collection != "params"))

    def rebuild(leaves: list[Any]) -> Any:
        return functools.partial(target, jax.tree_util.tree_unflatten(treedef, leaves))

    return ModelView("linen", target, type(model).__name__, params, rebuild, param_args=1)


def is_keras_on_jax(obj: Any) -> bool:
    """Whether ``obj`` is a Keras 3 layer (or model) and Keras runs on JAX (checked without importing Keras)."""
    keras = keras_module()
    return keras is not None and is_keras_layer(obj) and keras.backend.backend() == "jax"


def _view_keras(target: Any, model: Any) -> ModelView:
    """A Keras model on JAX: its variables (weights, batch statistics, seed-generator states) are the
    parameters, named as every backend names them (:mod:`torchlens_core.backend.keras_layers`).

    The rebuilt callable is the model's own ``__call__`` run in a ``keras.StatelessScope`` mapping each
    variable to the array given for it: the layers read those arrays, and what they assign (a dropout's
    seed state, batch statistics in training) stays in the scope instead of leaking a tracer into the
    model. A bound method other than ``__call__`` is refused: Keras's JAX trainer owns those.
    """
    import keras

    if inspect.ismethod(target) and target.__func__.__name__ != "__call__":
        raise UnsupportedError(
            f"{type(model).__name__}.{target.__func__.__name__} is a method of a Keras model; trace the model "
            f"itself (tl.trace(model, x, backend='jax')), which runs its __call__"
        )
    if not model.built:
        raise UnsupportedError(
            f"{type(model).__name__} is a Keras model that is not built yet, so its variables do not exist; "
            f"call it once (or build it with keras.Input) before tracing"
        )
    layers = layer_paths(model)
    names = variable_names(model, layers)
    variables = list(model.variables)
    params = []
    for v in variables:
        name, _, trainable, is_buffer = names.get(id(v)) or (sanitize(v.path), "", bool(v.trainable), True)
        params.append(ParamLeaf(name, v.value, trainable, is_buffer))

    def rebuild(leaves: list[Any]) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with keras.StatelessScope(state_mapping=list(zip(variables, leaves))):
                return model(*args, **kwargs)

        return call

    return ModelView("keras", target, type(model).__name__, params, rebuild, objects=layers)


def _this_thread(hook_of_calls: Callable[..., Any]) -> Callable[..., Any]:
    """A call hook passing this thread's calls to ``hook_of_calls``; other threads' calls run as they would."""
    ident = threading.get_ident()

    def hook(module: Any, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if threading.get_ident() != ident:
            return original(module, *args, **kwargs)
        return hook_of_calls(module, original, args, kwargs)

    return hook


def submodules(model: Any) -> list[tuple[str, Any]]:
    """``(path, module)`` of every module inside an nnx or equinox ``model`` (itself excluded);
    a module reachable by two paths is listed once, under the first."""
    model = model.__self__ if inspect.ismethod(model) else model
    kind = framework_of(model)
    if kind == "nnx":
        from flax import nnx

        nnx_found = [(_dotted(p), m) for p, m in nnx.iter_modules(model) if p]
        return sorted(nnx_found, key=lambda pm: _sort_key(pm[0]))
    if kind != "equinox":
        return []
    return [(_dotted(path), m) for path, m in _equinox_submodules(model)[0]]


def _equinox_submodules(model: Any) -> tuple[list[tuple[tuple[Any, ...], Any]], bool]:
    """``(path, module)`` of every equinox module inside ``model`` (itself excluded), each once under the first
    path reaching it, and whether some module is reachable by two paths."""
    import equinox as eqx

    found: list[tuple[tuple[Any, ...], Any]] = []
    seen = {id(model)}
    repeated: list[tuple[Any, ...]] = []
    for f in dataclasses.fields(model):
        _walk_equinox(getattr(model, f.name, None), (f.name,), eqx.Module, found, seen, repeated)
    return found, bool(repeated)


# nnx module paths by graph definition. nnx.iter_modules walks every node of the graph, arrays included (0.3 ms
# for nnx_cnn's 4 submodules, 0.8 ms for nnx_attention's 9), where a lookup costs a hash and an ==: two models
# of equal graph definitions (what nnx.jit keys its own cache on) have their submodules at the same paths.
# None: this structure's paths do not lead back to the modules nnx.iter_modules listed (a container whose
# indexing means something else), so its models are always walked.
_NNX_PATHS: OrderedDict[Any, tuple[tuple[Any, ...], ...] | None] = OrderedDict()
_NNX_PATHS_SIZE = 64
_NNX_LOCK = threading.Lock()


class _Missing(enum.Enum):
    MISSING = 0  # an enum member, Final: a type checker tells it from a cached value


_MISSING: Final = _Missing.MISSING


def _nnx_submodules(model: Any, graphdef: Any) -> tuple[tuple[tuple[Any, ...], ...] | None, list[tuple[str, Any]]]:
    """``model``'s submodules as :func:`submodules` lists them, and their paths (None when they cannot be
    followed), ``graphdef`` being the model's own graph definition."""
    from flax import nnx

    try:
        with _NNX_LOCK:
            paths = _NNX_PATHS.get(graphdef, _MISSING)
            if paths is not _MISSING:
                _NNX_PATHS.move_to_end(graphdef)
    except Exception:  # noqa: BLE001 - a static attribute that cannot be hashed or compared: no caching
        return None, submodules(model)
    if paths is not _MISSING:
        found = None if paths is None else _at_paths(model, paths)
        return (paths, found) if found is not None else (None, submodules(model))
    listed = sorted(((_dotted(p), p, m) for p, m in nnx.iter_modules(model) if p), key=lambda e: _sort_key(e[0]))
    walked = [(dotted, m) for dotted, _, m in listed]
    paths = tuple(p for _, p, _ in listed)
    found = _at_paths(model, paths)
    if found is None or [id(m) for _, m in found] != [id(m) for _, m in walked]:
        paths = None
    with _NNX_LOCK:
        _NNX_PATHS[graphdef] = paths
        while len(_NNX_PATHS) > _NNX_PATHS_SIZE:
            _NNX_PATHS.popitem(last=False)
    return paths, walked


def _at_paths(model: Any, paths: tuple[tuple[Any, ...], ...], kind: str = "nnx") -> list[tuple[str, Any]] | None:
    """``(dotted path, module)`` at each path of ``model``, in the order of ``paths`` (kept as :func:`submodules`
    lists them); None if a path does not lead to a distinct module of ``kind`` ("nnx" or "equinox")."""
    if kind == "nnx":
        from flax import nnx

        module_type = nnx.Module
    else:
        import equinox as eqx

        module_type = eqx.Module
    found: list[tuple[str, Any]] = []
    seen = {id(model)}
    for path in paths:
        obj = model
        try:
            for key in path:
                obj = obj[key] if isinstance(key, int) or isinstance(obj, Mapping) else getattr(obj, key)
        except (AttributeError, KeyError, IndexError, TypeError):
            return None
        if not isinstance(obj, module_type) or id(obj) in seen:
            return None
        seen.add(id(obj))
        found.append((_dotted(path), obj))
    return found


def _walk_equinox(
    obj: Any,
    path: tuple[Any, ...],
    module_type: Any,
    found: list[tuple[tuple[Any, ...], Any]],
    seen: set[int],
    repeated: list[tuple[Any, ...]],
) -> None:
    """Equinox modules under ``obj`` into ``found``, the paths of those met again into ``repeated`` (a
    module-level function: a closure calling itself is a reference cycle, left for the cyclic GC at every
    capture)."""
    if isinstance(obj, module_type):
        if id(obj) in seen:
            repeated.append(path)
            return
        seen.add(id(obj))
        found.append((path, obj))
        for f in dataclasses.fields(obj):
            _walk_equinox(getattr(obj, f.name, None), (*path, f.name), module_type, found, seen, repeated)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk_equinox(v, (*path, i), module_type, found, seen, repeated)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk_equinox(v, (*path, k), module_type, found, seen, repeated)


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey / FlattenedIndexKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(k) if isinstance(k, (str, int)) else _key_name(k) for k in path)


def _sort_key(path: str) -> tuple[Any, ...]:
    """Parents before children; numbered children in numeric order ("layers.2" before "layers.10")."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split("."))


def owner(name: str, module_paths: Container[str]) -> str:
    """The innermost module path that holds parameter ``name`` ("" for the root): its longest dotted prefix
    among ``module_paths`` (a set or dict: one lookup per prefix)."""
    end = name.rfind(".")
    while end > 0:
        if name[:end] in module_paths:
            return name[:end]
        end = name.rfind(".", 0, end)
    return ""


# -- the framework's own view of module outputs ------------------------------------------------
def observe_module_outputs(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Run the model plainly and keep a NumPy copy of each submodule call's output: ``{"path:pass": out}``.

    nnx and equinox: ``__call__`` wrappers keyed by object identity, with jit
    disabled so that loop bodies run once per iteration on concrete values
    (calls whose outputs are abstract even so, under ``jax.vmap``, map to
    None: seen, not compared). linen: the framework's own ``capture_intermediates``.
    """
    import jax

    target = unjitted(target)  # what a jit wrapper runs: its module calls are what this observes
    view = view_model(target, args)
    if view.kind == "linen":
        return _observe_linen(target, args, kwargs)
    if view.kind == "function":
        from torchlens_jax.observe import observe_function_modules

        return observe_function_modules(target, args, kwargs)
    call = view.rebuild([p.value for p in view.params]) if view.kind == "nnx" else target  # nnx: on a copy
    objects = view.objects_of(call)
    paths = {id(m): p for p, m in objects}
    passes: Counter[str] = Counter()
    outputs: dict[str, Any] = {}

    def hook(module: Any, original: Callable[..., Any], a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        path = paths.get(id(module))
        if path is None:
            return original(module, *a, **kw)
        passes[path] += 1
        key = f"{path}:{passes[path]}"
        out = original(module, *a, **kw)
        template, arrays, _ = slot_template(out)
        # under jax.vmap the outputs stay abstract even with jit off: the call was seen, its value cannot be
        # shown (None: counted, not compared, as the hook's contract says)
        concrete = not any(isinstance(x, jax.core.Tracer) for x in arrays)
        outputs[key] = fill(template, [to_numpy(x) for x in arrays]) if concrete else None
        return out

    installed = _this_thread(hook) if view.kind == "keras" else hook  # the user's own layers: this thread's calls
    with jax.disable_jit(), wrapped_calls(callable_classes([m for _, m in objects]), installed):
        call(*args, **kwargs)
    return outputs


def _observe_linen(apply: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """linen's own ``capture_intermediates``, and its method interceptor for the calls that misses.

    ``capture_intermediates`` does not see into lifted transforms (``nn.scan``,
    so ``nn.RNN``'s cell): their bodies keep the ``intermediates`` collection
    only when the model declares it among the transform's variable axes. The
    interceptor sees every ``__call__`` as it runs, jit off, each scan step
    on concrete values; a call whose output is abstract even so (linen's
    pass over a scan body for its broadcast variables) maps to None.
    """
    import flax.linen as nn
    import jax

    kwargs = dict(kwargs)
    mutable = kwargs.pop("mutable", False)  # the caller's own mutable collections, plus ours
    if mutable is False or isinstance(mutable, (str, list, tuple)):
        mutable = [*([mutable] if isinstance(mutable, str) else mutable or []), "intermediates"]
    intercepted: dict[str, Any] = {}
    passes: Counter[str] = Counter()

    def interceptor(next_fun: Callable[..., Any], a: tuple[Any, ...], kw: dict[str, Any], context: Any) -> Any:
        out = next_fun(*a, **kw)
        module = context.module
        if context.method_name == "__call__" and module.scope is not None and module.path:
            path = ".".join(map(str, module.path))
            passes[path] += 1
            template, arrays, _ = slot_template(out)
            concrete = not any(isinstance(x, jax.core.Tracer) for x in arrays)
            intercepted[f"{path}:{passes[path]}"] = fill(template, [to_numpy(x) for x in arrays]) if concrete else None
        return out

    with jax.disable_jit(), nn.intercept_methods(interceptor):
        _, state = apply(*args, capture_intermediates=True, mutable=mutable, **kwargs)
    outputs: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
        for key, value in node.items():
            if key == "__call__" and path:  # the root's own output is the model's
                for n, out in enumerate(value, 1):
                    template, arrays, _ = slot_template(out)
                    outputs[f"{'.'.join(path)}:{n}"] = fill(template, [to_numpy(x) for x in arrays])
            elif isinstance(value, Mapping):
                walk(value, (*path, key))

    walk(state.get("intermediates", {}), ())
    for key, out in intercepted.items():
        outputs.setdefault(key, out)
    return outputs
