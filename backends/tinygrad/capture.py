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
import weakref
from threading import get_ident
from time import perf_counter
from typing import Any

import numpy as np
from tinygrad import Tensor
from tinygrad.helpers import TRAINING

from torchlens_core.capture.branches import BranchTracker
from torchlens_core.capture.builder import TraceBuilder, returned
from torchlens_core.capture.edits import PassThroughs
from torchlens_core.capture.policy import HaltCapture
from torchlens_core.capture.sites import CallSites
from torchlens_core.capture.threads import OneCaptureAtATime
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, UnsupportedError
from torchlens_core.ir.records import OpRecord, ParamRecord, ParamRef, Ref
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
_NEVER = frozenset({
    "__init__", "__new__", "__del__", "__repr__", "__str__", "__hash__", "__bool__", "__len__",
    "__format__", "__sizeof__", "__reduce__", "__reduce_ex__", "__getattribute__", "__getattr__",
    "__setattr__", "__delattr__", "__dir__", "__init_subclass__", "__subclasshook__", "__class_getitem__",
    "sequential",
})
# Wrapped (so that what they call inside is not recorded) but never ops: they
# return plain data, change no value, or belong to autograd and scheduling.
_OPAQUE = frozenset({
    "realize", "is_param_", "callify", "schedule_linear", "linear_with_vars", "backward", "gradient",
    "manual_seed", "_next_counter", "numpy", "tolist", "item", "data", "_data", "_buffer", "as_param",
})
# Opaque methods that turn a tensor's value into Python data, which an ``if`` or ``while`` may
# test and the recorded graph then holds as fixed: they tell the branch tracker, and are reported
# to replay (``TraceBuilder.to_python``) as the conversion of ``torchlens_core.replay.inputs.CONVERSIONS``
# that checks them: name -> (kind, whether the method's own result is what that kind gives; if not,
# capture converts the tensor that way too). NumPy arrays, memoryviews and the Buffer hold every value:
# checked as ``tolist``. (``Tensor.__bool__`` raises, tinygrad has no ``__int__``, ``__float__`` or
# ``__index__``, and ``len()`` reads a shape, which never depends on values in tinygrad and which
# replay checks for every op.)
_DECIDING: dict[str, tuple[str, bool]] = {
    "item": ("item", True), "tolist": ("tolist", True), "numpy": ("tolist", False), "data": ("tolist", False),
    "_data": ("tolist", False), "_buffer": ("tolist", False),
}
# A converted tensor with more elements than this is not turned into a list to report it: the
# builder keeps no larger one (TraceBuilder.to_python), so replay on new inputs refuses it anyway.
_LARGEST_LIST = 4096
_INPLACE_DUNDERS = frozenset({"iadd", "isub", "imul", "itruediv", "ifloordiv", "ipow", "iand", "ior", "ixor",
                              "ilshift", "irshift", "imatmul"})
_INPLACE = frozenset({"assign", "__setitem__", "replace", "to_", "shard_"})
_RENAMED = {"truediv": "div", "rtruediv": "rdiv", "radd": "add", "rmul": "mul",
            "rand": "and", "ror": "or", "rxor": "xor", "invert": "bitwise_not"}
_RANDOM = frozenset({
    "rand", "randn", "randint", "normal", "uniform", "scaled_uniform", "glorot_uniform", "kaiming_uniform",
    "kaiming_normal", "randperm", "multinomial", "dropout", "rand_like", "randn_like",
    "scaled_dot_product_attention",  # random when dropout_p > 0
})

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
    return [(name, raw) for name, raw in found.items()
            if not isinstance(raw, (staticmethod, classmethod)) or isinstance(raw.__func__, types.FunctionType)]


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


class Recorder:
    """Records the outermost Tensor calls of one forward into a TraceBuilder."""

    def __init__(self, builder: TraceBuilder, param_names: dict[int, str]) -> None:
        self.builder = builder
        self.param_names = param_names
        self.depth = 0  # > 0 while a recorded call (or capture's own work) runs
        self.thread = get_ident()
        # id(tensor) -> (weakref, op index, path in that op's output)
        self.producers: dict[int, tuple[weakref.ref[Tensor], int, tuple[Any, ...]]] = {}
        self.pass_throughs = PassThroughs(self.producers, builder.ops)
        self.failure: TorchLensError | None = None  # the first error a recorded call raised
        # id(BUFFER node) -> recorded (op index, path) reading it, for copy-before-write. Entries
        # name ops, not tensors: a value save= drops is then really freed.
        self.storages: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
        self.snapshots: set[tuple[int, tuple[Any, ...]]] = set()  # values replaced by copies already
        self.own_buffers: set[int] = set()  # ids of BUFFER nodes capture realized (lazy in a plain run)
        self.params_before_write: dict[str, Tensor] = {}
        self.saved: dict[str, Any] = {}  # Tensor attributes replaced by wrappers (None: was inherited)
        self.cells: list[tuple[Any, Any]] = []  # tinygrad metadata wrappers' cells, with what they held
        self.branches = BranchTracker(_SITES.internal)
        # id(BUFFER node) -> ops whose value before an edit (op.pre_edit) reads it, copied before a write too
        self.pre_edits: dict[int, list[int]] = {}
        # id(BUFFER node) -> index of the op that last wrote into it (not recorded yet then), for conversions
        self.written_at: dict[int, int] = {}
        self.reported: set[tuple[Any, ...]] = set()  # conversions reported: (op index, path, how)
        # Recorded outputs not computed yet (see flush), and produce() entries whose buffer they wait for.
        self.unrealized: list[Tensor] = []
        self.unlinked: list[tuple[Tensor, int, tuple[Any, ...]]] = []
        # Edits at op sites read each op's value as it is recorded: then every op is realized as it returns.
        # Module sites alone keep the batches: the values are realized just before a module's edit (_edit_output).
        self.batched = builder.editor is None or not builder.editor.op_selectors

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
            target = args[0] if spec.in_place and args and isinstance(args[0], Tensor) else None
            meta: dict[str, Any] = {}
            if target is not None and self._protect(target):
                meta["isolate"] = True
            # The call's template is taken before it runs: a constant it writes into is kept as it was.
            parents: list[int] = []
            params: list[str] = []
            a = self._template(args, parents, params)
            k = self._template(kwargs, parents, params) if kwargs else {}
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
            return result if seen is None else seen
        except TorchLensError as exc:  # _capture raises it, also if the model caught it
            self.failure = self.failure or exc
            raise
        finally:
            self.depth -= 1

    def decide(self, decides: tuple[str, bool], func: Any, t: Tensor, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
        """``t`` turned into Python data (``t.item()``, ``t.numpy()``...): maybe the test of a branch.

        The recorded graph holds the result as fixed, so it is reported to the
        builder as the conversion ``decides`` names (see ``_DECIDING``), which
        replay on new inputs repeats on the replayed value and compares.
        """
        if self.unrealized:
            self.flush()
        found = self.producers.get(id(t))
        if found is not None and found[0]() is t and self._written_since(t, found[1]):
            t = t.clone()  # written since its op ran: a recorded copy, read as it is now (and edited, if so)
            found = self.producers.get(id(t))
        if found is None or found[0]() is not t:
            self.depth += 1
            try:
                return func(t, *args, **kwargs)
            finally:
                self.depth -= 1
        self.branches.condition(found[1])
        self.depth += 1  # what the conversion calls inside (data(), cast) is part of it, not an op
        try:
            result = func(t, *args, **kwargs)
            key = (found[1], found[2], decides[0])
            if key not in self.reported:  # a value converts alike each time: once is enough
                self.reported.add(key)
                self._converted(found[1], found[2], decides, t, result)
            return result
        finally:
            self.depth -= 1

    def _written_since(self, t: Tensor, index: int) -> bool:
        """Was ``t``'s buffer written after op ``index`` made it?

        Only a buffer realized before the capture (an input's) can be: other
        views of one capture realized get copies before a write (``_protect``),
        and a write into ``t`` itself makes it the writing op's value.
        """
        if not self.written_at:
            return False
        key = buffer_key(t)
        written = self.written_at.get(id(key)) if key is not None else None
        return written is not None and written > index

    def _converted(self, index: int, path: tuple[Any, ...], decides: tuple[str, bool], t: Tensor,
                   result: Any) -> None:
        """Report that op ``index``'s value ``t`` (at ``path``) became ``result``, for replay to check.

        Where the method's result is not what the conversion kind gives (a
        NumPy array, a memoryview, a Buffer), ``t`` is converted that way
        here (the wrappers pass through: depth is up). A tensor too large to
        keep as a list is reported with the raw result, which the builder does
        not keep: replay on new inputs then refuses.
        """
        how, exact = decides
        if not exact:
            result = t.tolist() if math.prod(shape_of(t)) <= _LARGEST_LIST else result
        self.builder.to_python(index, path, how, result)

    def _record(self, spec: OpSpec, func: Any, a: tuple[Any, ...], k: dict[str, Any], parents: list[int],
                params: list[str], out: Any, tensors: list[Tensor], target: Tensor | None, meta: dict[str, Any],
                random: bool, start: float) -> Any:
        """Record one call that returned ``out``; returns what intervene= made of it for the forward, or None."""
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
        if isinstance(out, Tensor):
            shape: Any = shape_of(out)
            dtype, device = dtype_name(out.dtype), device_name(out)
        else:
            shape = tuple(shape_of(t) if isinstance(t, Tensor) else None for t in out)
            dtype, device = dtype_name(tensors[0].dtype), device_name(tensors[0])
        op = self.builder.add_op(
            spec.func_name, func, a, k, tuple(dict.fromkeys(parents)), out, shape=shape, dtype=dtype,
            device=device, params=tuple(dict.fromkeys(params)), random=random, in_place=target is not None,
            code_context=_SITES.stack(), meta=meta or None, elapsed=elapsed, conditions=self.branches.current())
        seen = None
        if self.builder.editor is not None:  # intervene=: later ops see (and link to) the edited value
            edited = self.builder.seen_value(op, out)  # an in-place op's edit is assigned into `out` itself
            if edited is not out:
                seen = out = edited
                self._realize_edit(op, out)
        if isinstance(out, Tensor):
            self.produced(out, op.index, ())
        else:
            for i, t in enumerate(out):
                if isinstance(t, Tensor):
                    self.produced(t, op.index, (i,))
        return seen

    def produced(self, t: Tensor, index: int, path: tuple[Any, ...]) -> None:
        self.producers[id(t)] = (weakref.ref(t), index, path)
        if not getattr(self.builder.ops[index], "saved", True):  # dropped by save=: keep no reference
            return
        key = buffer_key(t)
        if key is not None:
            self.storages.setdefault(id(key), []).append((index, path))
        elif self.unrealized and not is_weak(t):  # not computed yet: its buffer is known after flush
            self.unlinked.append((t, index, path))

    def flush(self) -> None:
        """Realize every recorded output not computed yet, in one schedule, and note the buffers they got.

        Each is a realization target, so tinygrad cuts its kernels at each
        of them as realizing them one by one does; only the fixed cost per
        schedule is paid once. Called before anything that needs a value or
        writes one, at a halt and at the end of the forward.
        """
        todo, self.unrealized = self.unrealized, []
        self.depth += 1  # Tensor.realize is wrapped while capture runs: this is capture's own call
        try:
            realize(todo)
        finally:
            self.depth -= 1
        self._own(todo)
        waiting, self.unlinked = self.unlinked, []
        for t, index, path in waiting:
            key = buffer_key(t)
            if key is not None and self.builder.ops[index].out is not None:  # not dropped by save= since
                self.storages.setdefault(id(key), []).append((index, path))

    def _own(self, computed: list[Tensor]) -> None:
        """Note the buffers of ``computed``, realized by capture: values that are lazy in a plain run."""
        for t in computed:
            key = buffer_key(t)
            if key is not None:
                self.own_buffers.add(id(key))

    def _template(self, x: Any, parents: list[int], params: list[str]) -> Any:
        if isinstance(x, Tensor):
            # A parameter written in place during the forward is, from then on,
            # the output of the op that wrote it: look producers up first.
            found = self.producers.get(id(x))
            if found is not None and found[0]() is x:
                parents.append(found[1])
                return Ref(found[1], found[2])
            name = self.param_names.get(id(x))
            if name is not None:
                params.append(name)
                return ParamRef(name)
            if self.pass_throughs.unedited:
                self.pass_throughs.check_read(x)
            return snapshot(x)  # a tensor from outside the trace: a constant, as it is now
        t = type(x)
        if t is tuple or t is list:
            return t([self._template(v, parents, params) for v in x]) if x else x
        if t is dict:
            return {key: self._template(v, parents, params) for key, v in x.items()}
        return x

    def _protect(self, target: Tensor) -> bool:
        """Before ``target`` is written: keep every value the write must not change; True if views were isolated.

        Readers first: a lazy tensor reading the written buffer (a plain
        call's unrealized output) is computed now, as its plain run would have.
        A parameter or buffer written for the first time keeps its value from
        before the forward in its ParamRecord, which is what replay starts from.

        Then views. In a plain run an intermediate is lazy: a write into it
        changes that Tensor object only, and a view taken before keeps the old
        value. Capture realized it, so its views share its buffer and would
        follow the write: each other live tensor reading a buffer capture
        realized gets a copy of its own first (a buffer that was realized
        before capture, an input's or a parameter's, is shared as tinygrad
        shares it). Last, recorded values the write would still reach are
        replaced by copies.
        """
        settle_readers(target)
        key = buffer_key(target)
        if key is not None:  # what a conversion reads there from now on is not what ops recorded before this one
            self.written_at[id(key)] = len(self.builder.ops)
        if self.pre_edits:
            self._protect_pre_edits(target)
        name = self.param_names.get(id(target))
        if name is not None and name not in self.params_before_write:
            self.params_before_write[name] = self.builder.params[name].value = snapshot(target)
        isolated = key is not None and id(key) in self.own_buffers
        if isolated:
            for copy in isolate_views(target):
                self.own_buffers.add(id(buffer_key(copy)))
        entries = self.storages.pop(id(key), []) if key is not None else []
        found = self.producers.get(id(target))
        if found is not None and found[0]() is target:
            entries.append((found[1], found[2]))
        ops = self.builder.ops
        copies: dict[int, Tensor] = {}
        for index, path in entries:
            op = ops[index]
            if op.out is None or (index, path) in self.snapshots:  # dropped by save=, or copied already
                continue
            t = tree.get(op.out, path)
            if t is not target and buffer_key(t) is not key:  # a view given a copy of its own just now
                continue
            copy = copies.get(id(t))
            if copy is None:
                copy = copies[id(t)] = snapshot(t)
            op.out = copy if not path else tree.rebuild(op.out, [
                copy if i == path[0] else v for i, v in enumerate(op.out)])
            self.snapshots.add((index, path))
        return isolated

    # -- interventions ---------------------------------------------------------------------
    def _realize_edit(self, op: OpRecord, value: Any) -> None:
        """Compute the edited ``value`` now, as every recorded value is, and keep ``op.pre_edit`` safe.

        Its buffers are capture's own (a plain run with the same edit made
        by hand would leave the value lazy), and the value before the edit,
        which the model never sees, may still read a buffer the model writes
        into later (the edited op was a view): noted for :meth:`_protect`.
        """
        tensors = [t for _, t in tree.leaves(value, lambda v: isinstance(v, Tensor))]
        fresh = [t for t in tensors if buffer_key(t) is None]
        realize(tensors)
        self.own_buffers.update(id(key) for key in map(buffer_key, fresh) if key is not None)
        if op.pre_edit is None:
            return
        for _, t in tree.leaves(op.pre_edit, lambda v: isinstance(v, Tensor)):
            key = buffer_key(t)
            if key is not None:
                self.pre_edits.setdefault(id(key), []).append(op.index)

    def _protect_pre_edits(self, target: Tensor) -> None:
        key = buffer_key(target)
        if key is None:
            return
        for index in self.pre_edits.pop(id(key), ()):
            op = self.builder.ops[index]
            if op.pre_edit is not None:
                op.pre_edit = tree.map_leaves(
                    lambda v: snapshot(v) if isinstance(v, Tensor) and buffer_key(v) is key else v, op.pre_edit)

    def _edit_output(self, path: str, template: Any, output: Any) -> tuple[Any, Any]:
        """What layer call ``path`` returns to the model after intervene=, and its template."""
        builder = self.builder
        if self.unrealized and builder.editor.wants_module(*builder.module_stack[-1]):  # type: ignore[union-attr]
            self.flush()  # the helpers edit the values that ran, and the values before the edit get their buffers
        self.depth += 1  # the helpers' own Tensor calls are not the model's ops
        try:
            edited, template = builder.edit_module_output(path, template, output)
            if edited is output:
                return output, template
            for leaf_path, ref in tree.leaves(template, lambda v: isinstance(v, Ref)):
                leaf, original = tree.get(edited, leaf_path), tree.get(output, leaf_path)
                if leaf is not original:  # a new tensor: later ops read it as ref's value
                    self._realize_edit(self.builder.ops[ref.index], leaf)
                    self.produced(leaf, ref.index, ref.path)
                    self.pass_throughs.replaced(original, ref.index)
        finally:
            self.depth -= 1
        return edited, template

    # -- module passes -----------------------------------------------------------------------
    def around_layer(self, path: str, layer: Any, call: Any) -> Any:
        if self.depth or self.thread != get_ident():  # called from inside an op: part of it
            return call()
        builder = self.builder
        n = builder.enter_module(path)
        # tl.splice_module: the replacement runs on the layer's arguments instead of its own __call__
        out = call() if builder.editor is None else call(builder.splice_for(path))
        try:
            template, out = self.returned(out, (path, n))
            if builder.editor is not None:  # intervene=: the layer's output may be edited
                out, template = self._edit_output(path, template, out)
        except TorchLensError as exc:  # _capture raises it, also if the model caught it
            self.failure = self.failure or exc
            raise
        builder.exit_module(path, template)
        return out

    def returned(self, output: Any, inside: tuple[str, int] | None) -> tuple[Any, Any]:
        """Refs to what module pass ``inside`` (None: the model) returned, and what the forward gets back."""
        return returned(output, lambda v: isinstance(v, Tensor), lambda v: self._as_output(v, inside))

    def _as_output(self, value: Tensor, inside: tuple[str, int] | None) -> tuple[Ref, Tensor | None]:
        """A Ref to ``value`` as returned by pass ``inside``, and what intervene= made of it (None: nothing)."""
        self.depth += 1  # intervene= helpers may run here (on an identity op): their calls are not the model's ops
        try:
            parents: list[int] = []
            ref = self._template(value, parents, [])
            if parents and (inside is None or inside in self.builder.ops[ref.index].module_passes):
                return ref, None
            # Returned, not computed, here (an input, a parameter, a constant): an
            # explicit pass-through op keeps "every returned array is an op's
            # output" and "module outputs are computed inside the module" true.
            realize([value])
            op = self.builder.identity_op(ref, value, shape=shape_of(value), dtype=dtype_name(value.dtype),
                                          device=device_name(value))
            seen = value if self.builder.editor is None else self.builder.seen_value(op, value)
            if seen is not value:  # edited: the tensor returned keeps the producer it had
                self._realize_edit(op, seen)
            else:  # one object with what the caller may hold: later reads of it read the op
                self.pass_throughs.take(value, op.index)
            self.produced(seen, op.index, ())
            return Ref(op.index), None if seen is value else seen
        finally:
            self.depth -= 1



def _sdpa_dropout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
    return bool(p) and bool(TRAINING)


_JIT_MESSAGE = (
    "tinygrad backend: a TinyJit-wrapped function replays the kernels it captured and skips its Python code "
    "(data-dependent branches included), so its ops cannot be seen one by one; trace the undecorated function "
    "instead (for a TinyJit `f`, that is `f.fxn`)")


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
            isinstance(vars(klass).get("__call__"), TinyJit) for klass in type(target).__mro__):
        raise UnsupportedError(_JIT_MESSAGE)
    if engine_realize.capturing:
        raise UnsupportedError("tinygrad backend: cannot trace inside a TinyJit capture; call tl.trace outside "
                               "the jitted function")
    for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor)):
        if not isinstance(leaf.device, str):
            raise UnsupportedError(f"tinygrad backend: multi-device (sharded) tensors are not supported, got an "
                                   f"input on {leaf.device}; trace with single-device inputs")
        if not all(isinstance(d, int) for d in leaf.shape):
            raise UnsupportedError(f"tinygrad backend: symbolic shapes are not supported, got {leaf.shape}; "
                                   f"trace with concrete inputs")


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


def capture(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any = None) -> Trace:
    """Run ``target(*args, **kwargs)`` once with every Tensor method recorded; return its Trace.

    ``options`` (save=, halt=) are applied by the TraceBuilder; a HaltCapture it
    raises stops the forward and passes through, everything put back first.
    """
    with _ONE_AT_A_TIME.claim():
        return _capture(target, args, kwargs, options)


def _capture(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Trace:
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
        builder.add_param(ParamRecord(name=pname, shape=shape_of(t), dtype=dtype_name(t.dtype), numel=t.numel(),
                                      trainable=bool(t.is_param), module=pname.rpartition(".")[0],
                                      is_buffer=not t.is_param, value=t))
        param_names[id(t)] = pname
    under: dict[str, list[str]] = {}
    for pname in builder.params:
        parts = pname.split(".")
        for depth in range(1, len(parts)):
            under.setdefault(".".join(parts[:depth]), []).append(pname)
    paths = {}
    for path, layer in layers:
        paths[id(layer)] = path
        builder.add_module(path, type(layer).__name__, under.get(path, []))

    recorder = Recorder(builder, param_names)
    inputs = [leaf for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor))]
    fresh = [t for t in [builder.params[p].value for p in builder.params] + inputs if buffer_key(t) is None]
    realize([builder.params[p].value for p in builder.params] + inputs)  # values exist before the forward
    recorder.own_buffers.update(id(key) for key in map(buffer_key, fresh) if key is not None)
    settle_readers(*[builder.params[p].value for p in builder.params], *inputs)
    for leaf in inputs:
        if id(leaf) not in recorder.producers and id(leaf) not in param_names:
            op = builder.add_input(leaf, shape=shape_of(leaf), dtype=dtype_name(leaf.dtype),
                                   device=device_name(leaf))
            recorder.produced(leaf, op.index, ())
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
    if recorder.failure is not None:  # the model caught it and went on: the trace misses that call
        raise recorder.failure
    recorder.flush()
    builder.add_outputs(*recorder.returned(output, None))
    return builder.finish()


def compat_rows(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """tl.compat.report's rows: the capture's own refusals (TinyJit, sharded or symbolic inputs)."""
    from torchlens_core.views.compat import refusal_row

    return [refusal_row("wrapper", type(target).__name__, lambda: _check_supported(target, args, kwargs),
                        "a tinygrad function or model on single-device, concrete inputs: recorded as it runs")]
