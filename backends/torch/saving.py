"""Saving torch values and calls for ``tl.save``, and rebuilding them for ``tl.load``.

A call is saved as ``{"ns": namespace, "name": attribute}`` (``"get": true`` for
a property read such as ``Tensor.T``) and found again only by one attribute
lookup on an allow-listed torch namespace. The allow-list is positive, the
calls a TorchFunctionMode capture can record that compute on tensors
(:func:`pure`):

- functions torch itself lists as tensor functions
  (``torch.overrides.get_overridable_functions()``: ``torch.*`` functions taking
  tensors, ``torch.nn.functional``, Tensor methods and operators), and the
  Python functions of those namespaces that dispatch through
  ``handle_torch_function`` as they do (the list misses ``F.hardswish``, and
  ``torch.nn.init``'s ``kaiming_uniform_``, ``uniform_``, ``normal_``,
  ``constant_``, which write into the tensor they are given);
- ATen operator bindings (``torch._C._VariableFunctions``, ``_nn``, ``_linalg``,
  ``_fft``, ``_special``, Tensor methods) that return a tensor or write into a
  tensor argument: factories such as ``torch.zeros`` and fused kernels;
- a few tensor constructors that are neither (``torch.asarray``, ``from_numpy``).

Calls that change process-wide state take no tensor and return none
(``torch.use_deterministic_algorithms``, ``set_default_dtype``, ``manual_seed``,
``set_num_threads``, ``set_grad_enabled``, ``set_printoptions``, autocast and
cuFFT-cache settings), and ``torch.backends``, ``torch.cuda`` and
``torch.distributed`` are not searched, so none of them is on the list. Of the
tensor methods, those that reach beyond their tensors (hooks, ``backward``,
shared or pinned memory, CUDA streams, storages) are refused too, as are names
that read or write files (``load``, ``save``, ``from_file``...). Importing this
module does not import torch.
"""

from __future__ import annotations

import functools
import operator
import sys
import types
from typing import Any

from torchlens_core.ir.errors import TraceFileError

NAMESPACES = (
    "torch",
    "torch.Tensor",
    "torch.nn.functional",
    "torch.linalg",
    "torch.fft",
    "torch.special",
    "torch._C._nn",
    "torch._C._linalg",
    "torch._C._fft",
    "torch._C._special",
    "torch._C._VariableFunctions",
    "torch.nn.init",
)  # its initializers that dispatch as one tensor function (kaiming_uniform_...)
# Where ATen operators are bound: every callable there is one (by its __name__).
_ATEN_NAMESPACES = (
    "torch._C._VariableFunctions",
    "torch._C._nn",
    "torch._C._linalg",
    "torch._C._fft",
    "torch._C._special",
)
_REFUSED = ("load", "save", "file", "compile", "seed")
# Tensor functions that reach beyond the tensors they are given.
_BEYOND_TENSORS = frozenset(
    {
        "backward",
        "register_hook",
        "register_post_accumulate_grad_hook",
        "retain_grad",
        "requires_grad_",
        "share_memory_",
        "pin_memory",
        "_pin_memory",
        "record_stream",
        "storage",
        "untyped_storage",
        "set_",
        "data_ptr",
    }
)
# Tensor constructors that are neither overridable nor ATen operators.
_CONSTRUCTORS = frozenset(
    {
        ("torch", "asarray"),
        ("torch", "from_numpy"),
        ("torch._C._VariableFunctions", "asarray"),
        ("torch._C._VariableFunctions", "from_numpy"),
        ("torch.Tensor", "new_tensor"),
        ("torch.Tensor", "new"),
    }
)
_SIMPLE_CONSTANTS = ("dtype", "memory_format", "layout", "qscheme")


def _namespaces() -> dict[str, Any]:
    import torch
    import torch.nn.functional

    found = {}
    for ns in NAMESPACES:
        obj: Any = torch
        for part in ns.split(".")[1:]:
            obj = getattr(obj, part, None)
        if obj is not None:
            found[ns] = obj
    return found


@functools.cache
def _names() -> dict[int, list[tuple[str, str, Any]]]:
    """id(callable) -> every (namespace, attribute, callable) it is found as, in NAMESPACES order."""
    table: dict[int, list[tuple[str, str, Any]]] = {}
    for ns, obj in _namespaces().items():
        for name in dir(obj):
            try:
                value = getattr(obj, name)
            except Exception:  # noqa: BLE001 - lazy attributes that fail to load are not calls
                continue
            if callable(value):
                table.setdefault(id(value), []).append((ns, name, value))
    return table


@functools.cache
def _overridable() -> frozenset[int]:
    import torch.overrides

    return frozenset(id(f) for fs in torch.overrides.get_overridable_functions().values() for f in fs)


@functools.cache
def _aten_tensor_op(name: str) -> bool:
    """Is ``aten::name`` an operator that returns a tensor or writes into a tensor argument (some overload)?"""
    import torch

    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
        if any("Tensor" in str(r.type) for r in schema.returns) or any(
            a.alias_info is not None and a.alias_info.is_write and "Tensor" in str(a.type) for a in schema.arguments
        ):
            return True
    return False


def pure(fn: Any, ns: str, name: str) -> bool:
    """Is ``fn`` (found as ``ns.name``) a tensor computation a loaded trace may run? See the module docstring."""
    if name in _BEYOND_TENSORS or not _allowed(name, ns):
        return False
    if id(fn) in _overridable() or (ns, name) in _CONSTRUCTORS:
        return True
    if isinstance(fn, types.FunctionType):  # torch's own Python: a tensor function if it dispatches as one
        return fn.__module__.startswith("torch") and "handle_torch_function" in fn.__code__.co_names
    import torch

    aten = getattr(fn, "__name__", None)
    if not isinstance(aten, str):
        return False
    bound = [getattr(_namespaces().get(n), aten, None) for n in _ATEN_NAMESPACES]
    bound.append(vars(torch._C.TensorBase).get(aten))
    return any(b is fn for b in bound) and _aten_tensor_op(aten)


def encode_call(op: Any) -> Any:
    call = op.call
    if call is None:
        return None
    transforms = sys.modules.get("torchlens_torch.transforms")  # loaded by any capture that could record one
    if transforms is not None and isinstance(call, transforms.TransformCall):
        raise TraceFileError(call.unsaveable())  # the op is saved as not replayable, with this reason
    if getattr(call, "__name__", None) == "__get__":  # a property read (Tensor.T): the descriptor's getter
        import torch

        descriptor = getattr(call, "__self__", None)
        name = getattr(descriptor, "__name__", None) or getattr(getattr(descriptor, "fget", None), "__name__", None)
        if isinstance(name, str) and _allowed(name, "torch.Tensor") and _class_attr(torch.Tensor, name) is descriptor:
            return {"ns": "torch.Tensor", "name": name, "get": True}
        return None
    for ns, name, value in _names().get(id(call), ()):
        if value is call and pure(call, ns, name):
            return {"ns": ns, "name": name}
    return _encode_dispatcher_op(call)


# Operator libraries whose ``torch.ops.<library>.<op>`` a loaded trace may run: PyTorch's own and torchvision's
# (``nms``, ``roi_align``...), each op only when its schema writes none of its arguments. torchvision is imported
# to register its operators: the file names a library from this list, never a module.
OP_LIBRARIES = {"aten": None, "torchvision": "torchvision"}


def _encode_dispatcher_op(call: Any) -> Any:
    """``torch.ops.<library>.<op>`` (a packet: every overload must be functional) or one overload of it."""
    import torch

    if isinstance(call, torch._ops.OpOverload):
        packet, overload = call.overloadpacket, call._overloadname
    elif isinstance(call, torch._ops.OpOverloadPacket):
        packet, overload = call, None
    else:
        return None
    library, _, name = packet._qualified_op_name.partition("::")
    if library not in OP_LIBRARIES or not _allowed(name, "torch.ops") or not _functional(packet, overload):
        return None
    return {"ns": f"torch.ops.{library}", "name": name, **({"overload": overload} if overload else {})}


def _functional(packet: Any, overload: str | None = None) -> bool:
    """The overload (or, for None, every overload of ``packet``) returns new tensors: writes none of its arguments."""
    for name in packet.overloads() if overload is None else [overload]:
        schema = getattr(packet, name)._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return False
    return True


def _decode_dispatcher_op(library: str, name: str, overload: Any) -> Any:
    import importlib

    import torch

    if (
        library not in OP_LIBRARIES
        or not _allowed(name, "torch.ops")
        or not (overload is None or (isinstance(overload, str) and overload.isidentifier()))
    ):
        raise TraceFileError(f"torch.ops.{library}.{name} is not an operator a trace can replay")
    registers = OP_LIBRARIES[library]
    if registers is not None:
        try:
            importlib.import_module(registers)  # registers the library's operators
        except ImportError:
            return None  # not installed here: the op loads unreplayable
    try:
        packet = getattr(getattr(torch.ops, library), name)
        if overload is not None and overload not in packet.overloads():
            return None
    except (AttributeError, RuntimeError):
        return None  # not in this version
    if not isinstance(packet, torch._ops.OpOverloadPacket) or not _functional(packet, overload):
        raise TraceFileError(
            f"torch.ops.{library}.{name} writes into its arguments; the file was not written by tl.save or was changed"
        )
    return packet if overload is None else getattr(packet, overload)


def _class_attr(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def _allowed(name: str, ns: str) -> bool:
    if not name.isidentifier() or any(part in name.lower() for part in _REFUSED):
        return False
    if name.startswith("__") and name.endswith("__"):  # operators only (__add__, __radd__, __getitem__...)
        base = name[2:-2]
        bases = (base, base[1:]) if base[:1] in "ri" else (base,)
        return ns == "torch.Tensor" and any(hasattr(operator, b) or hasattr(operator, b + "_") for b in bases)
    if ns in ("torch", "torch.nn.functional") and name.startswith("set_"):
        return False
    # underscore names: torch's C bindings, and Tensor methods that are ATen operators (Tensor._is_all_true)
    return not name.startswith("_") or ns.startswith("torch._C.") or (ns == "torch.Tensor" and _aten_tensor_op(name))


def decode_call(data: Any) -> Any:
    if not (
        isinstance(data, dict)
        and set(data) <= {"ns", "name", "get", "overload"}
        and isinstance(data.get("ns"), str)
        and isinstance(data.get("name"), str)
    ):
        raise TraceFileError(f"not a torch call: {data!r}")
    ns, name = data["ns"], data["name"]
    if ns.startswith("torch.ops.") and "get" not in data:
        return _decode_dispatcher_op(ns.removeprefix("torch.ops."), name, data.get("overload"))
    if "overload" in data:
        raise TraceFileError(f"not a torch call: {data!r}")
    if ns not in NAMESPACES or not _allowed(name, ns):
        raise TraceFileError(
            f"{ns}:{name} is not a torch function a trace can replay; the file was not written "
            "by tl.save or was changed"
        )
    import torch

    owner = _namespaces().get(ns)
    if data.get("get"):
        descriptor = _class_attr(torch.Tensor, name) if ns == "torch.Tensor" else None
        if descriptor is None or not hasattr(descriptor, "__get__") or callable(descriptor):
            raise TraceFileError(f"{ns}:{name} is not a tensor property")
        return descriptor.__get__
    fn = getattr(owner, name, None) if owner is not None else None
    if fn is None:
        return None  # not in this torch version
    module = getattr(fn, "__module__", None) or ""
    if isinstance(fn, type) or not callable(fn) or (ns != "torch.Tensor" and not module.startswith("torch")):
        raise TraceFileError(f"{ns}:{name} is not a torch function")
    if not pure(fn, ns, name):
        raise TraceFileError(
            f"{ns}:{name} is not one of torch's tensor computations (it changes global state, or "
            "reaches beyond its tensors); the file was not written by tl.save or was changed"
        )
    return fn


def encode_value(value: Any) -> Any:
    import torch

    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Size):
        return {"size": [int(n) for n in value]}
    for kind in ("memory_format", "layout", "qscheme"):
        if isinstance(value, getattr(torch, kind)):
            return {kind: str(value).removeprefix("torch.")}
    if isinstance(value, type) and value in _PYTHON_TYPES.values():  # dtype=int, as torch accepts it
        return {"python_type": value.__name__}
    return None


# Python types torch takes where it takes a dtype (torch.zeros(1, dtype=int) is int64).
_PYTHON_TYPES = {"int": int, "float": float, "bool": bool, "complex": complex}


def decode_value(data: Any) -> Any:
    import torch

    if not (isinstance(data, dict) and len(data) == 1):
        raise TraceFileError(f"not a torch constant: {data!r}")
    ((kind, v),) = data.items()
    if kind == "device" and isinstance(v, str):
        try:
            return torch.device(v)
        except RuntimeError as exc:
            raise TraceFileError(f"bad torch device {v!r}") from exc
    if kind == "size" and isinstance(v, list) and all(type(n) is int for n in v):
        return torch.Size(v)
    if kind == "python_type" and isinstance(v, str) and v in _PYTHON_TYPES:
        return _PYTHON_TYPES[v]
    if kind in _SIMPLE_CONSTANTS and isinstance(v, str) and v.isidentifier() and not v.startswith("_"):
        value = getattr(torch, v, None)
        if isinstance(value, getattr(torch, kind)):
            return value
    raise TraceFileError(f"not a torch constant: {data!r}")


# Dtypes NumPy lacks, saved as their raw bits (an unsigned int of the same size).
_RAW_BITS = {
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
}


# Sparse layouts are saved as the dense values they stand for, the layout after the dtype ("float32:sparse_csr"),
# and made sparse again on load: the same values (explicit zeros are not kept, nor a hybrid COO's dense dims).
_SPARSE = {"sparse_coo": "to_sparse", "sparse_csr": "to_sparse_csr", "sparse_csc": "to_sparse_csc"}


def encode_array(value: Any) -> tuple[Any, str]:
    import torch

    layout = str(value.layout).removeprefix("torch.")
    if layout in _SPARSE:
        data, name = encode_array(value.to_dense())
        return data, f"{name}:{layout}"
    t = value.detach().cpu().resolve_conj().resolve_neg()
    name = str(t.dtype).removeprefix("torch.")
    raw = _RAW_BITS.get(name)
    if raw is not None:
        t = t.contiguous().view(getattr(torch, raw) if raw == "uint8" else torch.int16)
        return t.numpy().copy().view(raw), name
    return t.numpy().copy(), name


def from_numpy(array: Any, dtype: str, device: str) -> Any:
    import torch

    dtype, _, layout = dtype.partition(":")
    if layout:
        if layout not in _SPARSE:
            raise TraceFileError(f"a tensor of layout {layout!r}, which tl.save never writes")
        return getattr(from_numpy(array, dtype, device), _SPARSE[layout])()
    if dtype in _RAW_BITS and array.dtype.name == "uint16":  # torch views int16 bits as bfloat16
        array = array.view("int16")
    t = torch.from_numpy(array) if array.flags.writeable else torch.tensor(array)
    target = getattr(torch, dtype, None) if dtype.isidentifier() else None
    if isinstance(target, torch.dtype) and target != t.dtype:
        t = t.view(target) if dtype in _RAW_BITS else t.to(target)
    if device != "cpu":
        try:
            t = t.to(device)
        except (RuntimeError, AssertionError):  # no such device here: stay on the CPU
            pass
    return t
