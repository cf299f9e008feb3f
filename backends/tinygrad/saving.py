"""Saving tinygrad calls for ``tl.save`` and rebuilding them for ``tl.load``.

A call is a Tensor method: saved as ``{"method": name}`` and found again only
in an allow-list of tensor computations: the public methods and operator
dunders capture wraps, less those that reach beyond the tensors they are given
(:data:`_BEYOND_TENSORS`: seeding or advancing the global random generator,
autograd, building or running kernels and programs) and anything that reaches
outside the process (``from_url``, ``fetch``, disk and file access). Private
helpers are never replayed from a file. DTypes are saved by name. Importing
this module does not import tinygrad.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from torchlens_core.ir.errors import TraceFileError

_REFUSED = ("url", "fetch", "file", "disk", "save", "load", "blob")
# Public methods that act beyond their tensors: the global RNG, autograd, kernels and programs.
_BEYOND_TENSORS = frozenset(
    {
        "manual_seed",
        "backward",
        "gradient",
        "custom_kernel",
        "call",
        "callify",
        "schedule_linear",
        "as_param",
        "is_param_",
    }
)


@functools.cache
def _methods() -> dict[str, Any]:
    """name -> the raw Tensor attribute capture wraps (function, staticmethod or classmethod)."""
    from torchlens_tinygrad.capture import _wrappable

    return {name: raw for name, raw in _wrappable() if _allowed(name)}


def _allowed(name: str) -> bool:
    if any(p in name.lower() for p in _REFUSED) or name in _BEYOND_TENSORS:
        return False
    if name.startswith("__") and name.endswith("__"):  # operators (__add__, __radd__, __iadd__, __getitem__...)
        import operator

        base = name[2:-2]
        return any(hasattr(operator, b) or hasattr(operator, b + "_") for b in (base, base[1:]))
    return not name.startswith("_")


def _function(raw: Any) -> Any:
    """The function capture calls for a Tensor attribute (inside tinygrad's metadata wrapper, if any)."""
    from torchlens_tinygrad.capture import metadata_cell

    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    cell = metadata_cell(func)
    return cell.cell_contents if cell is not None else func


def encode_call(op: Any) -> Any:
    call = op.call
    func = call.__func__ if isinstance(call, types.MethodType) else call
    for name, raw in _methods().items():
        if _function(raw) is func:
            return {"method": name}
    return None


def decode_call(data: Any) -> Any:
    if not (isinstance(data, dict) and set(data) == {"method"} and isinstance(data["method"], str)):
        raise TraceFileError(f"not a tinygrad call: {data!r}")
    raw = _methods().get(data["method"])
    if raw is None:
        raise TraceFileError(
            f"Tensor.{data['method']} is not a tinygrad method a trace can replay; the file "
            "was not written by tl.save or was changed"
        )
    if isinstance(raw, classmethod):
        from tinygrad import Tensor

        return types.MethodType(_function(raw), Tensor)
    return _function(raw)


def encode_value(value: Any) -> Any:
    from tinygrad import dtypes
    from tinygrad.dtype import DType

    if isinstance(value, DType) and getattr(dtypes, value.name, None) == value:
        return {"dtype": value.name}
    return None


def decode_value(data: Any) -> Any:
    from tinygrad import dtypes
    from tinygrad.dtype import DType

    if (
        isinstance(data, dict)
        and set(data) == {"dtype"}
        and isinstance(data["dtype"], str)
        and data["dtype"].isidentifier()
        and not data["dtype"].startswith("_")
    ):
        value = getattr(dtypes, data["dtype"], None)
        if isinstance(value, DType):
            return value
    raise TraceFileError(f"not a tinygrad constant: {data!r}")


# Devices a loaded value may be placed on. Not DISK or TINYFS (a tensor there is a file, named by the file being
# loaded), NPY (a view of a NumPy array), NULL or RDMA; tinygrad imports the runtime a device name names, so an
# unknown name is refused before tinygrad sees it.
_LOADABLE_DEVICES = frozenset({"CPU", "PYTHON", "CUDA", "NV", "AMD", "HIP", "METAL", "CL", "QCOM", "WEBGPU", "DSP"})


def from_numpy(array: Any, dtype: str, device: str) -> Any:
    from tinygrad import Tensor, dtypes

    base, _, index = (device or "").upper().partition(":")
    if device and (base not in _LOADABLE_DEVICES or (index and not index.isdigit())):
        raise TraceFileError(
            f"tinygrad device {device!r} cannot hold a loaded value: expected one of "
            f"{sorted(d.lower() for d in _LOADABLE_DEVICES)}, optionally with ':N'"
        )
    target = getattr(dtypes, dtype, None)
    t = Tensor(array.copy(), device=device.upper() if device else None)
    if target is not None and t.dtype != target:
        t = t.bitcast(target) if array.dtype.kind == "u" and dtype.startswith(("bfloat", "float8")) else t.cast(target)
    return t.realize()
