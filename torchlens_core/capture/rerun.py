"""How a traced forward was called, kept so that ``trace.audit(untraced=True)`` can run it again.

A :class:`RecordedCall` holds no array of its own: the model is held weakly
where the object allows it (a module, a function, a bound method), and each
array argument is a Ref to the input node that recorded its value (or a
ParamRef, for a parameter passed as an argument). Anything else among the
arguments (flags, sizes, None, an object the walk does not enter, an array
the backend read as a constant of the model rather than as an input) is kept
as given. A rerun gets copies of the
recorded inputs, so a model that writes into its input cannot change the trace.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.backend.arrays import is_array_of
from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import ParamRef, Ref

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace


@attrs.frozen
class RecordedCall:
    """``model(*args, **kwargs)`` as a capture ran it; arrays are Refs to the trace's input nodes."""

    model_ref: Callable[[], Any]  # a weak reference, or a holder of an object that allows none
    model_name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    intervene: tuple[Any, ...] = ()  # the interventions the capture applied (fork().rerun repeats them)
    # input node -> a weak reference to the very array the model was given (a backend's live backward
    # needs it: the node may hold a copy); absent for arrays that take no weak reference
    given: dict[int, Callable[[], Any]] = attrs.Factory(dict)
    # the capture's own options (a CaptureOptions, save_to= left out), which trace.rerun(model, x) repeats
    options: Any = None

    def given_array(self, index: int) -> Any:
        """The array passed as input node ``index``, if it is still alive; else None."""
        ref = self.given.get(index)
        return ref() if ref is not None else None

    def model(self) -> Any:
        model = self.model_ref()
        if model is None:
            raise UnsupportedError(
                f"the traced {self.model_name} no longer exists (a trace holds its model weakly): "
                f"keep a reference to it for audit(untraced=True)"
            )
        return model

    def inputs(self, trace: Trace) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments, with copies of the recorded input values and the live parameters."""
        copies: dict[int, Any] = {}

        def value(leaf: Any) -> Any:
            if isinstance(leaf, Ref):
                if leaf.index not in copies:
                    copies[leaf.index] = _copy(trace.backend, trace.ops[leaf.index].out)
                return copies[leaf.index]
            if isinstance(leaf, ParamRef):
                return trace.params[leaf.name].value
            return leaf

        return tree.map_leaves(value, self.args), tree.map_leaves(value, self.kwargs)


_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})  # never an array
_CONTAINERS = frozenset({tuple, list, dict})  # walked into: an array only if an input node holds that very object


def rerun(trace: Trace, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Trace:
    """``trace.rerun(model, *args, **kwargs)``: ``tl.trace(model, *args, **kwargs)`` again, live, with the options
    the capture of ``trace`` was given (``save=``, ``halt=``, ``intervene=``, ``save_grads=``,
    ``intervention_ready=``...), on the same backend: a new trace, as a fresh ``tl.trace`` with those options
    gives. ``save_to=`` is not repeated (a rerun would write over the folder): the new trace holds its values.
    A trace from ``tl.load`` or ``tl.record`` kept no options: it reruns with none, and one that holds edits
    is refused (they cannot be made again)."""
    from torchlens_core.capture.api import trace as capture

    options = getattr(trace.call, "options", None)
    if options is None and trace.interventions:
        raise UnsupportedError(
            "this trace's own edits were not made by tl.trace in this process (it was loaded, or "
            "recorded), so a live rerun cannot repeat them: pass intervene= to tl.trace instead"
        )
    return capture(
        model,
        *args,
        backend=trace.backend,
        capture=options,
        intervention_ready=bool(trace.notes.get("intervention_ready")),
        **kwargs,
    )


def remember(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    trace: Trace,
    intervene: tuple[Any, ...] = (),
    options: Any = None,
) -> RecordedCall | str:
    """The call that produced ``trace``, or why it cannot be remembered.

    Each array argument is matched to its input node: by identity first (the
    node holds the very object), then, for backends that record a copy or a
    conversion, to the unclaimed input nodes: one holding the same values
    first, then in argument order (the order every backend adds them in) one
    of the same shape. An array no node is left for is one the backend read
    as a constant: it is kept as given.
    """
    inputs = [op for op in trace.ops if op.kind == "input"]
    # Both held by the trace, so a leaf with one of these ids is that very object.
    by_identity = {id(op.out): op.index for op in inputs}
    params = {id(p.value): name for name, p in trace.params.items()}
    match = _Matcher(by_identity, params, trace.backend)
    args_t, kwargs_t = match.template(args), match.template(kwargs)
    found, unmatched = match.found, match.unmatched
    if unmatched:  # a backend that records a copy or a conversion: the free input nodes, in order
        # Free: not holding an argument itself (JAX makes a node for each occurrence of one array, each holding it).
        free = [op for op in inputs if id(op.out) not in found]
        # An argument whose shape one free node alone has, and no other unmatched argument: that node, with no
        # values read (both passes below would pick it; reading them costs a copy of each through NumPy).
        shapes = [_shape(leaf) for key, leaf in unmatched.items() if key not in found]
        for key, leaf in unmatched.items():
            shape = _shape(leaf)
            if key in found or shape is None or shapes.count(shape) != 1:
                continue
            fitting = [op for op in free if op.shape is not None and tuple(op.shape) == shape]
            if len(fitting) == 1:
                free.remove(fitting[0])
                found[key] = Ref(fitting[0].index)
        # A node holding the very value first (the argument among several of one shape that it was made from),
        # then, in order, one of the same shape (the model may have written into its argument since).
        for same_value in (True, False):
            for key, leaf in unmatched.items():
                if key in found:
                    continue
                op = next((op for op in free if _fits(trace.backend, op, leaf, same_value)), None)
                if op is not None:
                    free.remove(op)
                    found[key] = Ref(op.index)
        for key, leaf in unmatched.items():
            # no node: the backend read it as a constant of the model (JAX: an array in a dataclass that is no
            # pytree), kept as given, as an object the walk does not enter keeps its arrays
            found.setdefault(key, leaf)
        args_t, kwargs_t = match.template(args), match.template(kwargs)

    name = getattr(model, "__name__", None) or type(model).__name__
    given: dict[int, Callable[[], Any]] = {}
    for key, ref in found.items():
        if isinstance(ref, Ref):
            leaf = unmatched.get(key)
            if leaf is None:
                leaf = trace.ops[ref.index].out
            try:
                given[ref.index] = weakref.ref(leaf)
            except TypeError:  # arrays without weak references (NumPy scalars): no live handle
                pass
    if options is not None:  # repeated by trace.rerun; a rerun writes no folder (the stream is this capture's)
        options = attrs.evolve(options, save_to=None, stream=None)
    return RecordedCall(_weakly(model), str(name), args_t, kwargs_t, intervene, given, options)


class _Matcher:
    """The arguments' templates: each array a Ref to its input node or a ParamRef, matched by identity.

    One walk over the arguments (a method, not a closure calling itself: that would be a reference cycle
    left for the cyclic GC at every capture)."""

    def __init__(self, by_identity: dict[int, int], params: dict[int, str], backend: str) -> None:
        self.by_identity, self.params, self.backend = by_identity, params, backend
        self.numpy = sys.modules.get("numpy")  # NumPy inputs: some backends convert them into input nodes
        self.is_array: Callable[[Any], bool] | None = None  # made at the first leaf that needs it
        self.found: dict[int, Any] = {}  # id(argument) -> what it is in the template (a Ref, a ParamRef, itself)
        self.unmatched: dict[int, Any] = {}  # arrays no input node holds, in argument order (one passed twice: once)

    def template(self, value: Any) -> Any:
        """``value`` with each array a Ref or ParamRef; arrays to match by position are left as they are."""
        t = type(value)
        if t in _PLAIN:  # (a small int is one shared object: its id says nothing)
            return value
        key = id(value)
        ref = self.found.get(key)
        if ref is not None:
            return ref
        index = self.by_identity.get(key)
        if index is not None:
            ref = self.found[key] = Ref(index)
            return ref
        name = self.params.get(key)
        if name is not None:
            ref = self.found[key] = ParamRef(name)
            return ref
        if t not in _CONTAINERS:  # the array hook costs more than the lookups; a plain container is no array
            if self.is_array is None:
                self.is_array = is_array_of(self.backend)
            if self.is_array(value) or (self.numpy is not None and isinstance(value, self.numpy.ndarray)):
                self.unmatched[key] = value
                return value
        kids = tree.children(value)
        return value if kids is None else tree.rebuild(value, [self.template(v) for _, v in kids])


def _fits(backend: str, op: Any, leaf: Any, same_value: bool) -> bool:
    """Can input node ``op`` be the node of argument ``leaf``: the same shape, and with ``same_value``, equal
    values (NaNs included) once cast to the node's dtype, as the backend converted it?"""
    import numpy as np

    if op.shape is None or tuple(op.shape) != tuple(leaf.shape):
        return False
    if not same_value:
        return True
    h = backend_named(backend, missing_ok=True)
    try:
        recorded = np.asarray(h.to_numpy(op.out))
        given = leaf if isinstance(leaf, np.ndarray) else h.to_numpy(leaf)
        given = np.asarray(given).astype(recorded.dtype, copy=False)
        return bool(np.array_equal(recorded, given, equal_nan=np.issubdtype(recorded.dtype, np.inexact)))
    except Exception:  # noqa: BLE001 - a value the hooks cannot read as NumPy: left to the match by shape
        return False


def _shape(leaf: Any) -> tuple[Any, ...] | None:
    shape = getattr(leaf, "shape", None)
    return None if shape is None else tuple(shape)


def _weakly(model: Any) -> Callable[[], Any]:
    try:
        if hasattr(model, "__self__") and hasattr(model, "__func__"):  # a bound method dies at once otherwise
            return weakref.WeakMethod(model)
        return weakref.ref(model)
    except TypeError:  # builtins and other objects without weak references: they live on anyway
        return lambda: model


def _copy(backend: str, value: Any) -> Any:
    """A copy of a recorded array on its own device, through the backend's NumPy hooks."""
    h = backend_named(backend, missing_ok=True)
    info = h.array_info(value)
    if info is None:
        return value
    encoded = h.encode_array(value)
    array, dtype = encoded if encoded is not None else (h.to_numpy(value), info[1])
    copy = h.from_numpy(array, dtype, info[2])
    return value if copy is None else copy
