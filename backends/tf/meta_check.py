"""Before an op of a loaded trace runs, TensorFlow's own shape inference on it: attributes that disagree are refused.

A file can be hand-made with hashes to match, and an allow-listed op is not
safe with any attributes: a ``Conv2D`` given strides of another length, or a
``Reshape`` given another shape, reaches the eager kernel, which fails with an
untyped error or gives a value of another shape. So the op is first built in a
scratch ``tf.Graph`` on placeholders of its arguments' shapes and dtypes:
building a graph op runs the op's registered shape function (the same checks
the kernel's own validation mirrors), and runs no kernel. Small integer
arguments (a reshape's shape, a transpose's permutation, an axis) go in as
constants, so shape functions that read such values use them. If building the
op raises, or its fully known output shape is not the recorded one, the op is
refused with a :class:`ReplayError` before the kernel sees the arguments.

Only loaded traces are checked: a live trace's ops ran with these very
arguments in the model's forward. Not checked, and run as before
(LIMITATIONS.md): variable reads and ops on variables (their arguments are
resources), replayed random values, calls with no tensor argument, and an
output whose inferred shape has unknown dimensions (it depends on values the
shape function does not see).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import op_def_registry

from torchlens_core.ir.records import OpRecord
from torchlens_core.replay.checked import PassedChecks, from_file, refused, wrong_shape

_CONSTANT_LIMIT = 64  # integer arguments up to this many elements go in as constants (shapes, axes, perms)
_UNCHECKABLE = (tf.resource, tf.variant, tf.string)


def check_loaded(op: OpRecord, args: tuple[Any, ...]) -> None:
    """Refuse ``op``'s call with these arguments when its trace was loaded and shape inference disagrees."""
    if from_file(op):
        check(op, args)


def check(op: OpRecord, args: tuple[Any, ...]) -> None:
    """Build ``op.call`` in a scratch graph; ReplayError if shape inference raises or gives another shape.

    A call already seen to pass (the same op type and attributes, the same argument shapes and dtypes and
    constant values, the same recorded shape) passes again without a graph: shape inference sees nothing
    else, and a model repeats the same calls in each of its blocks.
    """
    if op.call.kind != "op" or not args or not all(_checkable(a) for a in args):
        return  # variables, replayed random values, no or unusual tensor arguments: run as before
    _PASSED.run(_signature(op, args), lambda: _check(op, args))


_PASSED = PassedChecks()  # calls that passed, by signature (see check)


def _checkable(value: Any) -> bool:
    return isinstance(value, tf.Tensor) and value.dtype not in _UNCHECKABLE and value.shape.rank is not None


def _constant(value: tf.Tensor) -> bool:
    """Does ``value`` go into the scratch graph as a constant (a small integer tensor: a shape, an axis...)."""
    return value.dtype in (tf.int32, tf.int64) and value.shape.num_elements() <= _CONSTANT_LIMIT


def _signature(op: OpRecord, args: tuple[Any, ...]) -> Any:
    """What shape inference depends on, hashable; None where some attribute is not."""

    def describe(v: Any) -> Any:
        if isinstance(v, tf.Tensor):
            value = tuple(v.numpy().ravel().tolist()) if _constant(v) else None
            return ("tensor", tuple(v.shape.as_list()), v.dtype.name, value)
        if isinstance(v, tf.TensorShape):
            return ("shape", None if v.rank is None else tuple(v.as_list()))
        if isinstance(v, (list, tuple)):
            return (type(v), tuple(describe(x) for x in v))
        return (type(v), v)  # the type too: True == 1 == 1.0, but an attribute's kind may take them apart

    call = op.call
    try:
        key = (
            call.op_type,
            call.num_outputs,
            describe(call.attrs),
            describe(args),
            None if op.shape is None else tuple(op.shape),
        )
        hash(key)
    except TypeError:
        return None
    return key


def _attr_value(kind: str, value: Any) -> attr_value_pb2.AttrValue:
    """``value`` as an ``AttrValue`` of the op definition's attribute type ``kind`` ("int", "list(type)"...).

    The loader has checked each value against its attribute's type (``torchlens_tf.saving``)."""
    if kind.startswith("list("):
        item = kind[len("list(") : -1]
        out = attr_value_pb2.AttrValue()
        out.list.SetInParent()
        for v in value:
            one = _attr_value(item, v)
            getattr(
                out.list, {"type": "type", "int": "i", "float": "f", "bool": "b", "string": "s", "shape": "shape"}[item]
            ).append(getattr(one, one.WhichOneof("value")))
        return out
    if kind == "type":
        return attr_value_pb2.AttrValue(type=tf.as_dtype(value).as_datatype_enum)
    if kind == "int":
        return attr_value_pb2.AttrValue(i=value)
    if kind == "float":
        return attr_value_pb2.AttrValue(f=value)
    if kind == "bool":
        return attr_value_pb2.AttrValue(b=value)
    if kind == "string":
        return attr_value_pb2.AttrValue(s=value.encode() if isinstance(value, str) else value)
    if kind == "shape":
        return attr_value_pb2.AttrValue(shape=tf.TensorShape(value).as_proto())
    raise TypeError(f"attribute type {kind}")


def _counts(op_def: Any, attrs: dict[str, Any]) -> list[int | None]:
    """How many flat inputs each of the op definition's arguments takes (None: one, not in a list)."""
    return [
        attrs[arg.number_attr].i
        if arg.number_attr
        else len(attrs[arg.type_list_attr].list.type)
        if arg.type_list_attr
        else None
        for arg in op_def.input_arg
    ]


def _check(op: OpRecord, args: tuple[Any, ...]) -> None:
    """Shape inference itself: raises ReplayError where it disagrees with the arguments or the record."""
    call = op.call
    op_def = op_def_registry.get(call.op_type)
    defs = {a.name: a.type for a in op_def.attr}
    try:
        attrs = {
            name: _attr_value(defs[name], value)
            for name, value in zip(call.attrs[::2], call.attrs[1::2])
            if value is not None
        }
        counts = _counts(op_def, attrs)
    except (KeyError, TypeError):
        return  # an attribute this check cannot express (a function, a tensor), or none saying how many inputs
    if sum(1 if n is None else n for n in counts) != len(args):
        return  # replay refuses the call itself (torchlens_tf.replay.run_op checks the count)
    graph = tf.Graph()
    with graph.as_default():
        inputs = [tf.constant(a.numpy()) if _constant(a) else tf.compat.v1.placeholder(a.dtype, a.shape) for a in args]
        try:
            # the flat inputs: the graph groups them into the definition's list arguments itself, by its attributes
            built = graph._create_op_internal(call.op_type, inputs, attrs=attrs)
        except Exception as exc:  # noqa: BLE001 - shape functions raise ValueError, InvalidArgumentError...
            raise refused(
                op, f"its recorded attributes do not fit its arguments ({type(exc).__name__}: {str(exc)[:300]})"
            ) from None
    shapes = [o.shape for o in built.outputs]
    if op.shape is None or any(not s.is_fully_defined() for s in shapes):
        return  # the output's shape depends on values: the record check after the call still applies
    got = tuple(shapes[0].as_list()) if len(shapes) == 1 else tuple(tuple(s.as_list()) for s in shapes)
    if got != tuple(op.shape):
        raise wrong_shape(op, got, "attributes")
