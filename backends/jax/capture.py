"""tl.trace for JAX: trace the call to a jaxpr, then walk it eagerly, recording every primitive.

0. A jitted target captured before with the same key is answered by the
   capture cache (:mod:`torchlens_jax.capture_cache`): the first capture's
   records, every value from one call of the cached executable, and none of
   the steps below. A jit wrapper is otherwise traced as what it wraps
   (:mod:`torchlens_jax.jitted`).
1. The target is split into named parameter arrays and a rebuild function
   (:mod:`torchlens_jax.modules`); the array leaves of the arguments are the inputs.
2. ``jax.make_jaxpr`` traces ``rebuild(params)(*inputs)`` with submodule calls
   scoped and their outputs marked (:mod:`torchlens_jax.scopes`); for a plain
   function, the calls of the modules it uses (:mod:`torchlens_jax.function_modules`).
3. The walker (:mod:`torchlens_jax.walk`) visits the jaxpr equation by
   equation and records each one. Where the values come from
   (:mod:`torchlens_jax.compiled`, docs/backend-jax.md): a straight-line jaxpr
   is recorded first and then computed as one program, eagerly the first time
   it is captured and by one cached XLA executable after that; a jaxpr whose
   values the walk must read as it goes (loops, cond, ``intervene=``...) is
   evaluated by the walk itself, ``primitive.bind`` per equation.
4. Unless the executable computed the outputs, the model is then called once
   more the ordinary way (jit and all); that result is the trace's
   ``model_output``, so that audit compares two independent computations.
   With ``intervene=`` the walk is the edited forward (a plain call would not
   edit), so its outputs are ``model_output``.

The user's model is left as it was: an nnx model runs as copies made from the
same state, so a trace advances no RNG stream and no batch statistics.

Threads. JAX's tracing state and linen's interceptors are thread-local; the
nnx and equinox ``__call__`` wrappers are not, so step 2 runs under a lock,
one capture at a time. Calls from other threads meet the wrappers and pass
straight through: they are calls of the user's modules, never of the copies
being traced.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from torchlens_core.capture.builder import Recording, TraceBuilder
from torchlens_core.capture.policy import CaptureOptions, HaltCapture
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import ParamRecord, ParamRef, Ref
from torchlens_core.ir.trace import Trace
from torchlens_jax import cache_keys, capture_cache
from torchlens_jax.arrays import array_info, is_array
from torchlens_jax.compiled import DeferredWalker, device_of, execute, fast_path_refusal
from torchlens_jax.function_modules import FunctionScopes, function_interception, named_modules
from torchlens_jax.jitted import unjitted
from torchlens_jax.modules import owner, view_model
from torchlens_jax.scopes import CallScopes, Splicer, fill, slot_template
from torchlens_jax.walk import Val, Walker

# Submodule calls are intercepted by wrappers on the modules' classes (nnx, equinox), which every thread
# shares: one capture at a time traces its jaxpr, so that no capture wraps another's wrapper, or puts a
# class's __call__ back while another still needs it. The eager walk, most of a capture, runs concurrently.
_TRACING = threading.Lock()


def capture(
    target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None
) -> Trace | Recording:
    import jax

    options = options or CaptureOptions()
    # A jitted target captured before with the same key: its records again, values from one compiled call.
    cache_probe = cache_keys.probe(target, args, kwargs, options) if capture_cache.CAPTURE_CACHE else None
    skeleton = capture_cache.lookup(cache_probe)
    answered = None if skeleton is None or cache_probe is None else capture_cache.answer(cache_probe, skeleton)
    if answered is not None:
        return answered
    view = view_model(target, args)
    # Array leaves of the arguments become jaxpr inputs; anything else (flags, sizes) stays as given.
    leaves, treedef = jax.tree_util.tree_flatten((args[view.param_args :], kwargs))
    array_at = [i for i, leaf in enumerate(leaves) if is_array(leaf)]
    # Made before tracing: tl.splice_module replaces module calls while the jaxpr is traced.
    builder = TraceBuilder("jax", model_name=view.type_name, options=options)
    splicer = _splicer(builder)
    out_structure: dict[str, Any] = {}

    def traced(scopes: CallScopes, param_values: list[Any], input_values: list[Any]) -> list[Any]:
        filled = list(leaves)
        for i, v in zip(array_at, input_values):
            filled[i] = v
        a, kw = jax.tree_util.tree_unflatten(treedef, filled)
        fn = view.rebuild(param_values)
        if isinstance(scopes, FunctionScopes):
            fn = unjitted(fn)  # JAX reuses a jitted function's trace: its module calls would run no hook
            scopes.name_arguments(fn, a, kw)  # modules among the arguments, as the function receives them
        else:
            scopes.paths = {id(m): p for p, m in view.objects_of(fn)}  # the rebuilt model's own objects
        out = fn(*a, **kw)
        out_structure["template"], arrays, out_structure["flattened"] = slot_template(out)
        return arrays

    def trace_jaxpr(scopes: CallScopes) -> Any:
        interception = (
            function_interception(scopes) if isinstance(scopes, FunctionScopes) else view.interception(scopes)
        )
        try:
            with _TRACING, interception:
                return jax.make_jaxpr(functools.partial(traced, scopes))(
                    [p.value for p in view.params], [leaves[i] for i in array_at]
                )
        except (
            jax.errors.ConcretizationTypeError,
            jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError,
            jax.errors.TracerArrayConversionError,
        ) as exc:
            raise UnsupportedError(
                f"{view.type_name} branches on array values in Python (or converts them to Python numbers), "
                f"which a jaxpr cannot record; use jax.lax.cond / jax.lax.while_loop for data-dependent "
                f"control flow. JAX said: {str(exc).splitlines()[0]}"
            ) from exc

    if view.kind == "function":  # modules called inside the function (torchlens_jax.function_modules)
        named = named_modules(unjitted(target))
        expected = None
        if splicer is not None:  # a splice needs each call's final path as it is traced: learn the modules first
            probe = FunctionScopes(None, named)
            trace_jaxpr(probe)
            expected = probe.used()
        function_scopes = FunctionScopes(splicer, named, expected)
        closed = trace_jaxpr(function_scopes)
        function_scopes.resolve()  # names the calls, now that the function's top-level modules are known
        scopes: CallScopes = function_scopes
    else:
        scopes = CallScopes(splicer)
        closed = trace_jaxpr(scopes)

    _declare(builder, view, scopes)
    refusal = fast_path_refusal(closed, builder)
    param_values = [p.value for p in view.params]
    input_values = [leaves[i] for i in array_at]
    walker = (
        Walker(builder, scopes)
        if refusal is not None
        else DeferredWalker(builder, scopes, device_of(param_values + input_values))
    )
    param_vals = [Val(p.value, ParamRef(p.name)) for p in view.params]
    input_vals = []
    for value in input_values:
        shape, dtype, device = _array_info(value)
        input_vals.append(Val(value, Ref(builder.add_input(value, shape, dtype, device).index)))
    keep = cache_probe is not None and isinstance(walker, DeferredWalker)  # kept for the capture cache if it can be
    try:
        outs = walker.run_closed(closed, param_vals + input_vals, (), (), False)
        # The model's output: an output no op computed (an input, a parameter, a constant) gets an identity op.
        out_refs, outs = walker.outputs(out_structure["template"], outs)
    except HaltCapture:  # halt=: the program ends where the forward stopped; compute what it recorded
        if isinstance(walker, DeferredWalker):
            sources = capture_cache.value_sources(walker, []) if keep else None
            ran = execute(walker, [])
            if ran is not None:
                builder.notes["compiled"] = ran
            if sources is not None:  # finished here (tl.trace would finish it alike), to be kept
                halted = builder.finish(halted=True)
                if cache_probe is not None and isinstance(halted, Trace):  # (both: `keep` said so)
                    capture_cache.store(cache_probe, halted, walker, sources, None, view.params, input_values)
                return halted
        raise
    # read before execute fills them
    sources = capture_cache.value_sources(walker, outs) if keep and isinstance(walker, DeferredWalker) else None
    ran = execute(walker, outs) if isinstance(walker, DeferredWalker) else None
    if ran is not None:
        # One executable computed every kept value and the outputs: those are the model's output (no second,
        # plain call; audit() replays eagerly op by op, and audit(untraced=True) runs the model on demand).
        builder.notes["compiled"] = ran
        model_output = fill(out_structure["template"], [x.value for x in outs])
        how = "jax.make_jaxpr, a walk recording each primitive, then one compiled call computing the values"
    elif builder.editor is None:
        # Each value came from its own dispatch (the per-equation path, or the program's first, eager run); the
        # plain (jitted) call is the model's output, an independent computation audit compares with the ops.
        model_output = view.call_plain(args, kwargs)
        if out_structure["flattened"]:  # a container the core cannot look into: its arrays, in order
            model_output = tuple(slot_template(model_output)[1])
        how = (
            f"jax.make_jaxpr, then an eager walk binding each primitive ({refusal})"
            if refusal
            else "jax.make_jaxpr, a walk recording each primitive, then an eager run of them (compiled when the "
            "same program is captured again)"
        )
    else:  # intervene=: the edited forward is the walk itself; a plain call would return the unedited output
        model_output = fill(out_structure["template"], [x.value for x in outs])
        how = f"jax.make_jaxpr, then an eager walk binding each primitive ({refusal})"
    builder.add_outputs(out_refs, model_output)
    builder.notes.update(
        {
            "capture": how,
            "expanded": dict(walker.expanded),  # higher-order primitives replaced by their inner ops
            "opaque": dict(walker.opaque),  # higher-order primitives recorded as one op
            "output_flattened": out_structure["flattened"],
        }
    )
    trace = builder.finish()
    # (sources are read only when `keep`: a probe, a deferred walker, and so no tl.record)
    if sources is not None and cache_probe is not None and isinstance(walker, DeferredWalker):
        assert isinstance(trace, Trace)
        capture_cache.store(cache_probe, trace, walker, sources, out_structure["template"], view.params, input_values)
    return trace


def _array_info(value: Any) -> tuple[tuple[int, ...], str, str]:
    """:func:`array_info` of an input or parameter: an array leaf."""
    info = array_info(value)
    assert info is not None
    return info


def _splicer(builder: TraceBuilder) -> Splicer | None:
    """What replaces the n-th traced call of a module (``tl.splice_module``); None when no splice names one.

    A call is replaced where it is traced, which is where JAX lets code run
    instead of a module's own; the walk then checks, pass by pass, that each
    traced call ran only as passes the splice names (a loop body runs as many).
    """
    editor = builder.editor
    if editor is None or not editor.splice_targets():
        return None

    def splicer(path: str, n: int) -> Callable[..., Any] | None:
        splice = editor.splice_for(path, n)
        return None if splice is None else splice.replacement

    return splicer


def _declare(builder: TraceBuilder, view: Any, scopes: CallScopes) -> None:
    """Modules (known beforehand, or met during tracing for linen) and parameters."""
    types = {path: type(m).__name__ for path, m in view.objects}
    for path, type_name in scopes.types.items():
        types.setdefault(path, type_name)
    for path, type_name in types.items():
        builder.add_module(path, type_name)  # its parameters: listed by the builder at the end
    for p in view.params:
        shape, dtype, _ = _array_info(p.value)
        builder.add_param(
            ParamRecord(
                name=p.name,
                shape=shape,
                dtype=dtype,
                numel=int(p.value.size),
                trainable=p.trainable,
                module=owner(p.name, types),
                is_buffer=p.is_buffer,
                value=p.value,
            )
        )
