"""Telling module calls apart in a jaxpr: a named scope and an output marker per call.

While the jaxpr is traced, every call of a submodule runs inside a
``jax.named_scope`` unique to the call, and the array leaves of what it
returns pass through an identity primitive, the marker. The equations' name
stacks then say which call each one ran in (through jit, scan and cond bodies
too), and the marker says which variables the call returned, and where it
ended. Module calls are intercepted either by temporary ``__call__`` wrappers
(flax.nnx, equinox) or by linen's own method interceptor.

``tl.splice_module`` acts here too: a call that a splice names runs the
replacement instead of the module's own code while the jaxpr is traced, so the
replacement's equations are what the walk finds in that call's scope.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from torchlens_core.ir import tree
from torchlens_jax.arrays import is_array

SCOPE_PREFIX = "torchlens#"
MARKER_NAME = "torchlens_module_output"
_capture_ids = itertools.count(1)
# Every capture's scope names ("torchlens#4.2": capture 4, call 2), read by one pattern compiled once: a pattern of
# its own per capture id would be compiled by every capture (the `re` cache keeps a few hundred).
_SCOPE_NAME = re.compile(rf"{re.escape(SCOPE_PREFIX)}(\d+)\.(\d+)\b")

# hook(module, original __call__, args, kwargs) -> what the call returns
CallHook = Callable[[Any, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
# splicer(module path, how many calls of it have been traced, this one included) -> what replaces the call, or None
Splicer = Callable[[str, int], Callable[..., Any] | None]


class CallScopes:
    """Scopes and marks module calls while a jaxpr is traced.

    ``calls[k]`` is the module path of the k-th scoped call, ``templates[k]``
    the structure of what it returned, ``types[path]`` the module's type name.
    Scope names and markers carry this capture's id, so that leftovers of
    another capture (in a jit cache, say) are told apart and ignored.
    ``splicer`` (``tl.splice_module``) says which calls run a replacement;
    ``spliced`` holds those calls.
    """

    def __init__(self, splicer: Splicer | None = None) -> None:
        self.capture_id = next(_capture_ids)
        self.paths: dict[int, str] = {}  # id(module object) -> path, for wrapped __call__s
        self.calls: list[str] = []
        self.templates: list[Any] = []
        self.types: dict[str, str] = {}
        self.splicer = splicer
        self.spliced: set[int] = set()
        self._traced_calls: Counter[str] = Counter()
        self._id_text = str(self.capture_id)

    def calls_in(self, name_stack: str) -> tuple[int, ...]:
        """The calls named in an equation's printed name stack ("torchlens#4.0/torchlens#4.2/dot"),
        outermost first. The printed form is read, not JAX's private stack type; transforms
        show there as "jvp(torchlens#4.2)", which is found all the same."""
        mine = self._id_text
        return tuple(int(k) for capture, k in _SCOPE_NAME.findall(name_stack) if capture == mine)

    def call_of_marker(self, params: dict[str, Any]) -> int | None:
        capture_id, k = params["call"]
        return k if capture_id == self.capture_id else None

    def scoped(
        self, path: str, type_name: str, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run ``forward(*args, **kwargs)`` (or the splice's replacement) as a call of module ``path``:
        in its own scope, its array outputs marked."""
        import jax

        k = len(self.calls)
        self.calls.append(path)
        self.templates.append(None)
        self.types.setdefault(path, type_name)
        if self.splicer is not None:
            self._traced_calls[path] += 1
            replacement = self.splicer(path, self._traced_calls[path])
            if replacement is not None:
                forward = replacement
                self.spliced.add(k)
        with jax.named_scope(f"{SCOPE_PREFIX}{self.capture_id}.{k}"):
            out = forward(*args, **kwargs)
            template, arrays, flattened = slot_template(out)
            self.templates[k] = template
            marked = marker().bind(*arrays, call=(self.capture_id, k))
        # What follows must read the marker's outputs, or the marker would mark nothing. The
        # template rebuilds the output as it was (JAX would sort a dict's keys); a custom
        # pytree, which the template does not hold, is rebuilt by JAX.
        if not flattened:
            return fill(template, marked)
        swap = dict(zip(map(id, arrays), marked))
        return jax.tree_util.tree_map(lambda x: swap.get(id(x), x), out)

    def __call__(self, module: Any, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The hook for wrapped ``__call__``s: modules are known by object identity."""
        path = self.paths.get(id(module))
        if path is None:  # the root, or a module made during the call
            return original(module, *args, **kwargs)
        return self.scoped(path, type(module).__name__, lambda *a, **kw: original(module, *a, **kw), args, kwargs)

    def linen_interceptor(
        self, next_fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], context: Any
    ) -> Any:
        """The hook for ``flax.linen.intercept_methods``: modules are known by their scope path."""
        module = context.module
        if context.method_name != "__call__" or module.scope is None or not module.path:
            return next_fun(*args, **kwargs)
        path = ".".join(map(str, module.path))
        return self.scoped(path, type(module).__name__, next_fun, args, kwargs)


# -- temporary __call__ wrappers -------------------------------------------------------------
def callable_classes(modules: list[Any]) -> list[type]:
    """The classes of ``modules`` that define ``__call__`` (``object`` does not count)."""
    classes = dict.fromkeys(type(m) for m in modules)
    return [c for c in classes if any("__call__" in k.__dict__ for k in c.__mro__[:-1])]


@contextlib.contextmanager
def wrapped_calls(classes: list[type], hook: CallHook, method: str = "__call__") -> Iterator[None]:
    """Route every ``method`` (``__call__``; linen's ``apply``) of ``classes`` through
    ``hook(module, original, args, kwargs)``.

    The originals are looked up before anything is wrapped, so that a
    subclass's wrapper calls the original method, never its parent's wrapper
    (one call, one scope). Everything is put back on the way out, however it
    is left (an exception in the model, a KeyboardInterrupt).
    """
    originals = {cls: getattr(cls, method) for cls in classes}
    saved: list[tuple[type, Any]] = []
    try:
        for cls in classes:
            saved.append((cls, cls.__dict__.get(method, _MISSING)))
            setattr(cls, method, _wrapper(originals[cls], hook, method))
        yield
    finally:
        for cls, old in reversed(saved):
            if old is _MISSING:
                delattr(cls, method)
            else:
                setattr(cls, method, old)


_MISSING = object()


def _wrapper(original: Callable[..., Any], hook: CallHook, method: str = "__call__") -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return hook(self, original, args, kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__name__ = method
    wrapper.__qualname__ = getattr(original, "__qualname__", method)
    return wrapper


# -- the marker ------------------------------------------------------------------------------
_MARKER: Any = None


def marker() -> Any:
    """The identity primitive that marks a module call's outputs in the jaxpr.

    The capture's walker reads it and never runs it. Its rules (identity
    everywhere) keep a jaxpr that escaped into a jit cache during capture
    usable later: evaluated, lowered, batched or differentiated.
    """
    global _MARKER
    if _MARKER is None:
        from jax.extend.core import Primitive
        from jax.interpreters import ad, batching, mlir

        p = Primitive(MARKER_NAME)
        p.multiple_results = True
        p.def_impl(lambda *xs, call: list(xs))
        p.def_abstract_eval(lambda *avals, call: list(avals))
        mlir.register_lowering(p, lambda ctx, *xs, call: list(xs))
        batching.primitive_batchers[p] = lambda xs, dims, call: (p.bind(*xs, call=call), dims)
        ad.primitive_jvps[p] = lambda xs, ts, call: (p.bind(*xs, call=call), list(ts))
        ad.primitive_transposes[p] = lambda cts, *xs, call: list(cts)
        _MARKER = p
    return _MARKER


# -- output structure ------------------------------------------------------------------------
@attrs.frozen
class Slot:
    """Stands for the ``index``-th array leaf of a value, in a structure template."""

    index: int


def slot_template(value: Any) -> tuple[Any, list[Any], bool]:
    """``value``'s structure with each array leaf replaced by a Slot; the array leaves; whether flattened.

    Arrays are found as JAX flattens ``value``; the template keeps the
    structure the core can walk (tuple, list, dict, namedtuple, dataclass), in
    the value's own order. When arrays hide in something else (a custom
    pytree), the template is a flat tuple of Slots and the third result True.
    """
    import jax

    arrays = [leaf for leaf in jax.tree_util.tree_leaves(value) if is_array(leaf)]
    slots: dict[int, deque[int]] = {}
    for j, leaf in enumerate(arrays):
        slots.setdefault(id(leaf), deque()).append(j)
    used: list[int] = []

    def to_slot(leaf: Any) -> Any:
        queue = slots.get(id(leaf))
        if not queue:
            return leaf
        used.append(queue.popleft())
        return Slot(used[-1])

    try:
        template = tree.map_leaves(to_slot, value)
    except Exception:  # noqa: BLE001 - a dataclass that refuses to be rebuilt, say
        used = []
    if sorted(used) != list(range(len(arrays))):
        return tuple(Slot(j) for j in range(len(arrays))), arrays, True
    return template, arrays, False


def fill(template: Any, values: list[Any]) -> Any:
    """Replace the Slots of ``template`` by ``values``."""
    return tree.map_leaves(lambda x: values[x.index] if isinstance(x, Slot) else x, template)


def unfill(template: Any, value: Any, n: int) -> list[Any]:
    """The ``n`` leaves of ``value`` (``template`` filled, then rebuilt leaf by leaf) at its Slots, in slot
    order: :func:`fill`'s inverse."""
    found: list[Any] = [None] * n
    for path, slot in tree.leaves(template, lambda x: isinstance(x, Slot)):
        found[slot.index] = tree.get(value, path)
    return found
