"""How a traced forward was called, kept so that ``trace.audit(untraced=True)`` can run it again.

A :class:`RecordedCall` holds no array of its own: the model is held weakly
where the object allows it (a module, a function, a bound method), and each
array argument is a Ref to the input node that recorded its value (or a
ParamRef, for a parameter passed as an argument). Anything else among the
arguments (flags, sizes, None) is kept as given. A rerun gets copies of the
recorded inputs, so a model that writes into its input cannot change the trace.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.backend.arrays import is_array_of
from torchlens_core.backend.manager import hook
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

    def given_array(self, index: int) -> Any:
        """The array passed as input node ``index``, if it is still alive; else None."""
        ref = self.given.get(index)
        return ref() if ref is not None else None

    def model(self) -> Any:
        model = self.model_ref()
        if model is None:
            raise UnsupportedError(f"the traced {self.model_name} no longer exists (a trace holds its model weakly): "
                                   f"keep a reference to it for audit(untraced=True)")
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


def remember(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], trace: Trace,
             intervene: tuple[Any, ...] = ()) -> RecordedCall | str:
    """The call that produced ``trace``, or why it cannot be remembered.

    Each array argument is matched to its input node: by identity first (the
    node holds the very object), then, for backends that record a copy or a
    conversion, to the unclaimed input nodes in argument order, which is the
    order every backend adds them in, if the shapes agree.
    """
    inputs = [op for op in trace.ops if op.kind == "input"]
    # Both held by the trace, so a leaf with one of these ids is that very object.
    by_identity = {id(op.out): op.index for op in inputs}
    params = {id(p.value): name for name, p in trace.params.items()}
    is_array = is_array_of(trace.backend)
    numpy = sys.modules.get("numpy")  # NumPy inputs: some backends convert them into input nodes

    def array(value: Any) -> bool:  # the identity lookups first: the array hook costs more, on every leaf
        t = type(value)
        if t in _PLAIN:  # (a small int is one shared object: its id says nothing)
            return False
        if id(value) in by_identity or id(value) in params:
            return True
        return t not in _CONTAINERS and (is_array(value) or (numpy is not None and isinstance(value, numpy.ndarray)))

    arrays = [leaf for _, leaf in tree.leaves((args, kwargs), array)]
    arrays = list({id(leaf): leaf for leaf in arrays}.values())  # one array passed twice is one input
    found: dict[int, Any] = {}
    for leaf in arrays:
        if id(leaf) in by_identity:
            found[id(leaf)] = Ref(by_identity[id(leaf)])
        elif id(leaf) in params:
            found[id(leaf)] = ParamRef(params[id(leaf)])
    claimed = {ref.index for ref in found.values() if isinstance(ref, Ref)}
    free = iter([op for op in inputs if op.index not in claimed])
    for leaf in arrays:
        if id(leaf) not in found:
            op = next(free, None)
            if op is None or op.shape is None or tuple(op.shape) != tuple(leaf.shape):
                return f"an array argument of shape {tuple(leaf.shape)} matches no input node of the trace"
            found[id(leaf)] = Ref(op.index)

    def template(leaf: Any) -> Any:
        return found.get(id(leaf), leaf)

    name = getattr(model, "__name__", None) or type(model).__name__
    given = {}
    for leaf in arrays:
        ref = found[id(leaf)]
        if isinstance(ref, Ref):
            try:
                given[ref.index] = weakref.ref(leaf)
            except TypeError:  # arrays without weak references (NumPy scalars): no live handle
                pass
    return RecordedCall(_weakly(model), str(name), tree.map_leaves(template, args), tree.map_leaves(template, kwargs),
                        intervene, given)


def _weakly(model: Any) -> Callable[[], Any]:
    try:
        if hasattr(model, "__self__") and hasattr(model, "__func__"):  # a bound method dies at once otherwise
            return weakref.WeakMethod(model)
        return weakref.ref(model)
    except TypeError:  # builtins and other objects without weak references: they live on anyway
        return lambda: model


def _copy(backend: str, value: Any) -> Any:
    """A copy of a recorded array on its own device, through the backend's NumPy hooks."""
    h = hook()
    info = h.torchlens_array_info(backend=backend, value=value)
    if info is None:
        return value
    encoded = h.torchlens_encode_array(backend=backend, value=value)
    array, dtype = encoded if encoded is not None else (h.torchlens_to_numpy(backend=backend, value=value), info[1])
    copy = h.torchlens_from_numpy(backend=backend, array=array, dtype=dtype, device=info[2])
    return value if copy is None else copy
