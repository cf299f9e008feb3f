"""Values a TensorFlow forward turns into Python values: reported for replay on new inputs.

A recorded graph has every Python value the forward made from a tensor baked
in: the branch ``if tf.reduce_sum(h) > 0`` took (``__bool__``), the count of
a loop over ``range(int(n))``, the ``k`` of ``x[:k]``, a shape read off a
tensor whose shape depends on values (``tf.where``, ``tf.unique``). Eager
tensors make those Python values without running an op, so the op callback
never sees them: for the capture the EagerTensor methods that do it are
replaced on ``_EagerTensorBase`` (the Python class defining them; EagerTensor,
its C subclass, follows). Each reports, when the tensor is a recorded op's
output, to ``TraceBuilder.to_python`` with a conversion from
``torchlens_core.replay.inputs.CONVERSIONS``, which replay applies to the
replayed value (an EagerTensor, or a NumPy array given as a new input) and
compares:

- ``bool(t)``, ``int(t)``, ``float(t)``, ``operator.index(t)`` (``range(t)``,
  ``lst[t]``) as themselves; ``len(t)`` and ``for row in t`` as ``len`` (the
  rows are recorded ops, the count is the Python value);
- ``t.numpy()``, ``t.__array__()``, pickling (``__reduce__``),
  ``complex(t)``, ``format(t, spec)`` of a scalar, and NumPy's array
  constructors called on the tensor (below): the whole value. EagerTensors have no
  ``tolist`` or ``item`` for replay to call, so a scalar is reported as
  ``bool``/``int``/``float`` by its dtype (what ``.item()`` of it gives),
  and an array as its shape (below) and each element, at the path
  ``(..., (i, j))`` (``t[i, j]``, one strided slice at replay), up to
  :data:`ELEMENT_BUDGET` elements. A larger array, or one whose elements no
  conversion reproduces (complex, strings), is reported as a value too large
  to keep, which replay on new inputs refuses;
- ``t.shape`` (and ``get_shape()``, ``ndim``, which read it) as ``int`` of
  each dimension, at the path ``(..., "shape", k)``: replay reads the
  replayed tensor's ``shape[k]``, with no op run. Only for the outputs of
  multi-output ops: replay on new inputs compares every other op's output
  shape with the recorded one anyway (a shape depends on values only after
  ops such as ``tf.where``, ``tf.unique``).

Each report is made once per op output and conversion
(:meth:`torchlens_core.capture.recorder.Recorder.report`): tensors are
immutable, so a second read gives the same value. The reads that decide a
Python ``if``/``while`` also tell the branch tracker (shape reads do not: a
shape is static but for data-dependent ops, and ``if x.shape[0] > 1`` would
otherwise mark half of Keras as branched).

NumPy. ``np.array(t)`` and ``np.asarray(t)`` read the tensor through the
buffer protocol, from C, calling none of its methods (NumPy asks for a
buffer before ``__array__``). So ``np.array``, ``np.asarray``,
``np.asanyarray``, ``np.ascontiguousarray`` and ``np.asfortranarray`` are
replaced for the capture too, and report the whole value of a recorded
tensor given to them (``keras.ops.convert_to_numpy`` calls ``np.array``).
Not seen: other NumPy functions applied to a tensor (``np.sum(t)``,
``np.float32(t)``), a list of tensors given to ``np.array``,
``memoryview(t)``, ``tf.experimental.dlpack.to_dlpack(t)``: they read the
buffer unseen, and replay on new inputs cannot check what they made. Call
``t.numpy()`` first in a forward that is to be replayed on new inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any

import numpy as np
from tensorflow.python.framework import ops

from torchlens_core.capture.threads import SharedPatchUse, shared_patch
from torchlens_core.ir.records import Ref

if TYPE_CHECKING:
    from torchlens_tf.capture import Recorder

# At most this many elements of an array read whole are kept (as many as the core keeps of a tolist).
ELEMENT_BUDGET = 4096

# EagerTensor methods -> what they read: a conversion of the value, "iter" (``len``: the loop count),
# "whole" (the value as an array) or "format" (the whole value of a scalar; anything else formats as its
# text, like str()).
_READS = {
    "__bool__": "bool",
    "__int__": "int",
    "__float__": "float",
    "__index__": "index",
    "__len__": "len",
    "__iter__": "iter",
    "numpy": "whole",
    "__array__": "whole",
    "__reduce__": "whole",
    "__complex__": "whole",
    "__format__": "format",
}


def _element(dtype: Any) -> tuple[str, Callable[[Any], Any]] | None:
    """How each element (or a scalar) of a value read whole is converted: as ``.item()`` of it would be."""
    if dtype.is_bool:
        return "bool", bool
    if dtype.is_integer:
        return "int", int
    if dtype.is_floating:  # bfloat16 and float16 included: float() of their NumPy scalars is exact
        return "float", float
    return None  # complex, strings, quantized: no conversion of an EagerTensor reproduces them


def _report_shape(recorder: Recorder, ref: Ref, dims: tuple[int, ...]) -> None:
    """The tensor's shape was read: each dimension, as ``int(value.shape[k])``.

    Only for an output of a multi-output op (``tf.unique``'s, ``tf.dynamic_partition``'s): replay on new
    inputs checks the shape of every single-output op's value (and of each new input) itself.
    """
    if ref.path:
        for k, dim in enumerate(dims):
            recorder.report(ref.index, (*ref.path, "shape", k), "int", dim)


def _report_whole(recorder: Recorder, ref: Ref, t: Any) -> None:
    """The tensor's whole value was read into NumPy."""
    dtype = t.dtype
    # once per op output, marked among the recorder's reported conversions: its elements are not read again
    key = (ref.index, ref.path, "whole")
    if not dtype.is_numpy_compatible or key in recorder.reported:
        return  # a handle (resource, variant) has no value to read
    recorder.reported.add(key)
    dims = t._shape_tuple()
    element = _element(dtype)
    to_python, index, path = recorder.builder.to_python, ref.index, ref.path
    if element is None or math.prod(dims) > ELEMENT_BUDGET:
        # Reported as a value the builder does not keep (the tensor is not stored): replay on new
        # inputs refuses the trace rather than check less than was read.
        to_python(index, path, "tolist", t)
        return
    how, convert = element
    value = t._numpy()  # the buffer, read as numpy() does, without a copy
    if not dims:
        to_python(index, path, how, convert(value))
        return
    _report_shape(recorder, ref, dims)
    for at in np.ndindex(dims):
        to_python(index, (*path, at), how, convert(value[at]))


def patches() -> list[SharedPatchUse]:
    """The process-wide replacements that report value reads to the capturing thread's Recorder."""
    cls = ops._EagerTensorBase
    found = [shared_patch(cls, name, make) for name, make in _MAKERS.items() if hasattr(cls, name)]
    found.append(shared_patch(cls, "shape", _reporting_shape))
    found += [shared_patch(np, name, _reporting_numpy) for name in _NUMPY_READS]
    return found


def _reporting(kind: str) -> Callable[[Any, dict[int, Recorder]], Any]:
    def make(original: Any, recorders: dict[int, Recorder]) -> Any:
        """An EagerTensor value read that reports what it read, for the capturing thread."""
        find = recorders.get

        def read(t: Any, *args: Any, **kwargs: Any) -> Any:
            recorder = find(get_ident())
            if recorder is None or recorder.depth or recorder.failure is not None:
                return original(t, *args, **kwargs)
            ref = recorder.producer(t)
            if ref is None:  # a constant the forward made, not a recorded value: the graph holds it as is
                return original(t, *args, **kwargs)
            if kind != "iter":  # a for loop is no branch the tracker knows
                recorder.branches.condition(ref.index)
            result = original(t, *args, **kwargs)  # raises (a non-scalar's bool, say) before anything is reported
            if kind == "iter":
                recorder.report(ref.index, ref.path, "len", t._shape_tuple()[0])
            elif kind == "whole" or (kind == "format" and not t._shape_tuple()):
                _report_whole(recorder, ref, t)
            elif kind != "format":
                recorder.report(ref.index, ref.path, kind, result)
            return result

        read.__name__ = read.__qualname__ = original.__name__
        read.__wrapped__ = original  # type: ignore[attr-defined]
        return read

    return make


# NumPy's functions that make an array of their argument, which read a tensor through the buffer protocol
# (keras.ops.convert_to_numpy calls np.array).
_NUMPY_READS = ("array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray")

# One replacement maker per method, made once: shared_patch refuses a second maker for an attribute.
_MAKERS = {name: _reporting(kind) for name, kind in _READS.items()}


def _reporting_shape(original: Any, recorders: dict[int, Recorder]) -> Any:
    find, get = recorders.get, original.fget

    def shape(t: Any) -> Any:
        result = get(t)
        recorder = find(get_ident())
        # Only outputs of multi-output ops are reported (see _report_shape): Keras reads shapes all the time.
        if recorder is not None and recorder.multi_outputs and not recorder.depth and recorder.failure is None:
            ref = recorder.producer(t)
            if ref is not None and ref.path:
                _report_shape(recorder, ref, t._shape_tuple())
        return result

    return property(shape, doc=original.__doc__)


def _reporting_numpy(original: Any, recorders: dict[int, Recorder]) -> Any:
    """``np.array(t)`` and the other array constructors: NumPy reads a tensor through its buffer, unseen."""
    find = recorders.get

    def make_array(a: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(a, *args, **kwargs)  # NumPy's own errors first
        recorder = find(get_ident())
        if recorder is not None and not recorder.depth and recorder.failure is None:
            ref = recorder.producer(a)  # the tensor itself: a list of tensors is read unseen
            if ref is not None:
                recorder.branches.condition(ref.index)
                _report_whole(recorder, ref, a)
        return result

    make_array.__name__ = make_array.__qualname__ = original.__name__
    make_array.__doc__ = original.__doc__
    make_array.__wrapped__ = original  # type: ignore[attr-defined]
    return make_array
