"""``torch.func`` transforms in a traced forward, each recorded as one op.

``torch.vmap(f)(x)``, ``torch.func.grad(f)(x)``, ``jvp``, ``jacrev``,
``jacfwd``, ``hessian`` run ``f`` on wrapper tensors (per-sample views,
tangents) whose values a trace cannot hold, so the ops inside are not ops of
the forward. transformers 4.x builds every eager attention mask under
``torch.vmap``. Each transform call the forward makes (the outermost one,
when transforms nest) is recorded as one op instead: its call is a
:class:`TransformCall` (the transform with its options, and the function),
its arguments the tensors the transformed function is given, and replay
calls the transform again.

How it is seen. For the capture, and for its thread only (a
:class:`~torchlens_core.capture.threads.SharedPatch`), torch's transform
implementations are replaced: ``vmap_impl``, ``grad_impl``,
``grad_and_value_impl``, ``_jvp_with_argnums`` and ``_vjp_with_argnums``,
which every ``vmap``/``grad``/``jvp``/``vjp`` reaches however it was
imported, and ``jacrev``, ``jacfwd`` and ``hessian`` as attributes of
``torch.func`` and ``torch._functorch.eager_transforms`` (``jacrev`` is made
of ``vjp``, whose ``vjp_fn`` no op can return: it is recorded whole when it
is made through those names during the capture).

While the transform runs, the recorder is off the thread's function-mode
stack (the user's modes above it stay, as transformers'
``TransformGetItemToIndex``, and are entered again on replay), so nothing
inside is recorded, and a watcher mode on top sees every call:

- a tensor of the forward read from outside (a closure's, a parameter)
  becomes an input of the op too: the graph links it, and replay puts its
  replayed value in place of the original (:class:`_Substitute`), so replay
  on new inputs computes with the new values;
- the version counter of every tensor from outside it touches is kept.

Refused, with UnsupportedError, where a value inside the transform would
have to be kept: an output that is not tensors (``vjp``'s ``vjp_fn``), a
write into a tensor from outside the transform (an input, a parameter, a
closure's), a module of the traced model called inside (its pass would
return a wrapper). Random draws inside replay alike: the generator state
from before the call is kept.

A transform of a Python function cannot be rebuilt from a file (loading
would run code the file names): ``tl.save`` saves the op as not replayable,
saying so, and the loaded trace's replay raises UnsupportedError naming it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

import attrs
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from torchlens_core.capture.threads import shared_patch
from torchlens_core.ir.errors import UnsupportedError
from torchlens_torch.restore import until_done

# The op's keyword that holds the tensors the transform read from outside (replay swaps them in).
FREE = "torchlens_outside_tensors"
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_transform_level = torch._C._functorch.peek_interpreter_stack  # None: no transform running
_stack_length, _pop_mode, _push_mode = (
    torch._C._len_torch_function_stack,
    torch._C._pop_torch_function_stack,
    torch._C._push_on_torch_function_stack,
)
# Run(args, kwargs): the transform applied to the transformed function's arguments.
Run = Callable[[tuple[Any, ...], dict[str, Any]], Any]


def _name(func: Any) -> str:
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__
    return f"{module}.{qualname}" if module else str(qualname)


@attrs.define(slots=True, eq=False)
class TransformCall:
    """A recorded transform call, replayable: ``call(*args, **kwargs)`` applies the transform again.

    ``free`` are the tensors from outside the transform that it read, as they
    were when it ran; the op passes their replayed values as keyword
    :data:`FREE`, and each is swapped in for its original wherever the
    function reads it. ``modes``: the user's function modes that were active
    above the recorder (entered again around the call). ``spec``: the pytree
    structure of an output that was not one tensor or a flat tuple of them
    (the op's value is then the flat tuple of its tensors).
    """

    kind: str  # vmap, grad, jvp, jacrev...
    run: Run = attrs.field(repr=False)
    func: Any = attrs.field(repr=lambda f: _name(f))
    modes: tuple[Any, ...] = ()
    free: tuple[Tensor, ...] = attrs.field(default=(), repr=False)
    spec: Any = attrs.field(default=None, repr=False)

    @property
    def __name__(self) -> str:  # the op's func_name
        return self.kind

    def describe(self) -> str:
        return f"torch.func.{self.kind} of {_name(self.func)}"

    def unsaveable(self) -> str:
        """Why ``tl.save`` cannot save this call so that a loaded trace replays it."""
        return (
            f"{self.describe()} is a transform of a Python function, which cannot be rebuilt from a file "
            f"(loading would run code the file names); replay the trace tl.trace returned instead"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs = dict(kwargs)
        values = kwargs.pop(FREE, ())
        swap = {id(old): (old, new) for old, new in zip(self.free, values) if new is not old}
        with contextlib.ExitStack() as stack:
            for mode in self.modes:
                stack.enter_context(mode)
            if swap:
                stack.enter_context(_Substitute(swap))
            out = self.run(args, kwargs)
        return out if self.spec is None else tuple(pytree.tree_leaves(out))


class _Substitute(TorchFunctionMode):
    """At replay: every call inside the transform gets the replayed value where it would read an original."""

    def __init__(self, swap: dict[int, tuple[Tensor, Any]]) -> None:
        super().__init__()
        self.swap = swap

    def _swapped(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            found = self.swap.get(id(x))
            return found[1] if found is not None and found[0] is x else x
        t = type(x)
        if t is tuple or t is list:
            items = [self._swapped(v) for v in x]
            return x if all(a is b for a, b in zip(items, x)) else t(items)
        if t is dict:
            mapped = {k: self._swapped(v) for k, v in x.items()}
            return x if all(mapped[k] is v for k, v in x.items()) else mapped
        return x

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return func(*self._swapped(args), **(self._swapped(kwargs) if kwargs else {}))


class _Watcher(TorchFunctionMode):
    """While a recorded transform runs: the forward's tensors it reads from outside, and every outside tensor's
    version counter when first touched (a write into one shows as a changed counter)."""

    def __init__(self, recorder: Any, inputs: list[Tensor]) -> None:
        super().__init__()
        self.recorder = recorder
        # recorded values and parameters read as they are (a closure's, an argument not mapped over), in order
        self.free: dict[int, Tensor] = {}
        self.outside: dict[int, tuple[weakref.ref[Tensor], int]] = {}
        self.made: dict[int, weakref.ref[Tensor]] = {}  # plain tensors the calls inside returned
        self.looked: set[int] = set()
        with torch._C.DisableTorchFunction():
            for t in inputs:  # the op's own arguments: watched for writes from the start
                self._remember(t)

    def _remember(self, t: Tensor) -> None:
        if id(t) in self.outside:
            return
        try:
            version = t._version
        except RuntimeError:  # an inference tensor has no version counter (and cannot be written here)
            version = -1
        self.outside[id(t)] = (weakref.ref(t), version)

    def _look(self, x: Any) -> None:
        if isinstance(x, Tensor):
            if _wrapped(x) or id(x) in self.looked:  # an argument's wrapper, a value made inside; or known
                return
            made = self.made.get(id(x))
            if made is not None and made() is x:
                return
            self.looked.add(id(x))
            self._remember(x)
            recorder = self.recorder
            if recorder.producer(x) is not None or id(x) in recorder.param_names:
                self.free[id(x)] = x
        elif type(x) in (tuple, list):
            for v in x:
                self._look(v)
        elif type(x) is dict:
            for v in x.values():
                self._look(v)

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunction():  # the bookkeeping's own tensor reads are nobody's calls
            self._look(args)
            self._look(kwargs)
        out = func(*args, **kwargs)
        with torch._C.DisableTorchFunction():
            for t in (out,) if isinstance(out, Tensor) else out if type(out) in (tuple, list) else ():
                if isinstance(t, Tensor) and not _wrapped(t):
                    self.made[id(t)] = weakref.ref(t)  # a dead one's id, reused, is this tensor's now
        return out

    def written(self) -> list[Tensor]:
        """The tensors from outside whose version counter moved: written while the transform ran."""
        found = []
        with torch._C.DisableTorchFunction():
            for ref, version in self.outside.values():
                t = ref()
                if t is not None and version >= 0 and t._version != version:
                    found.append(t)
        return found


# -- what the forward's transform calls turn into --------------------------------------------------------------
def _refuse(recorder: Any, message: str) -> UnsupportedError:
    """The error, also kept as the capture's failure (raised by capture() even if the model catches it)."""
    exc = UnsupportedError(message)
    return recorder.remember(exc)


def _records(recorder: Any) -> int | None:
    """Where the recorder is on this thread's function-mode stack if this transform call is the forward's own,
    at the outermost level; else None (a transform inside one, or called from the recorder's own work)."""
    if recorder.transform is not None or _transform_level() is not None:
        return None
    for pos in range(_stack_length() - 1, -1, -1):
        if torch._C._get_function_stack_at(pos) is recorder:
            return pos
    return None


def record(recorder: Any, kind: str, run: Run, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``run(args, kwargs)`` (``kind`` of ``func``) with the recorder off the mode stack; record it as one op.

    Returns what the forward gets back: the transform's output (as intervene=
    may have edited it).
    """
    from torchlens_torch.capture import FuncInfo, _rng_states

    pos = _records(recorder)
    if pos is None:
        return run(args, kwargs)
    above = tuple(torch._C._get_function_stack_at(i) for i in range(pos + 1, _stack_length()))
    inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
    watcher = _Watcher(recorder, inputs)
    with torch._C.DisableTorchFunction():
        rng = _rng_states()

    def off() -> None:  # the recorder and what is above it out; the modes above back, the watcher on top
        while _stack_length() > pos:
            _pop_mode()
        for mode in (*above, watcher):
            _push_mode(mode)

    def back() -> None:
        while _stack_length() > pos:
            _pop_mode()
        for mode in (recorder, *above):
            _push_mode(mode)

    recorder.transform = kind
    recorder.depth += 1  # escape_detector: the kernels inside belong to this op
    try:
        until_done(off)
        try:
            start = perf_counter()
            out = run(args, kwargs)
            elapsed = perf_counter() - start
        finally:
            until_done(back)
        recorder.transform = None
        with torch._C.DisableTorchFunction():
            return _recorded(
                recorder, TransformCall(kind, run, func, above), watcher, rng, args, kwargs, out, elapsed, FuncInfo
            )
    finally:
        recorder.transform = None
        recorder.depth -= 1


def _recorded(
    recorder: Any,
    call: TransformCall,
    watcher: _Watcher,
    rng: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    elapsed: float,
    func_info: Any,
) -> Any:
    what = call.describe()
    written = watcher.written()
    if written:
        names = [recorder.param_names.get(id(t)) for t in written]
        named = ", ".join(f"parameter or buffer {n!r}" for n in names if n)
        raise _refuse(
            recorder,
            f"{what} wrote into {len(written)} tensor(s) from outside the transform "
            f"({named or 'an input of the transform or a tensor it reads'}): the written value "
            f"is made inside the transform, where a trace cannot keep it. Return the new value "
            f"from the transformed function and write it outside the transform",
        )
    leaves, spec = pytree.tree_flatten(out)
    bad = next((leaf for leaf in leaves if not isinstance(leaf, Tensor) or _wrapped(leaf)), None)
    if bad is not None or not leaves:
        got = "nothing" if not leaves else type(bad).__name__
        raise _refuse(
            recorder,
            f"{what} returned {got}, not only tensors: a trace records a transform as one op "
            f"whose outputs are tensors, and this output would keep values from inside the "
            f"transform (vjp's vjp_fn, linearize's jvp_fn). Use torch.func.jacrev/jacfwd/grad, "
            f"called as torch.func.<name> during the forward, or compute the products with "
            f"torch.func.jvp/grad",
        )
    flat = out if isinstance(out, Tensor) or (type(out) in (tuple, list) and len(leaves) == len(out)) else None
    if flat is None:
        call.spec, flat = spec, tuple(leaves)
    call.free = tuple(watcher.free.values())
    meta, random = None, False
    now = torch.get_rng_state()
    cuda = rng.get("cuda_rng_states")
    if not torch.equal(now, rng["rng_state"]) or (
        cuda is not None and any(not torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), cuda))
    ):
        meta, random = rng, True  # replay draws from the same state
    if call.free:
        kwargs = {**kwargs, FREE: call.free}
    seen = recorder._record(call, func_info(call), tuple(args), kwargs, flat, None, meta, elapsed, random)
    return seen if call.spec is None else pytree.tree_unflatten(list(seen), call.spec)


# -- the entry points ---------------------------------------------------------------------------------------------
_local = threading.local()  # .recorders: this thread's captures, innermost last (a capture inside a traced forward)


def _recorder(handlers: dict[int, Any]) -> Any:
    held = handlers.get(threading.get_ident())
    return held[-1] if held else None


@functools.cache
def _signature(func: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(func)


def _vmap(original: Callable[..., Any], handlers: dict[int, Any]) -> Callable[..., Any]:
    """``vmap_impl(func, in_dims, out_dims, randomness, chunk_size, *args, **kwargs)``."""

    def vmap_impl(*a: Any, **kw: Any) -> Any:
        recorder = _recorder(handlers)
        if recorder is None or len(a) < 5:
            return original(*a, **kw)
        func, options = a[0], a[1:5]
        return record(
            recorder, "vmap", lambda args, kwargs: original(func, *options, *args, **kwargs), func, tuple(a[5:]), kw
        )

    return vmap_impl


def _packed(kind: str) -> Callable[[Callable[..., Any], dict[int, Any]], Callable[..., Any]]:
    """``grad_impl`` / ``grad_and_value_impl(func, argnums, has_aux, args, kwargs)``."""

    def make(original: Callable[..., Any], handlers: dict[int, Any]) -> Callable[..., Any]:
        def impl(*a: Any, **kw: Any) -> Any:
            recorder = _recorder(handlers)
            if recorder is None:
                return original(*a, **kw)
            bound = _signature(original).bind(*a, **kw).arguments
            func, argnums, has_aux = bound["func"], bound["argnums"], bound["has_aux"]
            return record(
                recorder,
                kind,
                lambda args, kwargs: original(func, argnums, has_aux, tuple(args), dict(kwargs)),
                func,
                tuple(bound["args"]),
                dict(bound["kwargs"]),
            )

        return impl

    return make


def _jvp(original: Callable[..., Any], handlers: dict[int, Any]) -> Callable[..., Any]:
    """``_jvp_with_argnums(func, primals, tangents, argnums, *, strict=False, has_aux)``."""

    def impl(*a: Any, **kw: Any) -> Any:
        recorder = _recorder(handlers)
        if recorder is None:
            return original(*a, **kw)
        bound = _signature(original).bind(*a, **kw).arguments
        func = bound.pop("func")
        primals, tangents = bound.pop("primals"), bound.pop("tangents")
        return record(
            recorder, "jvp", lambda args, kwargs: original(func, *args, **bound), func, (primals, tangents), {}
        )

    return impl


def _vjp(original: Callable[..., Any], handlers: dict[int, Any]) -> Callable[..., Any]:
    """``_vjp_with_argnums(func, *primals, argnums=None, has_aux=False)``: its vjp_fn is refused."""

    def impl(*a: Any, **kw: Any) -> Any:
        recorder = _recorder(handlers)
        if recorder is None or not a:
            return original(*a, **kw)
        func = a[0]
        return record(recorder, "vjp", lambda args, kwargs: original(func, *args, **kw), func, tuple(a[1:]), {})

    return impl


def _composite(kind: str) -> Callable[[Callable[..., Any], dict[int, Any]], Callable[..., Any]]:
    """``jacrev(func, ...)``, ``jacfwd``, ``hessian``: what they make is recorded whole when the capture calls it."""

    def make(original: Callable[..., Any], handlers: dict[int, Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def constructor(func: Any, *a: Any, **kw: Any) -> Any:
            made = original(func, *a, **kw)  # now: torch checks the options here

            @functools.wraps(made)
            def transformed(*args: Any, **kwargs: Any) -> Any:
                recorder = _recorder(handlers)  # none once the capture is over: the transform as made
                if recorder is None:
                    return made(*args, **kwargs)
                return record(recorder, kind, lambda args, kwargs: made(*args, **kwargs), func, args, kwargs)

            return transformed

        return constructor

    return make


def _entry_points() -> list[tuple[Any, str, Callable[..., Any]]]:
    """(owner, attribute, make) for each replaced entry point this torch has (one ``make`` each: SharedPatch
    requires every capture to replace an attribute with the same one)."""
    import torch.func as func_namespace
    from torch._functorch import apis, eager_transforms

    found: list[tuple[Any, str, Callable[..., Any]]] = [
        (apis, "vmap_impl", _vmap),
        (eager_transforms, "grad_impl", _packed("grad")),
        (eager_transforms, "grad_and_value_impl", _packed("grad_and_value")),
        (eager_transforms, "_jvp_with_argnums", _jvp),
        (eager_transforms, "_vjp_with_argnums", _vjp),
    ]
    for name in ("jacrev", "jacfwd", "hessian"):
        make = _composite(name)
        found += [(owner, name, make) for owner in (func_namespace, eager_transforms)]
    return [(owner, name, make) for owner, name, make in found if callable(getattr(owner, name, None))]


_ENTRY_POINTS = _entry_points()


@contextlib.contextmanager
def recorded_transforms(recorder: Any) -> Iterator[None]:
    """While the block runs, this thread's torch.func transform calls at the outermost level are recorded by
    ``recorder`` (the capture's TorchFunctionMode, with a ``transform`` attribute) as one op each."""
    held = getattr(_local, "recorders", None)
    if held:  # a capture inside a traced forward: the entry points are in place for this thread already
        held.append(recorder)
        try:
            yield
        finally:
            held.pop()
        return
    _local.recorders = held = [recorder]
    try:
        with contextlib.ExitStack() as stack:
            for owner, name, make in _ENTRY_POINTS:
                stack.enter_context(shared_patch(owner, name, make).use(held))
            yield
    finally:
        _local.recorders = None


# -- the refusals the recorder raises ----------------------------------------------------------------------------
def unrecorded_transform(name: str) -> UnsupportedError:
    """For an op that reached the recorder from inside a transform it is not recording (one made before the
    capture through another name, functionalize, a tl.trace called inside a transform)."""
    return UnsupportedError(
        f"{name} ran inside a torch.func transform that the trace does not record as one op: its tensors are the "
        f"transform's wrappers (per-sample views, tangents), whose values a trace cannot hold or replay. vmap, "
        f"grad, grad_and_value, jvp, and jacrev/jacfwd/hessian made through torch.func.<name> during the forward "
        f"are recorded whole; call the transform that way, or trace the function it wraps, outside it"
    )


def module_in_transform(path: str, kind: str) -> UnsupportedError:
    """For a module of the traced model called inside a transform being recorded as one op."""
    return UnsupportedError(
        f"module '{path}' ran inside torch.func.{kind}: the trace records the transform as one op, and the "
        f"module's pass would return the transform's wrapper tensors, which a trace cannot keep as its output. "
        f"Call the module outside the transform, or call a copy that is not part of the traced model "
        f"(torch.func.functional_call on it works inside)"
    )
