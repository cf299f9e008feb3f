"""Capture by wrapper arrays: the model gets wrappers of its inputs, whose every call is recorded.

For a framework whose array class can be subclassed with a hook on every
call (NumPy's ``__array_ufunc__`` and ``__array_function__``, a
``__torch_function__`` subclass, any array library with such a protocol),
each input reaches the model as a *wrapper*: an instance of that subclass
which stands for a plain array (a view of it, or an object holding it). The
wrapper hands each
call to :func:`dispatch`, which finds its capture's :class:`WrappedRecorder`;
the recorder runs the call once on plain values, records it as one op, and
hands back wrappers of the outputs, so that later calls are seen too. Arrays
that never met an input are not ops: they enter the graph as constants.

Everything but the interception itself is here, written once: which wrapper
is which op's value (``op.out`` holds the plain values, the model holds the
wrappers), calls that answer with a Python value (recorded, and reported for
replay on new inputs), arrays returned without being computed (a
``constant`` op), constants read again unchanged (copied once), plain views of
recorded memory that leak into the graph (reported), and the conversions of
:class:`~torchlens_core.capture.conversions.Conversions`. A backend writes the
wrapper class (mixing in ``Conversions``, each hook calling :func:`dispatch`)
and a ``WrappedRecorder`` subclass saying what its arrays are; the numpy
plugin (``plugins/torchlens-numpy``) is the example.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

from torchlens_core.capture.calls import MethodCall, constant
from torchlens_core.capture.conversions import CONVERSIONS, Conversions, PythonValue, python_conversion
from torchlens_core.capture.recorder import Recorder
from torchlens_core.capture.sites import CallSites
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, UnsupportedError
from torchlens_core.ir.records import Ref
from torchlens_core.ir.trace import Trace

if TYPE_CHECKING:
    from torchlens_core.capture.builder import Recording


class Link(NamedTuple):
    """The capture a wrapper belongs to, and the plain value calls receive in its place."""

    recorder: WrappedRecorder
    # A plain array sharing the wrapper's memory, or the scalar (NumPy's np.float64...) that
    # the framework gave and that is tracked as a 0-d array.
    plain: Any
    scalar: bool


def plain_leaf(v: Any) -> Any:
    """The plain value a wrapper stands for (anything else as it is)."""
    if isinstance(v, Conversions):  # (Conversions._tl_plain, inlined: this runs for every argument of every call)
        link = v._tl
        return link.plain if link is not None else v._tl_unlinked()
    return v


def plain(x: Any) -> Any:
    """``x`` with every wrapper replaced by its plain value."""
    return tree.map_leaves(plain_leaf, x)


def dispatch(name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: list[Any]) -> Any:
    """A wrapper's call: recorded by the capture of the first wrapper among the arguments that records it now
    (its thread, not its own work, not over), else run on plain values. ``targets``: the arrays it writes into."""
    for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Conversions)):
        link = leaf._tl
        if link is not None and link.recorder.recording():
            return link.recorder.call(name, fn, args, kwargs, targets)
    return fn(*plain(args), **plain(kwargs))


class WrappedRecorder(Recorder):
    """Records the calls a model makes on wrapper arrays into a TraceBuilder.

    Besides the base's ``array_types`` (the plain arrays and the wrapper
    class), ``describe``, ``copy`` and ``memory`` (asked of wrappers too: a
    wrapper lives in its plain array's memory), a backend says:
    :meth:`wrapper` (a new wrapper of a plain array), ``scalar_types``
    (immutable values it tracks as 0-d arrays), ``sites`` (whose files are
    not the user's), and where it has them :meth:`same`, :meth:`draw`,
    ``value_free`` and ``shape_reads``. ``op.out`` holds plain values; the
    model holds their wrappers, and those are what ``producers`` maps to ops
    (:meth:`produced`).
    """

    #: Immutable values the framework gives for 0-d results (NumPy's scalars), tracked as 0-d arrays.
    scalar_types: tuple[type, ...] = ()
    #: The call sites of ops: ``CallSites(framework.__file__, files=(the wrapper's module file,))``.
    sites: CallSites
    #: Functions whose Python answer depends on shapes, dtypes or memory only: no op.
    value_free: frozenset[str] = frozenset()
    #: Of those, the ones that read the shape of their first argument: reported as ``len``.
    shape_reads: frozenset[str] = frozenset()

    def __init__(self, builder: Any) -> None:
        super().__init__(builder)
        # id(constant array) -> (that array, its copy): a closure weight read by every step of
        # a loop is copied once, unless it changed in between.
        self.constants: dict[int, tuple[Any, Any]] = {}
        # memory key -> (op index, path) of values save= dropped: nothing to copy before a write (the base keeps
        # no entry), but a plain view of them that leaks into the graph is still reported (leaked)
        self.dropped: dict[Any, list[tuple[int, tuple[Any, ...]]]] = {}

    # -- what a backend says (override) ------------------------------------------------------
    def wrapper(self, value: Any) -> Conversions:
        """A new wrapper standing for the plain array (or scalar) ``value``, sharing its memory."""
        raise NotImplementedError(f"{type(self).__name__} must say how to wrap an array (WrappedRecorder.wrapper)")

    def same(self, value: Any, copy: Any) -> bool:
        """Does array ``value`` still hold what ``copy`` (made of it earlier) holds? Default: not known (False)."""
        return False

    def draw(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, float]:
        """Run the random draw ``fn`` on plain values, keeping what replay needs to draw the same numbers:
        ``(meta, result, seconds)``. Only for backends that pass ``random=True`` to :meth:`call`."""
        raise UnsupportedError(f"{type(self).__name__} records no random draws (WrappedRecorder.draw)")

    # -- which wrapper is which op's -----------------------------------------------------------
    def produced(self, value: Any, ref: Ref, alias: bool = False) -> None:
        if not isinstance(value, Conversions):  # the plain values record() is given are op.out's
            return
        super().produced(value, ref, alias)
        if not self.builder.ops[ref.index].saved:
            self.dropped.setdefault(self.memory(value), []).append((ref.index, ref.path))

    def input(self, value: Any) -> Conversions:
        """The wrapper the model gets for the input array ``value``, recorded as an input node."""
        shape, dtype, device = self.describe(value)
        op = self.builder.add_input(value, shape=shape, dtype=dtype, device=device)
        return self.tracked(value, Ref(op.index))

    def tracked(self, v: Any, ref: Ref, written: dict[int, Any] | None = None) -> Any:
        """A wrapper of ``v``, op ``ref``'s value; ``written``: id of a plain array the op wrote into -> the
        wrapper the model holds of it, handed back instead."""
        t = written.get(id(v)) if written else None
        if t is not None:  # record() made it this op's value already
            t._tl = Link(self, v, False)
            return t
        t = self.wrapper(v)
        t._tl = Link(self, v, isinstance(v, self.scalar_types))
        self.produced(t, ref)
        return t

    def wrap(self, value: Any, index: int, written: dict[int, Any] | None = None) -> Any:
        """Wrappers of op ``index``'s value (one array, or a tuple/list of them)."""
        if self.is_array(value):
            return self.tracked(value, Ref(index), written)
        return tree.rebuild(
            value, [self.tracked(v, Ref(index, (i,)), written) if self.is_array(v) else v for i, v in enumerate(value)]
        )

    def constant(self, value: Any) -> Any:
        a = plain_leaf(value)  # a wrapper of another capture, or of none, is its plain array here
        if isinstance(a, self.scalar_types):
            return a
        if self.memories or self.dropped:
            key = self.memory(a)
            if key in self.memories or key in self.dropped:
                self.leaked(a, key)
        seen = self.constants.get(id(a))
        if seen is not None and seen[0] is a and self.same(a, seen[1]):
            return seen[1]
        copy = self.copy(a)
        self.constants[id(a)] = (a, copy)
        return copy

    def leaked(self, a: Any, key: Any) -> None:
        """``a``, about to enter the graph as a constant, lives in recorded memory: report what it was read from.

        Calls that do not dispatch (NumPy's ``np.asarray(x)``) hand the model
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
    def call(
        self,
        name: str,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        targets: list[Any],
        random: bool = False,
    ) -> Any:
        """Run one call on plain values and record it (``targets``: the arrays it writes into; ``random``:
        a draw, run by :meth:`draw`)."""
        a, k, parents, params = self.call_template(args, kwargs)
        for t in targets:
            self.protect(t)
        meta = None
        plain_args, plain_kwargs = plain(args), plain(kwargs)
        self.depth += 1  # what the call runs, and intervene='s helpers in record(), are not the model's ops
        try:
            if random:
                meta, result, elapsed = self.draw(fn, plain_args, plain_kwargs)
            else:
                start = time.perf_counter()
                result = fn(*plain_args, **plain_kwargs)
                elapsed = time.perf_counter() - start
            value = plain_leaf(targets[0]) if result is None and targets else result
            arrays = self.is_array(value) or (isinstance(value, (tuple, list)) and any(map(self.is_array, value)))
            if arrays:
                shape, dtype, device = self.describe(value)
                seen = self.record(
                    name,
                    fn,
                    a,
                    k,
                    parents,
                    params,
                    value,
                    written=tuple(targets),
                    shape=shape,
                    dtype=dtype,
                    device=device,
                    random=random,
                    code_context=self.sites.stack(1),
                    meta=meta,
                    elapsed=elapsed,
                )
        except TorchLensError as exc:  # raised by the capture, also if the model catches it
            raise self.remember(exc) from None
        finally:
            self.depth -= 1
        if not arrays:  # a Python value (a shape, a comparison), or None
            if parents and result is not None:
                return self.python_value(name, fn, args, a, k, parents, params, result, elapsed)
            return result
        # An in-place call hands back the very arrays it wrote into: the model keeps its own wrappers of them.
        written = {id(plain_leaf(t)): t for t in targets if isinstance(t, Conversions)} if targets else None
        wrapped = self.wrap(seen, self.builder.ops[-1].index, written)
        return None if result is None else wrapped

    def _record(self, *args: Any, **fields: Any) -> Any:
        """:meth:`record`, paused: ``intervene=``'s helpers run in it, and their calls are not ops."""
        with self.paused():
            try:
                return self.record(*args, **fields)
            except TorchLensError as exc:  # raised by the capture, also if the model catches it
                raise self.remember(exc) from None

    def python_value(
        self,
        name: str,
        fn: Any,
        args: tuple[Any, ...],
        a: Any,
        k: Any,
        parents: tuple[int, ...],
        params: tuple[str, ...],
        result: Any,
        elapsed: float,
    ) -> Any:
        """A call on recorded arrays answered with a Python value (``np.allclose``): what the model gets.

        A shape, dtype or memory question (``value_free``) is no op; a shape
        read is reported as one. A number (or a tuple of them) is recorded as
        an op whose value is the number as an array, and reported, so replay
        checks it.
        """
        if name in self.value_free:
            if name in self.shape_reads and args and isinstance(args[0], Conversions):
                args[0]._tl_read_shape(args[0]._tl_shape())
            return result
        how = python_conversion(result)
        if how is None:  # a string or an object: printing and the like decide nothing
            return result
        value = PythonValue.host(result)
        seen = self._record(
            name, PythonValue(fn), a, k, parents, params, value, code_context=self.sites.stack(1), elapsed=elapsed
        )
        got = CONVERSIONS[how](PythonValue.host(seen))
        if seen is not value:  # an edit: the model gets the edited answer, of the type it had
            result = type(result)(got) if isinstance(result, tuple) else got
        self.report(self.builder.ops[-1].index, (), how, got)
        return result

    def as_output(self, value: Any, inside: Any) -> tuple[Ref, Any]:
        """A returned array that no recorded op computed is a ``constant`` source op, so that the outputs are
        all nodes of the graph (and ``intervene=`` may pick it: the caller is the one later op to see the edit)."""
        ref = self.producer(value)
        if ref is not None:
            return ref, None
        value = plain_leaf(value)
        stored = value if isinstance(value, self.scalar_types) else self.copy(value)
        seen = self._record("constant", constant, (stored,), {}, [], [], value)
        return Ref(self.builder.ops[-1].index), (None if seen is value else seen)

    def finish(self, output: Any) -> Trace | Recording:
        """After the forward returned ``output`` (mark the capture over first: ``depth += 1``): the Trace
        (a Recording for ``tl.record``)."""
        self.raise_remembered()  # a recorded call raised, and the model caught it and went on
        template, output = self.returned(output, None)
        self.builder.add_outputs(template, plain(output))  # the caller gets plain values (an edited constant's)
        return self.builder.finish()

    # -- Python values (conversions.Conversions) -----------------------------------------------
    def reading(self, tracked: Any, values: bool = True) -> tuple[Any, Ref] | None:
        """The wrapper to convert for ``tracked`` and the Ref to report it at (None: convert unreported).

        ``tracked`` itself, unless its memory was written (through another
        view) since its op ran: replay checks a value as its op computed it,
        so the value read now is recorded first, as a ``copy`` op.
        ``values=False``: only the shape is read, which no write changes.
        """
        ref = self.producer(tracked)
        if ref is None or not self.recording():
            return None
        if values and not tracked._tl.scalar and self.written_since(tracked, ref.index):
            tracked = self.call("copy", MethodCall("copy"), (tracked,), {}, [])
            ref = self.producer(tracked)
            assert ref is not None  # the copy just recorded
        return tracked, ref
