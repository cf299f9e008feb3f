"""Modules called inside a traced function: which objects they are and what their calls are named.

``tl.trace(fn, x)`` where ``fn`` calls flax.linen (``m.apply(v, x)``, a bound
module), flax.nnx or equinox modules. While the jaxpr is traced, every
``__call__`` of an nnx or equinox module class, linen's ``Module.apply`` and
linen's method interceptor route module calls here, and each one that belongs
to a *top-level module* gets its scope and output marker
(:class:`~torchlens_jax.scopes.CallScopes`).

A top-level module is a module object the function reaches itself rather than
through another module's call: one it names (an argument, a closure variable,
a global its code reads, an attribute of a bound method's object, one level
into a list, tuple or dict of them), or one it calls outside every module
call. Its submodules are found by object identity (nnx, equinox: known before
the call) or by linen's scope path. Naming (docs/backend-jax.md, "Modules
inside a function"):

- one top-level module: paths are those of tracing that module itself
  (``Conv_0``, ``fc1``), and its own calls are not module passes, as the
  traced model's are not;
- several: each is a module of its own, named by the variable it was found
  under (``enc``, ``models.1``) or, when none names it, by its type and order
  (``MLP_0``), with its submodules below (``enc.Dense_0``).

Which of the two holds is known once the whole function has been traced, so
calls are recorded as (top-level module, path inside it) and named afterwards
(:meth:`FunctionScopes.resolve`). ``tl.splice_module`` needs a call's final
path while the call is traced: the capture traces once more beforehand to
learn the top-level modules (``expected``).

Every hook asks first whether the calling thread is the capturing one: the
wrapped classes are shared, and another thread's calls pass straight through.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from torchlens_core.ir.errors import UnsupportedError
from torchlens_jax.modules import framework_of, submodules
from torchlens_jax.scopes import CallScopes, Splicer, wrapped_calls

# Module classes of the frameworks' own transforms (eqx.filter_jit's wrapper, eqx.Partial, nnx's lifted
# modules): calling one is calling the function it wraps, not a layer.
_TRANSFORM_MODULES = ("flax.nnx.transforms", "equinox.")
_LAYER_MODULES = ("equinox.nn",)


@attrs.define
class TopModule:
    """A module object the traced function reaches itself."""

    name: str
    obj: Any  # held, so that no other object takes its id while the function is traced
    type_name: str
    submodules: list[tuple[str, str]]  # (path inside it, type name) of the submodules known before any call


class FunctionScopes(CallScopes):
    """CallScopes for a plain function: calls are found by the top-level module they belong to.

    ``sites[k]`` is call ``k``'s (top-level module index, path inside it: ""
    for the module's own call); ``calls[k]``, its final path, or None for the
    own call of a lone top-level module, is set by :meth:`resolve`.
    ``expected``: the top-level modules a first trace used (for splices).
    """

    def __init__(
        self, splicer: Splicer | None, named: list[tuple[str, Any]], expected: list[int] | None = None
    ) -> None:
        super().__init__(splicer)
        self.thread = threading.get_ident()
        self.tops: list[TopModule] = []
        self.sites: list[tuple[int, str]] = []
        self.expected = expected
        self._where: dict[int, list[tuple[int, str]]] = {}  # id(module) -> where it is, first found first
        self._open: list[int] = []  # the top-level module of each open scoped call, innermost last
        self._linen: list[int | None] = []  # linen's open top-level calls (None: run as part of another call)
        self._unnamed: Counter[str] = Counter()
        for name, obj in named:
            self.add(name, obj)

    # -- finding top-level modules ----------------------------------------------------------
    def add(self, name: str | None, obj: Any) -> int:
        """Register ``obj`` as a top-level module (named ``name``, or by its type and order); its index."""
        for top, sub in self._where.get(id(obj), ()):
            if not sub:
                return top
        type_name = type(obj).__name__
        if name is None or name in {t.name for t in self.tops}:
            taken = {t.name for t in self.tops}
            while name is None or name in taken:
                name = f"{type_name}_{self._unnamed[type_name]}"
                self._unnamed[type_name] += 1
        index = len(self.tops)
        subs = submodules(obj)  # nnx and equinox; linen submodules are known by their scope path instead
        self.tops.append(TopModule(name, obj, type_name, [(p, type(m).__name__) for p, m in subs]))
        self._where.setdefault(id(obj), []).append((index, ""))
        for path, module in subs:
            self._where.setdefault(id(module), []).append((index, path))
        return index

    def name_arguments(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The modules among the arguments the function is about to be called with (rebuilt from the
        arguments' leaves: not the caller's objects), named by the parameters they bind to."""
        for name, obj in argument_modules(fn, args, kwargs):
            self.add(name, obj)

    def _locate(self, module: Any) -> tuple[int, str] | None:
        """Where a called module is: inside the innermost open top-level call that holds it; called by the
        function itself, as a top-level module of its own if it is one; None if it is none of those."""
        found = self._where.get(id(module))
        if found and self._open:
            for top in reversed(self._open):
                for site in found:
                    if site[0] == top:
                        return site
            return found[0]
        if found:
            return next((site for site in found if not site[1]), found[0])
        if self._open:  # made during a call, or reached only through one: its ops are that call's
            return None
        return self.add(None, module), ""

    # -- scoping a call ---------------------------------------------------------------------
    def scoped_at(
        self,
        top: int,
        sub: str,
        type_name: str,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if self.expected is not None and len(self.expected) < 2 and top not in self.expected:
            # Only a splice's replacement runs here what the first trace did not: a second top-level module,
            # whose paths would be the lone module's ("fc2" for both), and every path would have to change.
            raise UnsupportedError(
                f"tl.splice_module's replacement calls {self.tops[top].name} ({self.tops[top].type_name}), a module "
                f"the traced function does not call otherwise; its modules would take the paths of the function's "
                f"own. Call it in the function too, or splice with a replacement that calls no other module"
            )
        self.sites.append((top, sub))
        self._open.append(top)
        try:
            # the path is None for a lone top-level module's own call (see the class): CallScopes types its
            # paths as str, and takes None through (calls_in never reports that call)
            path = self._path(top, sub, self._multi_while_tracing)
            return self.scoped(path, type_name, forward, args, kwargs)  # type: ignore[arg-type]
        finally:
            self._open.pop()

    @property
    def _multi_while_tracing(self) -> bool:
        # Before resolve, a path must be unique (prefixed) unless a first trace said how it ends.
        return True if self.expected is None else len(self.expected) > 1

    def _path(self, top: int, sub: str, multi: bool) -> str | None:
        if not multi:
            return sub or None
        name = self.tops[top].name
        return f"{name}.{sub}" if sub else name

    def __call__(self, module: Any, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The hook for wrapped nnx and equinox ``__call__``s."""
        site = self._locate(module) if threading.get_ident() == self.thread else None
        if site is None:
            return original(module, *args, **kwargs)
        return self.scoped_at(*site, type(module).__name__, lambda *a, **kw: original(module, *a, **kw), args, kwargs)

    def linen_apply(
        self, module: Any, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """The hook for ``flax.linen.Module.apply``: a top-level call, the module being the unbound one the
        user holds (apply runs a fresh bound clone of it each time)."""
        if threading.get_ident() != self.thread:
            return original(module, *args, **kwargs)
        site = self._locate(module)
        self._linen.append(None if site is None else site[0])
        try:
            if site is None:  # applied inside another module's call: part of that call
                return original(module, *args, **kwargs)
            return self.scoped_at(
                site[0], "", type(module).__name__, lambda *a, **kw: original(module, *a, **kw), args, kwargs
            )
        finally:
            self._linen.pop()

    def linen_interceptor(
        self, next_fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], context: Any
    ) -> Any:
        """The hook for ``flax.linen.intercept_methods`` (thread-local): submodules by their scope path,
        below the linen top-level call they run in; a bound module's own calls as top-level calls."""
        module = context.module
        if module.scope is None or context.method_name == "setup":
            return next_fun(*args, **kwargs)
        if not module.path:  # apply's clone (apply is the top-level call), or a bound module
            site = None if self._linen else self._locate(module)
            if site is None:
                return next_fun(*args, **kwargs)
            self._linen.append(site[0])
            try:
                return self.scoped_at(site[0], "", type(module).__name__, next_fun, args, kwargs)
            finally:
                self._linen.pop()
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        top = self._linen[-1] if self._linen else self._bound_top(module)
        if top is None:
            return next_fun(*args, **kwargs)
        return self.scoped_at(top, ".".join(map(str, module.path)), type(module).__name__, next_fun, args, kwargs)

    def _bound_top(self, module: Any) -> int | None:
        """A submodule of a bound module called by the function itself (``bound.encoder(x)``): its root."""
        import flax.linen as nn

        root = module
        while isinstance(root.parent, nn.Module):
            root = root.parent
        site = self._locate(root)
        return None if site is None else site[0]

    # -- after tracing ----------------------------------------------------------------------
    def calls_in(self, name_stack: str) -> tuple[int, ...]:
        return tuple(k for k in super().calls_in(name_stack) if self.calls[k] is not None)

    def used(self) -> list[int]:
        """The top-level modules some scoped call belongs to, in order of first call."""
        return list(dict.fromkeys(top for top, _ in self.sites))

    def resolve(self) -> None:
        """Give every call its final path, and ``types`` every module of the top-level modules used."""
        used = self.used()
        multi = len(used) > 1 if self.expected is None else len(self.expected) > 1
        before, provisional = self.types, self._multi_while_tracing
        self.types = {}
        for top in used:  # each top-level module, then its submodules known beforehand (called or not)
            if multi:
                self.types[self.tops[top].name] = self.tops[top].type_name
            for sub, type_name in self.tops[top].submodules:
                sub_path = self._path(top, sub, multi)
                if sub_path is not None:  # (always: a submodule's path inside its top-level module is not "")
                    self.types.setdefault(sub_path, type_name)
        for k, (top, sub) in enumerate(self.sites):
            path = self._path(top, sub, multi)
            self.calls[k] = path  # type: ignore[assignment]  # None, as in scoped_at
            if path is not None:
                self.types.setdefault(path, before[self._path(top, sub, provisional)])  # type: ignore[index]  # same


# -- what the function names -----------------------------------------------------------------
def named_modules(fn: Any) -> list[tuple[str, Any]]:
    """The modules ``fn`` names outside its arguments, ``(name, module)``: a partial's bound arguments,
    closure variables, globals its code reads (a decorated function's and each wrapper's), and the
    attributes of a bound method's (or callable object's) own object. Arguments are named when the
    function is called (``argument_modules``)."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    while id(fn) not in seen:
        seen.add(id(fn))
        if isinstance(fn, functools.partial):
            found += argument_modules(fn.func, fn.args, fn.keywords)
            fn = fn.func
            continue
        owner = None
        code_of: Any
        if inspect.ismethod(fn):
            owner, code_of = fn.__self__, fn.__func__
        elif inspect.isfunction(fn) or framework_of(fn) is not None or not callable(fn):
            code_of = fn
        else:  # a callable object: its attributes, and its class's __call__
            owner = fn
            code_of = next((vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)), None)
        found += _named_by_code(code_of)
        if owner is not None and framework_of(owner) is None:
            for name, value in list(getattr(owner, "__dict__", {}).items()):
                found += _modules_in(name, value)
        wrapped = getattr(fn, "__wrapped__", None)  # jax.jit, functools.wraps: what runs inside
        if wrapped is None:
            break
        fn = wrapped
    return found


def _named_by_code(fn: Any) -> list[tuple[str, Any]]:
    """The modules among a function's closure variables and the globals its code reads."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found: list[tuple[str, Any]] = []
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            found += _modules_in(name, cell.cell_contents)
        except ValueError:  # an empty cell: a variable not assigned yet
            pass
    namespace = getattr(fn, "__globals__", {})
    for name in _global_names(code):
        if name in namespace:
            found += _modules_in(name, namespace[name])
    return found


def argument_modules(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """The modules among ``args``/``kwargs``, named by the parameters of ``fn`` they bind to."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):  # no signature to read, or arguments it refuses: named by position
        bound = {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
    found: list[tuple[str, Any]] = []
    for name, value in bound.items():  # *args and **kwargs are a tuple and a dict: one level in
        found += _modules_in(name, value)
    return found


def _modules_in(name: str, value: Any) -> list[tuple[str, Any]]:
    """``value`` if it is a module (or a bound method of one), or the modules in a list, tuple or dict of
    modules (one level in; a container whose first item is no module is not searched, so that a large
    global list of numbers costs nothing)."""
    if inspect.ismethod(value) and framework_of(value.__self__) is not None:
        value = value.__self__
    if framework_of(value) is not None:
        return [(name, value)]
    items: list[tuple[Any, Any]] = []
    if isinstance(value, (list, tuple)) and value and framework_of(value[0]) is not None:
        items = list(enumerate(value))
    elif isinstance(value, dict) and value and framework_of(next(iter(value.values()))) is not None:
        items = list(value.items())
    return [(f"{name}.{k}", v) for k, v in items if framework_of(v) is not None]


def _global_names(code: Any) -> list[str]:
    """Names ``code`` (and the functions, lambdas and comprehensions inside it) may read as globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names += _global_names(const)
    return list(dict.fromkeys(names))


# -- interception ----------------------------------------------------------------------------
def module_classes() -> list[type]:
    """Every nnx and equinox module class defining ``__call__`` (those of the libraries imported so far),
    the frameworks' transform wrappers excepted."""
    bases = [sys.modules[name].Module for name in ("flax.nnx", "equinox") if name in sys.modules]
    found: dict[type, None] = {}
    todo = list(bases)
    while todo:
        for cls in type.__subclasses__(todo.pop()):
            if cls not in found:
                found[cls] = None
                todo.append(cls)
    return [
        cls
        for cls in found
        if any("__call__" in k.__dict__ for k in cls.__mro__[:-1])
        and (not cls.__module__.startswith(_TRANSFORM_MODULES) or cls.__module__.startswith(_LAYER_MODULES))
    ]


@contextlib.contextmanager
def function_interception(scopes: FunctionScopes) -> Iterator[None]:
    """Route module calls through ``scopes`` while a function's jaxpr is traced; all put back on the way out."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(wrapped_calls(module_classes(), scopes))
        if "flax.linen" in sys.modules:
            nn = sys.modules["flax.linen"]
            stack.enter_context(wrapped_calls([nn.Module], scopes.linen_apply, method="apply"))
            stack.enter_context(nn.intercept_methods(scopes.linen_interceptor))
        yield
