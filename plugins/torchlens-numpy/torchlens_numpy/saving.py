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

from torchlens import TraceFileError
from torchlens.backend import CallNames, identifier
from torchlens_numpy import capture

_UFUNC_METHODS = frozenset({"reduce", "accumulate", "reduceat", "outer", "at"})


class NumpyCalls(CallNames):
    """The core's names (functions, methods, operators, constants, Python values) and NumPy's own: ufuncs,
    their methods, and the global RNG's draws."""

    def encode(self, call: Any) -> Any:
        if isinstance(call, np.ufunc):
            return {"ufunc": call.__name__}
        owner = getattr(call, "__self__", None)
        if isinstance(owner, np.ufunc):
            return {"ufunc": owner.__name__, "method": call.__name__}
        if owner is np.random.mtrand._rand:
            return {"random": call.__name__}
        return super().encode(call)

    def decode(self, data: Any) -> Any:
        if isinstance(data, dict) and "ufunc" in data and len(data) in (1, 2):
            fn = getattr(np, identifier(data["ufunc"]), None)
            if not isinstance(fn, np.ufunc):
                raise TraceFileError(f"{data['ufunc']!r} is not a NumPy ufunc")
            method = data.get("method")
            if method is None:
                return fn
            if method not in _UFUNC_METHODS:
                raise TraceFileError(f"{method!r} is not a ufunc method")
            return getattr(fn, method)
        value = data.get("random") if isinstance(data, dict) and len(data) == 1 else None
        if (
            isinstance(value, str)
            and value in getattr(np.random.mtrand, "__all__", ())
            and value not in capture._NOT_DRAWS
        ):
            return getattr(np.random.mtrand._rand, value)
        return super().decode(data)


NAMES = NumpyCalls(
    {"numpy": np, "numpy.linalg": np.linalg, "numpy.fft": np.fft, "numpy.lib.stride_tricks": np.lib.stride_tricks},
    methods=capture._METHODS,
    operators={"getitem": operator.getitem, "setitem": operator.setitem},
    refused=("save", "load", "file", "txt"),  # functions that touch the file system
    # Only functions that dispatch through __array_function__: what a capture can record.
    accept=lambda fn: hasattr(fn, "_implementation"),
)


def encode_op(op: Any) -> Any:
    return NAMES.encode(op.call)


decode_call = NAMES.decode
