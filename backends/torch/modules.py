"""Each module's configuration (``out_channels=384, kernel_size=(3, 3)...``): what ``print(op)`` shows as Config.

The capture declares it with each module record (``_declare`` in capture.py), read when first asked for.

``trace.modules[path].config`` is what ``print(op)`` shows as ``Config`` for an op a module returned: the
module's constructor arguments, as the module keeps them in attributes of the same name. Arguments the
constructor requires come first (what it produces, ``out_*``, before what it takes, ``in_*``), then those
given other values than their defaults; anything that is not plain data (a parameter, a submodule, a
function) is left out, as are arguments the module does not keep.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

# Constructor arguments that say where or in what the weights are made, not what the module does.
_SKIP = frozenset({"device", "dtype", "factory_kwargs"})
_PLAIN = (bool, int, float, str, type(None))
# type -> its constructor's arguments: (name, default, required), in the order to show them
_SIGNATURES: dict[type, tuple[tuple[str, Any, bool], ...]] = {}


def module_config(module: torch.nn.Module) -> dict[str, Any]:
    """The module's constructor arguments it keeps as attributes: required ones, then those not at their default."""
    found: dict[str, Any] = {}
    members = (module._parameters, module._buffers, module._modules)
    for name, default, required in _signature(type(module)):
        if any(name in table for table in members):  # bias=False is the missing parameter, not a setting
            continue
        value = module.__dict__.get(name, _MISSING)
        if value is _MISSING or not _plain(value):
            continue
        if required or not _is_default(value, default):
            found[name] = value
    return found


_MISSING = object()


def _signature(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    known = _SIGNATURES.get(cls)
    if known is None:
        try:
            # (mypy: __init__ read off a class is the class's own, which is what is wanted here)
            params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # type: ignore[misc]  # self
        except (TypeError, ValueError):  # a constructor written in C, or one inspect cannot read
            params = []
        named = [
            (p.name, p.default, p.default is inspect.Parameter.empty)
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in _SKIP
        ]
        # what the module makes (out_channels, out_features) before what it takes (in_...), then the rest
        first = [n for n in named if n[2] and n[0].startswith("out_")]
        then = [n for n in named if n[2] and n[0].startswith("in_")]
        known = _SIGNATURES[cls] = (*first, *then, *(n for n in named if n not in first and n not in then))
    return known


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(isinstance(v, _PLAIN) for v in value)
    return isinstance(value, _PLAIN)


def _is_default(value: Any, default: Any) -> bool:
    """``stride=(1, 1)`` is the default ``stride=1``: torch widens a number to a tuple per dimension."""
    if default is inspect.Parameter.empty:
        return False
    if isinstance(value, (tuple, list)) and not isinstance(default, (tuple, list)):
        return all(v == default and type(v) is type(default) for v in value)
    return type(value) is type(default) and value == default


_NAMED_MODULES = torch.nn.Module.named_modules


def named_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``list(model.named_modules())``, walked without a generator per module.

    torch's walk nests one generator per level, and every module yielded climbs
    through each of them: on a model of 150 modules that walk costs more than the
    rest of declaring it, and a capture walks twice (declaring, and the values the
    trace must not share memory with). A model with a module whose class walks
    its own way gets torch's walk.
    """
    found: list[tuple[str, torch.nn.Module]] = []
    memo: set[torch.nn.Module] = set()  # by the modules' own hash, as torch's walk
    stack = [("", model)]
    while stack:
        prefix, module = stack.pop()
        if module in memo:
            continue
        if type(module).named_modules is not _NAMED_MODULES:
            return list(model.named_modules())
        memo.add(module)
        found.append((prefix, module))
        children = module._modules
        if children:  # pushed last first: popped in their order, each one's subtree before the next
            dot = f"{prefix}." if prefix else ""
            stack += reversed([(dot + name, child) for name, child in children.items() if child is not None])
    return found
