"""Records without their values, and new records made from them: what the capture cache keeps of a trace.

A :class:`Template` holds a record's field values in constructor order (the
value itself, the links to its trace and what is worked out after the
capture left out) and, for each field a record must not share with another
(a list, a dict, an argument template), the cheapest function that copies it.
:meth:`Template.make` gives a new record: two traces made from one template
share nothing a user could change in one of them. Templates are made once,
when a capture is kept; records, at every repeat capture
(:mod:`torchlens_jax.capture_cache`), so copying is kept to what is mutable.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import attrs

from torchlens_core.ir import tree
from torchlens_core.ir.records import DType, ModulePass, ModuleRecord, OpRecord, ParamRecord


@attrs.define(slots=True, eq=False)
class Template:
    """A record's field values in constructor order; ``copies``: the fields a new record needs its own copy of
    (lists, dicts, templates), with the function that copies each."""

    cls: type
    values: list[Any]
    copies: list[tuple[int, Any]]

    def make(self, at: int = -1, value: Any = None) -> Any:
        """A new record; field number ``at`` (if any) set to ``value``."""
        values = self.values.copy()
        for i, copier in self.copies:
            values[i] = copier(values[i])
        if at >= 0:
            values[at] = value
        return self.cls(*values)


FIELD_AT = {
    cls: {f.name: i for i, f in enumerate(attrs.fields(cls))}
    for cls in (OpRecord, ModulePass, ModuleRecord, ParamRecord)
}
# Templates call the records' constructors with every field in order.
assert all(f.init for cls in FIELD_AT for f in attrs.fields(cls)), "a record field the constructor does not take"
# Fields a template never keeps: values, links to the trace, and what is worked out after the capture.
_DROPPED = frozenset({"out", "pre_edit", "stored", "grad", "trace_ref", "cost", "value", "passes"})
_TEMPLATE_FIELDS = {"out_template", "in_template"}  # Ref templates: any container the core can walk


def template(record: Any, **fields: Any) -> Template:
    """The template of ``record``, with ``fields`` given other values (``elapsed=None``, say)."""
    values, copies = [], []
    for i, f in enumerate(attrs.fields(type(record))):
        if f.name in fields:
            value = fields[f.name]
        else:
            value = None if f.name in _DROPPED else getattr(record, f.name)
        if type(value) is DType:  # the plain str the slot keeps: records are made from templates without the
            value = str.__str__(value)  # property that converts it (records.op_from_fields)
        copier = fresh_template if f.name in _TEMPLATE_FIELDS else _copier(value)
        if copier is not None:
            value = copier(value)  # the template's own: the first trace's user may change its records
            copies.append((i, copier))
        values.append(value)
    return Template(type(record), values, copies)


def _mutable(value: Any) -> bool:
    if isinstance(value, (dict, list, set)):
        return True
    return type(value) is tuple and any(_mutable(v) for v in value)


_FLAT = (dict, list, set)


def _flat(value: Any) -> bool:
    """A dict, list or set holding nothing mutable: a shallow copy is a whole copy."""
    return type(value) in _FLAT and not any(map(_mutable, value.values() if type(value) is dict else value))


def _copier(value: Any) -> Any:
    """The cheapest function giving a copy of ``value`` that shares nothing mutable with it; None: nothing to copy.
    (Equation parameters are hashable, so ``op.call``'s and ``op.kwargs``' dicts hold nothing mutable.)"""
    if not _mutable(value):
        return None
    if _flat(value):
        return type(value).copy
    if (
        type(value) is tuple
        and len(value) == 2
        and not _mutable(value[0])
        and type(value[1]) is dict
        and _flat(value[1])
    ):
        return _copy_call  # op.call: (primitive, its parameters)
    if type(value) is tuple and all(_flat(v) or not _mutable(v) for v in value):
        return _copy_flat_items
    return fresh


def _copy_call(value: tuple[Any, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    return value[0], value[1].copy()


def _copy_flat_items(value: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(v.copy() if type(v) in _FLAT else v for v in value)


def fresh(value: Any) -> Any:
    """A copy of every dict, list and set in ``value`` (through plain tuples); anything else is shared."""
    if isinstance(value, dict):
        return {k: fresh(v) for k, v in value.items()}
    if isinstance(value, list):
        return [fresh(v) for v in value]
    if isinstance(value, set):
        return set(value)
    if type(value) is tuple:
        return tuple(fresh(v) for v in value)
    return value


def fresh_template(value: Any) -> Any:
    """A copy of a template's every container (tuple, list, dict, namedtuple, dataclass); its leaves shared."""
    kids = tree.children(value)
    if kids is None:
        return value
    if dataclasses.is_dataclass(value):
        new = copy.copy(value)
        for key, child in kids:
            object.__setattr__(new, key, fresh_template(child))
        return new
    return tree.rebuild(value, [fresh_template(child) for _, child in kids])
