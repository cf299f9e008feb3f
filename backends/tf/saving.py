"""Saving TensorFlow calls for ``tl.save`` and rebuilding them for ``tl.load``.

A call (a ``TFCall``) is saved as its op type, attributes, output count and
kind, and rebuilt only if the op's definition in TensorFlow's registry says it
is pure computation (:func:`refusal`). The allow-list, by kind:

- ``op`` (executed): an op TensorFlow files under its array, math, nn, linalg,
  image, bitwise, spectral, special-math, sparse, RNN or stateless-random
  operations (the module of its ``tf.raw_ops`` wrapper), that is not stateful,
  has at least one output and takes no function or tensor attribute; never
  ``Abort``, ``Timestamp``, ``ImmutableConst`` (it maps a file), printing,
  file, Python-callback, debug or device-communication ops;
- ``read``: ``ReadVariableOp`` of the one variable replay gives it;
- ``variable``: the variable ops capture records (reads, gathers, assigns,
  scatters, optimizer applies, ``tf.random.Generator`` draws), with every
  resource input among the variables, which replay replaces by temporaries;
- ``recorded``: stateful random ops, which are never executed (replay returns
  the recorded value).

Every attribute must be one the op defines, of the type it defines, and the
output count must be the one the definition gives for those attributes.
Attribute values are rebuilt from JSON only (numbers, strings, bytes, dtypes,
shapes and lists of them). Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from torchlens_core.ir.errors import TraceFileError

# Op types that touch files, run Python, print, or hold iterators: never run from a file.
_REFUSED = re.compile(
    r"File|Save|Restore|Py|Print|Write|Summary|Reader|Iterator|Dataset|Queue|Shell|Debug|"
    r"Checkpoint|Host|Send|Recv|Server|Enqueue|Dequeue|Record|Load",
    re.IGNORECASE,
)
_KINDS = ("op", "read", "variable", "recorded")
# Ops outside the array families, or that reach outside the process, even if the registry calls them pure.
_NEVER = re.compile(r"Abort|Timestamp|Immutable|Mlir|Xla|TPU|Tpu|DTensor|Collective|Nccl|Remote|Guarantee")
# tf.raw_ops wrapper modules (tensorflow.python.ops.gen_<name>) whose ops compute on arrays only.
_PURE_FAMILIES = frozenset(
    {
        "array_ops",
        "math_ops",
        "nn_ops",
        "linalg_ops",
        "image_ops",
        "bitwise_ops",
        "spectral_ops",
        "special_math_ops",
        "sparse_ops",
        "rnn_ops",
        "cudnn_rnn_ops",
        "ctc_ops",
        "manip_ops",
        "stateless_random_ops",
        "stateless_random_ops_v2",
        "random_index_shuffle_ops",
    }
)
_VARIABLE_OPS = re.compile(
    r"ReadVariableOp|ResourceGather(Nd)?|VariableShape|Assign(Add|Sub)?VariableOp|"
    r"ResourceScatter\w+|Resource(Sparse)?Apply\w+|ResourceStridedSliceAssign|Stateful\w+|"
    r"RngReadAndSkip|RngSkip"
)
_ATTR_TYPES = {"type": "dtype", "int": "int", "float": "float", "bool": "bool", "string": "string", "shape": "shape"}
MAX_OUTPUTS = 1 << 16  # replay allocates this many handles: a file must not ask for billions


def _attr(value: Any) -> Any:
    import tensorflow as tf

    if (
        value is None
        or isinstance(value, (bool, int, str))
        or (isinstance(value, float) and value == value and abs(value) != float("inf"))
    ):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, bytes):
        return {"bytes": value.decode("latin-1")}
    if isinstance(value, tf.DType):
        return {"dtype": value.name}
    if isinstance(value, tf.TensorShape):
        return {"shape": None if value.rank is None else [d for d in value.as_list()]}
    if isinstance(value, (list, tuple)):
        items = [_attr(v) for v in value]
        return None if any(i is _UNKNOWN for i in items) else {"list": items}
    return _UNKNOWN


_UNKNOWN = object()


def encode_call(op: Any) -> Any:
    call = op.call
    from torchlens_tf.capture import TFCall

    if not isinstance(call, TFCall):
        return None
    attrs = [_attr(v) for v in call.attrs]
    if any(a is _UNKNOWN for a in attrs) or refusal(call) is not None:
        return None  # the op loads as not replayable
    return {
        "op_type": call.op_type,
        "attrs": attrs,
        "num_outputs": call.num_outputs,
        "kind": call.kind,
        "variables": list(call.variables),
        "writes": list(call.writes),
    }


def _decode_attr(data: Any) -> Any:
    import tensorflow as tf

    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, dict) and len(data) == 1:
        ((kind, v),) = data.items()
        if kind == "float" and v in ("nan", "inf", "-inf"):
            return float(v)
        if kind == "bytes" and isinstance(v, str):
            return v.encode("latin-1")
        if kind == "dtype" and isinstance(v, str):
            try:
                return tf.as_dtype(v)
            except TypeError as exc:
                raise TraceFileError(f"unknown TensorFlow dtype {v!r}") from exc
        if kind == "shape" and (v is None or isinstance(v, list) and all(d is None or type(d) is int for d in v)):
            return tf.TensorShape(v)
        if kind == "list" and isinstance(v, list):
            return [_decode_attr(x) for x in v]
    raise TraceFileError(f"not a TensorFlow attribute value: {data!r}")


def decode_call(data: Any) -> Any:
    fields = {"op_type", "attrs", "num_outputs", "kind", "variables", "writes"}
    if not (
        isinstance(data, dict)
        and set(data) == fields
        and isinstance(data["op_type"], str)
        and isinstance(data["attrs"], list)
        and type(data["num_outputs"]) is int
        and data["kind"] in _KINDS
        and all(isinstance(x, list) and all(type(i) is int for i in x) for x in (data["variables"], data["writes"]))
    ):
        raise TraceFileError(f"not a TensorFlow call: {str(data)[:200]}")
    op_type = data["op_type"]
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", op_type):
        raise TraceFileError(f"{op_type[:80]!r} is not a TensorFlow op type")
    from torchlens_tf.capture import TFCall

    attrs = data["attrs"]
    if len(attrs) % 2 or not all(isinstance(n, str) for n in attrs[::2]):
        raise TraceFileError(f"malformed attributes for {op_type}")
    call = TFCall(
        op_type=op_type,
        attrs=tuple(_decode_attr(a) for a in attrs),
        num_outputs=data["num_outputs"],
        kind=data["kind"],
        variables=tuple(data["variables"]),
        writes=tuple(data["writes"]),
    )
    why = refusal(call)
    if why is not None:
        raise TraceFileError(
            f"{op_type} cannot be replayed from a file: {why}; the file was not written by tl.save or was changed"
        )
    return call


def refusal(call: Any) -> str | None:
    """Why ``call`` (a TFCall) is not a computation a loaded trace may run, or None if it is. See the docstring."""
    from tensorflow.python.framework import op_def_registry

    op_type, kind = call.op_type, call.kind
    op_def = op_def_registry.get(op_type)
    if op_def is None:
        return "it is not a registered TensorFlow op"
    if (_REFUSED.search(op_type) and op_type != "ReadVariableOp") or _NEVER.search(op_type):
        return "it reaches outside the process (files, Python, printing, devices...)"
    attrs = _attr_map(call.attrs, op_def)
    if isinstance(attrs, str):
        return attrs
    inputs = _arg_types(op_def.input_arg, attrs)
    outputs = _arg_types(op_def.output_arg, attrs)
    if isinstance(inputs, str) or isinstance(outputs, str):
        return inputs if isinstance(inputs, str) else outputs  # type: ignore[return-value]
    if call.num_outputs != len(outputs):
        return f"it has {len(outputs)} outputs for these attributes, the file says {call.num_outputs}"
    resources = {i for i, t in enumerate(inputs) if t == "resource"}
    if not set(call.writes) <= set(call.variables) <= set(range(len(inputs))):
        return "its variable positions are not among its inputs"
    if kind == "recorded":  # never run: replay returns the recorded value
        from torchlens_tf.capture import _RANDOM_KERNEL_STATE

        return None if op_type in _RANDOM_KERNEL_STATE else "only stateful random ops replay their recorded value"
    if kind == "read":
        return (
            None
            if op_type == "ReadVariableOp" and call.variables == (0,) and not call.writes
            else "a variable read is a ReadVariableOp of its one variable"
        )
    if kind == "variable":
        if not (_VARIABLE_OPS.fullmatch(op_type) and resources and resources == set(call.variables)):
            return "it is not a variable op on the variables replay gives it"
        return None
    if op_def.is_stateful or not outputs or resources or call.variables or call.writes:
        return "it is stateful, has no outputs or takes resources"
    if _family(op_type) not in _PURE_FAMILIES:
        return f"it is not one of TensorFlow's array operations (it is in {_family(op_type) or 'no public family'})"
    return None


def input_count(call: Any) -> int | None:
    """How many inputs the op's definition takes with the call's attributes (None if that cannot be told).

    TensorFlow's eager executor does not check it, and crashes when given
    more; replay checks it first (``torchlens_tf.replay``)."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(call.op_type)
    attrs = None if op_def is None else _attr_map(call.attrs, op_def)
    inputs = None if attrs is None or isinstance(attrs, str) else _arg_types(op_def.input_arg, attrs)
    return None if inputs is None or isinstance(inputs, str) else len(inputs)


def output_dtypes(call: Any) -> list[Any] | None:
    """The dtype of each output the op's definition gives with the call's attributes (None: cannot be told).

    A multi-output op's record keeps the first output's dtype only; the
    gradient replay (``torchlens_tf.grads``) needs each one's."""
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(call.op_type)
    attrs = None if op_def is None else _attr_map(call.attrs, op_def)
    if attrs is None or isinstance(attrs, str):
        return None
    found: list[Any] = []
    for arg in op_def.output_arg:
        if arg.type_list_attr:
            found += [tf.as_dtype(t) for t in attrs.get(arg.type_list_attr) or ()]
            continue
        dtype = arg.type or attrs.get(arg.type_attr)
        count = attrs.get(arg.number_attr) if arg.number_attr else 1
        if dtype is None or type(count) is not int:
            return None
        found += [tf.as_dtype(dtype)] * count
    return found


@functools.cache
def _family(op_type: str) -> str | None:
    """The ``gen_*`` module TensorFlow files ``tf.raw_ops.<op_type>`` under ("math_ops"...), if any."""
    import tensorflow as tf

    module = getattr(getattr(tf.raw_ops, op_type, None), "__module__", None) or ""
    prefix = "tensorflow.python.ops.gen_"
    return module[len(prefix) :] if module.startswith(prefix) else None


def _attr_map(flat: tuple[Any, ...], op_def: Any) -> dict[str, Any] | str:
    """Attribute name -> value, checked against the op definition; a string says what is wrong."""
    import tensorflow as tf

    defs = {a.name: a for a in op_def.attr}
    attrs: dict[str, Any] = {}
    for name, value in zip(flat[::2], flat[1::2]):
        attr = defs.get(name)
        if attr is None or name in attrs:
            return f"it has no attribute {name[:40]!r} (or has it twice)"
        kind = attr.type.removeprefix("list(").removesuffix(")")
        expected = _ATTR_TYPES.get(kind)
        listed = attr.type.startswith("list(")
        items = value if listed and isinstance(value, (list, tuple)) else [value]
        if (
            expected is None
            or (listed and not isinstance(value, (list, tuple)))
            or not all(_is(expected, v, tf) for v in items)
        ):
            return f"its attribute {name!r} is not a {attr.type}"
        attrs[name] = value
    for name, attr in defs.items():  # attributes left at their default were not saved
        if name not in attrs and attr.HasField("default_value"):
            which = attr.default_value.WhichOneof("value")
            if which == "i":
                attrs[name] = attr.default_value.i
            elif which == "type":
                attrs[name] = tf.as_dtype(attr.default_value.type)
            elif which == "list" and attr.type == "list(type)":
                attrs[name] = [tf.as_dtype(t) for t in attr.default_value.list.type]
    return attrs


def _is(expected: str, v: Any, tf: Any) -> bool:
    if expected == "dtype":  # capture sees type attributes as DataType numbers
        if type(v) is int:
            try:
                tf.as_dtype(v)
            except TypeError:
                return False
            return True
        return isinstance(v, tf.DType)
    if expected == "int":
        return type(v) is int
    if expected == "float":
        return type(v) in (int, float)
    if expected == "bool":
        return type(v) is bool
    if expected == "string":
        return isinstance(v, (str, bytes))
    return isinstance(v, tf.TensorShape)


def _arg_types(args: Any, attrs: dict[str, Any]) -> list[str] | str:
    """One entry per flat input or output: "resource" or "data"; a string (not a list) says what is wrong."""
    from tensorflow.core.framework import types_pb2

    flat: list[str] = []
    for arg in args:
        if arg.number_attr:
            n = attrs.get(arg.number_attr)
            if type(n) is not int or not 0 <= n <= MAX_OUTPUTS:
                return f"its {arg.number_attr!r} is not a count"
        elif arg.type_list_attr:
            n = len(attrs.get(arg.type_list_attr) or ())
        else:
            n = 1
        flat += ["resource" if arg.type == types_pb2.DT_RESOURCE else "data"] * n
        if len(flat) > MAX_OUTPUTS:
            return "it has too many inputs or outputs"
    return flat


def encode_value(value: Any) -> Any:
    import tensorflow as tf

    if isinstance(value, tf.DType):
        return {"dtype": value.name}
    return None


def decode_value(data: Any) -> Any:
    if isinstance(data, dict) and set(data) == {"dtype"}:
        return _decode_attr(data)
    raise TraceFileError(f"not a TensorFlow constant: {data!r}")


def from_numpy(array: Any, dtype: str, device: str) -> Any:
    import tensorflow as tf

    with tf.device("/CPU:0" if device == "cpu" else device.upper()):
        t = tf.constant(array)
        if dtype != t.dtype.name:
            t = (
                tf.bitcast(t, tf.as_dtype(dtype))
                if array.dtype.kind == "u" and "float" in dtype
                else tf.cast(t, tf.as_dtype(dtype))
            )
    return t
