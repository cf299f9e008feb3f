"""Capturing a plain Python function over NumPy arrays.

Each input array reaches the function as a :class:`Tracked` view: an ndarray
subclass whose ``__array_ufunc__`` (every ufunc, so every operator: ``+``,
``@``, ``>``, ``+=``...) and ``__array_function__`` (``np.dot``,
``np.concatenate``, ``np.einsum``...) see the calls made on it, and whose
methods (``x.sum()``, ``x.reshape()``, ``x.T``) and indexing are routed the
same way. Each call runs once on plain arrays, is recorded as one op, and
hands back Tracked outputs, so later calls are seen too. Calls on arrays that
never met an input (``np.zeros(3) + 1``) are not ops: their results enter the
graph as constants, copied, where a recorded op reads them.

The legacy global-RNG functions (``np.random.rand``, ``np.random.normal``...)
are wrapped for the duration of a capture, so each draw is a random source op
holding ``np.random.get_state()`` from just before it: replay is exact. The
wrappers are removed in a ``finally``; nothing else is patched.

Threads. Captures in several threads at once share the np.random wrappers
(installed by the first, removed by the last, counted under a lock) and each
records its own thread only: a draw in another thread runs plainly, under a
lock that keeps it from landing between a recorded draw and the state kept
for it (one that slips past the lock is detected: CaptureError, never a trace
that replays other numbers); a Tracked array used in another thread computes
as plain NumPy.

Saved values are the values that ran: before an op writes into an array, every
recorded value living in the same memory (the same base owner) is copied.

intervene=: each op is handed to the builder's editor as it is recorded, with
recording paused (the helpers' own NumPy calls are not the function's ops), and
the function gets the value that comes back (``Recorder.edited``). Without
``intervene=`` the builder has no editor and this costs one test per op.

Python values: every conversion of a Tracked array into a Python value
(``bool(x)``, ``x.item()``, ``len(x)``...) is reported to the builder, so that
replay on new inputs can check the graph still holds (``conversions.py``).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.ir import tree
from torchlens_core.ir.errors import CaptureError, UnsupportedError
from torchlens_core.ir.records import CodeLocation, OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.inputs import CONVERSIONS
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
# Legacy np.random functions that are not draws.
_NOT_DRAWS = frozenset({"RandomState", "get_state", "set_state", "seed", "get_bit_generator",
                        "set_bit_generator"})


class _Link(NamedTuple):
    """What a Tracked array stands for: op ``ref`` of ``recorder``, whose value is ``plain``."""

    recorder: Recorder
    ref: Ref
    # The plain value calls receive: an ndarray sharing the Tracked array's memory, or the
    # NumPy scalar (np.float64...) that NumPy gave and that is tracked as a 0-d array.
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
        return _dispatch("getitem", operator.getitem, (self, key), {}, [])

    def __setitem__(self, key: Any, value: Any) -> None:
        _dispatch("setitem", operator.setitem, (self, key, value), {}, [self])

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


# -- turning arguments into plain arrays and into templates ---------------------------------
def plain_leaf(v: Any) -> Any:
    """The plain value a Tracked array stands for (anything else as it is)."""
    if isinstance(v, Tracked):
        link = v._tl
        return link.plain if link is not None else np.ndarray.view(v, np.ndarray)
    return v


def _plain(x: Any) -> Any:
    return tree.map_leaves(plain_leaf, x)


def _recorder_in(x: Any) -> Recorder | None:
    """The live recorder of the first Tracked array inside ``x``, if this thread is the one it records.

    A Tracked array handed to another thread (a worker the traced function
    starts) computes there as plain NumPy: a capture records only its own thread.
    """
    for _, leaf in tree.leaves(x, lambda v: isinstance(v, Tracked)):
        link = leaf._tl
        if link is not None and link.recorder.active:
            return link.recorder if link.recorder.thread == threading.get_ident() else None
    return None


def _dispatch(name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: list[Any]) -> Any:
    recorder = _recorder_in((args, kwargs))
    if recorder is None:  # an array that outlived its capture: plain NumPy
        return fn(*_plain(args), **_plain(kwargs))
    return recorder.call(name, fn, args, kwargs, targets)


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


_NUMPY_DIR = os.path.dirname(np.__file__)
_OWN_FILES = frozenset({__file__, sys.modules[Conversions.__module__].__file__})  # never the user's code


def _code_context() -> tuple[CodeLocation, ...]:
    """The first caller outside NumPy and this module (file, line and function)."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename in _OWN_FILES or filename.startswith(_NUMPY_DIR) or filename.startswith("<frozen")):
            return (CodeLocation(filename, frame.f_lineno, frame.f_code.co_name),)
        frame = frame.f_back
    return ()


class Recorder:
    """Records the NumPy calls of one function call into a TraceBuilder."""

    def __init__(self, builder: TraceBuilder) -> None:
        self.builder = builder
        self.active = True
        self.thread = threading.get_ident()
        # id(memory owner) -> (op index, path) of recorded values living there, for copy-before-write
        self.by_owner: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
        # id(constant array) -> (that array, its copy): a closure weight read by every step of
        # a loop is copied once, unless it changed in between.
        self.constants: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # intervene=: id(memory owner) -> (op index, path) of op.pre_edit values living there
        self.pre_edits: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
        # (op index, path, conversion) reported to the builder: a value converts alike every time
        self.reported: set[tuple[int, tuple[Any, ...], str]] = set()

    # -- the hot path ----------------------------------------------------------------------
    def call(self, name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: list[Any],
             random: bool = False) -> Any:
        parents: list[int] = []
        a = self.template(args, parents)
        k = self.template(kwargs, parents) if kwargs else {}
        plain_targets = [plain_leaf(t) for t in targets]
        for t in plain_targets:
            self.protect(t)
        meta = None
        plain_args, plain_kwargs = _plain(args), _plain(kwargs)
        if random:
            meta, result, elapsed = _recorded_draw(fn, plain_args, plain_kwargs)
        else:
            start = time.perf_counter()
            result = fn(*plain_args, **plain_kwargs)
            elapsed = time.perf_counter() - start
        value = plain_targets[0] if result is None and targets else result
        if not _has_arrays(value):  # np.shape, np.allclose...: a Python value, or None
            if parents and result is not None:
                return self.python_value(name, fn, args, a, k, parents, result, elapsed)
            return result
        shape, dtype = _info(value)
        editing = self.builder.editor is not None  # intervene=; otherwise this one test is all it costs
        add_op = self.add_op_editing if editing else self.builder.add_op
        op = add_op(name, fn, a, k, tuple(dict.fromkeys(parents)), value, shape=shape, dtype=dtype, device="cpu",
                    random=random, in_place=bool(targets), code_context=_code_context(), meta=meta, elapsed=elapsed)
        if editing:
            value = self.edited(op, value)
        wrapped = self.wrap(value, op.index)
        if not targets:
            return wrapped
        # An in-place call hands back the very arrays it wrote into; they now stand for this op.
        originals = {id(p): t for p, t in zip(plain_targets, targets, strict=True) if isinstance(t, Tracked)}
        for path, v in _paths(value):
            t = originals.get(id(v))
            if t is not None:
                t._tl = _Link(self, Ref(op.index, path), v, False)
        if result is None:
            return None
        if _is_value(result):
            return originals.get(id(result), wrapped)
        return tree.rebuild(result, [originals.get(id(v), w) for v, w in zip(result, wrapped, strict=True)])

    def template(self, x: Any, parents: list[int]) -> Any:
        """``x`` with recorded arrays replaced by Refs and other arrays by copies."""
        def leaf(v: Any) -> Any:
            if isinstance(v, Tracked):
                link = v._tl
                if link is not None and link.recorder is self:
                    parents.append(link.ref.index)
                    return link.ref
                return self.constant(plain_leaf(v))
            if isinstance(v, np.ndarray):
                return self.constant(v)
            if isinstance(v, slice) and any(isinstance(b, np.ndarray) for b in (v.start, v.stop, v.step)):
                return slice(*(operator.index(b) if b is not None else None for b in (v.start, v.stop, v.step)))
            return v

        return tree.map_leaves(leaf, x)

    def constant(self, a: np.ndarray) -> np.ndarray:
        if id(_owner(a)) in self.by_owner:
            self.leaked(a)
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

    # -- intervene= -------------------------------------------------------------------------
    def add_op_editing(self, *args: Any, **kwargs: Any) -> OpRecord:
        """``builder.add_op`` with recording paused: the editor runs the helpers in it, on NumPy arrays.

        A helper's own NumPy calls (on a Tracked array it closes over, or a
        draw from np.random) are not the function's ops: while ``active`` is
        False they run as plain NumPy, as calls in another thread do.
        """
        self.active = False
        try:
            return self.builder.add_op(*args, **kwargs)
        finally:
            self.active = True

    def edited(self, op: OpRecord, value: Any) -> Any:
        """What the function gets of ``op``, just recorded with ``value``: ``value``, or its edit.

        An edit of an op that wrote in place is already written into
        ``value`` (``op.pre_edit`` is a copy). Any other edit is a new value
        and ``op.pre_edit`` is ``value`` itself, which may live in memory the
        function still writes (``x[0]`` is a view of ``x``): it is registered
        so that such a write copies it first, as recorded outputs are.
        """
        seen = self.builder.seen_value(op, value)
        if op.edits and op.pre_edit is value:
            for path, v in _paths(value):
                if isinstance(v, np.ndarray):
                    self.pre_edits.setdefault(id(_owner(v)), []).append((op.index, path))
        return seen

    # -- Python values (conversions.py) ------------------------------------------------------
    def reading(self, tracked: Tracked, values: bool = True) -> Tracked | None:
        """The array to convert and report for ``tracked`` (None: not recording this thread: convert unreported).

        ``tracked`` itself, unless its memory was written (through another
        view) since its op ran: replay checks a value as its op computed it,
        so the value read now is recorded first, as a copy, and reported.
        ``values=False``: only the shape is read, which no write changes.
        """
        link = tracked._tl
        if not self.active or self.thread != threading.get_ident() or link is None:
            return None
        if values and not link.scalar:  # a NumPy scalar is immutable
            ref = link.ref
            if (ref.index, ref.path) not in self.by_owner.get(id(_owner(link.plain)), ()):
                return self.call("copy", _method_call("copy"), (tracked,), {}, [])
        return tracked

    def converted(self, tracked: Tracked, how: str, result: Any) -> None:
        """The function got ``result`` from ``tracked`` (as :meth:`reading` gave it) by the conversion ``how``."""
        ref = tracked._tl.ref  # type: ignore[union-attr]
        self.report(ref.index, ref.path, how, result)

    def report(self, index: int, path: tuple[Any, ...], how: str, result: Any) -> None:
        """Report a conversion of op ``index``'s value at ``path`` to the builder, once: it converts alike each time."""
        key = (index, path, how)
        if key not in self.reported:
            self.reported.add(key)
            self.builder.to_python(index, path, how, result)

    def python_value(self, name: str, fn: Any, args: tuple[Any, ...], a: Any, k: Any, parents: list[int],
                     result: Any, elapsed: float) -> Any:
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
        call = PythonValue(fn)
        value = np.asarray(result)
        editing = self.builder.editor is not None
        add_op = self.add_op_editing if editing else self.builder.add_op
        op = add_op(name, call, a, k, tuple(dict.fromkeys(parents)), value, shape=value.shape,
                    dtype=value.dtype.name, device="cpu", code_context=_code_context(), elapsed=elapsed)
        seen = self.edited(op, value) if editing else value
        got = CONVERSIONS[how](np.asarray(seen))
        if seen is not value:  # an edit: the function gets the edited answer, of the type it had
            result = type(result)(got) if isinstance(result, tuple) else got
        self.report(op.index, (), how, got)
        return result

    def leaked(self, a: np.ndarray) -> None:
        """``a``, about to enter the graph as a constant, lives in recorded memory: report what it was read from.

        NumPy calls that do not dispatch (``np.asarray(x)``) hand the function
        a plain view of a recorded value; the graph keeps its contents as they
        were. Reported as ``tolist`` of every recorded value living in that
        memory now, so new inputs (or edits) that change them are refused.
        """
        ops = self.builder.ops
        for index, path in self.by_owner.get(id(_owner(a)), ()):
            if (index, path, "tolist") not in self.reported:
                out = ops[index].out
                # dropped by save=: nothing to compare with, and the core refuses a conversion it cannot check
                self.report(index, path, "tolist", a if out is None else tree.get(out, path).tolist())

    # -- values -----------------------------------------------------------------------------
    def wrap(self, value: Any, index: int) -> Any:
        """Register a recorded value for copy-before-write and give it back as Tracked array(s)."""
        if _is_value(value):
            return self._wrap_leaf(value, index, ())
        return tree.rebuild(value, [self._wrap_leaf(v, index, (i,)) if _is_value(v) else v
                                    for i, v in enumerate(value)])

    def _wrap_leaf(self, v: Any, index: int, path: tuple[Any, ...]) -> Tracked:
        scalar = isinstance(v, np.generic)
        if not scalar:  # a NumPy scalar is immutable: nothing can write into it
            self.by_owner.setdefault(id(_owner(v)), []).append((index, path))
        t = np.ndarray.view(np.asarray(v), Tracked)
        t._tl = _Link(self, Ref(index, path), v, scalar)
        return t

    def protect(self, target: Any) -> None:
        """Copy every recorded value sharing ``target``'s memory, before it is written."""
        if not isinstance(target, np.ndarray):
            return
        owner = id(_owner(target))
        entries = self.by_owner.pop(owner, None)
        ops = self.builder.ops
        for index, path in entries or ():
            op = ops[index]
            if op.out is not None:  # None: dropped by save=, nothing to keep
                op.out = _copied_at(op.out, path)
        if self.pre_edits:  # values from before an edit (intervene=), kept in the same memory
            for index, path in self.pre_edits.pop(owner, ()):
                op = ops[index]
                if op.pre_edit is not None:
                    op.pre_edit = _copied_at(op.pre_edit, path)

    # -- random draws -----------------------------------------------------------------------
    def draw(self, name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        targets = [args[0]] if name in _INPLACE_FUNCS and args else []
        return self.call(name, fn, args, kwargs, targets, random=True)


def _copied_at(value: Any, path: tuple[Any, ...]) -> Any:
    """``value`` (one array, or a tuple/list of them) with its array at ``path`` replaced by a copy."""
    if not path:
        return np.array(value, copy=True)
    return tree.rebuild(value, [np.array(v, copy=True) if i == path[0] else v for i, v in enumerate(value)])


def _paths(value: Any) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if _is_value(value):
        yield (), value
    else:
        for i, v in enumerate(value):
            yield (i,), v


# -- np.random, wrapped while any capture runs ----------------------------------------------------
_random_lock = threading.Lock()
_random_users = 0
_random_saved: dict[str, Any] = {}
_current = threading.local()  # .recorder: the capture running on this thread
# Held across a recorded draw and around other threads' draws while the wrappers are in: the state a
# draw records is then the one it drew from, whatever other threads draw meanwhile.
_draw_lock = threading.Lock()


def _recorded_draw(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any, float]:
    """Draw, keeping the global RNG state the draw started from; (meta, result, seconds).

    Other threads' draws wait on ``_draw_lock`` meanwhile, except one that
    looked np.random's function up before the wrappers went in. So the draw is
    checked: the same draw, by a private RandomState set to the kept state (on
    copies of the arguments), must end in the state the real one ended in, or
    another thread's draw came in between.
    """
    with _draw_lock:
        before = np.random.get_state()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        elapsed = time.perf_counter() - start
        after = np.random.get_state()
    check = np.random.RandomState()
    check.set_state(before)
    getattr(check, fn.__name__)(*tree.map_leaves(_copy_array, args), **tree.map_leaves(_copy_array, kwargs))
    again = check.get_state()
    if again[2:] != after[2:] or not np.array_equal(again[1], after[1]):  # position, cached gaussian, keys
        raise CaptureError(
            "another thread drew from NumPy's global random state while this capture recorded a draw from it, so "
            "the state the draw started from is unknown and replay could not be exact. Trace while no other "
            "thread draws from np.random's global functions, or give each thread an np.random.Generator")
    return {"rng_state": before}, result, elapsed


def _copy_array(v: Any) -> Any:
    return np.array(v, copy=True) if isinstance(v, np.ndarray) else v


def _draw_wrapper(name: str, original: Any) -> Any:
    @functools.wraps(original)
    def draw(*args: Any, **kwargs: Any) -> Any:
        recorder = getattr(_current, "recorder", None)
        if recorder is None or not recorder.active:
            with _draw_lock:
                return original(*args, **kwargs)
        return recorder.draw(name, original, args, kwargs)

    return draw


@contextlib.contextmanager
def _recording_random(recorder: Recorder) -> Iterator[None]:
    """Wrap np.random's global-RNG functions while this capture runs (counted: captures may overlap)."""
    global _random_users
    with _random_lock:
        if _random_users == 0:
            for name in getattr(np.random.mtrand, "__all__", ()):
                original = getattr(np.random, name, None)
                if name in _NOT_DRAWS or original is None or original is not getattr(np.random.mtrand, name):
                    continue  # not a draw, or not the global RandomState's own method
                _random_saved[name] = original
                setattr(np.random, name, _draw_wrapper(name, original))
        _random_users += 1
    previous = getattr(_current, "recorder", None)
    _current.recorder = recorder
    try:
        yield
    finally:
        _current.recorder = previous
        with _random_lock:
            _random_users -= 1
            if _random_users == 0:
                for name, original in _random_saved.items():
                    setattr(np.random, name, original)
                _random_saved.clear()


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
            if id(v) not in inputs:
                op = builder.add_input(v, shape=(), dtype=v.dtype.name, device="cpu")
                inputs[id(v)] = recorder._wrap_leaf(v, op.index, ())
            return inputs[id(v)]
        if not isinstance(v, np.ndarray):
            return v
        if isinstance(v, (np.matrix, np.ma.MaskedArray)):
            raise UnsupportedError(f"torchlens-numpy traces plain ndarrays; {type(v).__name__} inputs change "
                                   "what operators mean: pass np.asarray(x) or the masked array's .data")
        plain = plain_leaf(v)
        if id(plain) not in inputs:  # the same array passed twice is one input
            op = builder.add_input(plain, shape=tuple(plain.shape), dtype=plain.dtype.name, device="cpu")
            inputs[id(plain)] = recorder._wrap_leaf(plain, op.index, ())
        return inputs[id(plain)]

    tracked_args, tracked_kwargs = tree.map_leaves(track, (args, kwargs))
    try:
        with _recording_random(recorder):
            output = fn(*tracked_args, **tracked_kwargs)
    finally:
        recorder.active = False  # arrays that escape now behave as plain NumPy
    returned: list[Any] = []  # what the caller gets, leaf by leaf (an edited constant, with intervene=)

    def output_ref(v: Any) -> Any:
        ref, value = _output_ref(recorder, v)
        returned.append(value)
        return ref

    template = tree.map_leaves(output_ref, output)
    leaves = iter(returned)
    builder.add_outputs(template, tree.map_leaves(lambda _: next(leaves), output))
    return builder.finish()


def constant(value: Any) -> Any:
    """The call of a "constant" op: a returned array that no recorded op computed."""
    return value.copy()


def _output_ref(recorder: Recorder, v: Any) -> tuple[Any, Any]:
    """One leaf of what the function returned: (its template leaf, the value the caller gets)."""
    link = v._tl if isinstance(v, Tracked) else None
    if link is not None and link.recorder is recorder:
        return link.ref, link.plain
    if not _is_value(v):
        return v, v
    # Returned but not computed from the inputs: a constant source op, so the trace's
    # outputs are all nodes of the graph and audit can compare them with what was returned.
    value = plain_leaf(v)
    stored = np.array(value, copy=True) if isinstance(value, np.ndarray) else value
    shape, dtype = _info(stored)
    builder = recorder.builder
    op = builder.add_op("constant", constant, (stored,), {}, (), value, shape=shape, dtype=dtype, device="cpu")
    # intervene= may pick it too: the caller is the one "later op" to see the edit
    return Ref(op.index), builder.seen_value(op, value)
