"""Saving Paddle calls for ``tl.save`` and rebuilding them for ``tl.load``.

A call is saved as ``{"ns": "paddle._C_ops" | "paddle._legacy_C_ops" | "paddle.Tensor", "name": ...}``
and found again by one attribute lookup there. The allow-list is positive: a
C op is replayed only if Paddle's own array API calls it (the code of
``paddle.tensor``, ``paddle.nn``, ``paddle.linalg``, ``paddle.fft`` and
``paddle.signal`` names it, :func:`array_ops`), less the ops that talk to other
processes or devices (``all_reduce``, ``sync_batch_norm_``, ``memcpy``) and names
that touch files or print; so communication, scope and stream ops, file
readers and ``print`` are never run from a file. Tensor operators and methods
are replayed only among those capture records.

A C op whose binding reads a fixed list of positional arguments without
counting them (``pool2d`` or ``conv2d`` given fewer crash the process) loads
wrapped in a check that each is given, by position or by name (then passed at
its position), as Paddle's own type stub declares them (:func:`arities`).

The RNG state a random op ran with (a ``GeneratorState`` from
``paddle.get_rng_state()``) is saved as the plain data of its own
``__getstate__``: device, seed, offset and the engine state as text; so
dropout and ``rnn`` replay exactly after loading. Ops given an accelerator
``Place`` load as not replayable. Importing this module does not import Paddle.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import sys
import types
from typing import Any

from torchlens_core.ir.errors import TraceFileError

_OP_MODULES = ("paddle._C_ops", "paddle._legacy_C_ops")
_REFUSED = ("save", "load", "file", "print")
# Where Paddle's array API lives: the C ops its code calls are the ones a loaded trace may run.
_API_MODULES = (
    "paddle.tensor",
    "paddle.nn",
    "paddle.linalg",
    "paddle.fft",
    "paddle.signal",
    "paddle.base.dygraph.math_op_patch",
    "paddle.base.dygraph.tensor_patch_methods",
)
# Called by that API, but they communicate with other processes or devices.
_COMMUNICATING = frozenset({"all_reduce", "all_reduce_", "sync_batch_norm_", "memcpy", "memcpy_d2h", "memcpy_h2d"})
_ENGINE_WORDS = 313  # std::mt19937_64 as C++ streams write it: its 312 words, then its position


def _tensor_names() -> set[str]:
    from torchlens_paddle.intercept import TENSOR_DUNDERS, TENSOR_METHODS

    return set(TENSOR_DUNDERS) | set(TENSOR_METHODS)


def _original(fn: Any) -> Any:
    return getattr(fn, "__wrapped__", fn)


def encode_call(op: Any) -> Any:
    call = _original(op.call)  # a loaded trace's C ops are wrapped in an argument count check
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
    return (
        name.isidentifier()
        and not name.startswith("_")
        and not any(p in name.lower() for p in _REFUSED)
        and name not in _COMMUNICATING
        and name in array_ops()
    )


@functools.cache
def array_ops() -> frozenset[str]:
    """The names Paddle's array API code refers to (functions, methods, nested functions): the C ops it calls."""
    import paddle.fft
    import paddle.linalg
    import paddle.nn.functional
    import paddle.signal  # noqa: F401

    names: set[str] = set()
    seen: set[int] = set()

    def scan(fn: Any) -> None:  # a function, what it wraps and the functions its closure holds
        while isinstance(fn, types.FunctionType) and id(fn) not in seen:
            seen.add(id(fn))
            scan_code(fn.__code__)
            for cell in fn.__closure__ or ():
                try:
                    scan(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
            fn = getattr(fn, "__wrapped__", None)

    def scan_code(code: types.CodeType) -> None:
        names.update(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                scan_code(const)
            elif isinstance(const, str) and const.isidentifier():  # getattr(_C_ops, "name")
                names.add(const)

    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(_API_MODULES):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == module_name:
                for attr in vars(value).values():
                    scan(attr)
            else:
                scan(value)
    return frozenset(names)


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
            fn = _original(fn)
            needed = arities().get(name) if ns == "paddle._C_ops" else None
            return fn if needed is None else _counted(fn, needed)
        return None
    raise TraceFileError(
        f"{ns}:{name} is not a Paddle op a trace can replay; the file was not written by tl.save or was changed"
    )


def _counted(fn: Any, needed: tuple[tuple[str, Any], ...]) -> Any:
    """``fn``, refusing a call that leaves out an argument its binding reads (it would crash).

    ``needed`` are the binding's arguments in order, each with its default as
    Paddle's type stub declares it (``_NO_DEFAULT`` if none). The capture
    records the call as the forward made it, and Paddle's Python API leaves
    trailing arguments out where the binding fills them in (``gelu(x)``,
    ``approximate`` False): a left-out argument with a stub default is given
    that default, one without is refused. Bindings do not all read names
    (``conv2d`` given ``data_format=`` by name reads an empty position and
    crashes), so a needed argument given by name is passed at its position.
    """

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        rest = needed[len(args) :]
        missing = [n for n, default in rest if n not in kwargs and default is _NO_DEFAULT]
        if missing:
            raise TypeError(
                f"paddle._C_ops.{fn.__name__} reads {len(needed)} arguments "
                f"({', '.join(n for n, _ in needed)}); {', '.join(missing)} not given"
            )
        args = (*args, *(kwargs[n] if n in kwargs else default for n, default in rest))
        return fn(*args, **{k: v for k, v in kwargs.items() if k not in dict(rest)})

    return call


_NO_DEFAULT = object()


@functools.cache  # read once per process: the stub is parsed whole (about 0.1 s), and every loaded op asks
def arities() -> dict[str, tuple[tuple[str, Any], ...]]:
    """C op name -> the arguments its binding reads, in order, with their stub defaults (do not modify it).

    Read with ``ast``, never run: a default is kept only where it is a literal
    (``False``, ``[1, 1]``, ``"NCHW"``), else ``_NO_DEFAULT``. Every argument
    but the trailing ``name`` of the Python convention counts. Ops the stub
    declares ``(*args, **kwargs)`` parse and check their arguments themselves
    and are left out."""
    import paddle

    stub = pathlib.Path(paddle.__file__).parent / "_typing" / "libs" / "libpaddle" / "eager" / "ops" / "__init__.pyi"
    needed: dict[str, tuple[tuple[str, Any], ...]] = {}
    for node in _parsed(stub):
        if isinstance(node, ast.FunctionDef) and not (node.args.vararg or node.args.kwarg or node.args.kwonlyargs):
            names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
            defaults = [_NO_DEFAULT] * (len(names) - len(node.args.defaults)) + [
                _literal(d) for d in node.args.defaults
            ]
            pairs = tuple(zip(names, defaults))
            pairs = pairs[:-1] if names and names[-1] == "name" else pairs
            if node.name not in needed or len(pairs) < len(needed[node.name]):  # overloads: the shortest
                needed[node.name] = pairs
    return needed


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NO_DEFAULT


def _parsed(file: pathlib.Path) -> list[ast.AST]:
    try:
        return list(ast.parse(file.read_text()).body)
    except (OSError, SyntaxError, ValueError):  # another Paddle without the stub: its bindings run unchecked
        return []


def encode_value(value: Any) -> Any:
    import paddle

    if isinstance(value, paddle.dtype):
        return {"dtype": str(value).removeprefix("paddle.")}
    if isinstance(value, paddle.base.libpaddle.Place):
        return {"place": str(value)}
    if isinstance(value, paddle.base.libpaddle.GeneratorState):
        return _encode_rng_state(value)
    return None


def _encode_rng_state(state: Any) -> Any:
    """``[device, seed, offset, engine state]``: the tuple the state's own ``__getstate__`` gives, its bytes as text."""
    data = state.__getstate__()
    if not (isinstance(data, tuple) and len(data) == 4 and all(type(n) is int for n in data[:3])):
        return None  # another Paddle's layout: not saved (the op loads as not replayable)
    text = bytes(data[3]).decode("ascii", errors="replace")
    return {"rng_state": [*data[:3], text]} if _engine_state(text) else None


def _engine_state(text: Any) -> bool:
    """Is ``text`` an engine state as Paddle writes it? (A changed one must not reach the C++ parser.)"""
    if not isinstance(text, str) or len(text) > _ENGINE_WORDS * 21:
        return False
    words = text.split(" ")
    return len(words) == _ENGINE_WORDS and all(w.isascii() and w.isdigit() and int(w) < 2**64 for w in words)


def _decode_rng_state(data: Any) -> Any:
    import paddle

    if not (
        isinstance(data, list)
        and len(data) == 4
        and all(type(n) is int for n in data[:3])
        and _engine_state(data[3])
        and data[0] >= -1
    ):
        raise TraceFileError(f"not a Paddle RNG state: {str(data)[:80]}")
    if data[0] >= 0 and data[0] >= paddle.device.cuda.device_count():
        return None  # an accelerator's generator this machine lacks: the op loads as not replayable
    cls = paddle.base.libpaddle.GeneratorState
    state = cls.__new__(cls)  # then filled by its own __setstate__ from the plain data, as pybind11 allows
    state.__setstate__((*data[:3], list(data[3].encode("ascii"))))
    return state


def decode_value(data: Any) -> Any:
    import paddle

    if (
        isinstance(data, dict)
        and set(data) == {"dtype"}
        and isinstance(data["dtype"], str)
        and data["dtype"].isidentifier()
    ):
        value = getattr(paddle, data["dtype"], None)
        if isinstance(value, paddle.dtype):
            return value
    if isinstance(data, dict) and set(data) == {"place"} and data["place"] == "Place(cpu)":
        place = paddle.base.libpaddle.Place()
        place.set_place(paddle.CPUPlace())
        return place
    if isinstance(data, dict) and set(data) == {"place"}:
        return None  # an accelerator placement: not rebuilt (the op loads as not replayable)
    if isinstance(data, dict) and set(data) == {"rng_state"}:
        return _decode_rng_state(data["rng_state"])
    raise TraceFileError(f"not a Paddle constant: {data!r}")


def encode_array(value: Any) -> tuple[Any, str]:
    """A tensor's values and dtype name. One never written (an RNN layer's dropout state, which Paddle
    creates empty) has no values: it is saved as zeros of its shape, with its ``undefined`` place."""
    import numpy as np

    from torchlens_paddle.arrays import dtype_name, to_numpy

    if not value._is_initialized():
        return np.zeros(tuple(value.shape), np.uint8), dtype_name(value.dtype)
    return to_numpy(value), dtype_name(value.dtype)


def from_numpy(array: Any, dtype: str, device: str) -> Any:
    import paddle

    if device == "undefined":  # a tensor never written: made again as one, as the layer made it
        target = getattr(paddle, dtype, None) if dtype.isidentifier() else None
        if not isinstance(target, paddle.dtype):
            raise TraceFileError(f"not a Paddle dtype: {dtype!r}")
        core = paddle.base.core
        t = core.eager.Tensor(target, [], "", core.VarDesc.VarType.DENSE_TENSOR, False)
        t.get_tensor()._set_dims(list(array.shape))  # (made with its shape, a 0-size one would have no place)
        return t
    t = paddle.to_tensor(array, place=paddle.CPUPlace()) if device == "cpu" else paddle.to_tensor(array)
    if dtype != array.dtype.name:
        t = t.astype(dtype)  # bfloat16 was saved as float32 (exactly)
    return t
