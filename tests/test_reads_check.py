"""The schema's check of an op's reads (the Refs and ParamRefs in its arguments against its parent_indices and
params) takes a type whose values hold nothing once, and still looks inside a value that passes for a container."""

from __future__ import annotations

import numpy as np

from torchlens_core.ir import schema
from torchlens_core.ir.records import OpRecord, Ref


class _Posing:
    """Passes for the class of what it wraps, as some proxies do: isinstance believes it, type() does not."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    @property
    def __class__(self):
        return type(self._wrapped)

    def items(self):
        return self._wrapped.items()


class _Constant:
    """A constant argument of a type of its own: it holds nothing."""


def _op(*args) -> OpRecord:
    return OpRecord(index=2, kind="op", func_name="f", args=args, parent_indices=(0,), shape=(2,), dtype="float32")


def test_a_leaf_type_is_learned_and_the_reads_are_still_checked() -> None:
    assert schema.op_problem(_op(_Constant(), Ref(0)), {}) is None
    assert _Constant in schema._LEAVES
    # the next op's constant of that type is passed by its type; its reads are checked all the same
    assert schema.op_problem(_op(_Constant(), np.ones(2), Ref(0)), {}) is None
    assert "parent_indices lists [0]" in schema.op_problem(_op(_Constant()), {})
    assert "read ops [0, 1]" in schema.op_problem(_op(_Constant(), Ref(0), Ref(1)), {})


def test_a_value_passing_for_another_class_is_never_taken_for_a_leaf() -> None:
    # First a posing value that holds nothing (it passes for an int), then one that passes for a dict holding a Ref:
    # had its type been learned as a leaf from the first, the second's Ref would go unseen.
    assert "parent_indices lists [0]" in schema.op_problem(_op(_Posing(7)), {})
    assert _Posing not in schema._LEAVES
    assert schema.op_problem(_op(_Posing(7), _Posing({"a": Ref(0)})), {}) is None


def test_the_learned_types_stay_bounded(monkeypatch) -> None:
    monkeypatch.setattr(schema, "_LEAVES", set())
    monkeypatch.setattr(schema, "_MAX_LEAVES", 3)
    for i in range(10):
        made = type(f"Made{i}", (), {})  # classes made at run time
        assert schema.op_problem(_op(made(), Ref(0)), {}) is None
        assert len(schema._LEAVES) <= 3 and made in schema._LEAVES
