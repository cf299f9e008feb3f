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
from threading import get_ident
from time import perf_counter
from typing import Any

import numpy as np
import paddle

from torchlens_core.capture.branches import BranchTracker
from torchlens_core.capture.builder import TraceBuilder, returned
from torchlens_core.capture.edits import PassThroughs
from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.capture.sites import CallSites, PassSites
from torchlens_core.capture.threads import OneCaptureAtATime
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, UnsupportedError
from torchlens_core.ir.records import OpRecord, ParamRecord, ParamRef, Ref
from torchlens_core.ir.trace import Trace
from torchlens_paddle.arrays import allocation, device_name, dtype_name, snapshot
from torchlens_paddle.intercept import STATE, OpInfo, Patches, amp_casting, amp_refusal, to_static_enabled
from torchlens_paddle.layer_calls import LayerCalls
from torchlens_paddle.splice import spliced

Tensor = paddle.Tensor
_version = Tensor.__dict__["_inplace_version"]
_clone = Tensor.__dict__["clone"]
# The copy a conversion reads when the value was written since its op ran (see Recorder._read_now).
_READ_NOW = OpInfo("clone", getattr(_clone, "__wrapped__", _clone))


# Paddle and the TorchLens packages are never the user's code site.
_SITES = CallSites(paddle.__file__, __file__, tree.__file__)


# Arguments taken into an op's template as they are (sizes, flags, names): the common case, checked first.
_PLAIN = frozenset({int, float, bool, str, type(None)})

# A converted tensor with more elements than this is not turned into a list to report it: the
# builder keeps no larger one (TraceBuilder.to_python), so replay on new inputs refuses it anyway.
_LARGEST_LIST = 4096



def drop_scratch(out: Any, scratch: tuple[int, ...]) -> Any:
    """``out`` with the outputs at ``scratch`` (backward-only, maybe uninitialized) replaced by None."""
    return type(out)(None if i in scratch else v for i, v in enumerate(out))


def _is_tensor(value: Any) -> bool:
    return isinstance(value, Tensor)


def _tensor_leaves(out: tuple[Any, ...] | list[Any]) -> list[tuple[tuple[Any, ...], Tensor]]:
    """``tree.leaves(out)``'s tensors: for the usual flat tuple of tensors and Nones, without the generic walk."""
    if all(v is None or isinstance(v, Tensor) for v in out):
        return [((i,), v) for i, v in enumerate(out) if v is not None]
    return list(tree.leaves(out, _is_tensor))


def _merged(result: Any, edited: Any, scratch: tuple[int, ...]) -> Any:
    """What an op of several outputs returns to the model after an edit: ``edited``, scratch outputs put back."""
    if not scratch:
        return edited
    return type(result)(v if i in scratch else edited[i] for i, v in enumerate(result))


def _replace(obj: Any, path: tuple[Any, ...], new: Any) -> Any:
    """``obj`` with the leaf at ``path`` replaced by ``new``."""
    if not path:
        return new
    kids = tree.children(obj)
    assert kids is not None
    return tree.rebuild(obj, [_replace(v, path[1:], new) if k == path[0] else v for k, v in kids])


class Recorder:
    """Records every intercepted call of one forward into a TraceBuilder."""

    def __init__(self, builder: TraceBuilder, param_names: dict[int, str], params: dict[str, Tensor]) -> None:
        self.builder = builder
        self.param_names = param_names
        # allocation -> parameter name, so that a write through a view of a parameter is seen
        self.param_allocations = {allocation(p): name for name, p in params.items()}
        self.param_allocations.pop(0, None)
        self.params = params
        self.depth = 0  # > 0 while a recorded call (or the recorder itself) runs
        self.thread = get_ident()
        # id(tensor) -> (weakref, op index, path in that op's output). The weakref
        # guards against a freed tensor's id being reused by another tensor.
        self.producers: dict[int, tuple[weakref.ref[Tensor], int, tuple[Any, ...]]] = {}
        self.pass_throughs = PassThroughs(self.producers, builder.ops)
        # allocation -> recorded (op index, path) living there, for copy-before-write. Entries
        # name ops, not tensors: a value save= drops is then really freed (its entries are
        # skipped, as op.out is None).
        self.storages: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
        # (op index, path, id(tensor), _inplace_version() when recorded), for the tripwire
        self.versions: list[tuple[int, tuple[Any, ...], int, int]] = []
        # allocation -> ops whose value before an edit (op.pre_edit) lives there, copied before a write too
        self.pre_edits: dict[int, list[int]] = {}
        self.snapshots: set[tuple[int, tuple[Any, ...]]] = set()  # values already copied before a write
        # id(tensor from outside the trace) -> (weakref, version, its copy)
        self.constants: dict[int, tuple[weakref.ref[Tensor], int, Tensor]] = {}
        self.params_before_write: dict[str, Tensor] = {}
        self.branches = BranchTracker(_SITES.internal)
        self.sites = PassSites(_SITES)  # each op's call-site walk ends at its layer call (call_layer's frame)
        # allocation -> index of the op that last wrote into it (it had not been recorded yet), for conversions
        self.written_at: dict[int, int] = {}
        self.reported: set[tuple[Any, ...]] = set()  # conversions reported: ((op index, path), how, with args)
        # id(layer) -> (layer, path) for the model's sublayers, whose calls are module passes (call_layer)
        self.layers: dict[int, tuple[Any, str]] = {}
        self.failure: TorchLensError | None = None  # the first error a recorded call raised

    # -- the hot path ------------------------------------------------------------------
    def run(self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one intercepted call and record it."""
        self.depth += 1
        try:
            if info.compiled:
                raise UnsupportedError(
                    f"the model ran a compiled program ({info.name}, from paddle.jit.to_static): its ops "
                    "cannot be seen one by one. Trace the dynamic-graph Layer or function without to_static.")
            written = info.written(args, kwargs)
            targets = []
            for where in written:
                t = args[where] if isinstance(where, int) else kwargs[where]
                if isinstance(t, Tensor):
                    self._protect(t)
                    targets.append(t)
            # The call as it is about to run: tensors from outside the trace are copied
            # before the op can write into them.
            parents: list[int] = []
            params: list[str] = []
            a = self._template(args, parents, params)
            k = self._template(kwargs, parents, params) if kwargs else {}
            meta = {"rng_state": paddle.get_rng_state()} if info.random else {}
            start = perf_counter()
            out = info.call(*args, **kwargs)
            elapsed = perf_counter() - start
            return self._record(info, a, k, parents, params, out, targets, written, meta, elapsed)
        except TorchLensError as exc:  # _capture raises it, also if the model caught it
            self.failure = self.failure or exc
            raise
        finally:
            self.depth -= 1

    def decide(self, orig: Any, how: str, exact: bool, t: Tensor, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Any:
        """``t`` turned into a Python value (``bool(t)``, ``t.item()``...): maybe the test of a branch.

        The recorded graph holds the result as fixed, so it is reported to the
        builder as conversion ``how`` (see ``intercept.DECIDING``), which replay
        on new inputs repeats on the replayed value and compares.
        """
        found = self.producer(t)
        if found is not None and self._written_since(t, found[0]):
            t = self._read_now(t)  # written through another view since its op ran: read as it is now
            found = self.producer(t)
        if found is not None:
            self.branches.condition(found[0])
        self.depth += 1  # what the conversion calls inside (numpy(), astype) is part of it, not an op
        try:
            result = orig(t, *args, **kwargs)
            if found is not None and (found, how, bool(args)) not in self.reported:
                self.reported.add((found, how, bool(args)))  # a value converts alike each time: once is enough
                self._converted(found, how, exact and not args, t, result)
            return result
        finally:
            self.depth -= 1

    def _written_since(self, t: Tensor, index: int) -> bool:
        """Was ``t``'s memory written after op ``index`` made it (through another view: its own write moves it)?"""
        written = self.written_at.get(allocation(t)) if self.written_at else None
        return written is not None and written > index

    def _read_now(self, t: Tensor) -> Tensor:
        """A recorded copy of ``t`` as it is now, for the conversion to read.

        Replay checks a converted value where its op computed it, before the
        write that changed it since; the copy is an op of its own, after the
        write, so replay computes (and checks) the value that was read. It is
        what the conversion reads, an edit of it included.
        """
        return self.run(_READ_NOW, (t,), {})

    def _converted(self, found: tuple[int, tuple[Any, ...]], how: str, exact: bool, t: Tensor, result: Any) -> None:
        """Report that op ``found``'s value ``t`` became ``result``, as the conversion ``how`` replay repeats.

        Where the method's result is not what ``how`` gives (a NumPy array,
        ``complex(t)``, ``t.item(i)`` with an index), ``t`` is converted that way
        here: ``tolist`` checks every element, ``item`` the one there is. A
        tensor too large to keep as a list is reported with the array itself,
        which the builder does not keep: replay on new inputs then refuses.
        """
        if not exact:
            if how == "item" and math.prod(t.shape) != 1:  # t.item(i): the element is one of them
                how = "tolist"
            if how == "tolist":
                result = t.tolist() if math.prod(t.shape) <= _LARGEST_LIST else result
            else:
                result = t.item()
        self.builder.to_python(found[0], found[1], how, result)

    def alias(self, t: Tensor, out: Any) -> None:
        """``out`` holds ``t``'s data under another Tensor object (intercept.ALIASING): it is the same op's value."""
        found = self.producer(t)
        if found is not None and isinstance(out, Tensor) and out is not t:
            self.producers[id(out)] = (weakref.ref(out), *found)

    def before_share(self, dst: Tensor) -> None:
        """``dst`` is about to take another tensor's data (intercept.SHARING): a parameter or buffer keeps its
        value from before, for replay to start from."""
        if isinstance(dst, Tensor):
            self._protect(dst)

    def shared(self, src: Tensor, dst: Tensor) -> None:
        """``dst`` now holds ``src``'s data (intercept.SHARING): later reads of ``dst`` read ``src``'s op."""
        if not isinstance(dst, Tensor) or dst is src:
            return
        found = self.producer(src)
        if found is not None:
            self._produced(dst, found[0], found[1], alias=True)
            return
        self.producers.pop(id(dst), None)  # no recorded value: read from now on as what it holds
        name = self.param_names.get(id(dst))
        if name is not None:
            exc = UnsupportedError(
                f"parameter {name!r} was given the data of a tensor from outside the trace "
                f"(Tensor._share_underline_tensor_to) during the forward, which replay cannot repeat: set the "
                f"parameter before tracing")
            self.failure = self.failure or exc  # _capture raises it, also if the model caught it
            raise exc

    def _record(self, info: OpInfo, a: tuple[Any, ...], k: dict[str, Any], parents: list[int], params: list[str],
                out: Any, targets: list[Tensor], written: Any, meta: dict[str, Any], elapsed: float) -> Any:
        """Record one call that returned ``out``; returns what the forward gets back (``out``, or its edit)."""
        result = out
        if isinstance(out, Tensor):
            shape, dtype, device = tuple(out.shape), dtype_name(out.dtype), device_name(out.place)
            leaves = None
        else:
            if out is None and targets:  # __setitem__ and friends return None but wrote into a tensor
                out = targets[0]
                shape, dtype, device = tuple(out.shape), dtype_name(out.dtype), device_name(out.place)
                leaves = None
            else:
                if not isinstance(out, (tuple, list)):
                    return result
                if info.scratch:
                    out = drop_scratch(out, info.scratch)
                leaves = _tensor_leaves(out)
                if not leaves:
                    return result
                shape = tuple(tuple(v.shape) if isinstance(v, Tensor) else None for v in out)
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
        op = self.builder.add_op(
            info.name, info.call, a, k, tuple(dict.fromkeys(parents)), out, shape=shape, dtype=dtype,
            device=device, params=tuple(dict.fromkeys(params)), random=info.random, in_place=bool(targets),
            code_context=self.sites.stack(), meta=meta, elapsed=elapsed, conditions=self.branches.current())
        if leaves is not None:
            # Replay checks an op's output shape against the recorded one only for ops of one output; an
            # op of several may have shapes decided by values (paddle.unique), which the forward may read
            # (u.shape[0]) into ops of fixed shapes: each output's shape is reported as read.
            for path, t in leaves:
                self.builder.to_python(op.index, path, "shape", [int(d) for d in t.shape])
        if self.builder.editor is not None:  # intervene=: later ops see (and link to) the edited value
            seen = self.builder.seen_value(op, out)  # an in-place op's edit is written into `out` itself
            if seen is not out:
                result = seen if leaves is None else _merged(result, seen, info.scratch)
                out = seen
                leaves = None if leaves is None else list(tree.leaves(out, _is_tensor))
                self._keep_pre_edit(op)
        if leaves is None:
            self._produced(out, op.index, ())
        else:
            for path, t in leaves:
                self._produced(t, op.index, path)
        for t in targets:  # the written tensor is, from now on, this op's output
            if t is out:
                continue
            if leaves is None:
                self._produced(t, op.index, (), alias=True)
                continue
            # An op of several outputs writing in place (batch norm's running statistics): the written
            # tensor is the output living in its allocation (mean_out, variance_out), which later reads
            # of it (a reused BatchNorm, model code reading ``bn._mean``) then name.
            key = allocation(t)
            path = next((p for p, v in leaves if key and allocation(v) == key), None)
            if path is not None:
                self._produced(t, op.index, path, alias=True)
        return result

    def _produced(self, t: Tensor, index: int, path: tuple[Any, ...], alias: bool = False) -> None:
        """Note that ``t`` is the value of op ``index`` at ``path``.

        ``alias``: ``t`` is not itself in ``op.out`` (a tensor written by an op
        that returned another object): it is looked up as that op's output, but
        its version is not the recorded value's.
        """
        self.producers[id(t)] = (weakref.ref(t), index, path)
        if not self.builder.ops[index].saved:  # dropped by save= already: nothing to protect
            return
        key = allocation(t)
        if key:
            self.storages.setdefault(key, []).append((index, path))
            if not alias:
                self.versions.append((index, path, id(t), _version(t)))

    def producer(self, t: Tensor) -> tuple[int, tuple[Any, ...]] | None:
        """(op index, path) of the recorded value ``t`` is, or None (the weakref guards against id reuse)."""
        found = self.producers.get(id(t))
        if found is None or found[0]() is not t:
            return None
        return found[1], found[2]

    def _template(self, x: Any, parents: list[int], params: list[str]) -> Any:
        if type(x) in _PLAIN:
            return x
        if isinstance(x, Tensor):
            # A parameter written in place during the forward is, from then on,
            # the output of the op that wrote it: look producers up first.
            found = self.producer(x)
            if found is not None:
                parents.append(found[0])
                return Ref(*found)
            name = self.param_names.get(id(x))
            if name is not None:
                params.append(name)
                return ParamRef(name)
            return self._constant(x)
        t = type(x)
        if t is tuple or t is list:  # the arguments, sizes, lists of tensors: their plain items taken as they are
            return t([v if type(v) in _PLAIN else self._template(v, parents, params) for v in x]) if x else x
        if t is dict:
            return {key: self._template(v, parents, params) for key, v in x.items()}
        if t is np.ndarray:
            return x.copy()
        return x

    def _constant(self, x: Tensor) -> Tensor:
        """A tensor from outside the trace: its value as it is now (one copy while unchanged)."""
        if self.pass_throughs.unedited:
            self.pass_throughs.check_read(x)
        version = _version(x)
        cached = self.constants.get(id(x))
        if cached is not None and cached[0]() is x and cached[1] == version:
            return cached[2]
        copy = snapshot(x)
        self.constants[id(x)] = (weakref.ref(x), version, copy)
        return copy

    def _protect(self, target: Tensor) -> None:
        """Copy every recorded value living in ``target``'s allocation, before it is written.

        A parameter or buffer written for the first time keeps its value from
        before the forward in its ParamRecord, which is what replay starts from.
        """
        key = allocation(target)
        if key:  # what a conversion reads there from now on is not what ops recorded before this one
            self.written_at[key] = len(self.builder.ops)
        name = self.param_names.get(id(target)) or self.param_allocations.get(key)
        if name is not None and name not in self.params_before_write:
            self.params_before_write[name] = snapshot(self.params[name])
            self.builder.params[name].value = self.params_before_write[name]
        if not key:
            return
        if self.pre_edits:
            self._protect_pre_edits(key)
        entries = self.storages.pop(key, None)
        if not entries:
            return
        ops = self.builder.ops
        snapshots = self.snapshots
        for index, path in entries:
            op = ops[index]
            if op.out is None or (index, path) in snapshots:  # dropped by save=, or copied already
                continue
            value = tree.get(op.out, path)
            if isinstance(value, Tensor):
                op.out = _replace(op.out, path, snapshot(value))
            snapshots.add((index, path))

    # -- interventions -------------------------------------------------------------------
    def _keep_pre_edit(self, op: OpRecord) -> None:
        """Note where ``op.pre_edit`` lives, so that a later write there (through a view) copies it first.

        The model never sees the value before an edit, but it may hold
        another view of the same memory (the edited op was a reshape or a
        slice of a tensor it keeps).
        """
        if op.pre_edit is None:
            return
        for _, t in tree.leaves(op.pre_edit, lambda v: isinstance(v, Tensor)):
            key = allocation(t)
            if key:
                self.pre_edits.setdefault(key, []).append(op.index)

    def _protect_pre_edits(self, key: int) -> None:
        for index in self.pre_edits.pop(key, ()):
            op = self.builder.ops[index]
            if op.pre_edit is not None:
                op.pre_edit = tree.map_leaves(
                    lambda v: snapshot(v) if isinstance(v, Tensor) and allocation(v) == key else v, op.pre_edit)

    def _edit_output(self, path: str, template: Any, output: Any) -> tuple[Any, Any]:
        """What layer call ``path`` returns to the model after intervene=, and its template (see call_layer)."""
        self.depth += 1  # the helpers' own Paddle calls are not the model's ops
        try:
            edited, template = self.builder.edit_module_output(path, template, output)
        finally:
            self.depth -= 1
        if edited is not output:
            for leaf_path, ref in tree.leaves(template, lambda v: isinstance(v, Ref)):
                leaf, original = tree.get(edited, leaf_path), tree.get(output, leaf_path)
                if leaf is not original:  # a new tensor: later ops read it as ref's value
                    self._produced(leaf, ref.index, ref.path)
                    self._keep_pre_edit(self.builder.ops[ref.index])
                    self.pass_throughs.replaced(original, ref.index)
        return edited, template

    # -- layer calls ---------------------------------------------------------------------
    # layer_calls' __call__ replacement calls this for the model's own layers, in the capturing thread.
    def call_layer(self, path: str, call: Any, layer: Any, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``call(layer, *inputs, **kwargs)`` (``Layer.__call__``, the layer's hooks included) as pass ``path``.

        The pass opens before the layer's pre-hooks run and closes after its
        post-hooks, where a prepended pre-hook and a last post-hook of ours would
        sit; what it returns is what the model gets back (intervene= may edit it).
        """
        builder = self.builder
        builder.enter_module(path)
        self.sites.enter(path, sys._getframe())  # this frame is above every frame the layer's call runs
        try:
            output = call(layer, *inputs, **kwargs)
        finally:
            self.sites.exit(path)
        current = builder.module_stack[-1] if builder.module_stack else None
        try:
            if isinstance(output, Tensor):  # the usual one tensor: what returned() gives for a leaf, without its walk
                template, edit = self._as_output(output, current)
                edited = output if edit is None else edit
            else:
                template, edited = self.returned(output, current)
            if builder.editor is not None:  # intervene=: the layer's output may be edited, as a post-hook would
                edited, template = self._edit_output(path, template, edited)
        except TorchLensError as exc:  # _capture raises it, also if the model caught it
            self.failure = self.failure or exc
            raise
        builder.exit_module(path, template)
        return edited

    def returned(self, output: Any, inside: tuple[str, int] | None) -> tuple[Any, Any]:
        """Refs to what layer pass ``inside`` (None: the model) returned, and what the forward gets back."""
        return returned(output, lambda v: isinstance(v, Tensor), lambda v: self._as_output(v, inside))

    def _as_output(self, value: Tensor, inside: tuple[str, int] | None) -> tuple[Ref, Tensor | None]:
        """A Ref to ``value`` as returned by layer pass ``inside``, and what intervene= made of it (None: nothing)."""
        self.depth += 1  # intervene= helpers may run here (on an identity op): their calls are not the model's ops
        try:
            parents: list[int] = []
            ref = self._template(value, parents, [])
            if parents and (inside is None or inside in self.builder.ops[ref.index].module_passes):
                return ref, None
            # Returned, not computed, here (nn.Identity, a parameter, a constant): an
            # explicit pass-through op keeps "every returned array is an op's output"
            # and "layer outputs are computed inside the layer" true.
            op = self.builder.identity_op(ref, value, shape=tuple(value.shape), dtype=dtype_name(value.dtype),
                                          device=device_name(value.place))
            seen = value if self.builder.editor is None else self.builder.seen_value(op, value)
            if seen is value:  # one object with what the caller may hold: later reads of it read the op
                self.pass_throughs.take(value, op.index)
                self._produced(value, op.index, ())
                return Ref(op.index), None
            self._produced(seen, op.index, ())
            self._keep_pre_edit(op)  # edited: the tensor returned keeps the producer it had
            return Ref(op.index), seen
        finally:
            self.depth -= 1

    # -- after the forward -----------------------------------------------------------------
    def check_versions(self) -> None:
        """Flag any saved value changed in place after recording without a copy being made."""
        ops = self.builder.ops
        snapshots = self.snapshots
        for index, path, tensor_id, version in self.versions:
            op = ops[index]
            if op.out is None or (index, path) in snapshots:  # dropped by save=, or copied before the write
                continue
            value = tree.get(op.out, path)
            if id(value) != tensor_id:  # intervene= replaced it by a new tensor, registered on its own
                continue
            if isinstance(value, Tensor) and _version(value) != version:
                op.meta["mutated_after_recording"] = True


def _refuse_unsupported(model: Any, layers: list[tuple[str, Any]]) -> None:
    """Raise UnsupportedError for what cannot be captured op by op."""
    if amp_casting():  # auto_cast around tl.trace; one entered inside the forward is refused by intercept's guard
        raise amp_refusal("around tl.trace")
    from paddle.jit import TranslatedLayer
    from paddle.jit.dy2static.program_translator import StaticFunction

    if not paddle.in_dynamic_mode():
        raise UnsupportedError(
            "Paddle is in static-graph mode (paddle.enable_static()): there is no forward to watch op by op. "
            "Call paddle.disable_static() and trace the dynamic-graph Layer or function.")
    if isinstance(model, TranslatedLayer):
        raise UnsupportedError("a TranslatedLayer (paddle.jit.load) runs a saved static program, whose ops cannot "
                               "be seen one by one: trace the original dynamic-graph Layer instead")
    if ((isinstance(model, StaticFunction) and to_static_enabled(model))
            or isinstance(getattr(model, "__func__", None), StaticFunction)):
        raise UnsupportedError("paddle.jit.to_static functions run as compiled programs, whose ops cannot be seen "
                               "one by one: trace the undecorated function (or its .dygraph_function)")
    for path, layer in layers:
        forward = layer.__dict__.get("forward") or getattr(type(layer), "forward", None)
        if isinstance(forward, StaticFunction) and to_static_enabled(forward):
            where = f"sublayer {path!r}" if path else "the model"
            raise UnsupportedError(
                f"{where} was converted with paddle.jit.to_static, which runs a compiled program whose ops "
                "cannot be seen one by one: trace the dynamic-graph Layer (without to_static)")
    if not callable(model):
        raise UnsupportedError(f"the paddle backend traces paddle.nn.Layer models and Python functions using Paddle, "
                               f"not {type(model).__name__} objects")


def _declare(builder: TraceBuilder, layers: list[tuple[str, Any]], param_names: dict[int, str],
             params: dict[str, Tensor]) -> None:
    """Declare the model's layers, parameters and buffers before the forward.

    ``layers`` is ``[("", model), *model.named_sublayers()]``; names and order
    are those of ``named_parameters()`` / ``named_buffers()``, shared ones once.
    """
    under: dict[str, list[str]] = {}  # layer path -> every parameter and buffer below it, in declaration order
    ancestors = [_ancestors(path) for path, _ in layers]
    for (path, layer), above in zip(layers, ancestors):
        for key, p in layer._parameters.items():
            if p is None or id(p) in param_names:
                continue
            name = f"{path}.{key}" if path else key
            shape = tuple(p.shape)
            builder.add_param(ParamRecord(name=name, shape=shape, dtype=dtype_name(p.dtype), numel=math.prod(shape),
                                          trainable=not p.stop_gradient, module=path, value=p))
            param_names[id(p)] = name
            params[name] = p
            for ancestor in above:
                under.setdefault(ancestor, []).append(name)
    for (path, layer), above in zip(layers, ancestors):
        for key, b in layer._buffers.items():
            if not isinstance(b, Tensor) or id(b) in param_names:
                continue
            name = f"{path}.{key}" if path else key
            shape = tuple(b.shape)
            builder.add_param(ParamRecord(name=name, shape=shape, dtype=dtype_name(b.dtype), numel=math.prod(shape),
                                          trainable=False, module=path, is_buffer=True, value=b))
            param_names[id(b)] = name
            params[name] = b
            for ancestor in above:
                under.setdefault(ancestor, []).append(name)
    for path, layer in layers[1:]:
        builder.add_module(path, type(layer).__name__, under.get(path, []))


def _ancestors(path: str) -> list[str]:
    """``"a.b.c"`` -> ``["a", "a.b", "a.b.c"]``: the layers a parameter declared by layer ``path`` is below."""
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


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


def capture(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None) -> Trace:
    """Run ``model(*args, **kwargs)`` once with every Paddle op recorded; return its Trace."""
    is_layer = isinstance(model, paddle.nn.Layer)
    layers = [("", model), *model.named_sublayers()] if is_layer else []
    _refuse_unsupported(model, layers)
    with _ONE_AT_A_TIME.claim():
        return _capture(model, layers, is_layer, args, kwargs, options)


def _capture(model: Any, layers: list[tuple[str, Any]], is_layer: bool, args: tuple[Any, ...],
             kwargs: dict[str, Any], options: CaptureOptions | None) -> Trace:
    builder = TraceBuilder("paddle", type(model).__name__ if is_layer else getattr(model, "__name__", "function"),
                           options)
    builder.notes["framework"] = f"paddlepaddle {paddle.__version__}"
    param_names: dict[int, str] = {}
    params: dict[str, Tensor] = {}
    _declare(builder, layers, param_names, params)
    recorder = Recorder(builder, param_names, params)
    for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor)):
        if recorder.producer(leaf) is None and id(leaf) not in param_names:
            op = builder.add_input(leaf, shape=tuple(leaf.shape), dtype=dtype_name(leaf.dtype),
                                   device=device_name(leaf.place))
            recorder._produced(leaf, op.index, ())
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
    if recorder.failure is not None:  # the model caught it and went on: the trace misses that call
        raise recorder.failure
    builder.add_outputs(*recorder.returned(output, None))
    recorder.check_versions()
    return builder.finish()


def compat_rows(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """tl.compat.report's rows: the capture's own refusals (static mode, to_static, TranslatedLayer)."""
    from torchlens_core.views.compat import refusal_row

    layers = [("", model), *model.named_sublayers()] if isinstance(model, paddle.nn.Layer) else []
    return [refusal_row("wrapper", type(model).__name__, lambda: _refuse_unsupported(model, layers),
                        "a dynamic-graph Layer or function: recorded as it runs, one capture at a time per process")]
