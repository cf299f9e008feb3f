"""Saving JAX calls and constants for ``tl.save``, and rebuilding them for ``tl.load``.

A call (``(primitive, params)``, as the jaxpr equation had it) is saved as
``{"primitive": name, "params": {name: value}}``. On load the name is looked up
in a table of JAX's own primitive objects, built once from the attributes of
JAX's modules; nothing named in a file is imported. The table is an
allow-list of array computations: primitives defined in ``jax._src.lax`` (but
not its collectives, ``lax.parallel``, nor the stateful ``rng_uniform``), the
random, autodiff-utility, dispatch, ``jit`` and cuDNN modules. Reference and
box state, checks and assertions, callbacks, printing, FFI, Pallas and
sharding inspection are not on it. Parameters are rebuilt
from plain data only: numbers, strings, tuples, NumPy dtypes and scalars, the
enums and dimension-number classes of ``jax.lax``, ``lax.Tolerance``, the
copy semantics of ``device_put`` and the registered PRNG implementations.
Anything else (an inner jaxpr, a callback, a sharding, a device) is not
encoded: that op loads as not replayable instead of replaying wrongly. The
same codec saves JAX constants in an op's arguments (typed literals) and
keyword arguments. Importing this module does not import JAX.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
import sys
from typing import Any

from torchlens_core.ir.errors import TraceFileError, UnsupportedError

# Primitives that run Python, print or call foreign code: never bound from a file.
_REFUSED = ("callback", "print", "ffi", "exported", "custom_partitioning")
# A primitive is an array computation if one of these JAX modules holds it and none of _NOT_ARRAY does
# (modules import the primitives they use, so the defining module is among the holders).
_ARRAY_MODULES = (
    "jax._src.lax",
    "jax._src.ad_util",
    "jax._src.random",
    "jax._src.prng",
    "jax._src.dispatch",
    "jax._src.pjit",
    "jax._src.cudnn",
)
# Collectives (they talk to other devices), references, boxes and staging (mutable state).
_NOT_ARRAY = ("jax._src.lax.parallel", "jax._src.core", "jax._src.hijax", "jax._src.state")
_STATEFUL = frozenset({"rng_uniform"})  # XLA's stateful generator
_NAME = re.compile(r"[a-z][a-z0-9_\-]*\Z")  # how JAX spells primitive names ("scatter-add")
_MAX_DEPTH = 32


@functools.cache
def _primitives() -> dict[str, Any]:
    """The primitives a loaded trace may run: :func:`_all_primitives` that are array computations."""
    return {name: p for name, (p, array) in _all_primitives().items() if array and _allowed(name)}


@functools.cache
def _all_primitives() -> dict[str, tuple[Any, bool]]:
    """Primitive name -> (the primitive, is it an array computation), from every loaded ``jax.*`` module.

    Importing jax and its public submodules loads the modules that define the
    primitives (all of lax, random, prng, ad_util...); no name from a file
    reaches an import. A name two modules define differently is left out (it
    would be ambiguous)."""
    import jax.lax
    import jax.nn
    import jax.numpy
    import jax.random  # noqa: F401
    from jax.extend.core import Primitive

    found: dict[str, Any] = {}
    ambiguous: set[str] = set()
    holders: dict[str, set[str]] = {}  # name -> the jax._src modules holding it
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "jax" or module_name.startswith("jax.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Primitive):
                if found.setdefault(value.name, value) is not value:
                    ambiguous.add(value.name)
                if module_name.startswith("jax._src."):
                    holders.setdefault(value.name, set()).add(module_name)

    def array_computation(name: str) -> bool:
        where = holders.get(name, set())
        return any(m.startswith(_ARRAY_MODULES) for m in where) and not any(m.startswith(_NOT_ARRAY) for m in where)

    return {name: (p, array_computation(name)) for name, p in found.items() if name not in ambiguous}


def _allowed(name: str) -> bool:
    return bool(_NAME.match(name)) and not any(part in name for part in _REFUSED) and name not in _STATEFUL


@functools.cache
def _classes() -> dict[str, type]:
    """The parameter classes rebuilt by name: ``jax.lax``'s enums, dimension numbers and Tolerance,
    and device_put's copy semantics."""
    import jax.lax

    found = {
        name: v
        for name, v in vars(jax.lax).items()
        if isinstance(v, type) and name[:1].isupper() and (issubclass(v, enum.Enum) or _fields(v) is not None)
    }
    try:
        from jax._src.dispatch import ArrayCopySemantics
    except ImportError:  # another JAX version: device_put's parameters are then not saved
        return found
    found[ArrayCopySemantics.__name__] = ArrayCopySemantics
    return found


def _fields(cls: type) -> tuple[str, ...] | None:
    """The constructor's field names of a parameter class (namedtuple, dataclass, lax.Tolerance), else None."""
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return tuple(cls._fields)
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)
    if cls.__name__ == "Tolerance":  # a plain class: Tolerance(atol, rtol, ulps)
        return ("atol", "rtol", "ulps")
    return None


def _prngs() -> dict[str, Any]:
    try:
        from jax._src.random import prng
    except ImportError:  # older JAX
        from jax._src import prng
    return prng.prngs


def _literal_types() -> dict[str, type]:
    try:
        from jax._src import literals
    except ImportError:  # a JAX without typed literals
        return {}
    return {t.__name__: t for t in (literals.TypedInt, literals.TypedFloat, literals.TypedComplex)}


# -- the codec ----------------------------------------------------------------------------
def _encode(v: Any) -> Any:
    """Plain JSON for one parameter value; UnsupportedError naming what cannot be saved."""
    import numpy as np

    t = type(v)
    if v is None or t in (bool, int, str):
        return v
    if t is float:
        return v if math.isfinite(v) else {"float": repr(v)}
    if t is complex:
        return {"complex": [_encode(v.real), _encode(v.imag)]}
    if t is tuple:
        return [_encode(x) for x in v]
    if isinstance(v, np.dtype) and v.kind != "O" and not v.names and v.name.isidentifier():
        return {"dtype": v.name}
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return {"scalar": [v.dtype.name, _encode(v.item())]}
    literal = _literal_types().get(t.__name__)
    if literal is t:  # a jaxpr literal in an op's arguments: the number and its dtype
        number = complex(v) if isinstance(v, complex) else int(v) if isinstance(v, int) else float(v)
        return {"literal": [t.__name__, _encode(number), _encode(v.dtype)]}
    name = t.__name__
    if _classes().get(name) is t:
        if isinstance(v, enum.Enum):
            return {"enum": [name, v.name]}
        fields = _fields(t)
        if fields is not None:  # (_classes holds enums and classes with fields: always)
            return {"struct": [name, [[f, _encode(getattr(v, f))] for f in fields]]}
    prng_name = getattr(v, "name", None)
    if name == "PRNGImpl" and isinstance(prng_name, str) and _prngs().get(prng_name) is v:
        return {"prng": prng_name}
    if name in ("Jaxpr", "ClosedJaxpr"):
        raise UnsupportedError("it holds a jaxpr, a program that the format does not save")
    raise UnsupportedError(f"a {name} ({_short(v)}) has no saved form")


def _decode(data: Any, depth: int = 0) -> Any:
    """The value ``_encode`` wrote as ``data``; TraceFileError for anything it would not have written."""
    if depth > _MAX_DEPTH:
        raise TraceFileError(f"JAX parameters nest deeper than {_MAX_DEPTH} levels")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return tuple(_decode(x, depth + 1) for x in data)
    if not (isinstance(data, dict) and len(data) == 1):
        raise TraceFileError(f"not a JAX parameter: {_short(data)}")
    ((tag, v),) = data.items()
    if tag == "float" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "complex" and isinstance(v, list) and len(v) == 2:
        re_, im = (_decode(x, depth + 1) for x in v)
        if type(re_) is float and type(im) is float:
            return complex(re_, im)
    if tag == "dtype" and isinstance(v, str):
        return _dtype(v)
    if tag == "scalar" and _pair(v, str):
        dtype = _dtype(v[0])
        value = _decode(v[1], depth + 1)
        if dtype.kind in "biuf" and type(value) in (bool, int, float):
            return dtype.type(value)
    if tag == "literal" and isinstance(v, list) and len(v) == 3 and isinstance(v[0], str):
        import numpy as np

        cls, value, dtype = _literal_types().get(v[0]), _decode(v[1], depth + 1), _decode(v[2], depth + 1)
        if cls is not None and type(value) is cls.__mro__[1] and isinstance(dtype, np.dtype):
            return cls(value, dtype)  # TypedInt(int, dtype), TypedFloat(float, dtype)...
    if tag == "enum" and _pair(v, str) and isinstance(v[1], str):
        cls = _classes().get(v[0])
        if cls is not None and issubclass(cls, enum.Enum) and v[1] in cls.__members__:
            return cls[v[1]]
    if tag == "struct" and _pair(v, str) and isinstance(v[1], list):
        cls = _classes().get(v[0])
        if (
            cls is not None
            and not issubclass(cls, enum.Enum)
            and all(_pair(f, str) for f in v[1])
            and (fields := _fields(cls)) is not None
            and [f[0] for f in v[1]] == list(fields)
        ):
            return cls(**{f: _decode(x, depth + 1) for f, x in v[1]})
    if tag == "prng" and isinstance(v, str) and v in _prngs():
        return _prngs()[v]
    raise TraceFileError(f"not a JAX parameter: {_short(data)}")


def _pair(v: Any, first: type) -> bool:
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], first)


def _dtype(name: str) -> Any:
    import jax.numpy  # noqa: F401 - registers bfloat16, float8... (ml_dtypes) with NumPy
    import numpy as np

    if not name.isidentifier():
        raise TraceFileError(f"not a dtype name: {name!r}")
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise TraceFileError(f"unknown dtype {name!r}") from None
    if dtype.name != name or dtype.kind == "O":
        raise TraceFileError(f"not a plain dtype: {name!r}")
    return dtype


def _same(a: Any, b: Any) -> bool:
    """Is ``b`` (decoded) the very parameter ``a`` was? Types included: a replay must bind what capture bound."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    fields = None if isinstance(a, enum.Enum) else _fields(type(a))
    if fields is not None:  # lax.Tolerance has no __eq__
        return all(_same(getattr(a, f), getattr(b, f)) for f in fields)
    return bool(a == b)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


# -- the hooks ----------------------------------------------------------------------------
def encode_call(op: Any) -> Any:
    primitive, params = op.call
    name = primitive.name
    if not _allowed(name):
        raise UnsupportedError(f"JAX primitive {name!r} runs Python or foreign code, so it is never run from a file")
    if _primitives().get(name) is not primitive:
        raise UnsupportedError(f"JAX primitive {name!r} is not one of JAX's own primitives a trace can replay")
    encoded = {}
    for key, value in params.items():
        try:
            encoded[key] = _encode(value)
        except UnsupportedError as exc:
            raise UnsupportedError(f"JAX primitive {name!r}: its parameter {key!r} cannot be saved: {exc}") from None
    decoded = {key: _decode(value) for key, value in encoded.items()}
    if not all(_same(params[key], decoded[key]) for key in params):  # never replay what capture did not bind
        raise UnsupportedError(f"JAX primitive {name!r}: its parameters do not load back as they were")
    return {"primitive": name, "params": encoded}


def decode_call(data: Any) -> Any:
    if not (
        isinstance(data, dict)
        and set(data) == {"primitive", "params"}
        and isinstance(data["primitive"], str)
        and isinstance(data["params"], dict)
    ):
        raise TraceFileError(f"not a JAX call: {_short(data)}")
    name = data["primitive"]
    if not _allowed(name):
        raise TraceFileError(
            f"{name!r} is not a JAX primitive a trace can replay; the file was not written by tl.save or was changed"
        )
    primitive = _primitives().get(name)
    if primitive is None and name in _all_primitives():  # JAX has it, but not as an array computation
        raise TraceFileError(
            f"{name!r} is not a JAX array computation a trace can replay (collectives, references "
            "and state, checks...); the file was not written by tl.save or was changed"
        )
    params = {key: _decode(value) for key, value in data["params"].items()}
    if "precision" in params and not _precision(params["precision"]):
        # Lowering passes it to MLIR unchecked: another type aborts the process (LLVM "Invalid value").
        raise TraceFileError(f"{name}: precision {_short(params['precision'])} is not a JAX precision")
    return None if primitive is None else (primitive, params)  # None: a primitive this JAX version lacks


def _precision(value: Any) -> bool:
    """None, a ``lax.Precision``, a pair of those (or None), or a dot algorithm: what lax canonicalizes to."""
    classes = _classes()
    kinds = tuple(
        c
        for c in (classes.get("Precision"), classes.get("DotAlgorithm"), classes.get("DotAlgorithmPreset"))
        if c is not None
    )
    if value is None or isinstance(value, kinds):
        return True
    precision = classes.get("Precision")
    return (
        type(value) is tuple
        and len(value) == 2
        and precision is not None
        and all(v is None or isinstance(v, precision) for v in value)
    )


def encode_value(value: Any) -> Any:
    """JAX constants in arguments and keyword arguments: typed literals, lax enums and classes, PRNG impls."""
    if type(value) in (bool, int, float, str, tuple) or value is None:
        return None  # the core's own encoding
    try:
        return _encode(value)
    except UnsupportedError:
        return None


def decode_value(data: Any) -> Any:
    return _decode(data)


def from_numpy(array: Any, dtype: str, device: str) -> Any:
    import jax
    import jax.numpy as jnp

    if dtype.startswith("key<"):  # typed PRNG keys were saved as their key data; the dtype names the impl's tag
        impl = next((i for i in _prngs().values() if i.tag == dtype[4:-1]), None)
        return jnp.asarray(array) if impl is None else jax.random.wrap_key_data(jnp.asarray(array), impl=impl.name)
    if dtype != array.dtype.name:
        array = array.view(jnp.dtype(dtype))  # bfloat16 and friends: their raw bits
    return jnp.asarray(array)
