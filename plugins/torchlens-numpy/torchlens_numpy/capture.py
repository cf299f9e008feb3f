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
``intervene=``, conversions reported once, what the function returned) is the
core's :class:`~torchlens_core.capture.recorder.Recorder`; this module says
how NumPy calls are intercepted and what a NumPy array is: its memory is the
object ``.base`` leads to, shared by every view.

The legacy global-RNG functions (``np.random.rand``...) are replaced while
captures run (``shared_patch``: the first capture installs them, the last puts
them back), so each draw is a random source op holding
``np.random.get_state()`` from just before it: replay is exact. A capture
records its own thread only: other threads' draws run plainly, under a lock
that keeps them from landing between a recorded draw and the state kept for it
(one that slips past is detected: CaptureError); a Tracked array used in
another thread, by ``intervene=``'s helpers, or after its capture computes as
plain NumPy.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.capture.recorder import Recorder as BaseRecorder
from torchlens_core.capture.sites import CallSites
from torchlens_core.capture.threads import shared_patch
from torchlens_core.ir import tree
from torchlens_core.ir.errors import CaptureError, TorchLensError, UnsupportedError
from torchlens_core.ir.records import Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.inputs import CONVERSIONS
from torchlens_numpy import conversions
from torchlens_numpy.conversions import SHAPE_READS, VALUE_FREE, Conversions, PythonValue, python_conversion

NAME = "numpy"

# ndarray methods recorded as ops named after the method (``x.sum()`` -> "sum").
# Left out: methods that return no array (tolist, item, tobytes, dump...) and
# resize/byteswap, which a view (what the function is given) cannot honour alike.
_METHODS = tuple(name for name in (
    "all", "any", "argmax", "argmin", "argpartition", "argsort", "astype", "choose", "clip", "compress",
    "conj", "conjugate", "copy", "cumprod", "cumsum", "diagonal", "dot", "fill", "flatten", "getfield",
    "max", "mean", "min", "nonzero", "partition", "prod", "put", "ravel", "repeat", "reshape", "round",
    "searchsorted", "setfield", "sort", "squeeze", "std", "sum", "swapaxes", "take", "trace", "transpose",
    "var", "view",
) if hasattr(np.ndarray, name))
# Methods and functions that write into their first argument.
_INPLACE_METHODS = frozenset({"fill", "sort", "partition", "put", "setfield"})
_INPLACE_FUNCS = frozenset({"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis", "shuffle"})
# Legacy np.random functions that are not draws; the rest of np.random.mtrand's are (the global RandomState's).
_NOT_DRAWS = frozenset({"RandomState", "get_state", "set_state", "seed", "get_bit_generator",
                        "set_bit_generator"})
_DRAWS = tuple(name for name in getattr(np.random.mtrand, "__all__", ())
               if name not in _NOT_DRAWS and hasattr(np.random, name))
# A call's code site: the first frame outside NumPy and these modules (the zoo's functions are a user's code).
_SITES = CallSites(np.__file__, files=(__file__, conversions.__file__))


class _Link(NamedTuple):
    """The capture a Tracked array belongs to, and the plain value calls receive in its place."""

    recorder: Recorder
    # An ndarray sharing the Tracked array's memory, or the NumPy scalar (np.float64...) that
    # NumPy gave and that is tracked as a 0-d array.
    plain: Any
    scalar: bool


class Tracked(Conversions, np.ndarray):
    """An ndarray whose NumPy calls, and conversions into Python values, are recorded while its capture runs.

    After the capture (or for an array the capture did not produce) calls run
    as plain NumPy and return plain arrays.
    """

    _tl: _Link | None = None

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        fn = ufunc if method == "__call__" else getattr(ufunc, method)
        outs = kwargs.get("out", ())
        if any(isinstance(o, Tracked) and o._tl is not None and o._tl.scalar for o in outs):
            # ``s += 1`` on what NumPy gave as a scalar rebinds s to a new scalar: not a write.
            kwargs = {k: v for k, v in kwargs.items() if k != "out"}
            outs = ()
        targets = [inputs[0]] if method == "at" else [o for o in outs if isinstance(o, np.ndarray)]
        return _dispatch(name, fn, inputs, kwargs, targets)

    def __array_function__(self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not all(issubclass(t, np.ndarray) for t in types):
            return NotImplemented  # another array library's override: let it decide
        name = func.__name__
        targets = _out_targets(kwargs)
        if name in _INPLACE_FUNCS and args:
            targets.insert(0, args[0])
        return _dispatch(name, func, args, kwargs, targets)

    def __getitem__(self, key: Any) -> Any:
        return _dispatch("getitem", operator.getitem, (self, _bounds(key)), {}, [])

    def __setitem__(self, key: Any, value: Any) -> None:
        _dispatch("setitem", operator.setitem, (self, _bounds(key), value), {}, [self])

    # ``x.T`` and ``x.mT`` as the recorded methods they abbreviate.
    @property
    def T(self) -> Any:  # noqa: N802 - ndarray's name
        return self.transpose()

    @property
    def mT(self) -> Any:  # noqa: N802 - ndarray's name
        return self.swapaxes(-1, -2)

    @property
    def real(self) -> Any:
        return np.real(self)

    @property
    def imag(self) -> Any:
        return np.imag(self)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._tl_read_shape(np.ndarray.shape.__get__(self))  # a shape can depend on values: x[x > 0]

    @shape.setter
    def shape(self, value: Any) -> None:
        raise UnsupportedError("torchlens-numpy cannot record `x.shape = ...` (it changes an array in place "
                               "without a NumPy call): use `x = x.reshape(...)`")

    # Printing must not record ops, and must look as it does outside a capture.
    def __repr__(self) -> str:
        return repr(plain_leaf(self))

    def __str__(self) -> str:
        return str(plain_leaf(self))

    @property
    def size(self) -> int:
        self._tl_read_shape(np.ndarray.shape.__get__(self))
        return np.ndarray.size.__get__(self)

    def __copy__(self) -> Any:
        return self.copy()

    def __deepcopy__(self, memo: Any) -> Any:
        return self.copy()


def _method_call(name: str) -> Callable[..., Any]:
    """``value.<name>(...)`` as a function of the value: the call a recorded method replays.

    Looked up on the value, not on ndarray, because a NumPy scalar has the same methods.
    """
    def call(value: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(value, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _method(name: str) -> Callable[..., Any]:
    call = _method_call(name)
    in_place = name in _INPLACE_METHODS

    @functools.wraps(getattr(np.ndarray, name))
    def method(self: Tracked, *args: Any, **kwargs: Any) -> Any:
        targets = _out_targets(kwargs)
        if in_place:
            targets.insert(0, self)
        return _dispatch(name, call, (self, *args), kwargs, targets)

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


def plain_leaf(v: Any) -> Any:
    """The plain value a Tracked array stands for (anything else as it is)."""
    if isinstance(v, Tracked):
        link = v._tl
        return link.plain if link is not None else np.ndarray.view(v, np.ndarray)
    return v


def _plain(x: Any) -> Any:
    return tree.map_leaves(plain_leaf, x)


def _dispatch(name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: list[Any]) -> Any:
    """Record the call with the recorder of the first Tracked array whose capture records it; else plain NumPy."""
    for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tracked)):
        link = leaf._tl
        if link is not None and link.recorder.recording():  # its thread, not its own work, not over
            return link.recorder.call(name, fn, args, kwargs, targets)
    return fn(*_plain(args), **_plain(kwargs))


def _owner(a: Any) -> Any:
    """The object that owns ``a``'s memory: every view of it shares this owner.

    ``.base`` is followed through non-arrays too: ``sliding_window_view`` and
    ``as_strided`` views hang off a helper object whose ``.base`` is the array.
    """
    base = getattr(a, "base", None)
    while base is not None:
        a, base = base, getattr(base, "base", None)
    return a


def _is_value(v: Any) -> bool:
    return isinstance(v, (np.ndarray, np.generic))


def _info(v: Any) -> tuple[Any, str | None]:
    """Shape and dtype name of a result: one array, or a tuple/list of them (None for non-arrays)."""
    if _is_value(v):
        return tuple(np.shape(v)), v.dtype.name
    kids = [x for _, x in tree.children(v) or []]
    arrays = [x for x in kids if _is_value(x)]
    return tuple(tuple(np.shape(x)) if _is_value(x) else None for x in kids), arrays[0].dtype.name


def _has_arrays(v: Any) -> bool:
    if _is_value(v):
        return True
    return isinstance(v, (tuple, list)) and any(_is_value(x) for x in v)


class Recorder(BaseRecorder):
    """Records the NumPy calls of one function call into a TraceBuilder.

    ``op.out`` holds plain values; the function holds their Tracked views, and
    those are what ``producers`` maps to ops (:meth:`produced`).
    """

    array_types = (np.ndarray, np.generic)

    def __init__(self, builder: TraceBuilder) -> None:
        super().__init__(builder)
        # id(constant array) -> (that array, its copy): a closure weight read by every step of
        # a loop is copied once, unless it changed in between.
        self.constants: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # memory key -> (op index, path) of values save= dropped: nothing to copy before a write (the base keeps
        # no entry), but a plain view of them that leaks into the graph is still reported (leaked)
        self.dropped: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}

    # -- what a NumPy array is -----------------------------------------------------------------
    def describe(self, value: Any) -> tuple[Any, Any, str]:
        shape, dtype = _info(value)
        return shape, dtype, "cpu"

    def copy(self, value: Any) -> Any:
        return np.array(value, copy=True)

    def memory(self, value: Any) -> int | None:
        return None if isinstance(value, np.generic) else id(_owner(value))  # a NumPy scalar is immutable

    def produced(self, value: Any, ref: Ref, alias: bool = False) -> None:
        if type(value) is not Tracked:  # the plain values record() is given are op.out's; the function reads views
            return
        super().produced(value, ref, alias)
        if not self.builder.ops[ref.index].saved:
            self.dropped.setdefault(self.memory(value), []).append((ref.index, ref.path))  # type: ignore[arg-type]

    def constant(self, value: Any) -> Any:
        a = plain_leaf(value)  # a Tracked array of another capture, or of none, is its plain array here
        if isinstance(a, np.generic):
            return a
        if self.memories or self.dropped:
            key = self.memory(a)
            if key in self.memories or key in self.dropped:
                self.leaked(a, key)
        seen = self.constants.get(id(a))
        if seen is not None and seen[0] is a:
            try:
                if np.array_equal(a, seen[1], equal_nan=a.dtype.kind in "fc"):
                    return seen[1]
            except TypeError:  # dtypes that cannot be compared
                pass
        copy = np.array(a, copy=True)
        self.constants[id(a)] = (a, copy)
        return copy

    def leaked(self, a: np.ndarray, key: int) -> None:
        """``a``, about to enter the graph as a constant, lives in recorded memory: report what it was read from.

        NumPy calls that do not dispatch (``np.asarray(x)``) hand the function
        a plain view of a recorded value; the graph keeps its contents as they
        were. Reported as ``tolist`` of every recorded value living in that
        memory now, so new inputs (or edits) that change them are refused.
        """
        ops, written = self.builder.ops, self.written_at.get(key, -1)
        for index, path in (*self.memories.get(key, ()), *self.dropped.get(key, ())):
            if index >= written and (index, path, "tolist") not in self.reported:  # (older: written over since)
                out = ops[index].out
                # dropped by save=: nothing to compare with, and the core refuses a conversion it cannot check
                self.report(index, path, "tolist", a if out is None else tree.get(out, path).tolist())

    # -- the hot path ----------------------------------------------------------------------
    def call(self, name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: list[Any],
             random: bool = False) -> Any:
        """Run one NumPy call on plain arrays and record it (``targets``: the arrays it writes into)."""
        parents: list[int] = []
        params: list[str] = []
        a = self.template(args, parents, params)
        k = self.template(kwargs, parents, params) if kwargs else {}
        for t in targets:
            self.protect(t)
        meta = None
        plain_args, plain_kwargs = _plain(args), _plain(kwargs)
        self.depth += 1  # what the call runs, and intervene='s helpers in record(), are not the function's ops
        try:
            if random:
                meta, result, elapsed = _recorded_draw(fn, plain_args, plain_kwargs)
            else:
                start = time.perf_counter()
                result = fn(*plain_args, **plain_kwargs)
                elapsed = time.perf_counter() - start
            value = plain_leaf(targets[0]) if result is None and targets else result
            arrays = _has_arrays(value)
            if arrays:
                shape, dtype = _info(value)
                seen = self.record(name, fn, a, k, parents, params, value, written=tuple(targets), shape=shape,
                                   dtype=dtype, device="cpu", random=random, code_context=_SITES.stack(1), meta=meta,
                                   elapsed=elapsed)
        except TorchLensError as exc:  # raised by the capture, also if the function catches it
            raise self.remember(exc) from None
        finally:
            self.depth -= 1
        if not arrays:  # np.shape, np.allclose...: a Python value, or None
            if parents and result is not None:
                return self.python_value(name, fn, args, a, k, parents, params, result, elapsed)
            return result
        # An in-place call hands back the very arrays it wrote into: the function keeps its own views of them.
        written = {id(plain_leaf(t)): t for t in targets if type(t) is Tracked} if targets else None
        wrapped = self.wrap(seen, self.builder.ops[-1].index, written)
        return None if result is None else wrapped

    def _record(self, *args: Any, **fields: Any) -> Any:
        """:meth:`record`, paused: ``intervene=``'s helpers run in it, and their NumPy calls are not ops."""
        with self.paused():
            try:
                return self.record(*args, **fields)
            except TorchLensError as exc:  # raised by the capture, also if the function catches it
                raise self.remember(exc) from None

    def python_value(self, name: str, fn: Any, args: tuple[Any, ...], a: Any, k: Any, parents: list[int],
                     params: list[str], result: Any, elapsed: float) -> Any:
        """A NumPy call on recorded arrays answered with a Python value (``np.allclose``): what the function gets.

        A shape, dtype or memory question is no op; a shape read is reported
        as one. A number (or a tuple of them) is recorded as an op whose value
        is the number as an array, and reported, so replay checks it.
        """
        if name in VALUE_FREE:
            if name in SHAPE_READS and args and isinstance(args[0], Tracked):
                args[0]._tl_read_shape(np.ndarray.shape.__get__(args[0]))
            return result
        how = python_conversion(result)
        if how is None:  # a string or an object: printing and the like decide nothing
            return result
        value = np.asarray(result)
        seen = self._record(name, PythonValue(fn), a, k, parents, params, value, code_context=_SITES.stack(1),
                            elapsed=elapsed)
        got = CONVERSIONS[how](np.asarray(seen))
        if seen is not value:  # an edit: the function gets the edited answer, of the type it had
            result = type(result)(got) if isinstance(result, tuple) else got
        self.report(self.builder.ops[-1].index, (), how, got)
        return result

    def wrap(self, value: Any, index: int, written: dict[int, Tracked] | None = None) -> Any:
        """Tracked views of op ``index``'s value (one array, or a tuple/list of them); ``written``: id of a
        plain array the op wrote into -> the view the function holds of it, handed back instead."""
        if _is_value(value):
            return self.tracked(value, Ref(index), written)
        return tree.rebuild(value, [self.tracked(v, Ref(index, (i,)), written) if _is_value(v) else v
                                    for i, v in enumerate(value)])

    def tracked(self, v: Any, ref: Ref, written: dict[int, Tracked] | None = None) -> Tracked:
        t = written.get(id(v)) if written else None
        if t is not None:  # record() made it this op's value already
            t._tl = _Link(self, v, False)
            return t
        t = np.ndarray.view(np.asarray(v), Tracked)
        t._tl = _Link(self, v, isinstance(v, np.generic))
        self.produced(t, ref)
        return t

    def as_output(self, value: Any, inside: Any) -> tuple[Ref, Any]:
        """A returned array that no recorded op computed is a ``constant`` source op, so that the outputs are
        all nodes of the graph (and ``intervene=`` may pick it: the caller is the one later op to see the edit)."""
        ref = self.producer(value)
        if ref is not None:
            return ref, None
        plain = plain_leaf(value)
        stored = self.copy(plain) if isinstance(plain, np.ndarray) else plain
        seen = self._record("constant", constant, (stored,), {}, [], [], plain)
        return Ref(self.builder.ops[-1].index), (None if seen is plain else seen)

    # -- Python values (conversions.py) ------------------------------------------------------
    def reading(self, tracked: Tracked, values: bool = True) -> tuple[Tracked, Ref] | None:
        """The array to convert for ``tracked`` and the Ref to report it at (None: convert unreported).

        ``tracked`` itself, unless its memory was written (through another
        view) since its op ran: replay checks a value as its op computed it,
        so the value read now is recorded first, as a ``copy`` op.
        ``values=False``: only the shape is read, which no write changes.
        """
        ref = self.producer(tracked)
        if ref is None or not self.recording():
            return None
        if values and not tracked._tl.scalar and self.written_since(tracked, ref.index):  # type: ignore[union-attr]
            tracked = self.call("copy", _method_call("copy"), (tracked,), {}, [])
            ref = self.producer(tracked)
        return tracked, ref  # type: ignore[return-value]


def constant(value: Any) -> Any:
    """The call of a "constant" op: a returned array that no recorded op computed."""
    return value.copy()


# -- np.random, replaced while any capture runs ----------------------------------------------------
_current = threading.local()  # .recorder: the capture running on this thread (the innermost, if they nest)
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
        after = np.random.get_state()
    check = np.random.RandomState()
    check.set_state(before)
    copied = tree.map_leaves(lambda v: np.array(v, copy=True) if isinstance(v, np.ndarray) else v, (args, kwargs))
    getattr(check, fn.__name__)(*copied[0], **copied[1])
    again = check.get_state()
    if again[2:] != after[2:] or not np.array_equal(again[1], after[1]):  # position, cached gaussian, keys
        raise CaptureError(
            "another thread drew from NumPy's global random state while this capture recorded a draw from it, so "
            "the state the draw started from is unknown and replay could not be exact. Trace while no other "
            "thread draws from np.random's global functions, or give each thread an np.random.Generator")
    return {"rng_state": before}, result, elapsed


def _draw_replacement(original: Any, handlers: dict[int, Any]) -> Any:
    """``np.random.<name>`` while captures run: a draw is an op of the capture recording this thread (found
    through ``_current``; see ``_recording_random``)."""
    name = original.__name__

    @functools.wraps(original)
    def draw(*args: Any, **kwargs: Any) -> Any:
        recorder = getattr(_current, "recorder", None)
        if recorder is None or not recorder.recording():
            with _draw_lock:
                return original(*args, **kwargs)
        targets = [args[0]] if name in _INPLACE_FUNCS and args else []
        return recorder.call(name, original, args, kwargs, targets, random=True)

    return draw


@contextlib.contextmanager
def _recording_random(recorder: Recorder) -> Iterator[None]:
    """np.random's draws replaced while this capture runs; a capture nested in it uses its replacements.

    A draw finds its capture through ``_current``, which a nested capture changes, not through the patch's
    per-thread handlers (one per thread: they cannot nest)."""
    previous = getattr(_current, "recorder", None)
    _current.recorder = recorder
    patched = shared_patch(np.random, _DRAWS, _draw_replacement).use(None) if previous is None else None
    try:
        with patched or contextlib.nullcontext():
            yield
    finally:
        _current.recorder = previous


# -- the capture ----------------------------------------------------------------------------------
def capture(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None) -> Trace:
    """Run ``fn(*args, **kwargs)`` once with its input arrays tracked and return its Trace."""
    builder = TraceBuilder(NAME, getattr(fn, "__name__", type(fn).__name__), options)
    recorder = Recorder(builder)
    inputs: dict[int, Tracked] = {}

    def track(v: Any) -> Any:
        # A NumPy number passed in (``eps=np.float32(1e-5)``) is an input too: replay on new inputs takes a
        # new one there, as it takes an array (a Python number stays a constant of the call).
        if isinstance(v, np.generic) and v.dtype.kind in "biufc":
            plain = v
        elif not isinstance(v, np.ndarray):
            return v
        elif isinstance(v, (np.matrix, np.ma.MaskedArray)):
            raise UnsupportedError(f"torchlens-numpy traces plain ndarrays; {type(v).__name__} inputs change "
                                   "what operators mean: pass np.asarray(x) or the masked array's .data")
        else:
            plain = plain_leaf(v)
        if id(plain) not in inputs:  # the same array passed twice is one input
            op = builder.add_input(plain, shape=tuple(np.shape(plain)), dtype=plain.dtype.name, device="cpu")
            inputs[id(plain)] = recorder.tracked(plain, Ref(op.index))
        return inputs[id(plain)]

    tracked_args, tracked_kwargs = tree.map_leaves(track, (args, kwargs))
    try:
        with _recording_random(recorder):
            output = fn(*tracked_args, **tracked_kwargs)
    finally:
        recorder.depth += 1  # the capture is over: Tracked arrays that escape it compute as plain NumPy
    recorder.raise_remembered()  # a recorded call raised, and the function caught it and went on
    template, output = recorder.returned(output, None)
    builder.add_outputs(template, _plain(output))  # the caller gets plain values (an edited constant's edit)
    return builder.finish()
