"""Saving TensorFlow calls for ``tl.save`` and rebuilding them for ``tl.load``.

A call (a ``TFCall``) is saved as its op type, attributes, output count and
kind. On load the op type must be registered with TensorFlow and must not be
one that reaches outside the process (files, savers, Python callbacks,
datasets, printing...): such a name in a file raises TraceFileError. Attribute
values are rebuilt from JSON only (numbers, strings, bytes, dtypes, shapes and
lists of them). Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import re
from typing import Any

from torchlens_core.ir.errors import TraceFileError

# Op types that touch files, run Python, print, or hold iterators: never run from a file.
_REFUSED = re.compile(r"File|Save|Restore|Py|Print|Write|Summary|Reader|Iterator|Dataset|Queue|Shell|Debug|"
                      r"Checkpoint|Host|Send|Recv|Server|Enqueue|Dequeue|Record|Load", re.IGNORECASE)
_KINDS = ("op", "read", "variable", "recorded")


def _attr(value: Any) -> Any:
    import tensorflow as tf

    if value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and value == value
                                                                  and abs(value) != float("inf")):
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
    if any(a is _UNKNOWN for a in attrs):
        return None
    return {"op_type": call.op_type, "attrs": attrs, "num_outputs": call.num_outputs, "kind": call.kind,
            "variables": list(call.variables), "writes": list(call.writes)}


def _decode_attr(data: Any) -> Any:
    import tensorflow as tf

    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, dict) and len(data) == 1:
        (kind, v), = data.items()
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
    if not (isinstance(data, dict) and set(data) == fields
            and isinstance(data["op_type"], str) and isinstance(data["attrs"], list)
            and type(data["num_outputs"]) is int and data["kind"] in _KINDS
            and all(isinstance(x, list) and all(type(i) is int for i in x)
                    for x in (data["variables"], data["writes"]))):
        raise TraceFileError(f"not a TensorFlow call: {str(data)[:200]}")
    op_type = data["op_type"]
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", op_type) or (_REFUSED.search(op_type) and op_type != "ReadVariableOp"):
        raise TraceFileError(f"{op_type!r} is not a TensorFlow op a trace can replay; the file was not written by "
                             "tl.save or was changed")
    from tensorflow.python.framework import op_def_registry

    from torchlens_tf.capture import TFCall

    if op_def_registry.get(op_type) is None:
        raise TraceFileError(f"{op_type!r} is not a registered TensorFlow op")
    attrs = data["attrs"]
    if len(attrs) % 2 or not all(isinstance(n, str) for n in attrs[::2]):
        raise TraceFileError(f"malformed attributes for {op_type}")
    return TFCall(op_type=op_type, attrs=tuple(_decode_attr(a) for a in attrs), num_outputs=data["num_outputs"],
                  kind=data["kind"], variables=tuple(data["variables"]), writes=tuple(data["writes"]))


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
            t = tf.bitcast(t, tf.as_dtype(dtype)) if array.dtype.kind == "u" and "float" in dtype else \
                tf.cast(t, tf.as_dtype(dtype))
    return t
