"""Naming recorded NumPy calls for ``tl.save`` and finding them again for ``tl.load``.

A call is saved as JSON data of one of these forms, and rebuilt only from
NumPy itself: a ufunc (``{"ufunc": "add"}``, with ``"method": "reduce"`` for
its methods), a ``__array_function__`` function of an allow-listed namespace
(``{"function": "numpy.linalg:norm"}``), an ndarray method (``{"method": "sum"}``),
indexing (``{"operator": "getitem"}``), a draw from the global RNG
(``{"random": "normal"}``), a returned constant (``{"constant": 0}``), or a
function that answered with a Python number, saved as that function
(``{"python_value": {"function": "numpy:allclose"}}``).
Anything else in a file, ``os:system`` say, raises TraceFileError: nothing
outside NumPy is ever looked up, and file readers and writers (``np.save``...)
are refused even though NumPy has them.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from torchlens_core.ir.errors import TraceFileError
from torchlens_numpy import capture
from torchlens_numpy.conversions import PythonValue

NAMESPACES = {"numpy": np, "numpy.linalg": np.linalg, "numpy.fft": np.fft,
              "numpy.lib.stride_tricks": np.lib.stride_tricks}
_UFUNC_METHODS = frozenset({"reduce", "accumulate", "reduceat", "outer", "at"})
_OPERATORS = {"getitem": operator.getitem, "setitem": operator.setitem}
_REFUSED_PARTS = ("save", "load", "file", "txt")  # functions that touch the file system


def encode_op(op: Any) -> Any:
    return encode_call(op.call)


def encode_call(call: Any) -> Any:
    if isinstance(call, PythonValue):
        inner = encode_call(call.function)
        return None if inner is None else {"python_value": inner}
    if isinstance(call, np.ufunc):
        return {"ufunc": call.__name__}
    owner = getattr(call, "__self__", None)
    if isinstance(owner, np.ufunc):
        return {"ufunc": owner.__name__, "method": call.__name__}
    if owner is np.random.mtrand._rand:
        return {"random": call.__name__}
    if call is capture.constant:
        return {"constant": 0}
    for name, fn in _OPERATORS.items():
        if call is fn:
            return {"operator": name}
    name = getattr(call, "__name__", None)
    if getattr(call, "__module__", None) == capture.__name__ and name in capture._METHODS:
        return {"method": name}
    for ns, module in NAMESPACES.items():
        if isinstance(name, str) and getattr(module, name, None) is call:
            return {"function": f"{ns}:{name}"}
    return None


def decode_call(data: Any) -> Any:
    if not isinstance(data, dict) or len(data) not in (1, 2):
        raise TraceFileError(f"not a NumPy call: {data!r}")
    if "ufunc" in data:
        fn = getattr(np, _name(data["ufunc"]), None)
        if not isinstance(fn, np.ufunc):
            raise TraceFileError(f"{data['ufunc']!r} is not a NumPy ufunc")
        method = data.get("method")
        if method is None:
            return fn
        if method not in _UFUNC_METHODS:
            raise TraceFileError(f"{method!r} is not a ufunc method")
        return getattr(fn, method)
    if len(data) != 1:
        raise TraceFileError(f"not a NumPy call: {data!r}")
    (kind, value), = data.items()
    if kind == "python_value":
        if isinstance(value, dict) and "python_value" in value:
            raise TraceFileError(f"a Python value of a Python value: {data!r}")
        return PythonValue(decode_call(value))
    if kind == "method" and value in capture._METHODS:
        return capture._method_call(value)
    if kind == "operator" and value in _OPERATORS:
        return _OPERATORS[value]
    if kind == "constant":
        return capture.constant
    if kind == "random" and value in getattr(np.random.mtrand, "__all__", ()) and value not in capture._NOT_DRAWS:
        return getattr(np.random.mtrand._rand, value)
    if kind == "function" and isinstance(value, str) and value.count(":") == 1:
        ns, name = value.split(":")
        module = NAMESPACES.get(ns)
        fn = getattr(module, _name(name), None) if module is not None else None
        # Only functions that dispatch through __array_function__: what a capture can record.
        if hasattr(fn, "_implementation") and not any(part in name for part in _REFUSED_PARTS):
            return fn
    raise TraceFileError(f"{data!r} names nothing a NumPy trace can replay; the file was not written by tl.save "
                         "or was changed")


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise TraceFileError(f"{name!r} is not a NumPy name")
    return name
