"""Saving Paddle calls for ``tl.save`` and rebuilding them for ``tl.load``.

A call is saved as ``{"ns": "paddle._C_ops" | "paddle._legacy_C_ops" | "paddle.Tensor", "name": ...}``
and found again by one attribute lookup there: C ops by public name, Tensor
operators and methods only among those capture records. Names that touch files
(``save``, ``load``...) are refused. The RNG state of random ops
(``paddle.get_rng_state()``: generator objects) is not saved, so random ops load
as not replayable, and so do ops given an accelerator ``Place``. Importing this module does not import Paddle.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.errors import TraceFileError

_OP_MODULES = ("paddle._C_ops", "paddle._legacy_C_ops")
_REFUSED = ("save", "load", "file", "print")


def _tensor_names() -> set[str]:
    from torchlens_paddle.intercept import TENSOR_DUNDERS, TENSOR_METHODS

    return set(TENSOR_DUNDERS) | set(TENSOR_METHODS)


def _original(fn: Any) -> Any:
    return getattr(fn, "__wrapped__", fn)


def encode_call(call: Any) -> Any:
    import paddle

    name = getattr(call, "__name__", None)
    if not isinstance(name, str):
        return None
    for ns, module in zip(_OP_MODULES, (paddle._C_ops, paddle._legacy_C_ops)):
        if _original(getattr(module, name, None)) is call and _allowed(name):
            return {"ns": ns, "name": name}
    for attr in _tensor_names():
        if _original(paddle.Tensor.__dict__.get(attr)) is call:
            return {"ns": "paddle.Tensor", "name": attr}
    return None


def _allowed(name: str) -> bool:
    return name.isidentifier() and not name.startswith("_") and not any(p in name.lower() for p in _REFUSED)


def decode_call(data: Any) -> Any:
    if not (isinstance(data, dict) and set(data) == {"ns", "name"} and isinstance(data["name"], str)):
        raise TraceFileError(f"not a Paddle call: {data!r}")
    ns, name = data["ns"], data["name"]
    if ns == "paddle.Tensor" and name in _tensor_names():
        import paddle

        fn = paddle.Tensor.__dict__.get(name)
        return None if fn is None else _original(fn)
    if ns in _OP_MODULES and _allowed(name):
        import paddle

        module = paddle._C_ops if ns == "paddle._C_ops" else paddle._legacy_C_ops
        fn = getattr(module, name, None)
        if fn is not None and callable(fn) and not isinstance(fn, type):
            return _original(fn)
        return None
    raise TraceFileError(f"{ns}:{name} is not a Paddle op a trace can replay; the file was not written by "
                         "tl.save or was changed")


def encode_value(value: Any) -> Any:
    import paddle

    if isinstance(value, paddle.dtype):
        return {"dtype": str(value).removeprefix("paddle.")}
    if isinstance(value, paddle.base.libpaddle.Place):
        return {"place": str(value)}
    return None


def decode_value(data: Any) -> Any:
    import paddle

    if isinstance(data, dict) and set(data) == {"dtype"} and isinstance(data["dtype"], str) \
            and data["dtype"].isidentifier():
        value = getattr(paddle, data["dtype"], None)
        if isinstance(value, paddle.dtype):
            return value
    if isinstance(data, dict) and set(data) == {"place"} and data["place"] == "Place(cpu)":
        place = paddle.base.libpaddle.Place()
        place.set_place(paddle.CPUPlace())
        return place
    if isinstance(data, dict) and set(data) == {"place"}:
        return None  # an accelerator placement: not rebuilt (the op loads as not replayable)
    raise TraceFileError(f"not a Paddle constant: {data!r}")


def from_numpy(array: Any, dtype: str, device: str) -> Any:
    import paddle

    t = paddle.to_tensor(array, place=paddle.CPUPlace()) if device == "cpu" else paddle.to_tensor(array)
    if dtype != array.dtype.name:
        t = t.astype(dtype)  # bfloat16 was saved as float32 (exactly)
    return t
