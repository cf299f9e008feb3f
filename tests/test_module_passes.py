"""torchlens_core.capture.passes.ModulePasses for a capture whose values carry their Ref (a walk's environment,
as JAX's jaxpr walk has), not arrays found by ``id``: module passes close with the Refs of what the module
computed, pass-through ops for the rest, and intervene='s module sites, each checked against NumPy's own answer.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import attrs
import numpy as np
import pytest

from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.capture.edits import PassThroughs
from torchlens_core.capture.passes import ModulePasses
from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.capture.selectors import module
from torchlens_core.ir.errors import InterventionError
from torchlens_core.ir.records import OpRecord, ParamRecord, ParamRef, Ref
from torchlens_core.steer.helpers import when


@attrs.define(slots=True, eq=False)
class Leaf:
    """A value of the toy walk's environment: the array and what an op reading it says for it."""

    value: Any
    ref: Ref | ParamRef | None = None


class Walk(ModulePasses):
    """The hooks a walk gives ModulePasses: no producer map, each leaf says which op made it."""

    def __init__(self, builder: TraceBuilder) -> None:
        self.builder = builder
        self.reads = PassThroughs(None, builder.ops)

    def is_array(self, value: Any) -> bool:
        return type(value) is Leaf

    def producer(self, value: Leaf) -> Ref | None:
        return value.ref if isinstance(value.ref, Ref) else None

    def pass_source(self, value: Leaf, ref: Ref | None) -> tuple[Any, Any]:
        return (ref if ref is not None else value.ref if value.ref is not None else value.value), value.value

    def passed(self, value: Leaf, op: OpRecord, seen: Any) -> Leaf:
        return Leaf(seen, Ref(op.index))

    def values_of(self, output: Any) -> Any:
        return tuple(v.value if type(v) is Leaf else v for v in output)

    def relink(self, value: Leaf, ref: Ref, edited: Any) -> Leaf:
        if edited is not value.value:
            self.reads.replaced(value, ref.index)
        return Leaf(edited, ref)

    def describe(self, value: Any) -> tuple[tuple[int, ...], str, str]:
        return tuple(value.shape), str(value.dtype), "cpu"

    def op(self, name: str, fn: Any, *args: Leaf) -> Leaf:
        self.reads.read(list(args))
        value = fn(*(a.value for a in args))
        parents = tuple(a.ref.index for a in args if isinstance(a.ref, Ref))
        params = tuple(a.ref.name for a in args if isinstance(a.ref, ParamRef))
        op = self.builder.add_op(
            name,
            fn,
            tuple(a.ref for a in args),
            {},
            parents,
            value,
            shape=value.shape,
            dtype=str(value.dtype),
            device="cpu",
            params=params,
        )
        return Leaf(self.builder.seen_value(op, value), Ref(op.index))


def _start(options: CaptureOptions | None = None) -> tuple[Walk, Leaf, Leaf]:
    builder = TraceBuilder("numpy", options=options)
    builder.add_module("block", "Block")
    builder.add_param(ParamRecord("block.w", (3,), "float64", 3, True, "block", value=np.full(3, 2.0)))
    x = np.arange(3.0)
    walk = Walk(builder)
    return (
        walk,
        Leaf(x, Ref(builder.add_input(x, (3,), "float64", "cpu").index)),
        Leaf(np.full(3, 2.0), ParamRef("block.w")),
    )


def test_a_pass_returns_its_own_ops_and_pass_through_ops_for_the_rest() -> None:
    walk, x, w = _start()
    builder = walk.builder
    walk.enter_pass("block")
    y = walk.op("multiply", np.multiply, x, w)
    out = walk.exit_pass("block", (y, x, w, 7))  # computed, the caller's input, a parameter, plain data
    assert out[0] is y and out[3] == 7
    identities = [op for op in builder.ops if op.meta.get("identity")]
    assert [op.args for op in identities] == [(Ref(0),), (ParamRef("block.w"),)]
    assert all(op.module_passes == (("block", 1),) for op in identities)  # computed inside the pass
    template = builder.modules["block"].passes[0].out_template
    assert template == (y.ref, Ref(identities[0].index), Ref(identities[1].index), 7)
    assert [v.ref for v in out[1:3]] == [template[1], template[2]]
    np.testing.assert_array_equal(out[1].value, np.arange(3.0))
    # the model's own output: every recorded op counts, only the parameter gets an op
    refs, returned = walk.returned((y, w), None)
    assert refs[0] == y.ref and builder.ops[refs[1].index].args == (ParamRef("block.w"),)
    assert builder.module_stack == ()


@pytest.mark.skipif(
    importlib.util.find_spec("torchlens_numpy") is None,
    reason="the edit helpers run on the numpy backend's array operations: the core session has it",
)
def test_a_module_site_edits_what_the_caller_reads_and_refuses_the_modules_own_kept_value() -> None:
    helper = when(module("block"), lambda v, site: v * -1.0)
    walk, x, w = _start(CaptureOptions(intervene=helper))
    walk.enter_pass("block")
    y = walk.op("multiply", np.multiply, x, w)
    (edited,) = walk.exit_pass("block", (y,))
    np.testing.assert_array_equal(edited.value, -(np.arange(3.0) * 2.0))  # NumPy's answer on the plain arrays
    assert edited.ref == y.ref and walk.builder.ops[y.ref.index].edits
    after = walk.op("add", np.add, edited, x)
    np.testing.assert_array_equal(after.value, -(np.arange(3.0) * 2.0) + np.arange(3.0))
    with pytest.raises(InterventionError, match="kept elsewhere"):  # the module's own, unedited y
        walk.op("add", np.add, y, x)
