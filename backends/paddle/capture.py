"""Capturing a Paddle forward in dynamic-graph mode.

The wrappers of :mod:`torchlens_paddle.intercept` report every ``_C_ops`` call,
Tensor operator and copying Tensor method to one :class:`Recorder`; a call
made while another recorded call runs belongs to the outer one. Layer paths
and passes come from the layers' ``__call__``, replaced for the capture
(:mod:`torchlens_paddle.layer_calls`; Paddle has no global hooks): a call of
one of the model's sublayers opens its pass before the layer's own pre-hooks
run and closes it after its post-hooks. A call is an op when it returns a
tensor, or when it writes into one (an in-place op, ``x[i] = v``, ``out=``).

Saved values are the values that ran: before an op writes into a tensor, every
recorded value living in the same allocation (views included: a tensor's
allocation is ``data_ptr() - _offset()``) is copied first, and a parameter or
buffer written for the first time keeps its value from before the forward.

``save=`` and ``halt=`` are applied by the TraceBuilder as ops arrive. The
recorder's side tables name ops by index and hold no tensors (``producers``
and the constant cache hold weak references, checked on every look-up), so a
value the builder drops is really freed; ``op.out`` of an earlier op may be
None at any time and is checked before it is read. A HaltCapture raised from a
wrapper goes up through the model to the ``finally`` that takes every patch down.

Threads. The wrappers replace process-wide attributes and report to the one
recorder of :data:`intercept.STATE`, so one capture runs at a time: a second
one, nested or in another thread, is refused with UnsupportedError before it
installs anything. The wrappers (``Layer.__call__``'s included) pass every call
of any other thread straight through, unrecorded: plain forwards beside a capture,
of the traced model too, run as they would without it.
"""

from __future__ import annotations

import math
import sys
import weakref
from time import perf_counter
from typing import Any

import numpy as np
import paddle
from paddle import Tensor

from torchlens_core.capture.branches import BranchTracker
from torchlens_core.capture.builder import Recording, TraceBuilder
from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.capture.recorder import Recorder as BaseRecorder
from torchlens_core.capture.sites import CallSites, PassSites
from torchlens_core.capture.threads import OneCaptureAtATime
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, UnsupportedError
from torchlens_core.ir.records import ParamRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_paddle.arrays import allocation, device_name, dtype_name, snapshot
from torchlens_paddle.intercept import STATE, OpInfo, Patches, amp_casting, amp_refusal, to_static_enabled
from torchlens_paddle.layer_calls import LayerCalls
from torchlens_paddle.splice import spliced

_version = Tensor.__dict__["_inplace_version"]
_clone = Tensor.__dict__["clone"]
# The copy a conversion reads when the value was written since its op ran (see Recorder._read_now).
_READ_NOW = OpInfo("clone", getattr(_clone, "__wrapped__", _clone))


# Paddle and the TorchLens packages are never the user's code site.
_SITES = CallSites(paddle.__file__, __file__, tree.__file__)


# A converted tensor with more elements than this is not turned into a list to report it: the
# builder keeps no larger one (TraceBuilder.to_python), so replay on new inputs refuses it anyway.
_LARGEST_LIST = 4096


def drop_scratch(out: Any, scratch: tuple[int, ...]) -> Any:
    """``out`` with the outputs at ``scratch`` (backward-only, maybe uninitialized) replaced by None."""
    return type(out)([None if i in scratch else v for i, v in enumerate(out)])


def _is_tensor(value: Any) -> bool:
    return isinstance(value, Tensor)


def _merged(result: Any, edited: Any, scratch: tuple[int, ...]) -> Any:
    """What an op of several outputs returns to the model after an edit: ``edited``, scratch outputs put back."""
    if not scratch:
        return edited
    return type(result)(v if i in scratch else edited[i] for i, v in enumerate(result))


class Recorder(BaseRecorder):
    """Records every intercepted call of one forward into a TraceBuilder.

    What is Paddle's own here: the entry points the wrappers call (:meth:`run`,
    :meth:`decide`, :meth:`alias`, :meth:`before_share` / :meth:`shared`,
    :meth:`call_layer`), how a call becomes an op (the tensors it writes,
    scratch outputs, the shapes of several outputs), a write through a view of
    a parameter, and one copy per unchanged constant; the bookkeeping is
    :class:`torchlens_core.capture.recorder.Recorder`'s.
    """

    array_types = (Tensor,)
    copied_types = (np.ndarray,)  # a NumPy argument: the model may change it after the call
    version = staticmethod(_version)  # Tensor._inplace_version itself: read for every recorded output

    def __init__(self, builder: TraceBuilder, param_names: dict[int, str], params: dict[str, Tensor]) -> None:
        super().__init__(builder, param_names)
        # allocation -> parameter name, so that a write through a view of a parameter is seen
        self.param_allocations = {allocation(p): name for name, p in params.items()}
        self.param_allocations.pop(0, None)
        self.params = params
        # id(tensor from outside the trace) -> (weakref, version, its copy)
        self.constants: dict[int, tuple[weakref.ref[Tensor], int, Tensor]] = {}
        self.branches = BranchTracker(_SITES.internal)
        self.sites = PassSites(_SITES)  # each op's call-site walk ends at its layer call (call_layer's frame)
        # id(layer) -> (layer, path) for the model's sublayers, whose calls are module passes (call_layer)
        self.layers: dict[int, tuple[Any, str]] = {}

    # -- Paddle's tensors ----------------------------------------------------------------
    def describe(self, value: Tensor) -> tuple[tuple[int, ...], str, str]:
        return tuple(value.shape), dtype_name(value.dtype), device_name(value.place)

    def copy(self, value: Tensor) -> Tensor:
        return snapshot(value)

    def memory(self, value: Tensor) -> int | None:
        return allocation(value) or None  # views of one tensor share it; 0: no allocation

    def constant(self, value: Tensor) -> Tensor:
        """A tensor from outside the trace: its value as it is now (one copy while unchanged)."""
        version = _version(value)
        cached = self.constants.get(id(value))
        if cached is not None and cached[0]() is value and cached[1] == version:
            return cached[2]
        copy = snapshot(value)
        self.constants[id(value)] = (weakref.ref(value), version, copy)
        return copy

    def protect(self, target: Tensor) -> None:
        """Before ``target`` is written. A view of a parameter (conv and norm layers reshape theirs) is
        protected as the parameter, whose allocation it shares: the parameter keeps its value from before."""
        if self.param_allocations and id(target) not in self.param_names:
            name = self.param_allocations.get(allocation(target))
            if name is not None:
                target = self.params[name]
        super().protect(target)

    # -- the hot path ------------------------------------------------------------------
    def run(self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one intercepted call and record it."""
        self.depth += 1
        try:
            if info.compiled:
                raise UnsupportedError(
                    f"the model ran a compiled program ({info.name}, from paddle.jit.to_static): its ops "
                    "cannot be seen one by one. Trace the dynamic-graph Layer or function without to_static."
                )
            written = info.written(args, kwargs)
            targets = []
            for where in written:
                t = args[where] if isinstance(where, int) else kwargs[where]
                if isinstance(t, Tensor):
                    self.protect(t)
                    targets.append(t)
            # The call as it is about to run: tensors from outside the trace are copied
            # before the op can write into them.
            a, k, parents, params = self.call_template(args, kwargs)
            meta = {"rng_state": paddle.get_rng_state()} if info.random else {}
            start = perf_counter()
            out = info.call(*args, **kwargs)
            elapsed = perf_counter() - start
            return self._record(info, a, k, parents, params, out, targets, written, meta, elapsed)
        except TorchLensError as exc:  # _capture raises it, also if the model caught it
            self.remember(exc)
            raise
        finally:
            self.depth -= 1

    def _record(
        self,
        info: OpInfo,
        a: tuple[Any, ...],
        k: dict[str, Any],
        parents: tuple[int, ...],
        params: tuple[str, ...],
        out: Any,
        targets: list[Tensor],
        written: Any,
        meta: dict[str, Any],
        elapsed: float,
    ) -> Any:
        """Record one call that returned ``out``; returns what the forward gets back (``out``, or its edit)."""
        result = out
        leaves = None  # an op of several outputs: its tensors, by path
        shape = dtype = device = None  # one tensor: described by record()
        if not isinstance(out, Tensor):
            if out is None and targets:  # __setitem__ and friends return None but wrote into a tensor
                out = targets[0]
            else:
                if not isinstance(out, (tuple, list)):
                    return result
                if info.scratch:
                    out = drop_scratch(out, info.scratch)
                flat = all([v is None or isinstance(v, Tensor) for v in out])  # the usual tuple of tensors and Nones
                leaves = (
                    [((i,), v) for i, v in enumerate(out) if v is not None]
                    if flat
                    else list(tree.leaves(out, _is_tensor))
                )
                if not leaves:
                    return result
                shape = tuple([tuple(v.shape) if isinstance(v, Tensor) else None for v in out])
                first = leaves[0][1]
                dtype, device = dtype_name(first.dtype), device_name(first.place)
        if written:
            meta["writes"] = tuple(written)
        if info.scratch:
            meta["scratch"] = info.scratch
        if info.undefined and isinstance(out, Tensor):
            # uninitialized memory: replay gives back the value that ran, kept here (not only in
            # op.out, which save= may drop)
            meta["undefined"] = snapshot(out)
        seen = self.record(
            info.name,
            info.call,
            a,
            k,
            parents,
            params,
            out,
            written=tuple(targets),
            shape=shape,
            dtype=dtype,
            device=device,
            random=info.random,
            code_context=self.sites.stack(skip=2),  # (this frame and run()'s: ours, not looked at)
            meta=meta,
            elapsed=elapsed,
            conditions=self.branches.current(),
        )
        if leaves is None:
            return result if seen is out else seen
        index = self.builder.ops[-1].index  # the op record() just added
        # Replay checks an op's output shape against the recorded one only for ops of one output; an
        # op of several may have shapes decided by values (paddle.unique), which the forward may read
        # (u.shape[0]) into ops of fixed shapes: each output's shape is reported as read.
        for path, t in leaves:
            self.builder.to_python(index, path, "shape", [int(d) for d in t.shape])
        if not flat:  # record() linked the outputs at the top; these are nested deeper (a list of states)
            for path, t in tree.leaves(seen, _is_tensor):
                if len(path) > 1:
                    self.produced(t, Ref(index, path))
        return result if seen is out else _merged(result, seen, info.scratch)

    # -- conversions into Python values ------------------------------------------------------
    def decide(self, orig: Any, how: str, exact: bool, t: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``t`` turned into a Python value (``bool(t)``, ``t.item()``...): maybe the test of a branch.

        The recorded graph holds the result as fixed, so it is reported to the
        builder as conversion ``how`` (see ``intercept.DECIDING``), which replay
        on new inputs repeats on the replayed value and compares.
        """
        ref = self.producer(t)
        if ref is not None and self.written_since(t, ref.index):
            t = self._read_now(t)  # written through another view since its op ran: read as it is now
            ref = self.producer(t)
        if ref is not None:
            self.branches.condition(ref.index)
        with self.paused():  # what the conversion calls inside (numpy(), astype) is part of it, not an op
            result = orig(t, *args, **kwargs)
            if ref is not None:
                if exact and not args:
                    self.report(ref.index, ref.path, how, result)
                else:
                    self._converted(ref, how, t, result)
        return result

    def _read_now(self, t: Tensor) -> Tensor:
        """A recorded copy of ``t`` as it is now, for the conversion to read.

        Replay checks a converted value where its op computed it, before the
        write that changed it since; the copy is an op of its own, after the
        write, so replay computes (and checks) the value that was read. It is
        what the conversion reads, an edit of it included.
        """
        return self.run(_READ_NOW, (t,), {})

    def _converted(self, ref: Ref, how: str, t: Tensor, result: Any) -> None:
        """Report op ``ref``'s value ``t`` as conversion ``how``, where the method's result is not what ``how``
        gives (a NumPy array, ``complex(t)``, ``t.item(i)`` with an index).

        ``t`` is converted that way here: ``tolist`` checks every element,
        ``item`` the one there is. A tensor too large to keep as a list is
        reported with the array itself, which the builder does not keep:
        replay on new inputs then refuses.
        """
        numel = math.prod(t.shape)
        if how == "item" and numel != 1:  # t.item(i): the element is one of them
            how = "tolist"
        if (ref.index, ref.path, how) in self.reported:  # a value converts alike each time: once is enough
            return
        if how == "tolist":
            result = t.tolist() if numel <= _LARGEST_LIST else result
        else:
            result = t.item()
        self.report(ref.index, ref.path, how, result)

    # -- tensors sharing data ----------------------------------------------------------------
    def alias(self, t: Tensor, out: Any) -> None:
        """``out`` holds ``t``'s data under another Tensor object (intercept.ALIASING): it is the same op's value."""
        ref = self.producer(t)
        if ref is not None and isinstance(out, Tensor) and out is not t:
            self.producers[id(out)] = (weakref.ref(out), ref)

    def before_share(self, dst: Tensor) -> None:
        """``dst`` is about to take another tensor's data (intercept.SHARING): a parameter or buffer keeps its
        value from before, for replay to start from."""
        if isinstance(dst, Tensor):
            self.protect(dst)

    def shared(self, src: Tensor, dst: Tensor) -> None:
        """``dst`` now holds ``src``'s data (intercept.SHARING): later reads of ``dst`` read ``src``'s op."""
        if not isinstance(dst, Tensor) or dst is src:
            return
        ref = self.producer(src)
        if ref is not None:
            self.produced(dst, ref, alias=True)
            return
        self.producers.pop(id(dst), None)  # no recorded value: read from now on as what it holds
        name = self.param_names.get(id(dst))
        if name is not None:
            raise self.remember(
                UnsupportedError(  # _capture raises it, also if the model caught it
                    f"parameter {name!r} was given the data of a tensor from outside the trace "
                    f"(Tensor._share_underline_tensor_to) during the forward, which replay cannot repeat: set the "
                    f"parameter before tracing"
                )
            )

    # -- layer calls ---------------------------------------------------------------------
    # layer_calls' __call__ replacement calls this for the model's own layers, in the capturing thread.
    def call_layer(self, path: str, call: Any, layer: Any, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``call(layer, *inputs, **kwargs)`` (``Layer.__call__``, the layer's hooks included) as pass ``path``.

        The pass opens before the layer's pre-hooks run and closes after its
        post-hooks, where a prepended pre-hook and a last post-hook of ours would
        sit; what it returns is what the model gets back (intervene= may edit it).
        """
        self.enter_pass(path)
        self.sites.enter(path, sys._getframe())  # this frame is above every frame the layer's call runs
        try:
            output = call(layer, *inputs, **kwargs)
        finally:
            self.sites.exit(path)
        return self.exit_pass(path, output)


def _refuse_unsupported(model: Any, layers: list[tuple[str, Any]]) -> None:
    """Raise UnsupportedError for what cannot be captured op by op."""
    if amp_casting():  # auto_cast around tl.trace; one entered inside the forward is refused by intercept's guard
        raise amp_refusal("around tl.trace")
    from paddle.jit import TranslatedLayer
    from paddle.jit.dy2static.program_translator import StaticFunction

    if not paddle.in_dynamic_mode():
        raise UnsupportedError(
            "Paddle is in static-graph mode (paddle.enable_static()): there is no forward to watch op by op. "
            "Call paddle.disable_static() and trace the dynamic-graph Layer or function."
        )
    if isinstance(model, TranslatedLayer):
        raise UnsupportedError(
            "a TranslatedLayer (paddle.jit.load) runs a saved static program, whose ops cannot "
            "be seen one by one: trace the original dynamic-graph Layer instead"
        )
    if (isinstance(model, StaticFunction) and to_static_enabled(model)) or isinstance(
        getattr(model, "__func__", None), StaticFunction
    ):
        raise UnsupportedError(
            "paddle.jit.to_static functions run as compiled programs, whose ops cannot be seen "
            "one by one: trace the undecorated function (or its .dygraph_function)"
        )
    for path, layer in layers:
        forward = layer.__dict__.get("forward") or getattr(type(layer), "forward", None)
        if isinstance(forward, StaticFunction) and to_static_enabled(forward):
            where = f"sublayer {path!r}" if path else "the model"
            raise UnsupportedError(
                f"{where} was converted with paddle.jit.to_static, which runs a compiled program whose ops "
                "cannot be seen one by one: trace the dynamic-graph Layer (without to_static)"
            )
    if not callable(model):
        raise UnsupportedError(
            f"the paddle backend traces paddle.nn.Layer models and Python functions using Paddle, "
            f"not {type(model).__name__} objects"
        )


def _declare(
    builder: TraceBuilder, layers: list[tuple[str, Any]], param_names: dict[int, str], params: dict[str, Tensor]
) -> None:
    """Declare the model's layers, parameters and buffers before the forward.

    ``layers`` is ``[("", model), *model.named_sublayers()]``; names and order
    are those of ``named_parameters()`` / ``named_buffers()``, shared ones once.
    """
    for is_buffer in (False, True):  # every parameter first, then every buffer, as named_parameters() and
        # named_buffers() list them
        for path, layer in layers:
            for key, value in (layer._buffers if is_buffer else layer._parameters).items():
                if not isinstance(value, Tensor) or id(value) in param_names:  # (None: a slot left empty)
                    continue
                name = f"{path}.{key}" if path else key
                shape = tuple(value.shape)
                builder.add_param(
                    ParamRecord(
                        name=name,
                        shape=shape,
                        dtype=dtype_name(value.dtype),
                        numel=math.prod(shape),
                        trainable=not is_buffer and not value.stop_gradient,
                        module=path,
                        is_buffer=is_buffer,
                        value=value,
                    )
                )
                param_names[id(value)] = name
                params[name] = value
    for path, layer in layers[1:]:
        builder.add_module(path, type(layer).__name__)  # its parameters: listed by the builder at the end


def _defining_modules(model: Any, layers: list[tuple[str, Any]]) -> list[Any]:
    """The modules defining the model's classes (or the function): searched for C ops bound there."""
    names = {type(layer).__module__ for _, layer in layers}
    if isinstance(model, paddle.nn.Layer):
        names.add(type(model).__module__)
    else:
        names.add(getattr(model, "__module__", None) or "")
    return [sys.modules[n] for n in sorted(names) if n in sys.modules and not n.startswith("paddle")]


# The wrappers report to one recorder (intercept.STATE): a second capture, nested or in another
# thread, is refused before it installs anything.
_ONE_AT_A_TIME = OneCaptureAtATime("paddle")


def capture(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None
) -> Trace | Recording:
    """Run ``model(*args, **kwargs)`` once with every Paddle op recorded; return its Trace."""
    is_layer = isinstance(model, paddle.nn.Layer)
    layers = [("", model), *model.named_sublayers()] if is_layer else []
    _refuse_unsupported(model, layers)
    with _ONE_AT_A_TIME.claim():
        return _capture(model, layers, is_layer, args, kwargs, options)


def _capture(
    model: Any,
    layers: list[tuple[str, Any]],
    is_layer: bool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: CaptureOptions | None,
) -> Trace | Recording:
    builder = TraceBuilder(
        "paddle", type(model).__name__ if is_layer else getattr(model, "__name__", "function"), options
    )
    builder.notes["framework"] = f"paddlepaddle {paddle.__version__}"
    param_names: dict[int, str] = {}
    params: dict[str, Tensor] = {}
    _declare(builder, layers, param_names, params)
    recorder = Recorder(builder, param_names, params)
    for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor)):
        if recorder.producer(leaf) is None and id(leaf) not in param_names:
            op = builder.add_input(
                leaf, shape=tuple(leaf.shape), dtype=dtype_name(leaf.dtype), device=device_name(leaf.place)
            )
            recorder.produced(leaf, Ref(op.index))
    recorder.layers = {id(layer): (layer, path) for path, layer in layers[1:]}
    patches = Patches()
    layer_calls = LayerCalls()
    try:
        layer_calls.install(layers[1:])
        patches.install(_defining_modules(model, layers))
        STATE.recorder = recorder
        with spliced(layers[1:], builder):  # tl.splice_module: the layers it names run the replacement
            output = model(*args, **kwargs)
    finally:
        STATE.recorder = None
        recorder.branches.close()
        try:
            patches.restore()
        finally:
            layer_calls.restore()
    recorder.raise_remembered()  # the model caught an error of a recorded call and went on
    builder.add_outputs(*recorder.returned(output, None))
    recorder.check_versions()
    return builder.finish()


def compat_rows(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """tl.compat.report's rows: the capture's own refusals (static mode, to_static, TranslatedLayer)."""
    from torchlens_core.views.compat import refusal_row

    layers = [("", model), *model.named_sublayers()] if isinstance(model, paddle.nn.Layer) else []
    return [
        refusal_row(
            "wrapper",
            type(model).__name__,
            lambda: _refuse_unsupported(model, layers),
            "a dynamic-graph Layer or function: recorded as it runs, one capture at a time per process",
        )
    ]
