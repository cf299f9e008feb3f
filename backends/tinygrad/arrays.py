"""Array adapters: what the core may ask of a tinygrad Tensor, and the copies capture makes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.dtype import DType, _to_np_dtype
from tinygrad.uop.ops import Ops

from torchlens_core.backend.array_ops import ArrayOps
from torchlens_core.backend.arrays import numpy_error

_DTYPE_NAMES: dict[DType, str] = {}


def dtype_name(dtype: DType) -> str:
    """A NumPy-style name: ``float32``, ``int64``, ``bfloat16`` (tinygrad's own names are C types)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        if dtype == dtypes.bfloat16:
            name = "bfloat16"
        else:
            np_type = _to_np_dtype(dtype) if dtype not in dtypes.weaks else None
            name = np.dtype(np_type).name if np_type is not None else dtype.name.replace(" ", "_")
        _DTYPE_NAMES[dtype] = name
    return name


def device_name(t: Tensor) -> str:
    device = t.device
    if device is None:  # a tensor tinygrad has not placed (Tensor.arange): it runs where the default device is
        from tinygrad import Device

        device = Device.DEFAULT
    return device.lower() if isinstance(device, str) else str(device)


def shape_of(t: Tensor) -> tuple[Any, ...]:
    return tuple(d if isinstance(d, int) else str(d) for d in t.shape)


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not isinstance(value, Tensor):
        return None
    return shape_of(value), dtype_name(value.dtype), device_name(value)


def to_numpy(value: Tensor) -> Any:
    return np.array(value.numpy(), copy=True)


def array_error(actual: Tensor, expected: Tensor) -> float:
    """max |a - e| / (1 + |e|); inf for a shape or dtype mismatch or NaNs in other places."""
    if tuple(actual.shape) != tuple(expected.shape) or dtype_name(actual.dtype) != dtype_name(expected.dtype):
        return math.inf
    return numpy_error(to_numpy(actual), to_numpy(expected))


# -- what capture and replay need -------------------------------------------------------
def is_weak(t: Tensor) -> bool:
    """A tensor of a weak dtype (a Python constant not yet given a dtype): it has no storage."""
    return t.dtype in dtypes.weaks


def buffer_key(t: Tensor) -> Any:
    """The BUFFER node a realized tensor (or a view of one) reads its data from; None if it has none."""
    base = t.uop.base
    return base if base.op is Ops.BUFFER else None


def realize(values: list[Tensor]) -> None:
    """Compute ``values`` now; weak-dtype constants have no storage and stay as they are."""
    todo = [t for t in values if not is_weak(t)]
    if todo:
        Tensor.realize(*todo)


def snapshot(t: Tensor) -> Tensor:
    """A realized copy of ``t`` in a buffer of its own, safe from later writes into ``t``."""
    if is_weak(t):
        return Tensor(t.uop)  # no storage to write into: a new object on the same (immutable) graph
    return t.clone().realize()


def settle_readers(*targets: Tensor) -> None:
    """Realize every live lazy tensor that reads the buffer of one of ``targets``.

    tinygrad shares identical graph nodes between tensors, and realizing one
    rewrites every live tensor holding that node to read the new buffer. A
    caller's unrealized tensor (the output of a plain call of the same model,
    say) can so come to read, or even hold a pending write into, a buffer that
    capture realized; computing such readers first, before capture realizes or
    writes anything, keeps them as they were. Views of a buffer are left
    alone: they share it on purpose.
    """
    from tinygrad.tensor import all_tensors

    keys = {id(key) for key in map(buffer_key, targets) if key is not None}
    if not keys:
        return
    skip = {id(t) for t in targets}
    readers = []
    for ref in list(all_tensors):
        t = ref()
        if t is None or id(t) in skip or is_weak(t):
            continue
        uop = t.uop
        if uop.base.op is Ops.BUFFER:  # realized, or a view of a buffer: reads no graph lazily
            continue
        if any(u.op is Ops.BUFFER and id(u) in keys for u in uop.backward_slice):
            readers.append(t)
    if readers:
        Tensor.realize(*readers)


def isolate_views(target: Tensor) -> list[Tensor]:
    """Give every other live tensor reading ``target``'s buffer a copy of its own; the copies.

    After this a write into ``target`` changes ``target`` alone, as it does to
    an unrealized tensor in a plain (lazy) tinygrad run.
    """
    from tinygrad.tensor import all_tensors

    key = buffer_key(target)
    if key is None:
        return []
    views = [t for ref in list(all_tensors) if (t := ref()) is not None and t is not target and buffer_key(t) is key]
    copies = []
    for t in views:
        copy = snapshot(t)
        t.replace(copy)  # same value, own buffer
        copies.append(copy)
    return copies


class TinygradArrayOps(ArrayOps):
    """ArrayOps on tinygrad Tensors, for interventions.

    Results are lazy like any tinygrad expression; capture realizes what it
    hands to the model. tinygrad writes in place through ``assign``, which
    changes the written Tensor object (what the model holds), so an in-place
    op's edit is assigned into its output (:meth:`write_into`).
    """

    def zeros_like(self, x: Tensor) -> Tensor:
        return x.zeros_like()

    def mean(self, x: Tensor, axes: tuple[int, ...]) -> Tensor:
        return x.mean(axis=axes, keepdim=True).cast(x.dtype)  # an integer tensor's mean is float: cast back

    def sum(self, x: Tensor, axis: int) -> Tensor:
        return x.sum(axis=axis, keepdim=True, dtype=x.dtype)  # without dtype=, small ints sum to a wider type

    def clip(self, x: Tensor, low: float | None, high: float | None) -> Tensor:
        return x.clip(low, high)

    def total(self, x: Tensor) -> Tensor:
        return x.sum()

    def take(self, x: Tensor, indices: Sequence[int], axis: int) -> Tensor:
        picks = Tensor(list(indices), dtype=dtypes.int32, device=x.device)
        return x[(slice(None),) * axis + (picks,)]

    def from_numpy(self, array: Any, like: Tensor) -> Tensor:
        data = np.asarray(array)
        if like.dtype == dtypes.bfloat16:  # NumPy has no bfloat16: through float32
            return Tensor(data.astype(np.float32), device=like.device).cast(like.dtype)
        return Tensor(data.astype(_to_np_dtype(like.dtype)), device=like.device, dtype=like.dtype)

    def copy(self, x: Tensor) -> Tensor:
        return snapshot(x)

    def write_into(self, target: Tensor, value: Tensor) -> Tensor:
        if value is not target:
            # computed into a buffer of its own first: the edit may read the buffer it is written into
            target.assign(snapshot(value))
        return target.realize()


ARRAY_OPS = TinygradArrayOps()
