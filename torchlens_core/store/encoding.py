"""Values to JSON and back, for ``tl.save`` / ``tl.load``. No pickle; nothing named in a file is run.

A value becomes JSON as follows. None, bools, ints, strings and finite floats
are themselves; a tuple is a JSON list; anything else is a JSON object with
exactly one tag key:

``{"list": [...]}``, ``{"dict": [[key, value], ...]}``, ``{"float": "nan" | "inf" | "-inf"}``,
``{"complex": [re, im]}``, ``{"slice": [start, stop, step]}``, ``{"ellipsis": 0}``,
``{"ref": [index, path]}``, ``{"param": name}``, ``{"array": n}`` (row ``n`` of the
array table), ``{"numpy_dtype": "<f4"}``, ``{"numpy_type": "<f4"}`` (``np.float32`` itself),
``{"value": data, "repr": text}`` (a framework constant such as ``torch.float32``, encoded by the backend's hook), and
``{"unsaved": text}`` (a value no encoder knew: it loads as an :class:`Unsaved`).

Namedtuples and dataclasses (Hugging Face ``ModelOutput``...) are saved as
plain tuples and dicts, and load as such.

Arrays go to one binary blob; the array table row says where (``offset``,
``nbytes``), what the bytes are (``storage``, a NumPy dtype string), the shape,
and the dtype name the framework gave (``dtype``: ``bfloat16`` is stored as its
raw ``uint16`` bits). ``kind`` is ``numpy`` (a NumPy array), ``scalar`` (a NumPy
scalar) or ``framework`` (an array of the trace's backend).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from torchlens_core.backend.manager import backend_named
from torchlens_core.ir.errors import TraceFileError
from torchlens_core.ir.records import ParamRef, Ref

ALIGN = 64  # array offsets in the blob are multiples of this
# NumPy dtype kinds that hold plain bytes: bool, ints, floats, complex, strings, times.
STORAGE_KINDS = frozenset("biufcSUmM")
_TAGS = frozenset(
    {
        "list",
        "dict",
        "float",
        "complex",
        "slice",
        "ellipsis",
        "ref",
        "param",
        "array",
        "numpy_dtype",
        "numpy_type",
        "value",
        "unsaved",
    }
)
MAX_DEPTH = 64  # deeper nesting in a file is refused (no recursion blow-ups on crafted files)


class Unsaved:
    """Stands in for a value that could not be saved (an object no encoder knew, say).

    An op whose call or arguments hold one cannot be replayed after loading.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<unsaved {self.text}>"


class FrameworkValue:
    """A framework constant (``torch.float32``, a device...) loaded where its backend could not rebuild it.

    Shows as the original did; an op whose arguments hold one cannot be replayed.
    """

    __slots__ = ("data", "text")

    def __init__(self, data: Any, text: str) -> None:
        self.data, self.text = data, text

    def __repr__(self) -> str:
        return self.text


def is_json(data: Any, depth: int = 0) -> bool:
    """Is ``data`` plain JSON (dicts with string keys, lists, strings, numbers, bools, None)?"""
    if depth > MAX_DEPTH:
        return False
    if data is None or isinstance(data, (bool, int, str)):
        return True
    if isinstance(data, float):
        return math.isfinite(data)
    if isinstance(data, list):
        return all(is_json(v, depth + 1) for v in data)
    if isinstance(data, dict):
        return all(isinstance(k, str) and is_json(v, depth + 1) for k, v in data.items())
    return False


class Encoder:
    """Turns values into JSON, collecting their arrays into one blob.

    ``backend`` is the trace's backend: its ``array_info`` tells framework arrays
    apart, ``encode_array`` gives their bytes and ``encode_value`` encodes its constants.
    """

    def __init__(self, backend: str) -> None:
        self.impl = backend_named(backend, missing_ok=True)
        self.backend = backend
        self.arrays: list[dict[str, Any]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.seen: dict[int, tuple[Any, int]] = {}  # id(array) -> (array, row): one copy per object
        self.unsaved = 0  # values that became {"unsaved": ...}

    def encode(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        t = type(x)
        if t is int:
            return x
        if t is float:
            return x if math.isfinite(x) else {"float": repr(x)}
        if t is tuple:
            return [self.encode(v) for v in x]
        if t is list:
            return {"list": [self.encode(v) for v in x]}
        if t is dict:
            return {"dict": [[self.encode(k), self.encode(v)] for k, v in x.items()]}
        if t is Ref:
            return {"ref": [x.index, [self.encode(p) for p in x.path]]}
        if t is ParamRef:
            return {"param": x.name}
        if isinstance(x, (np.ndarray, np.generic)):
            return self._array(x, "scalar" if isinstance(x, np.generic) else "numpy")
        if t is complex:
            return {"complex": [self.encode(x.real), self.encode(x.imag)]}
        if t is slice:
            return {"slice": [self.encode(x.start), self.encode(x.stop), self.encode(x.step)]}
        if x is Ellipsis:
            return {"ellipsis": 0}
        if isinstance(x, np.dtype):
            return {"numpy_dtype": x.str if x.kind in STORAGE_KINDS else x.name}
        if isinstance(x, type) and issubclass(x, np.generic) and np.dtype(x).kind in STORAGE_KINDS:
            return {"numpy_type": np.dtype(x).str}
        if isinstance(x, (Unsaved, FrameworkValue)):  # loaded earlier, saved again
            return {"unsaved": x.text} if isinstance(x, Unsaved) else {"value": x.data, "repr": x.text}
        if self.impl.array_info(x) is not None:
            return self._array(x, "framework")
        data = self.impl.encode_value(x)
        if data is not None and is_json(data):
            return {"value": data, "repr": repr(x)}
        if isinstance(x, (bool, int, float)):  # subclasses (IntEnum...) as the plain number
            return self.encode(float(x) if isinstance(x, float) else int(x))
        if isinstance(x, tuple):  # namedtuple, torch.Size...
            return [self.encode(v) for v in x]
        if isinstance(x, list):
            return {"list": [self.encode(v) for v in x]}
        if isinstance(x, dict) or (dataclasses.is_dataclass(x) and not isinstance(x, type)):
            items = x.items() if isinstance(x, dict) else ((f.name, getattr(x, f.name)) for f in dataclasses.fields(x))
            return {"dict": [[self.encode(k), self.encode(v)] for k, v in items]}
        self.unsaved += 1
        return {"unsaved": _short_repr(x)}

    def _array(self, x: Any, kind: str) -> dict[str, Any]:
        found = self.seen.get(id(x))
        if found is not None and found[0] is x:
            return {"array": found[1]}
        if kind == "framework":
            try:
                info = self.impl.array_info(x)
                if info is None:  # told a framework array by the same method: a backend that changed its mind
                    raise TypeError(f"the {self.backend} backend does not describe this array")
                encoded = self.impl.encode_array(x)
                if encoded is None:  # a plugin without the hook: its to_numpy and array_info
                    encoded = (self.impl.to_numpy(x), info[1])
                data, dtype = encoded
                device = info[2]
            except Exception:  # noqa: BLE001 - a sparse or meta tensor, say: kept as unsaved, not fatal
                self.unsaved += 1
                return {"unsaved": _short_repr(x)}
        else:
            data, dtype, device = x, x.dtype.name, "cpu"
        data = np.asarray(data)
        if data.dtype.kind not in STORAGE_KINDS:
            if data.dtype.kind == "V" and data.dtype.itemsize in (1, 2, 4, 8) and not data.dtype.names:
                data = data.view(f"<u{data.dtype.itemsize}")  # ml_dtypes (bfloat16, float8...): raw bits
            else:
                self.unsaved += 1
                return {"unsaved": _short_repr(x)}
        if not data.flags.c_contiguous:  # (not np.ascontiguousarray: it turns 0-d arrays into 1-d)
            data = data.copy(order="C")
        raw = data.tobytes()
        pad = -self.size % ALIGN
        if pad:
            self.chunks.append(b"\0" * pad)
            self.size += pad
        row = len(self.arrays)
        self.arrays.append(
            {
                "kind": kind,
                "offset": self.size,
                "nbytes": len(raw),
                "storage": data.dtype.str,
                "shape": list(data.shape),
                "dtype": str(dtype),
                "device": str(device),
            }
        )
        self.chunks.append(raw)
        self.size += len(raw)
        self.seen[id(x)] = (x, row)
        return {"array": row}


def _short_repr(x: Any) -> str:
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a repr that fails still names the type
        text = f"<{type(x).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."


class Decoder:
    """Turns JSON back into values, reading arrays from the blob.

    Framework arrays become the backend's arrays through its ``from_numpy``
    when its framework imports here, else NumPy arrays (``bfloat16`` upcast to
    ``float32``, other dtypes NumPy lacks as their raw unsigned-int bits).
    """

    def __init__(self, backend: str, table: Any, blob: bytearray, framework: bool) -> None:
        self.impl = backend_named(backend, missing_ok=True)
        self.backend = backend
        self.table = check_table(table, len(blob))
        self.blob = blob
        self.framework = framework  # may turn False at the first array if the framework fails to import
        self.cache: dict[int, Any] = {}
        self.why = f"the {backend} backend is not installed here"  # why values stayed NumPy, if they did
        self.lossy = False  # set when a value could not be rebuilt as it was (unsaved, or no framework)

    def decode(self, data: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise TraceFileError(f"values nest deeper than {MAX_DEPTH} levels: the file is malformed")
        if data is None or isinstance(data, (bool, int, float, str)):
            return data
        d = depth + 1
        if isinstance(data, list):
            return tuple(self.decode(v, d) for v in data)
        if not isinstance(data, dict) or len(data) == 0 or not (set(data) <= _TAGS | {"repr"}):
            raise TraceFileError(f"unknown value encoding {_short_repr(data)}")
        tag = next(k for k in data if k != "repr")
        v = data[tag]
        if tag == "list":
            return [self.decode(x, d) for x in _list(v, "list")]
        if tag == "dict":
            out = {}
            for pair in _list(v, "dict"):
                key, value = _list(pair, "dict item", 2)
                out[self.decode(key, d)] = self.decode(value, d)
            return out
        if tag == "float":
            if v not in ("nan", "inf", "-inf"):
                raise TraceFileError(f"bad float {v!r}")
            return float(v)
        if tag == "complex":
            re, im = _list(v, "complex", 2)
            return complex(_number(self.decode(re, d)), _number(self.decode(im, d)))
        if tag == "slice":
            return slice(*(self.decode(x, d) for x in _list(v, "slice", 3)))
        if tag == "ellipsis":
            return Ellipsis
        if tag == "ref":
            index, path = _list(v, "ref", 2)
            return Ref(_int(index, "ref index"), tuple(self.decode(p, d) for p in _list(path, "ref path")))
        if tag == "param":
            return ParamRef(_str(v, "param name"))
        if tag == "array":
            return self.array(_int(v, "array row"))
        if tag == "numpy_dtype":
            try:
                dtype = np.dtype(_str(v, "numpy dtype"))
            except TypeError:
                raise TraceFileError(f"unknown NumPy dtype {v!r}") from None
            # Extension dtypes registered by the framework (bfloat16, float8...) are kind "V" with no fields.
            extension = dtype.kind == "V" and dtype.fields is None and dtype.name == v
            if dtype.kind not in STORAGE_KINDS and dtype.kind != "O" and not extension:
                raise TraceFileError(f"unsupported NumPy dtype {v!r}")
            return dtype
        if tag == "numpy_type":
            dtype = np.dtype(_str(v, "numpy type"))
            if dtype.kind not in STORAGE_KINDS:
                raise TraceFileError(f"unsupported NumPy type {v!r}")
            return dtype.type
        if tag == "value":
            text = _str(data.get("repr", ""), "repr")
            value = None
            if self.framework:
                try:
                    value = self.impl.decode_value(v)
                except ImportError:
                    self.framework = False
                    self.why = f"{self.backend} is not importable here, so values loaded as NumPy arrays"
            if value is None:
                self.lossy = True
                return FrameworkValue(v, text)
            return value
        self.lossy = True  # "unsaved"
        return Unsaved(_str(v, "unsaved"))

    def array(self, row: int) -> Any:
        if row in self.cache:
            return self.cache[row]
        if not 0 <= row < len(self.table):
            raise TraceFileError(f"array {row} is not in the array table ({len(self.table)} rows)")
        entry = self.table[row]  # checked by check_table: in bounds, sizes agree, no overlap
        storage = np.dtype(entry["storage"])
        array = self.raw(entry, storage).reshape(tuple(entry["shape"]))
        kind, dtype = entry["kind"], entry["dtype"]
        if kind in ("scalar", "numpy") and dtype != storage.name:
            array = _extension_view(array, dtype)
        if kind == "scalar":
            value = array[()]
        elif kind == "numpy":
            value = array
        else:
            value = self._framework_array(array, dtype, entry["device"])
        self.cache[row] = value
        return value

    def raw(self, entry: dict[str, Any], storage: np.dtype) -> np.ndarray:
        """The bytes of one array table row, flat, as ``storage``: a view of the blob (a lazy reader reads them)."""
        return np.frombuffer(
            self.blob, dtype=storage, count=entry["nbytes"] // storage.itemsize, offset=entry["offset"]
        )

    def _framework_array(self, array: np.ndarray, dtype: str, device: str) -> Any:
        if self.framework:
            try:
                value = self.impl.from_numpy(array, dtype, device)
            except ImportError:
                value, self.framework = None, False
                self.why = f"{self.backend} is not importable here, so values loaded as NumPy arrays"
            if value is not None:
                return value
            if self.framework:
                self.framework = False
                self.why = f"the {self.backend} backend cannot load arrays (it has no torchlens_from_numpy)"
        self.lossy = True
        if dtype == "bfloat16" and array.dtype == np.uint16:  # exact: bfloat16 is float32's upper half
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array


_ROW_KEYS = frozenset({"kind", "offset", "nbytes", "storage", "shape", "dtype", "device"})
MAX_DIM = 1 << 62  # no real axis is longer; bigger numbers only make NumPy and the tables overflow


def check_table(table: Any, blob_size: int) -> list[dict[str, Any]]:
    """The array table, every row checked against the array file of ``blob_size`` bytes.

    Each row must describe plain-data bytes whose shape and dtype make exactly
    its ``nbytes``, start on the writer's alignment and lie inside the file, and
    no two rows may share bytes: tl.save never writes them so, and rows
    overlapping one region could make loading cost many times the file's size.
    A framework array may not be decoded to a wider dtype than its bytes hold
    (again what tl.save never writes), so what load allocates stays within a
    small multiple of what the manifest declares; and the file must end where
    its last array does, so tl.load can check this before reading the file.
    """
    from torchlens_core.ir.records import itemsize

    rows = _list(table, "array table")
    spans = []
    for row, entry in enumerate(rows):
        where = f"array {row}"
        if not (isinstance(entry, dict) and set(entry) == _ROW_KEYS):
            raise TraceFileError(f"{where}: expected the fields {sorted(_ROW_KEYS)}, got {_short_repr(entry)}")
        try:
            storage = np.dtype(_str(entry["storage"], f"{where} storage"))
        except TypeError:
            raise TraceFileError(f"{where}: unknown storage dtype {entry['storage']!r}") from None
        if storage.kind not in STORAGE_KINDS or storage.names or storage.subdtype or storage.itemsize == 0:
            raise TraceFileError(f"{where}: storage dtype {entry['storage']!r} is not plain data")
        shape = _list(entry["shape"], f"{where} shape")
        if len(shape) > 32 or not all(type(n) is int and 0 <= n < MAX_DIM for n in shape):
            raise TraceFileError(f"{where}: shape {_short_repr(shape)} is not a list of sizes")
        offset, nbytes = _int(entry["offset"], f"{where} offset"), _int(entry["nbytes"], f"{where} nbytes")
        if math.prod(shape) * storage.itemsize != nbytes:
            raise TraceFileError(f"{where}: shape {tuple(shape)} of {storage} does not make {nbytes} bytes")
        if offset < 0 or offset % ALIGN or offset + nbytes > blob_size:
            raise TraceFileError(
                f"{where}: bytes {offset}..{offset + nbytes} are not an aligned span of "
                f"the array file ({blob_size} bytes)"
            )
        kind = entry["kind"]
        if kind not in ("numpy", "scalar", "framework") or (kind == "scalar" and shape):
            raise TraceFileError(f"{where}: unknown kind {kind!r} (or a scalar with a shape)")
        dtype = _str(entry["dtype"], f"{where} dtype")
        _str(entry["device"], f"{where} device")
        size = itemsize(dtype) if kind == "framework" else None
        if size is not None and size > storage.itemsize:
            raise TraceFileError(f"{where}: {storage} bytes would be widened to {dtype}, which tl.save never writes")
        if nbytes:
            spans.append((offset, offset + nbytes, row))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise TraceFileError(f"arrays {a} and {b} share bytes of the array file, which tl.save never writes")
    # tl.save's array file ends with its last array: bytes beyond it would be read (and held) for nothing.
    end = max((int(entry["offset"]) + int(entry["nbytes"]) for entry in rows), default=0)
    if end != blob_size:
        raise TraceFileError(
            f"the array file has {blob_size} bytes but its arrays end at byte {end}: "
            f"tl.save writes no bytes that no array uses"
        )
    return rows


def _extension_view(array: np.ndarray, name: str) -> np.ndarray:
    """Raw bits of a NumPy extension dtype (bfloat16, float8...) seen as that dtype, where it is registered here."""
    try:
        dtype = np.dtype(name)
    except TypeError:
        return array  # not registered in this process (ml_dtypes not imported): the raw bits stay
    if dtype.kind != "V" or dtype.fields is not None or dtype.itemsize != array.dtype.itemsize:
        raise TraceFileError(f"array of dtype {name!r} cannot be stored as {array.dtype}")
    return array.view(dtype)


# -- strict readers for the file's JSON: anything unexpected is a TraceFileError ---------------
def _list(v: Any, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(v, list) or (length is not None and len(v) != length):
        raise TraceFileError(f"{what}: expected a list{f' of {length}' if length else ''}, got {_short_repr(v)}")
    return v


def _int(v: Any, what: str) -> int:
    if type(v) is not int:
        raise TraceFileError(f"{what}: expected an integer, got {_short_repr(v)}")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise TraceFileError(f"{what}: expected a string, got {_short_repr(v)}")
    return v


def _number(v: Any) -> float:
    if type(v) not in (int, float):
        raise TraceFileError(f"expected a number, got {_short_repr(v)}")
    return v
