"""What the aligner knows of each op of one side: a :class:`Point` and the value it holds.

Each op that depends on an input becomes a point with the evidence two sides
can share: the module pass it returns from (paths normalized across naming
conventions: ``features.0``, ``features_0`` and flax's ``features.layers.0``
are one path), its class in the equivalence table (:mod:`.classes`), its shape,
and a value fingerprint — evenly spaced order statistics of the value, which a
layout change (NCHW vs NHWC, merged axes, even a broadcast) leaves unchanged
and a small numerical difference changes only a little.

Values are read as float64 NumPy arrays. An op that returned several arrays
(Paddle's ``batch_norm`` returns the output and its statistics) is read at its
first float leaf, the one a layer passes on. Integer and boolean values
(positions, indices, masks) keep their kind: they are compared exactly.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.compare.classes import module_class, normalized, op_class
from torchlens_core.compare.metrics import mask_fills
from torchlens_core.ir import tree
from torchlens_core.ir.progress import progress
from torchlens_core.ir.records import OpRecord
from torchlens_core.ir.trace import Trace

QUANTILES = 33  # order statistics per fingerprint
# Container names that wrap a sequence of layers without naming a layer of the model.
CONTAINERS = frozenset({"layers", "_layers", "modules", "_modules", "submodules", "module", "children"})


@attrs.define(slots=True)
class Point:
    """One op of one side, with the evidence the aligner reads."""

    index: int
    cls: str | None
    module: str  # normalized path of the innermost module pass it ran in ("" outside every module)
    module_outputs: frozenset[str]  # normalized "path:pass" of each module pass that returned it
    shape: tuple[int, ...] | None
    size: int | None
    kind: str = "none"  # "float", "int" (integers and booleans, compared exactly) or "none" (no value)
    fingerprint: Any = None  # QUANTILES order statistics of the value, or None when it was not saved
    scale: float = 0.0  # the largest magnitude in the value, mask fills left out
    distinct: int = 0  # distinct values among the fingerprint's: 1 or 2 say little about which op it is
    func: str = ""  # the function's name as the equivalence table normalizes it
    path: tuple[Any, ...] = ()  # where the value sits in an op that returned several arrays (unbind, split)

    @property
    def node(self) -> tuple[int, tuple[Any, ...]]:
        return self.index, self.path


def normalized_path(path: str, match: dict[str, str] | None = None) -> str:
    """A module path as both sides can spell it: ``match`` prefixes applied, separators unified, containers out."""
    for old, new in (match or {}).items():
        if path == old or path.startswith(old + "."):
            path = new + path[len(old) :]
            break
    parts = [p for p in re.split(r"[./_\-]+", path.lower()) if p and p not in CONTAINERS]
    return ".".join(parts)


def points(trace: Trace, match: dict[str, str] | None = None) -> list[Point]:
    """The points of ``trace``: every op but those that depend on no input (parameter reshapes, constants)."""
    found: list[Point] = []
    with progress("tl.compare: reading values", total=len(trace.ops)) as bar:  # shown only past a few seconds
        for op in bar.each(trace.ops):
            _add_points(trace, op, match, found)
    return found


def _add_points(trace: Trace, op: OpRecord, match: dict[str, str] | None, found: list[Point]) -> None:
    """The points of one op (one per array it returned) appended to ``found``."""
    import numpy as np

    if op.kind not in ("input", "output") and op.source in ("parameter", "constant"):
        return
    outputs = frozenset(module_key(key, match) for key in op.module_outputs)
    cls = op_class(op)
    for key in reversed(op.module_outputs):  # the innermost module's type names what it returns
        module = trace.modules.get(key.rpartition(":")[0])
        if module is not None and module_class(module.type_name) is not None:
            cls = module_class(module.type_name)
            break
    for path, value, kind in read_values(trace, op):
        shape = (
            tuple(int(d) for d in value.shape)
            if value is not None
            else (tuple(int(d) for d in op.shape) if op.shape is not None and is_shape(op.shape) else None)
        )
        point = Point(
            op.index,
            cls,
            normalized_path(op.module_passes[-1][0], match) if op.module_passes else "",
            outputs,
            shape,
            int(np.prod(shape)) if shape is not None else None,
            kind,
            func=normalized(op.func_name),
            path=path,
        )
        if value is not None and value.size:
            flat = value.ravel()
            if kind == "float":
                flat = flat[np.isfinite(flat) & ~mask_fills(flat)]
            if flat.size:
                flat = np.sort(flat)
                point.fingerprint = flat[np.linspace(0, flat.size - 1, QUANTILES).round().astype(int)]
                point.scale = float(max(abs(flat[0]), abs(flat[-1])))
                point.distinct = len(np.unique(point.fingerprint))
        found.append(point)


def read_values(trace: Trace, op: OpRecord) -> list[tuple[tuple[Any, ...], Any, str]]:
    """``(path, value, kind)`` for each array ``op`` returned: one with path ``()`` for an op that returned one.

    An op that returned several arrays (``unbind``, ``split``, Paddle's
    ``batch_norm`` with its statistics) gives one entry per array leaf, so
    that each can pair on its own; one without a saved value gives
    ``[((), None, "none")]``.
    """
    if op.saved and op.out is not None and not is_shape(op.shape):
        found = [
            (path, *read_value(trace, op, path)) for path, _ in tree.leaves(op.out, lambda x: tree.children(x) is None)
        ]
        found = [entry for entry in found if entry[1] is not None]
        if found:
            return found
    return [((), *read_value(trace, op))]


def read_value(trace: Trace, op: OpRecord, path: tuple[Any, ...] = ()) -> tuple[Any, str]:
    """``op``'s value (at ``path`` in what it returned) as a float64 NumPy array and its kind ("float" or
    "int"); ``(None, "none")`` without one."""
    if not op.saved or op.out is None:
        return None, "none"
    value = op.out
    if path:
        value = tree.get(value, path)
    elif not is_shape(op.shape):  # several arrays: the first float one is what the op passes on
        found = next(
            (
                leaf
                for _, leaf in tree.leaves(value, lambda x: tree.children(x) is None)
                if _kind(trace, leaf) == "float"
            ),
            None,
        )
        if found is None:
            return None, "none"
        value = found
    import numpy as np

    array = _numpy(trace, value)
    if array is None:
        return None, "none"
    kind = {"f": "float", "i": "int", "u": "int", "b": "int"}.get(array.dtype.kind, "none")
    if kind == "none" or (not path and op.shape is not None and is_shape(op.shape) and array.shape != tuple(op.shape)):
        return None, "none"
    return array.astype(np.float64), kind


def _numpy(trace: Trace, value: Any) -> Any:
    """``value`` as a NumPy array of its own dtype (bfloat16 as float32); None when it is not an array."""
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return None  # a leaf beside the arrays (Paddle's batch_norm returns Nones), not an array
    h = backend_named(trace.backend, missing_ok=True)
    try:
        if h.array_info(value) is None:
            return None
        return np.asarray(h.to_numpy(value))
    except Exception:  # noqa: BLE001 - an object the backend does not count as an array, or a framework not installed here
        return None


def array_value(trace: Trace, op: OpRecord) -> Any:
    """``op``'s value as a float64 NumPy array, integers included; None when it was not saved or is not one."""
    return read_value(trace, op)[0]


def _kind(trace: Trace, value: Any) -> str:
    """ "float", "int" or "none" for a leaf, from its dtype as the backend describes it (no copy)."""
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)):
        dtype = value.dtype
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return "none"
    else:
        info = backend_named(trace.backend, missing_ok=True).array_info(value)
        if info is None:
            return "none"
        text = str(info[1]).lower()
        return (
            "float"
            if "float" in text or "half" in text or "double" in text
            else ("int" if "int" in text or "bool" in text or "long" in text else "none")
        )
    return {"f": "float", "i": "int", "u": "int", "b": "int"}.get(dtype.kind, "none")


def module_key(key: str, match: dict[str, str] | None) -> str:
    path, _, pass_num = key.rpartition(":")
    return f"{normalized_path(path, match)}:{pass_num}"


def is_shape(shape: Any) -> bool:
    return isinstance(shape, (tuple, list)) and all(isinstance(d, int) and d >= 0 for d in shape)
