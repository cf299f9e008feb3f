"""Capturing a tinygrad forward.

tinygrad has no dispatch hook: every op is a ``Tensor`` method (``matmul``,
``conv2d``, ``relu``, ``__add__``, ``reshape``, the ``Tensor.rand`` family...),
and most methods are written in terms of other methods. For the length of one
capture every function, staticmethod and classmethod of ``Tensor`` is wrapped:
inside tinygrad's own metadata wrapper where there is one (so that references
taken before capture, ``Tensor.relu`` in a layer list, are seen too), on the
class otherwise. A depth counter makes an op of each outermost call only: a
Tensor method called from inside a recorded method belongs to that op, so
``x.linear(w.T, b)`` is one ``linear`` (not the ~100 helper calls it makes)
and ``Tensor.relu`` stays ``relu`` rather than the compare-and-where it lowers to.

Every op's output is realized, so that its value is there to keep: fusion
stops at each op, which can move results by a rounding error against the
fused plain call (docs/backend-tinygrad.md has the numbers). Outputs are
realized in batches, not one by one: tinygrad's cost is mostly Python work
per schedule, whatever the schedule's size, so capture collects recorded
outputs and realizes them together (``Recorder.flush``) whenever a value
must exist or a write must not reach a pending reader: before an in-place
write, a random op, a conversion to Python data, any other non-op Tensor
method (``realize``, ``backward``...), and at the end of the forward or at a
halt. Each output is a realization target of its own, so the kernels are
cut where the one-by-one schedules cut them, and the values are the same.
Writes, random draws, ``Tensor.empty`` and every op of a capture with
intervene= edits are realized as they return, and timed (``op.elapsed``);
an op realized in a batch carries no ``elapsed``: building its graph is not
its computation, and a batch's time is not one op's.

Saved values are the values that ran. tinygrad writes in place through
``Tensor.assign``, ``__setitem__`` and ``+=`` and friends, into a buffer that
views share; before such a write, every recorded value reading the written
buffer (or being the written Tensor object) is replaced by a copy of its own,
and other live views of a buffer capture realized get copies too, so that the
forward computes what a plain lazy run computes (see ``Recorder._protect``).

Layers (``tinygrad.nn`` or the user's: any attribute with a ``__call__``) get
module passes through temporary class-level ``__call__`` wrappers, see
:mod:`torchlens_tinygrad.modules`. Everything is put back in a ``finally``.

Threads. Every wrapper lives on a class that all threads share, so one capture
runs at a time: a second one, nested or in another thread, is refused with
UnsupportedError before it installs anything. The wrappers (TinyJit's refusal
included) pass every call of another thread straight to the original,
unrecorded. tinygrad itself is not thread-safe (its ``Context`` variables and
its kernel cache's database connection are process-wide), so work in another
thread that overlaps a capture's, plain or not, is only as safe as tinygrad.
"""

from __future__ import annotations

import inspect
import math
import types
from threading import get_ident
from time import perf_counter
from typing import Any

import numpy as np
from tinygrad import Tensor
from tinygrad.helpers import TRAINING

from torchlens_core.capture.branches import BranchTracker
from torchlens_core.capture.builder import Recording, TraceBuilder
from torchlens_core.capture.policy import HaltCapture
from torchlens_core.capture.recorder import Recorder as BaseRecorder
from torchlens_core.capture.sites import CallSites
from torchlens_core.capture.threads import OneCaptureAtATime
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, UnsupportedError
from torchlens_core.ir.records import OpRecord, ParamRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_tinygrad.arrays import (
    buffer_key,
    device_name,
    dtype_name,
    is_weak,
    isolate_views,
    realize,
    settle_readers,
    shape_of,
    snapshot,
)
from torchlens_tinygrad.modules import model_object, named_layers, named_tensors, wrapped_layers

# Never wrapped: object lifecycle, what Python calls implicitly, and methods
# that call the user's code (``sequential`` runs layers, which must stay visible).
_NEVER = frozenset(
    {
        "__init__",
        "__new__",
        "__del__",
        "__repr__",
        "__str__",
        "__hash__",
        "__bool__",
        "__len__",
        "__format__",
        "__sizeof__",
        "__reduce__",
        "__reduce_ex__",
        "__getattribute__",
        "__getattr__",
        "__setattr__",
        "__delattr__",
        "__dir__",
        "__init_subclass__",
        "__subclasshook__",
        "__class_getitem__",
        "sequential",
    }
)
# Wrapped (so that what they call inside is not recorded) but never ops: they
# return plain data, change no value, or belong to autograd and scheduling.
_OPAQUE = frozenset(
    {
        "realize",
        "is_param_",
        "callify",
        "schedule_linear",
        "linear_with_vars",
        "backward",
        "gradient",
        "manual_seed",
        "_next_counter",
        "numpy",
        "tolist",
        "item",
        "data",
        "_data",
        "_buffer",
        "as_param",
    }
)
# Opaque methods that turn a tensor's value into Python data, which an ``if`` or ``while`` may
# test and the recorded graph then holds as fixed: they tell the branch tracker, and are reported
# to replay (``TraceBuilder.to_python``) as the conversion of ``torchlens_core.replay.inputs.CONVERSIONS``
# that checks them: name -> (kind, whether the method's own result is what that kind gives; if not,
# capture converts the tensor that way too). NumPy arrays, memoryviews and the Buffer hold every value:
# checked as ``tolist``. (``Tensor.__bool__`` raises, tinygrad has no ``__int__``, ``__float__`` or
# ``__index__``, and ``len()`` reads a shape, which never depends on values in tinygrad and which
# replay checks for every op.)
_DECIDING: dict[str, tuple[str, bool]] = {
    "item": ("item", True),
    "tolist": ("tolist", True),
    "numpy": ("tolist", False),
    "data": ("tolist", False),
    "_data": ("tolist", False),
    "_buffer": ("tolist", False),
}
# A converted tensor with more elements than this is not turned into a list to report it: the
# builder keeps no larger one (TraceBuilder.to_python), so replay on new inputs refuses it anyway.
_LARGEST_LIST = 4096
_INPLACE_DUNDERS = frozenset(
    {"iadd", "isub", "imul", "itruediv", "ifloordiv", "ipow", "iand", "ior", "ixor", "ilshift", "irshift", "imatmul"}
)
_INPLACE = frozenset({"assign", "__setitem__", "replace", "to_", "shard_"})
_RENAMED = {
    "truediv": "div",
    "rtruediv": "rdiv",
    "radd": "add",
    "rmul": "mul",
    "rand": "and",
    "ror": "or",
    "rxor": "xor",
    "invert": "bitwise_not",
}
_RANDOM = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "normal",
        "uniform",
        "scaled_uniform",
        "glorot_uniform",
        "kaiming_uniform",
        "kaiming_normal",
        "randperm",
        "multinomial",
        "dropout",
        "rand_like",
        "randn_like",
        "scaled_dot_product_attention",  # random when dropout_p > 0
    }
)

# Factories whose output is whatever the memory held: replay reuses the recorded bytes.
_UNINITIALIZED = frozenset({"empty", "empty_like"})


class OpSpec:
    """What capture needs to know about one Tensor method, worked out once."""

    __slots__ = ("name", "func_name", "in_place", "random", "opaque", "uninitialized", "decides", "eager")

    def __init__(self, name: str) -> None:
        self.name = name
        self.in_place = name in _INPLACE
        if name.startswith("__") and name.endswith("__"):
            base = name[2:-2]
            if base in _INPLACE_DUNDERS:  # __iadd__ -> add_, __itruediv__ -> div_
                self.in_place = True
                self.func_name = _RENAMED.get(base[1:], base[1:]) + "_"
            else:
                self.func_name = _RENAMED.get(base, base)
        else:
            self.func_name = name.lstrip("_") or "op"
        self.random = name in _RANDOM
        self.opaque = name in _OPAQUE
        self.uninitialized = name in _UNINITIALIZED
        self.decides: tuple[str, bool] | None = _DECIDING.get(name)  # (conversion kind, exact), for conversions
        # Realized as it runs, with every value recorded before computed first (Recorder.flush): a write must
        # land in order with its readers, an uninitialized buffer must hold the bytes recorded, and a non-op
        # method may read any value. So is a random op that draws (the RNG state is read from a tensor).
        self.eager = self.in_place or self.uninitialized or self.opaque


_SPECS: dict[str, OpSpec] = {}


def _wrappable() -> list[tuple[str, Any]]:
    """``(name, raw attribute)`` of every Tensor method to wrap, read now (first in the MRO wins)."""
    found: dict[str, Any] = {}
    for klass in Tensor.__mro__:
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if name in found or name in _NEVER:
                continue
            if isinstance(raw, (types.FunctionType, staticmethod, classmethod)):
                found[name] = raw
    return [
        (name, raw)
        for name, raw in found.items()
        if not isinstance(raw, (staticmethod, classmethod)) or isinstance(raw.__func__, types.FunctionType)
    ]


def _metadata_code() -> Any:
    from tinygrad import tensor

    maker = getattr(tensor, "_metadata_wrapper", None)
    return maker(lambda: None).__code__ if maker is not None else None


_METADATA_CODE = _metadata_code()


def metadata_cell(raw: Any) -> Any:
    """The closure cell holding the method that tinygrad's metadata wrapper ``raw`` calls, or None.

    With TRACEMETA on (the default), tinygrad replaces every Tensor method by
    a ``_metadata_wrapper`` closure over the real function; every call, through
    the class or through a reference taken earlier, goes through that cell.
    """
    if not isinstance(raw, types.FunctionType) or raw.__code__ is not _METADATA_CODE or not raw.__closure__:
        return None
    cell = raw.__closure__[raw.__code__.co_freevars.index("fn")]
    return cell if isinstance(cell.cell_contents, types.FunctionType) else None


# tinygrad and this package are never the user's code site.
_SITES = CallSites(inspect.getfile(Tensor), __file__)


def rng_state() -> dict[str, Any]:
    """tinygrad's RNG state (seed, per-device seeds and counters), as copies."""
    counters = {device: np.array(t.numpy(), copy=True) for device, t in Tensor._device_rng_counters.items()}
    return {"seed": Tensor._seed, "device_seeds": dict(Tensor._device_seeds), "counters": counters}


# Tensor's methods are wrapped on the class for the length of one capture: a second capture, nested or
# in another thread, is refused before it installs anything.
_ONE_AT_A_TIME = OneCaptureAtATime("tinygrad")


class Recorder(BaseRecorder):
    """Records the outermost Tensor calls of one forward into a TraceBuilder.

    What is tinygrad's own here: the wrappers, realizing outputs in batches
    (``flush``), and keeping a lazy framework's views apart before a write
    (``protect``); the bookkeeping is :class:`torchlens_core.capture.recorder.Recorder`'s.
    """

    array_types = (Tensor,)

    def __init__(self, builder: TraceBuilder, param_names: dict[int, str]) -> None:
        super().__init__(builder, param_names)
        self.own_buffers: set[int] = set()  # ids of BUFFER nodes capture realized (lazy in a plain run)
        self.saved: dict[str, Any] = {}  # Tensor attributes replaced by wrappers (None: was inherited)
        self.cells: list[tuple[Any, Any]] = []  # tinygrad metadata wrappers' cells, with what they held
        self.branches = BranchTracker(_SITES.internal)
        # Recorded outputs not computed yet (see flush), and produced() entries whose buffer they wait for.
        self.unrealized: list[Tensor] = []
        self.unlinked: list[tuple[Tensor, Ref]] = []
        # Edits at op sites read each op's value as it is recorded: then every op is realized as it returns.
        # Module sites alone keep the batches: the values are realized just before a module's edit (settle).
        # save_to= too: a batch is realized all at once, so it would hold every value of the forward in memory
        # before the first is written out; realized as they return, each leaves as it is produced.
        self.batched = (builder.editor is None or not builder.editor.op_selectors) and builder.stream is None

    # -- tinygrad's arrays -------------------------------------------------------------------
    def describe(self, value: Tensor) -> tuple[Any, str, str]:
        return shape_of(value), dtype_name(value.dtype), device_name(value)

    def copy(self, value: Tensor) -> Tensor:
        return snapshot(value)

    def memory(self, value: Tensor) -> int | None:
        key = buffer_key(value)
        return None if key is None else id(key)

    def settle(self) -> None:
        if self.unrealized:
            self.flush()

    def adopt(self, op: OpRecord, value: Any) -> None:
        """An edited value is computed now, as every recorded value is; its buffers are capture's own (a plain
        run with the same edit made by hand would leave it lazy)."""
        tensors = [t for _, t in tree.leaves(value, lambda v: isinstance(v, Tensor))]
        fresh = [t for t in tensors if buffer_key(t) is None]
        realize(tensors)
        self._own(fresh)

    def adopt_value(self, value: Tensor) -> None:
        realize([value])

    def produced(self, value: Any, ref: Ref, alias: bool = False) -> None:
        super().produced(value, ref, alias)
        # not computed yet: its buffer is known after flush
        if self.unrealized and buffer_key(value) is None and not is_weak(value) and self.builder.ops[ref.index].saved:
            self.unlinked.append((value, ref))

    # -- installing the wrappers -----------------------------------------------------------
    def install(self) -> None:
        for name, raw in _wrappable():
            spec = _SPECS.get(name) or _SPECS.setdefault(name, OpSpec(name))
            cell = metadata_cell(raw)
            if cell is not None:
                # tinygrad's own wrapper: swap the function it calls, so that
                # references taken before capture (Tensor.relu in a layer list) are seen too
                self.cells.append((cell, cell.cell_contents))
                cell.cell_contents = self._wrap(spec, cell.cell_contents)
            else:
                self.saved[name] = vars(Tensor).get(name)
                type.__setattr__(Tensor, name, self._wrap(spec, raw))

    def uninstall(self) -> None:
        for cell, original in self.cells:
            cell.cell_contents = original
        self.cells.clear()
        for name, original in self.saved.items():
            if original is None:
                type.__delattr__(Tensor, name)
            else:
                type.__setattr__(Tensor, name, original)
        self.saved.clear()

    def _wrap(self, spec: OpSpec, raw: Any) -> Any:
        rec = self
        if isinstance(raw, classmethod):
            func = raw.__func__

            def class_wrapper(cls: Any, *args: Any, **kwargs: Any) -> Any:
                if rec.depth or rec.thread != get_ident():
                    return func(cls, *args, **kwargs)
                return rec.call(spec, types.MethodType(func, cls), args, kwargs)

            class_wrapper.__name__ = class_wrapper.__qualname__ = spec.name
            class_wrapper.__wrapped__ = func  # type: ignore[attr-defined]
            return classmethod(class_wrapper)
        func = raw.__func__ if isinstance(raw, staticmethod) else raw

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if rec.depth or rec.thread != get_ident():
                return func(*args, **kwargs)
            return rec.call(spec, func, args, kwargs)

        wrapper.__name__ = wrapper.__qualname__ = spec.name
        wrapper.__doc__ = func.__doc__
        wrapper.__wrapped__ = func  # type: ignore[attr-defined]
        return staticmethod(wrapper) if isinstance(raw, staticmethod) else wrapper

    # -- the hot path ----------------------------------------------------------------------
    def call(self, spec: OpSpec, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if spec.decides and args and isinstance(args[0], Tensor):
            return self.decide(spec.decides, func, args[0], args[1:], kwargs)
        random = spec.random and (spec.name != "scaled_dot_product_attention" or _sdpa_dropout(args, kwargs))
        if (spec.eager or random) and self.unrealized:  # it needs (or writes) values: recorded ones exist first
            self.flush()
        self.depth += 1
        try:
            if spec.opaque:
                return func(*args, **kwargs)
            target = None
            if spec.in_place:  # the written tensor is `self`, however it is passed (`Tensor.assign(self=t, x=v)`)
                written = args[0] if args else kwargs.get("self")
                target = written if isinstance(written, Tensor) else None
            meta: dict[str, Any] = {}
            if target is not None and self._isolate(target):
                meta["isolate"] = True
            # The call's template is taken before it runs: a constant it writes into is kept as it was.
            a, k, parents, params = self.call_template(args, kwargs)
            if random:
                meta.update(rng=rng_state(), training=TRAINING.value)
            start = perf_counter()
            result = out = func(*args, **kwargs)
            if isinstance(out, Tensor):
                tensors = [out]
            elif out is None and target is not None:  # __setitem__ returns None but wrote into its target
                out, tensors = target, [target]
            elif isinstance(out, (tuple, list)) and any(isinstance(t, Tensor) for t in out):
                tensors = [t for t in out if isinstance(t, Tensor)]
            else:
                return result
            seen = self._record(spec, func, a, k, parents, params, out, tensors, target, meta, random, start)
            return result if seen is out else seen
        except TorchLensError as exc:  # _capture raises it, also if the model caught it
            raise self.remember(exc) from None
        finally:
            self.depth -= 1

    def decide(
        self, decides: tuple[str, bool], func: Any, t: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``t`` turned into Python data (``t.item()``, ``t.numpy()``...): maybe the test of a branch.

        The recorded graph holds the result as fixed, so it is reported to the
        builder as the conversion ``decides`` names (see ``_DECIDING``), which
        replay on new inputs repeats on the replayed value and compares.
        """
        if self.unrealized:
            self.flush()
        ref = self.producer(t)
        if ref is not None and self.written_since(t, ref.index):
            # Written since its op ran (only a buffer realized before the capture can be: other views of one
            # capture realized get copies before a write): a recorded copy, read as it is now (and edited, if so)
            t = t.clone()
            ref = self.producer(t)
        with self.paused():  # what the conversion calls inside (data(), cast) is part of it, not an op
            result = func(t, *args, **kwargs)
            if ref is not None:
                self.branches.condition(ref.index)
                how, exact = decides
                if not exact and (ref.index, ref.path, how) not in self.reported:
                    # not what the conversion kind gives (a NumPy array, a Buffer): converted that way here; a
                    # tensor too large to keep as a list is reported raw, which replay on new inputs refuses
                    converted = t.tolist() if math.prod(shape_of(t)) <= _LARGEST_LIST else result
                    self.report(ref.index, ref.path, how, converted)
                else:
                    self.report(ref.index, ref.path, how, result)
        return result

    def _record(
        self,
        spec: OpSpec,
        func: Any,
        a: tuple[Any, ...],
        k: dict[str, Any],
        parents: tuple[int, ...],
        params: tuple[str, ...],
        out: Any,
        tensors: list[Tensor],
        target: Tensor | None,
        meta: dict[str, Any],
        random: bool,
        start: float,
    ) -> Any:
        """Record one call that returned ``out``; returns what the forward gets back."""
        fresh = [t for t in tensors if buffer_key(t) is None]  # the rest are views of a buffer: nothing to compute
        elapsed: float | None = None
        if self.batched and not spec.eager and not random:
            self.unrealized.extend(fresh)  # before add_op, which may halt: flush computes them then too
        else:
            realize(tensors)
            elapsed = perf_counter() - start  # tinygrad is lazy: the time includes realizing the output
            self._own(fresh)
        if spec.uninitialized and isinstance(out, Tensor):
            meta["uninitialized"] = snapshot(out)
        return self.record(
            spec.func_name,
            func,
            a,
            k,
            parents,
            params,
            out,
            written=() if target is None else (target,),
            random=random,
            code_context=_SITES.stack(),
            meta=meta or None,
            elapsed=elapsed,
            conditions=self.branches.current(),
        )

    def flush(self) -> None:
        """Realize every recorded output not computed yet, in one schedule, and note the buffers they got.

        Each is a realization target, so tinygrad cuts its kernels at each
        of them as realizing them one by one does; only the fixed cost per
        schedule is paid once. Called before anything that needs a value or
        writes one, at a halt and at the end of the forward.
        """
        todo, self.unrealized = self.unrealized, []
        with self.paused():  # Tensor.realize is wrapped while capture runs: this is capture's own call
            realize(todo)
        self._own(todo)
        waiting, self.unlinked = self.unlinked, []
        for t, ref in waiting:
            key = buffer_key(t)
            if key is not None and self.builder.ops[ref.index].out is not None:  # not dropped by save= since
                self.memories.setdefault(id(key), []).append((ref.index, ref.path))

    def _own(self, computed: list[Tensor]) -> None:
        """Note the buffers of ``computed``, realized by capture: values that are lazy in a plain run."""
        for t in computed:
            key = buffer_key(t)
            if key is not None:
                self.own_buffers.add(id(key))

    def _isolate(self, target: Tensor) -> bool:
        """Before ``target`` is written: keep every value the write must not change; True if views were isolated.

        Readers first: a lazy tensor reading the written buffer (a plain
        call's unrealized output) is computed now, as its plain run would have.

        Then views. In a plain run an intermediate is lazy: a write into it
        changes that Tensor object only, and a view taken before keeps the old
        value. Capture realized it, so its views share its buffer and would
        follow the write: each other live tensor reading a buffer capture
        realized gets a copy of its own first (a buffer that was realized
        before capture, an input's or a parameter's, is shared as tinygrad
        shares it). Last, recorded values the write would still reach are
        replaced by copies (:meth:`protect`): the written tensor's own value
        among them, even where it is a view with no buffer of its own.
        """
        settle_readers(target)
        key = buffer_key(target)
        isolated = key is not None and id(key) in self.own_buffers
        if isolated:
            for copy in isolate_views(target):
                self.own_buffers.add(id(buffer_key(copy)))
            # views given a copy of their own just now no longer live in the written buffer
            entries = self.memories.get(id(key), ())
            ops = self.builder.ops
            self.memories[id(key)] = [
                (i, p) for i, p in entries if ops[i].out is None or buffer_key(tree.get(ops[i].out, p)) is key
            ]
        ref = self.producer(target)
        self.protect(target)
        if ref is not None:
            self.copy_recorded([(ref.index, ref.path)])
        return isolated

    # -- module passes -----------------------------------------------------------------------
    def around_layer(self, path: str, layer: Any, call: Any) -> Any:
        if self.depth or self.thread != get_ident():  # called from inside an op: part of it
            return call()
        return self.module_pass(path, call)


def _sdpa_dropout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
    return bool(p) and bool(TRAINING)


_JIT_MESSAGE = (
    "tinygrad backend: a TinyJit-wrapped function replays the kernels it captured and skips its Python code "
    "(data-dependent branches included), so its ops cannot be seen one by one; trace the undecorated function "
    "instead (for a TinyJit `f`, that is `f.fxn`)"
)


def _jit_refusal(jit_call: Any, thread: int) -> Any:
    """``TinyJit.__call__`` refusing calls made by the capturing thread; other threads' calls run as usual."""

    def refuse_jit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if get_ident() == thread:
            raise UnsupportedError(_JIT_MESSAGE + " (one was called inside the traced model)")
        return jit_call(self, *args, **kwargs)

    refuse_jit.__wrapped__ = jit_call  # type: ignore[attr-defined]
    return refuse_jit


def _check_supported(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    from tinygrad.engine import realize as engine_realize
    from tinygrad.engine.jit import _TinyJit as TinyJit

    # the jit itself, a bound method of one, functools.partial(jit.__call__, obj) (a jitted method)
    candidates = (target, getattr(target, "__self__", None), getattr(getattr(target, "func", None), "__self__", None))
    if any(isinstance(c, TinyJit) for c in candidates) or any(
        isinstance(vars(klass).get("__call__"), TinyJit) for klass in type(target).__mro__
    ):
        raise UnsupportedError(_JIT_MESSAGE)
    if engine_realize.capturing:
        raise UnsupportedError(
            "tinygrad backend: cannot trace inside a TinyJit capture; call tl.trace outside the jitted function"
        )
    for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor)):
        if not isinstance(leaf.device, str):
            raise UnsupportedError(
                f"tinygrad backend: multi-device (sharded) tensors are not supported, got an "
                f"input on {leaf.device}; trace with single-device inputs"
            )
        if not all(isinstance(d, int) for d in leaf.shape):
            raise UnsupportedError(
                f"tinygrad backend: symbolic shapes are not supported, got {leaf.shape}; trace with concrete inputs"
            )


def _public_method(target: Any) -> Any:
    """A Tensor method passed as the target itself (``tl.trace(Tensor.relu, x)``): call it through its wrapper."""
    func = getattr(target, "__func__", target)
    owner = getattr(target, "__self__", None)
    for name, raw in _wrappable():
        if getattr(raw, "__func__", raw) is not func:
            continue
        if isinstance(owner, Tensor):
            return lambda *args, **kwargs: getattr(owner, name)(*args, **kwargs)
        return lambda *args, **kwargs: getattr(Tensor, name)(*args, **kwargs)
    return target


def capture(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any = None) -> Trace | Recording:
    """Run ``target(*args, **kwargs)`` once with every Tensor method recorded; return its Trace.

    ``options`` (save=, halt=) are applied by the TraceBuilder; a HaltCapture it
    raises stops the forward and passes through, everything put back first.
    """
    with _ONE_AT_A_TIME.claim():
        return _capture(target, args, kwargs, options)


def _capture(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Trace | Recording:
    _check_supported(target, args, kwargs)
    root = model_object(target)
    name = type(root).__name__ if root is not None else getattr(target, "__name__", "function")
    builder = TraceBuilder("tinygrad", name) if options is None else TraceBuilder("tinygrad", name, options)
    builder.notes["training"] = TRAINING.value
    param_names: dict[int, str] = {}
    layers = list(named_layers(root))
    for pname, t in named_tensors(root):  # the names get_state_dict gives
        if id(t) in param_names:
            continue
        builder.add_param(
            ParamRecord(
                name=pname,
                shape=shape_of(t),
                dtype=dtype_name(t.dtype),
                numel=t.numel(),
                trainable=bool(t.is_param),
                module=pname.rpartition(".")[0],
                is_buffer=not t.is_param,
                value=t,
            )
        )
        param_names[id(t)] = pname
    paths = {}
    for path, layer in layers:
        paths[id(layer)] = path
        builder.add_module(path, type(layer).__name__)  # its parameters: listed by the builder at the end

    recorder = Recorder(builder, param_names)
    inputs = [leaf for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor))]
    fresh = [t for t in [builder.params[p].value for p in builder.params] + inputs if buffer_key(t) is None]
    realize([builder.params[p].value for p in builder.params] + inputs)  # values exist before the forward
    recorder.own_buffers.update(id(key) for key in map(buffer_key, fresh) if key is not None)
    settle_readers(*[builder.params[p].value for p in builder.params], *inputs)
    for leaf in inputs:
        if id(leaf) not in recorder.producers and id(leaf) not in param_names:
            op = builder.add_input(leaf, shape=shape_of(leaf), dtype=dtype_name(leaf.dtype), device=device_name(leaf))
            recorder.produced(leaf, Ref(op.index))
    from tinygrad.engine.jit import _TinyJit

    jit_call = vars(_TinyJit)["__call__"]
    call = _public_method(target)
    try:
        try:
            recorder.install()
            type.__setattr__(_TinyJit, "__call__", _jit_refusal(jit_call, recorder.thread))
            with wrapped_layers(paths, [layer for _, layer in layers], recorder.around_layer):
                output = call(*args, **kwargs)
        finally:
            type.__setattr__(_TinyJit, "__call__", jit_call)
            recorder.branches.close()
            recorder.uninstall()
    except HaltCapture:
        recorder.flush()  # the values recorded up to the halt are computed before the trace is built
        raise
    recorder.raise_remembered()  # the model caught an error of a recorded call and went on
    recorder.flush()
    builder.add_outputs(*recorder.returned(output, None))
    return builder.finish()


def compat_rows(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """tl.compat.report's rows: the capture's own refusals (TinyJit, sharded or symbolic inputs)."""
    from torchlens_core.views.compat import refusal_row

    return [
        refusal_row(
            "wrapper",
            type(target).__name__,
            lambda: _check_supported(target, args, kwargs),
            "a tinygrad function or model on single-device, concrete inputs: recorded as it runs",
        )
    ]
