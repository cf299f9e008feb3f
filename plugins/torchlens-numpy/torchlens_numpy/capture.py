"""Capturing a plain Python function over NumPy arrays.

Each input array reaches the function as a :class:`Tracked` view: an ndarray
subclass whose ``__array_ufunc__`` (every ufunc, so every operator: ``+``,
``@``, ``>``, ``+=``...), ``__array_function__`` (``np.dot``,
``np.concatenate``...), methods (``x.sum()``, ``x.T``) and indexing hand the
call to its capture's :class:`Recorder`. Each call runs once on plain arrays,
is recorded as one op, and hands back Tracked outputs, so later calls are seen
too. Arrays that never met an input (``np.zeros(3) + 1``) are not ops: they
enter the graph as constants, copied, where a recorded op reads them.

What recording means (which value is which op's, copy-before-write, edits of
``intervene=``, conversions into Python values reported once, what the
function returned) is the core's: a wrapper array mixes in
:class:`~torchlens.backend.Conversions` and hands its calls
to :func:`~torchlens.backend.dispatch`, recorded by a
:class:`~torchlens.backend.WrappedRecorder`. This module says
how NumPy calls are intercepted and what a NumPy array is: its memory is the
object ``.base`` leads to, shared by every view.

The legacy global-RNG functions (``np.random.rand``...) are replaced while
captures run (the core's :class:`~torchlens.backend.Routed`: the
first capture installs them, the last puts them back), so each draw is a
random source op holding ``np.random.get_state()`` from just before it:
replay is exact. A capture
records its own thread only: other threads' draws run plainly, under a lock
that keeps them from landing between a recorded draw and the state kept for it
(one that slips past is detected: CaptureError); a Tracked array used in
another thread, by ``intervene=``'s helpers, or after its capture computes as
plain NumPy.
"""

from __future__ import annotations

import functools
import operator
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from torchlens import CaptureError, UnsupportedError
from torchlens.backend import (
    CallSites,
    CaptureOptions,
    Conversions,
    MethodCall,
    Recording,
    Routed,
    Trace,
    TraceBuilder,
    WrappedRecorder,
    dispatch,
    plain_leaf,
    tree,
)

NAME = "numpy"

# ndarray methods recorded as ops named after the method (``x.sum()`` -> "sum").
# Left out: methods that return no array (tolist, item, tobytes, dump...) and
# resize/byteswap, which a view (what the function is given) cannot honour alike.
_METHODS = tuple(
    name
    for name in (
        "all any argmax argmin argpartition argsort astype choose clip compress conj conjugate copy cumprod "
        "cumsum diagonal dot fill flatten getfield max mean min nonzero partition prod put ravel repeat "
        "reshape round searchsorted setfield sort squeeze std sum swapaxes take trace transpose var view"
    ).split()
    if hasattr(np.ndarray, name)
)
# Methods and functions that write into their first argument.
_INPLACE_METHODS = frozenset({"fill", "sort", "partition", "put", "setfield"})
_INPLACE_FUNCS = frozenset({"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis", "shuffle"})
# Legacy np.random functions that are not draws; the rest of np.random.mtrand's are (the global RandomState's).
_NOT_DRAWS = frozenset({"RandomState", "get_state", "set_state", "seed", "get_bit_generator", "set_bit_generator"})
_DRAWS = tuple(
    name for name in getattr(np.random.mtrand, "__all__", ()) if name not in _NOT_DRAWS and hasattr(np.random, name)
)
# Functions whose answer depends on shapes, dtypes or memory only, never on values: not ops. np.shape and
# np.size are reported as reads of the shape (``len``), as ``x.shape`` is.
VALUE_FREE = frozenset(
    "shape size ndim iscomplexobj isrealobj result_type can_cast may_share_memory shares_memory isfortran".split()
)
SHAPE_READS = frozenset({"shape", "size"})


# Ignored for mypy: NumPy's stub makes ndarray unhashable and types tobytes' order as a Literal, where
# Conversions (one for every framework) hashes what the framework gave as a scalar and takes any order string
class Tracked(Conversions, np.ndarray):  # type: ignore[misc]
    """An ndarray whose NumPy calls, and conversions into Python values, are recorded while its capture runs.

    After the capture (or for an array the capture did not produce) calls run
    as plain NumPy and return plain arrays.
    """

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        fn = ufunc if method == "__call__" else getattr(ufunc, method)
        outs = kwargs.get("out", ())
        if any(isinstance(o, Tracked) and o._tl is not None and o._tl.scalar for o in outs):
            # ``s += 1`` on what NumPy gave as a scalar rebinds s to a new scalar: not a write.
            kwargs = {k: v for k, v in kwargs.items() if k != "out"}
            outs = ()
        targets = [inputs[0]] if method == "at" else [o for o in outs if isinstance(o, np.ndarray)]
        return dispatch(name, fn, inputs, kwargs, targets)

    # NumPy passes a tuple and a dict (NEP 18); its stub declares them as any iterable and mapping
    def __array_function__(  # type: ignore[override]
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not all(issubclass(t, np.ndarray) for t in types):
            return NotImplemented  # another array library's override: let it decide
        name = func.__name__
        targets = _out_targets(kwargs)
        if name in _INPLACE_FUNCS and args:
            targets.insert(0, args[0])
        return dispatch(name, func, args, kwargs, targets)

    def __getitem__(self, key: Any) -> Any:
        return dispatch("getitem", operator.getitem, (self, _bounds(key)), {}, [])

    def __setitem__(self, key: Any, value: Any) -> None:
        dispatch("setitem", operator.setitem, (self, _bounds(key), value), {}, [self])

    # What the core's Conversions ask of a wrapper: the plain array unlinked, the shape unreported, rounding.
    def _tl_unlinked(self) -> np.ndarray:
        return np.ndarray.view(self, np.ndarray)

    def _tl_shape(self) -> tuple[int, ...]:
        return np.ndarray.shape.__get__(self)

    def _tl_round(self, ndigits: int) -> Any:
        return np.round(self, ndigits)  # a NumPy value: a recorded op

    # ``x.T`` and ``x.mT`` as the recorded methods they abbreviate.
    @property
    def T(self) -> Any:
        return self.transpose()

    @property
    def mT(self) -> Any:
        return self.swapaxes(-1, -2)

    @property
    def real(self) -> Any:
        return np.real(self)

    @real.setter
    def real(self, value: Any) -> None:
        self._refuse_part_write("real", "x = value + 1j * x.imag")
        self[...] = value  # a real array is its own real part: a recorded write of the whole array

    @property
    def imag(self) -> Any:
        return np.imag(self)

    @imag.setter
    def imag(self, value: Any) -> None:
        self._refuse_part_write("imag", "x = x.real + 1j * value")
        plain = self._tl_unlinked()
        plain.imag = value  # a real array: NumPy's TypeError, nothing written

    def _refuse_part_write(self, part: str, instead: str) -> None:
        if np.iscomplexobj(self._tl_unlinked()):
            raise UnsupportedError(
                f"torchlens-numpy cannot record `x.{part} = ...` on a complex array (a write to part of each "
                f"element): use `{instead}`"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return self._tl_read_shape(self._tl_shape())  # a shape can depend on values: x[x > 0]

    @shape.setter
    def shape(self, value: Any) -> None:
        raise UnsupportedError(
            "torchlens-numpy cannot record `x.shape = ...` (it changes an array in place "
            "without a NumPy call): use `x = x.reshape(...)`"
        )

    # Printing must not record ops, and must look as it does outside a capture.
    def __repr__(self) -> str:
        return repr(plain_leaf(self))

    def __str__(self) -> str:
        return str(plain_leaf(self))

    @property
    def size(self) -> int:
        self._tl_read_shape(self._tl_shape())
        return np.ndarray.size.__get__(self)

    def __copy__(self) -> Any:
        return self.copy()

    def __deepcopy__(self, memo: Any) -> Any:
        return self.copy()


def _method(name: str) -> Callable[..., Any]:
    call = MethodCall(name)  # the recorded call: replay runs value.<name>(...), on an array or a NumPy scalar
    in_place = name in _INPLACE_METHODS

    @functools.wraps(getattr(np.ndarray, name))
    def method(self: Tracked, *args: Any, **kwargs: Any) -> Any:
        targets = _out_targets(kwargs)
        if in_place:
            targets.insert(0, self)
        return dispatch(name, call, (self, *args), kwargs, targets)

    return method


for _name in _METHODS:  # one recorded wrapper per method, all alike
    setattr(Tracked, _name, _method(_name))


def _out_targets(kwargs: dict[str, Any]) -> list[Any]:
    out = kwargs.get("out")
    outs = out if isinstance(out, tuple) else (out,)
    return [o for o in outs if isinstance(o, np.ndarray)]


def _bounds(key: Any) -> Any:
    """An index whose slice bounds are arrays (``x[:n]``, ``n`` a NumPy integer) with them as the ints NumPy
    reads from them (``operator.index``: a reported conversion), so the op's args hold plain data."""
    if type(key) is tuple:
        return tuple(_bounds(k) for k in key) if any(type(k) is slice for k in key) else key
    if type(key) is slice and any(isinstance(b, np.ndarray) for b in (key.start, key.stop, key.step)):
        return slice(*(None if b is None else operator.index(b) for b in (key.start, key.stop, key.step)))
    return key


def _owner(a: Any) -> Any:
    """The object that owns ``a``'s memory: every view of it shares this owner.

    ``.base`` is followed through non-arrays too: ``sliding_window_view`` and
    ``as_strided`` views hang off a helper object whose ``.base`` is the array.
    """
    base = getattr(a, "base", None)
    while base is not None:
        a, base = base, getattr(base, "base", None)
    return a


_VALUES = (np.ndarray, np.generic)  # what NumPy computes: arrays, and scalars for 0-d results


def _info(v: Any) -> tuple[Any, str | None]:
    """Shape and dtype name of a result: one array, or a tuple/list of them (None for non-arrays)."""
    if isinstance(v, _VALUES):
        return tuple(np.shape(v)), v.dtype.name
    kids = [x for _, x in tree.children(v) or []]
    arrays = [x for x in kids if isinstance(x, _VALUES)]
    return tuple(tuple(np.shape(x)) if isinstance(x, _VALUES) else None for x in kids), arrays[0].dtype.name


class Recorder(WrappedRecorder):
    """Records the NumPy calls of one function call: what a NumPy array is, and how a NumPy draw is kept."""

    array_types = _VALUES
    scalar_types = (np.generic,)
    # A call's code site: the first frame outside NumPy and this module (the zoo's functions are a user's code).
    sites = CallSites(np.__file__, files=(__file__,))
    value_free, shape_reads = VALUE_FREE, SHAPE_READS

    def describe(self, value: Any) -> tuple[Any, Any, str]:
        shape, dtype = _info(value)
        return shape, dtype, "cpu"

    def copy(self, value: Any) -> Any:
        return np.array(value, copy=True)

    def memory(self, value: Any) -> int | None:
        return None if isinstance(value, np.generic) else id(_owner(value))  # a NumPy scalar is immutable

    def wrapper(self, value: Any) -> Tracked:
        return np.ndarray.view(np.asarray(value), Tracked)

    def same(self, value: Any, copy: Any) -> bool:
        try:
            return np.array_equal(value, copy, equal_nan=value.dtype.kind in "fc")
        except TypeError:  # dtypes that cannot be compared
            return False

    def draw(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, float]:
        return _recorded_draw(fn, args, kwargs)


# -- np.random, replaced while any capture runs ----------------------------------------------------
# Held across a recorded draw and around other threads' draws while the replacements are in: the state a
# draw records is then the one it drew from, whatever other threads draw meanwhile.
_draw_lock = threading.Lock()


def _recorded_draw(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any, float]:
    """Draw, keeping the global RNG state the draw started from; (meta, result, seconds).

    Other threads' draws wait on ``_draw_lock`` meanwhile, except one that
    looked np.random's function up before the replacements went in. So the
    draw is checked: the same draw, by a private RandomState set to the kept
    state (on copies of the arguments), must end in the state the real one
    ended in, or another thread's draw came in between.
    """
    with _draw_lock:
        before = np.random.get_state()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        elapsed = time.perf_counter() - start
        after: Any = np.random.get_state()  # the legacy tuple, as below
    check = np.random.RandomState()
    check.set_state(before)
    copied = tree.map_leaves(lambda v: np.array(v, copy=True) if isinstance(v, np.ndarray) else v, (args, kwargs))
    getattr(check, fn.__name__)(*copied[0], **copied[1])
    again: Any = check.get_state()  # the legacy tuple (MT19937): NumPy's stub says the dict form
    if again[2:] != after[2:] or not np.array_equal(again[1], after[1]):  # position, cached gaussian, keys
        raise CaptureError(
            "another thread drew from NumPy's global random state while this capture recorded a draw from it, so "
            "the state the draw started from is unknown and replay could not be exact. Trace while no other "
            "thread draws from np.random's global functions, or give each thread an np.random.Generator"
        )
    return {"rng_state": before}, result, elapsed


def _draw(recorder: Recorder, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``np.random.<name>(...)`` called on the thread a capture records: an op of that capture."""
    name = original.__name__
    targets = [args[0]] if name in _INPLACE_FUNCS and args else []
    return recorder.call(name, original, args, kwargs, targets, random=True)


def _unrecorded_draw(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with _draw_lock:
        return original(*args, **kwargs)


_RANDOM = Routed(np.random, _DRAWS, _draw, _unrecorded_draw)


# -- the capture ----------------------------------------------------------------------------------
def capture(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None
) -> Trace | Recording:
    """Run ``fn(*args, **kwargs)`` once with its input arrays tracked and return its Trace."""
    builder = TraceBuilder(NAME, getattr(fn, "__name__", type(fn).__name__), options)
    recorder = Recorder(builder)
    inputs: dict[int, Conversions] = {}

    def track(v: Any) -> Any:
        # A NumPy number passed in (``eps=np.float32(1e-5)``) is an input too: replay on new inputs takes a
        # new one there, as it takes an array (a Python number stays a constant of the call).
        if isinstance(v, np.generic) and v.dtype.kind in "biufc":
            plain = v
        elif not isinstance(v, np.ndarray):
            return v
        elif isinstance(v, (np.matrix, np.ma.MaskedArray)):
            raise UnsupportedError(
                f"torchlens-numpy traces plain ndarrays; {type(v).__name__} inputs change "
                "what operators mean: pass np.asarray(x) or the masked array's .data"
            )
        else:
            plain = plain_leaf(v)
        if id(plain) not in inputs:  # the same array passed twice is one input
            inputs[id(plain)] = recorder.input(plain)
        return inputs[id(plain)]

    tracked_args, tracked_kwargs = tree.map_leaves(track, (args, kwargs))
    try:
        with _RANDOM.recording(recorder):
            output = fn(*tracked_args, **tracked_kwargs)
    finally:
        recorder.depth += 1  # the capture is over: Tracked arrays that escape it compute as plain NumPy
    return recorder.finish(output)
