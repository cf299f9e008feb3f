"""Module outputs of a plain function, seen by the frameworks' own means (for the conformance suite).

``tl.trace(fn, x)`` records the module calls ``fn`` makes (function_modules.py).
The reference the suite compares them with runs ``fn`` plainly, jit off, and
sees each call as the framework shows it: linen's method interceptor (with
each module's own scope path), equinox's ``__call__`` on the module objects
found inside the one top-level module. Where that reference cannot be made
independently of the capture's own naming, it says so (None) rather than
guess: several top-level modules (named after the variables holding them),
and nnx modules, whose calls update their state (running them here would move
the user's RNG streams and batch statistics).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from torchlens_jax.arrays import to_numpy
from torchlens_jax.function_modules import argument_modules, named_modules
from torchlens_jax.modules import framework_of, submodules
from torchlens_jax.scopes import callable_classes, fill, slot_template, wrapped_calls


def observe_function_modules(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``{"path:pass": output}`` of the module calls inside ``fn``; {} when it uses no module; None when the
    calls cannot be named without the capture's own rules (see the module docstring)."""
    found = {id(m): m for _, m in named_modules(fn) + argument_modules(fn, args, kwargs)}
    if not found:
        return {}
    if len(found) > 1:
        return None
    (top,) = found.values()
    kind = framework_of(top)
    if kind == "linen":
        return _linen_calls(fn, args, kwargs)
    if kind == "equinox":
        return _equinox_calls(top, fn, args, kwargs)
    return None


def _record(outputs: dict[str, Any], passes: Counter[str], path: str, out: Any) -> None:
    import jax

    passes[path] += 1
    template, arrays, _ = slot_template(out)
    concrete = not any(isinstance(x, jax.core.Tracer) for x in arrays)  # under vmap: seen, not comparable
    outputs[f"{path}:{passes[path]}"] = fill(template, [to_numpy(x) for x in arrays]) if concrete else None


def _linen_calls(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    import flax.linen as nn
    import jax

    outputs: dict[str, Any] = {}
    passes: Counter[str] = Counter()

    def interceptor(next_fun: Callable[..., Any], a: tuple[Any, ...], kw: dict[str, Any], context: Any) -> Any:
        out = next_fun(*a, **kw)
        module = context.module
        if context.method_name == "__call__" and module.scope is not None and module.path:  # the root's own: no
            _record(outputs, passes, ".".join(map(str, module.path)), out)
        return out

    with jax.disable_jit(), nn.intercept_methods(interceptor):
        fn(*args, **kwargs)
    return outputs


def _equinox_calls(top: Any, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    import jax

    objects = submodules(top)
    paths = {id(m): p for p, m in objects}
    outputs: dict[str, Any] = {}
    passes: Counter[str] = Counter()

    def hook(module: Any, original: Callable[..., Any], a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        out = original(module, *a, **kw)
        path = paths.get(id(module))
        if path is not None:
            _record(outputs, passes, path, out)
        return out

    with jax.disable_jit(), wrapped_calls(callable_classes([m for _, m in objects]), hook):
        fn(*args, **kwargs)
    return outputs
