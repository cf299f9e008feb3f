"""Capturing an eager TensorFlow / Keras 3 forward.

An eager op callback (``Context.add_op_callback``) sees every TensorFlow
op the forward executes, with its inputs, attributes and real outputs: the ops
Keras runs inside layers included. Each becomes an op record whose ``call`` is
``TFCall(op type, attributes, number of outputs)``, which replay executes
again. An input tensor that an earlier op (or the caller) produced is a
``Ref``; anything else is a constant, kept as the (immutable) tensor it was.

save= and halt=. The builder drops the values save= does not select, and
capture holds no recorded tensor itself, so a dropped value is freed during
the forward: producers are matched by id() and checked with a weakref, and
nothing here reads ``op.out`` after ``add_op``. halt= raises HaltCapture from
``add_op`` (in the op callback) or ``exit_module`` (in the layer wrapper); it
propagates to tl.trace, and nothing is recorded after it.

Variables. An op that takes a variable's resource handle reads the
variable's *state*: a ``ParamRef`` to the variable's value before the forward,
or, once an op of the forward has written the variable, a ``Ref`` to that
write. So ``ReadVariableOp`` is an op (``read_variable``) whose argument is the
parameter, a parameter source in the graph; writes (``assign``,
``assign_add``, ...) are ops whose value is the variable's new value.

Layers. ``keras.layers.Layer.__call__`` is wrapped for the capture
(:mod:`torchlens_tf.layers`): each call of a known layer opens a module pass,
and what it returned closes it (an identity op stands for anything returned
but not computed inside the pass).

``tf.function``. Functions called by the capturing thread run eagerly (their
Python function is called, as ``tf.config.run_functions_eagerly(True)`` would
do, without that process-wide switch), so their ops are recorded one by one
rather than as one opaque function call; the trace's notes list them. A graph
function that cannot run eagerly (a concrete function, a SavedModel
signature) is refused.

Python values. Reading a recorded tensor's value into Python (``bool(t)``,
``t.numpy()``, ``t.shape``...) runs no op; the EagerTensor methods doing it
are replaced for the capture (:mod:`torchlens_tf.conversions`): each read is
reported to the builder (``to_python``), which replay on new inputs checks,
and tells the branch tracker, which marks the ops of the ``if`` or ``while``
body that value decided.

Everything installed (the callback, the layer wrapper, the tf.function
wrapper, the value-reading methods) is removed in a ``finally``, whatever ends
the forward (a halt included).

Threads. The op callback is thread-local in TensorFlow, but the switch that
makes the eager fallback path call callbacks (``execute.execute``) is a module
global, and the wrappers replace class attributes: all of them are shared by
every thread. Each is installed by the first capture that needs it and put
back by the last one out (:class:`~torchlens_core.capture.threads.SharedPatch`),
and each call goes to the Recorder of the thread making it, or straight to the
original in a thread that is not capturing. Captures in several threads at
once are each whole; a capture started inside a captured forward is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import re
import sys
import weakref
from threading import get_ident
from typing import Any

import attrs
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context, execute
from tensorflow.python.framework import op_def_registry
from tensorflow.python.framework.ops import _EagerTensorBase
from tensorflow.python.ops import gen_resource_variable_ops

from torchlens_core.capture.branches import BranchTracker
from torchlens_core.capture.builder import Recording, TraceBuilder
from torchlens_core.capture.policy import CaptureOptions, HaltCapture
from torchlens_core.capture.recorder import Recorder as BaseRecorder
from torchlens_core.capture.sites import CallSites, PassSites
from torchlens_core.capture.threads import SharedPatchUse, shared_patch
from torchlens_core.ir import tree
from torchlens_core.ir.errors import CaptureError, InterventionError, UnsupportedError
from torchlens_core.ir.records import OpRecord, ParamRecord, ParamRef, Ref
from torchlens_core.ir.trace import Trace
from torchlens_tf.arrays import device_name
from torchlens_tf.conversions import patches as value_read_patches
from torchlens_tf.custom_grads import noting_custom_gradients
from torchlens_tf.edits import Handover, gradients_through_edits
from torchlens_tf.layers import (
    LayerCalls,
    ModelView,
    VarInfo,
    check_keras_backend,
    is_keras_layer,
    resource_variable,
    unwrap,
    view_model,
)


@attrs.frozen(slots=True)
class TFCall:
    """What replay needs to run an op again: ``quick_execute(op_type, num_outputs, inputs, attrs)``.

    ``kind``: "op" (execute it), "read" (ReadVariableOp: the variable state is
    the value), "variable" (an op on variables: run on temporary variables
    holding the recorded states; ``variables`` are the argument positions
    that were variable handles, ``writes`` those it wrote), "recorded" (a
    stateful random op without replayable state: its recorded value is
    replayed).
    """

    op_type: str
    attrs: tuple[Any, ...]
    num_outputs: int
    kind: str = "op"
    variables: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()


# Op types whose snake-case name would read badly.
_NAMES = {
    "MatMul": "matmul",
    "BatchMatMul": "batch_matmul",
    "BatchMatMulV2": "batch_matmul",
    "BatchMatMulV3": "batch_matmul",
    "AddV2": "add",
    "RealDiv": "div",
    "ReadVariableOp": "read_variable",
    "DepthwiseConv2dNative": "depthwise_conv2d",
    "Conv2DBackpropInput": "conv2d_transpose",
    "Conv3DBackpropInputV2": "conv3d_transpose",
    "FusedBatchNorm": "batch_norm",
    "FusedBatchNormV2": "batch_norm",
    "FusedBatchNormV3": "batch_norm",
    "ConcatV2": "concat",
    "Pack": "stack",
    "Unpack": "unstack",
    "GatherV2": "gather",
    "ResourceGather": "gather",
    "AssignVariableOp": "assign",
    "AssignAddVariableOp": "assign_add",
    "AssignSubVariableOp": "assign_sub",
    "Relu6": "relu6",
    "Conv2D": "conv2d",
    "Conv3D": "conv3d",
    "Conv1D": "conv1d",
    "LeakyRelu": "leaky_relu",
}
_WRITE_PREFIXES = ("Assign", "ResourceScatter", "ResourceApply", "ResourceSparseApply", "ResourceStridedSliceAssign")
_WRITES = frozenset(
    {
        "StatefulUniform",
        "StatefulUniformInt",
        "StatefulUniformFullInt",
        "StatefulStandardNormal",
        "StatefulStandardNormalV2",
        "StatefulTruncatedNormal",
        "StatefulRandomBinomial",
        "RngSkip",
        "RngReadAndSkip",
    }
)
# Random ops whose generator state lives inside the op kernel, out of reach:
# their recorded values are replayed.
_RANDOM_KERNEL_STATE = frozenset(
    {
        "RandomUniform",
        "RandomUniformInt",
        "RandomStandardNormal",
        "TruncatedNormal",
        "ParameterizedTruncatedNormal",
        "Multinomial",
        "RandomShuffle",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomCrop",
        "RandomBinomial",
        "SampleDistortedBoundingBox",
        "SampleDistortedBoundingBoxV2",
        "AllCandidateSampler",
        "UniformCandidateSampler",
        "LogUniformCandidateSampler",
        "LearnedUnigramCandidateSampler",
        "ThreadUnsafeUnigramCandidateSampler",
        "FixedUnigramCandidateSampler",
    }
)
_RANDOM = _RANDOM_KERNEL_STATE | _WRITES - {"RngSkip"}
_STATELESS_RANDOM = ("StatelessRandom", "StatelessTruncated", "StatelessMultinomial", "StatelessParameterized")
# Ops that only create or query resources; they carry no data worth a record.
_SKIP = frozenset(
    {"VarHandleOp", "VarIsInitializedOp", "DestroyResourceOp", "AnonymousSeedGenerator", "DeleteSeedGenerator", "NoOp"}
)


def _snake(op_type: str) -> str:
    name = _NAMES.get(op_type)
    if name is None:
        base = re.sub(r"V\d+$", "", op_type).removesuffix("Op") or op_type  # AddV2 -> add
        # BiasAdd -> bias_add, MaxPool3D -> max_pool3d, LRNGrad -> lrn_grad, L2Loss -> l2_loss
        name = re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z0-9])(?=[A-Z][a-z])", "_", base).lower()
        name = re.sub(r"\W", "_", name) or "op"
    return name


@attrs.define(slots=True)
class _OpInfo:
    func_name: str
    writes: bool
    random: bool
    kernel_state: bool
    skip: bool


_OP_INFO: dict[str, _OpInfo] = {}


def _op_info(op_type: str) -> _OpInfo:
    info = _OP_INFO.get(op_type)
    if info is None:
        if op_def_registry.get(op_type) is None:
            raise UnsupportedError(
                f"a graph function ({op_type}) ran as one opaque op inside the forward. The tf backend "
                f"records eager ops: tf.function code runs eagerly during a capture, but a concrete function, "
                f"a SavedModel signature or a restored function has no Python code to run. Trace the Keras "
                f"model or the Python function it was made from instead."
            )
        info = _OP_INFO[op_type] = _OpInfo(
            func_name=_snake(op_type),
            writes=op_type.startswith(_WRITE_PREFIXES) or op_type in _WRITES,
            random=op_type in _RANDOM or op_type.startswith(_STATELESS_RANDOM),
            kernel_state=op_type in _RANDOM_KERNEL_STATE,
            skip=op_type in _SKIP,
        )
    return info


def _attrs(raw: Any) -> tuple[Any, ...]:
    """The attribute tuple to run the op again with: defaults (None) and repeated names dropped."""
    out: list[Any] = []
    seen: set[str] = set()
    for i in range(0, len(raw), 2):
        name, value = raw[i], raw[i + 1]
        if value is None or name in seen:
            continue
        seen.add(name)
        out += (name, value)
    return tuple(out)


# (op type, attributes as the callback gave them) -> (the attribute tuple, keyword arguments): most ops of a
# forward repeat a few attribute sets. The key holds each value with its type (the same dtype comes as a
# DType or as its enum, the same flag as True or 1, depending on TensorFlow's path), lists as tuples; only
# text, integers, flags, dtypes and lists of them are kept (a float key would take -0.0 for 0.0).
_ATTRS: dict[Any, tuple[tuple[Any, ...], dict[str, Any], bool]] = {}
_MAX_ATTRS = 4096
_KEY_TYPES = frozenset({str, bytes, int, bool, type(None), tf.dtypes.DType})


def _attrs_key(op_type: str, raw: Any) -> Any:
    """The cache key of these attributes, or None when they cannot be one. The types come before the values:
    a key compares no value of one type with a value of another."""
    kinds = tuple(map(type, raw))
    if _KEY_TYPES.issuperset(kinds):
        return op_type, kinds, tuple(raw)
    if list not in kinds:
        return None
    values = []
    for value, kind in zip(raw, kinds):
        if kind is list:
            inner = tuple(map(type, value))
            if not _KEY_TYPES.issuperset(inner):
                return None
            values.append((inner, tuple(value)))
        elif kind in _KEY_TYPES:
            values.append(value)
        else:
            return None
    return op_type, kinds, tuple(values)


def _call_attrs(op_type: str, raw: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The attribute tuple replay runs the op with, and the op's keyword arguments (a new dict each time).

    The attributes are the op's keyword arguments, for op.config and FLOP formulas (replay reads the call).
    """
    key = _attrs_key(op_type, raw)
    found = _ATTRS.get(key) if key is not None else None
    if found is not None:  # copies: each op's call and kwargs have lists of their own, as when made anew
        attrs_t, kwargs, lists = found
        if not lists:
            return attrs_t, kwargs.copy()
        return _fresh(attrs_t), dict(zip(kwargs.keys(), _fresh(kwargs.values())))
    attrs_t = _attrs(raw)
    kwargs = {name: _plain(value) for name, value in zip(attrs_t[::2], attrs_t[1::2])}
    if key is not None:
        if len(_ATTRS) >= _MAX_ATTRS:
            _ATTRS.clear()
        lists = any(type(v) is list for v in attrs_t)
        _ATTRS[key] = (_fresh(attrs_t), dict(zip(kwargs.keys(), _fresh(kwargs.values()))), lists)
    return attrs_t, kwargs


def _fresh(values: Any) -> tuple[Any, ...]:
    return tuple([list(v) if type(v) is list else v for v in values])


def _plain(value: Any) -> Any:
    """An attribute value as a keyword argument: text as str (callbacks give some as bytes), shapes as lists."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, tf.TensorShape):
        return None if value.rank is None else value.as_list()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# The CallSites of the last capture, by the files it treats as internal. Its verdicts on code objects (and
# their CodeLocations) are what the next capture would work out again; a package imported since (tf_keras,
# tensorflow_probability) changes the files, and a new CallSites is made.
_SITES: dict[tuple[str, ...], CallSites] = {}


def _call_sites() -> CallSites:
    """TensorFlow, Keras and TorchLens frames are never the code site of an op."""
    import torchlens

    files = [__file__, torchlens.__file__]
    for name in ("tensorflow", "keras", "tf_keras", "tensorflow_probability"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            files.append(path)
    key = tuple(files)
    sites = _SITES.get(key)
    if sites is None:
        sites = CallSites(*files)
        sites.stop_at(_capture)  # the walk ends at the backend's call of the model, not in pluggy above it
        _SITES.clear()
        _SITES[key] = sites
    return sites


def _is_eager_tensor(x: Any) -> bool:
    return isinstance(x, tf.Tensor) and hasattr(x, "numpy")


# DataType enum -> dtype name: ``t.dtype`` makes a DType object on every read, the enum is a C call.
_DTYPE_NAMES: dict[int, str] = {}


def _dtype_name(t: Any) -> str:
    enum = t._datatype_enum()
    name = _DTYPE_NAMES.get(enum)
    if name is None:
        name = _DTYPE_NAMES[enum] = tf.dtypes.as_dtype(enum).name
    return name


def _info(t: Any) -> tuple[tuple[int, ...], str, str]:
    """(shape, dtype name, device name) of an eager tensor."""
    return t._shape_tuple(), _dtype_name(t), device_name(t.device)


_DT_RESOURCE = tf.resource.as_datatype_enum
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _buffer_address(t: Any) -> int | None:
    """Where a tensor's data lives (through DLPack); None for dtypes DLPack does not carry."""
    try:
        capsule = tf.experimental.dlpack.to_dlpack(t)
    except Exception:  # noqa: BLE001 - strings, resources, variants, empty tensors...
        return None
    return ctypes.c_void_p.from_address(_capsule_pointer(capsule, b"dltensor")).value


def _handle_name(handle: Any) -> str:
    found = re.search(r'name="([^"]*)"', repr(handle))
    name = re.sub(r"/\d+$", "", found.group(1)) if found else ""
    return re.sub(r"[.:/\s]+", "_", name) or "variable"


class _VarState:
    """One variable during the capture: its handle (held, so that its id stays its own), the
    template of its current state, and where its current value lives (for reads TensorFlow does
    not report)."""

    __slots__ = ("info", "state", "dtype", "handle", "address")

    def __init__(self, info: VarInfo | None, state: Any, dtype: Any, handle: Any) -> None:
        self.info, self.state, self.dtype, self.handle = info, state, dtype, handle
        self.address: int | None = None


class Recorder(BaseRecorder):
    """The op callback: records every eager op of one forward into a TraceBuilder.

    TensorFlow's own here: the op callback (op types, attributes, the outputs
    given after the op ran), variables (resource handles, their states, reads
    TensorFlow does not report) and handing the model an op's edit
    (:class:`~torchlens_tf.edits.Handover`); the bookkeeping is
    :class:`torchlens_core.capture.recorder.Recorder`'s. ``failure`` is the
    first error of an op or a pass's end, any BaseException (a halt, a
    refusal): nothing is recorded after it. Eager tensors are immutable:
    nothing is protected before a write (variables' writes are states here).
    """

    array_types = (_EagerTensorBase,)

    def __init__(self, builder: TraceBuilder, view: ModelView) -> None:
        super().__init__(builder)
        # id(resource handle) -> what is known of that variable, and its current state template.
        self.vars: dict[int, _VarState] = {}
        self.graph_ops = 0
        self.multi_outputs = False  # a leaf of a multi-output op's value was produced (shape reads reported)
        self.tf_functions: list[str] = []
        sites = _call_sites()
        self.sites = PassSites(sites)  # each op's call-site walk ends at its layer call
        self.branches = BranchTracker(sites.internal)
        self.untracked: list[str] = []
        self.other_resources: dict[int, Any] = {}  # resource handles that are not variables, held
        # intervene=: op outputs replaced by their edits (torchlens_tf.edits); empty without edits
        self.replaced: dict[int, tuple[weakref.ref[Any], int]] = {}
        self.editing = builder.editor is not None
        self.handover = Handover(self)
        # Variables by the buffer of their current value: a tf.Variable handed
        # straight to an op is read inside TensorFlow's C++ fast path, which runs
        # no callback for the read; the op's input then shares the variable's
        # buffer. buffer address -> variable, for the (shape, dtype enum)s in var_keys.
        # Each variable has one entry, moved at each write (the variable holds
        # that buffer until then), and a match is checked against the variable's
        # buffer as it is now: an address is never trusted after it may be freed.
        self.buffers: dict[int, _VarState] = {}
        self.var_keys: set[tuple[tuple[int, ...], int]] = set()
        # Variables not in `buffers` yet, with the value whose buffer they hold: most forwards read every
        # variable through an op the callback sees, and taking hundreds of addresses (DLPack) up front would
        # cost more than the reads it serves. They are entered at the first input that may be an unseen
        # read, or when the variable is written (which moves its buffer).
        self.unaddressed: dict[int, tuple[_VarState, Any]] = {}
        for v in view.variables:
            var = self.vars[id(v.variable.handle)] = _VarState(v, ParamRef(v.name), v.variable.dtype, v.variable.handle)
            value = builder.params[v.name].value
            self.var_keys.add((value._shape_tuple(), value._datatype_enum()))
            self.unaddressed[id(var)] = (var, value)

    # -- what the base asks of the backend ---------------------------------------------------
    def is_array(self, value: Any) -> bool:
        """An eager tensor, or a variable: a layer may return one, recorded as its value then (:meth:`as_output`)."""
        return isinstance(value, _EagerTensorBase) or resource_variable(value) is not None

    def describe(self, value: Any) -> tuple[tuple[int, ...], str, str]:
        return _info(value)

    def copy(self, value: Any) -> Any:
        return value  # eager tensors are immutable: the tensor is its value as it ran

    def produced(self, value: Any, ref: Ref, alias: bool = False) -> None:
        """As the base's, less memories and versions (nothing is written in place); notes a multi-output
        op's value, whose shape reads are reported (:mod:`torchlens_tf.conversions`)."""
        self.producers[id(value)] = (weakref.ref(value), ref)
        if ref.path:
            self.multi_outputs = True

    def adopt(self, op: OpRecord, value: Any) -> None:
        """What a module site's (or a pass-through op's) edit hands the model must be a tensor."""
        if not isinstance(value, _EagerTensorBase):
            site = op.edits[-1].site if op.edits else f"{op.layer_label}:{op.pass_num}"
            raise InterventionError(
                f"intervene= at {site}: a helper returned {type(value).__name__}, not a "
                f"TensorFlow tensor; return one (tf.constant(...), or arithmetic on the "
                f"value it was given)"
            )

    def as_output(self, value: Any, inside: tuple[str, int] | None) -> tuple[Ref, Any]:
        """The base's, for a tensor; a variable returned as it is stands for its value now, from its state."""
        if not isinstance(value, _EagerTensorBase):  # then a variable (is_array)
            variable = resource_variable(value)
            current = variable.read_value()
            var = self.vars.get(id(variable.handle))
            if var is not None and var.state is not None:
                shape, dtype, device = _info(current)
                return Ref(
                    self.builder.identity_op(var.state, current, shape=shape, dtype=dtype, device=device).index
                ), None
            value = current
        if self.replaced and self.producer(value) is None:
            self.handover.check_not_replaced(value)
        return super().as_output(value, inside)

    # -- variables -----------------------------------------------------------------------------
    def _remember_buffer(self, var: _VarState, value: Any) -> None:
        """``value`` (which shares the variable's buffer) is the variable's value from now on."""
        self.unaddressed.pop(id(var), None)
        if var.address is not None and self.buffers.get(var.address) is var:
            del self.buffers[var.address]
        var.address = address = _buffer_address(value)
        if address is not None:
            self.buffers[address] = var
            self.var_keys.add((value._shape_tuple(), value._datatype_enum()))

    def _implicit_read(self, t: Any) -> _VarState | None:
        """The variable whose current value ``t`` is, read where no callback saw it; or None."""
        for held, value in list(self.unaddressed.values()):  # unwritten: still the buffer read before the forward
            self._remember_buffer(held, value)
        address = _buffer_address(t)
        var = self.buffers.get(address) if address is not None else None
        if var is None or var.info is None:
            return None
        now = gen_resource_variable_ops.read_variable_op(var.handle, var.dtype)  # not recorded: inside the op callback
        return var if _buffer_address(now) == address else None

    # -- the hot path ------------------------------------------------------------------
    def __call__(
        self, op_type: Any, inputs: Any, attrs: Any, outputs: Any, op_name: Any = None, graph: Any = None
    ) -> None:
        if self.depth or self.failure is not None:  # ops the recorder itself runs; after a halt or refusal
            return None
        if graph is not None:  # graph construction: a function traced during the forward
            self.graph_ops += 1
            return None
        self.depth += 1
        try:
            if type(op_type) is str:  # the fast path: the gradient tape has seen the op already
                self._record(op_type, inputs, attrs, outputs or ())
            else:  # the Python fallback path, whose caller records the op on the tape after this
                if self.editing:  # before the helpers run on its outputs (torchlens_tf.edits)
                    self.handover.record_gradient_first(op_type, inputs, attrs, outputs)
                self._record(op_type.decode(), inputs, attrs, outputs or ())
        except BaseException as exc:  # a halt included: nothing is recorded after it
            self.remember(exc)
            raise
        finally:
            self.depth -= 1
        return None

    def _record(self, op_type: str, inputs: Any, raw_attrs: Any, outputs: Any) -> None:
        info = _OP_INFO.get(op_type) or _op_info(op_type)
        if info.skip:
            if op_type == "VarHandleOp" and outputs:  # a variable created during the forward
                self.vars[id(outputs[0])] = _VarState(None, None, None, outputs[0])  # held: its id stays its own
                self.builder.notes.setdefault("variables_created", 0)
                self.builder.notes["variables_created"] += 1
            return
        producers = self.producers
        var_keys = self.var_keys
        parents: list[int] = []
        params: list[str] = []
        args: list[Any] = []
        var_args: list[tuple[int, _VarState]] = []
        implicit: list[str] = []
        for i, t in enumerate(inputs):
            found = producers.get(id(t))
            if found is not None and found[0]() is t:
                ref = found[1]
                parents.append(ref.index)
                args.append(ref)
                continue
            enum = t._datatype_enum()  # (t.dtype makes a DType object each time)
            if enum == _DT_RESOURCE:
                var = self.vars.get(id(t)) or self._untracked(t, op_type, info, outputs)
                if var is not None:
                    state = var.state
                    if isinstance(state, ParamRef):
                        params.append(state.name)
                    elif isinstance(state, Ref):
                        parents.append(state.index)
                    elif not info.writes or op_type != "AssignVariableOp":
                        raise UnsupportedError(
                            f"{op_type} read a variable created during the forward before any value was assigned to it"
                        )
                    var_args.append((i, var))
                    args.append(state)
                    continue
            if var_keys and (t._shape_tuple(), enum) in var_keys:
                var = self._implicit_read(t)
                if var is not None:  # a variable read inside the C++ fast path, unseen
                    state = var.state
                    if isinstance(state, ParamRef):
                        params.append(state.name)
                    else:
                        parents.append(state.index)
                    implicit.append(var.info.name)  # type: ignore[union-attr]
                    args.append(state)
                    continue
            if self.replaced:  # an op output whose edit the model should have been handed instead
                self.handover.check_not_replaced(t)
            if self.pass_throughs.unedited:  # a layer's output an edit replaced, read where the layer kept it
                self.pass_throughs.check_read(t)
            args.append(t)  # a constant: tensors are immutable, so this is its value as it ran
        attrs_t, kwargs = _call_attrs(op_type, raw_attrs)
        n_out = len(outputs)
        writes: tuple[int, ...]
        if op_type == "ReadVariableOp" and var_args:
            kind, writes = "read", ()
        elif var_args:
            kind = "variable"
            writes = tuple(i for i, _ in var_args) if info.writes else ()
        elif info.kernel_state:
            kind, writes = "recorded", ()
        else:
            kind, writes = "op", ()
        if writes:  # the variables' new values follow the op's outputs
            values = [*outputs, *[self._read_state(var, inputs[i]) for i, var in var_args if i in writes]]
        else:
            values = list(outputs) if self.editing else outputs  # (intervene='s handover builds on a list)
        if not values:
            return  # nothing computed, nothing written (an op without outputs on a non-variable)
        out = values[0] if len(values) == 1 else tuple(values)
        shape: tuple[Any, ...]  # one output's, or a tuple of each output's
        if len(values) == 1:
            shape, dtype, device = _info(out)
        else:
            shape = tuple(_info(v)[0] for v in values)
            dtype, device = _info(values[0])[1:]
        meta: dict[str, Any] = {"op_type": op_type}
        if info.random:
            meta["random"] = True
        if kind == "recorded":
            meta["replayed_from_record"] = True
            # Replay returns this value: it is part of the call, kept even when save= drops op.out.
            meta["recorded_value"] = out
        if var_args:
            meta["variables"] = [v.info.name if v.info else "" for _, v in var_args]
        if implicit:
            meta["implicit_variable_reads"] = implicit
        call = TFCall(op_type, attrs_t, n_out, kind, tuple([i for i, _ in var_args]) if var_args else (), writes)
        op = self.builder.add_op(
            info.func_name,
            call,
            tuple(args),
            kwargs,
            tuple(parents) if len(parents) < 2 else tuple(dict.fromkeys(parents)),
            out,
            shape=shape,
            dtype=dtype,
            device=device,
            params=tuple(dict.fromkeys(params)) if params else (),
            random=info.random,
            in_place=bool(writes),
            code_context=self.sites.stack(skip=2),  # (this frame and __call__'s: ours, not looked at)
            meta=meta,
            conditions=self.branches.current(),
        )
        # From here on, nothing reads op.out: save= may already have dropped it.
        index = op.index
        if self.editing:  # intervene=: the model gets the edited values, and later ops link to them
            values = self.handover.op_output(op, out, values, outputs, n_out, var_args, writes)
        if len(values) == 1:
            if n_out:
                self.produced(values[0], Ref(index))
        else:
            for k in range(n_out):
                self.produced(values[k], Ref(index, (k,)))
        k = n_out
        for i, var in var_args:
            if i in writes:
                var.state = Ref(index) if len(values) == 1 else Ref(index, (k,))
                if var.info is not None:
                    self._remember_buffer(var, values[k])
                k += 1

    def _read_state(self, var: _VarState, handle: Any) -> Any:
        """The variable's value right after a write (read without recording)."""
        dtype = var.dtype
        if dtype is None:
            shape_and_type = handle._handle_data.shape_and_type
            dtype = var.dtype = tf.dtypes.as_dtype(shape_and_type[0].dtype)
        return gen_resource_variable_ops.read_variable_op(handle, dtype)

    def _untracked(self, handle: Any, op_type: str, info: _OpInfo, outputs: Any) -> _VarState | None:
        """A variable the model does not hold (a global seed generator, say): a buffer from now on."""
        if id(handle) in self.other_resources:
            return None
        var = self._untracked_variable(handle, op_type, info)
        if var is None:  # a table, an iterator...: kept (and held, so its id stays its own) as a constant
            self.other_resources[id(handle)] = handle
        return var

    def _untracked_variable(self, handle: Any, op_type: str, info: _OpInfo) -> _VarState | None:
        try:
            data = handle._handle_data
            if not data.is_set or not data.shape_and_type:
                return None
            dtype = tf.dtypes.as_dtype(data.shape_and_type[0].dtype)
        except Exception:  # noqa: BLE001 - not a variable handle (a table, an iterator...)
            return None
        if dtype == tf.variant or "Var" not in repr(handle):
            return None
        if op_type != "ReadVariableOp" and info.writes and op_type != "AssignVariableOp":
            raise UnsupportedError(
                f"{op_type} changed a variable the traced model does not hold ({_handle_name(handle)}) "
                f"before reading it, so its value before the forward is unknown. Hold the variable on the "
                f"Keras model or tf.Module being traced, or pass it as an argument."
            )
        value = gen_resource_variable_ops.read_variable_op(handle, dtype)
        name = base = "untracked." + _handle_name(handle)
        k = 2
        while name in self.builder.params:
            name, k = f"{base}_{k}", k + 1
        shape, dtype_name, _ = _info(value)
        self.builder.add_param(
            ParamRecord(
                name=name,
                shape=shape,
                dtype=dtype_name,
                numel=math.prod(shape),
                trainable=False,
                module="",
                is_buffer=True,
                value=value,
            )
        )
        self.untracked.append(name)
        var = self.vars[id(handle)] = _VarState(VarInfo(name, None, "", False, True), ParamRef(name), dtype, handle)
        self._remember_buffer(var, value)
        return var

    # -- layer calls (torchlens_tf.layers.LayerCalls) ------------------------------------------
    # After a halt (or a refusal) nothing more is recorded: the passes still open
    # stay open, as when torch's forward hooks never run. Closing a pass may
    # itself halt the capture (HaltCapture from exit_module), which is remembered
    # and propagates through the layers' calls.
    def enter(self, path: str) -> None:
        if self.failure is None:
            self.enter_pass(path)
            self.sites.enter(path, sys._getframe(1))  # the layer wrapper's frame: it calls the layer

    def splice(self, path: str) -> Any:
        """What runs instead of this call of layer ``path`` (``tl.splice_module``), or None."""
        return self.builder.splice_for(path) if self.failure is None else None

    def leave(self, path: str, output: Any) -> Any:
        """Close the layer call's pass; returns what the caller gets instead of ``output``, or None."""
        if self.failure is not None:
            return None
        edited = self._close(path, self.exit_pass, output)
        if edited is output:
            return None
        _keep_masks(output, edited)
        return edited

    def failed(self, path: str) -> None:
        """A layer call raised (and its caller may go on): close its pass, with no output."""
        if self.failure is None and any(p == path for p, _ in self.builder.module_stack):
            self._close(path, self.builder.exit_module, None)

    def _close(self, path: str, close: Any, output: Any) -> Any:
        """``close(path, output)``, which reads values (a variable returned) and runs intervene='s helpers: no op
        is recorded. A halt, and with edits any error (a helper's), ends the capture even if the model catches
        it (the base remembers the capture's own errors)."""
        self.sites.exit(path)
        self.depth += 1
        try:
            return close(path, output)
        except BaseException as exc:
            if isinstance(exc, HaltCapture) or (self.editing and isinstance(exc, Exception)):
                self.remember(exc)
            raise
        finally:
            self.depth -= 1


def _keep_masks(output: Any, edited: Any) -> None:
    """A Keras mask the layer set on a tensor it returned (read by the next layer) goes to that tensor's edit."""
    for at, leaf in tree.leaves(edited, lambda v: isinstance(v, _EagerTensorBase)):
        before = tree.get(output, at)
        if before is leaf:
            continue
        mask = getattr(before, "_keras_mask", None)
        if mask is not None and getattr(leaf, "_keras_mask", None) is None:
            leaf._keras_mask = mask


def _patches() -> list[SharedPatchUse]:
    """The process-wide replacements a capture uses besides Layer.__call__ and tf.function's __call__.

    The value reads (:mod:`torchlens_tf.conversions`) serve the Recorder of the calling thread, if it is
    capturing; other threads get the original.
    """
    # Op callbacks are thread-local, but the eager fallback path calls them only while
    # ``execute.execute`` is ``execute_with_callbacks``: op_callbacks.add_op_callback switches that
    # module global on and remove_op_callback switches it off, in every thread at once, as soon as
    # the removing thread has no callback left. It is switched here instead, counted.
    return [*value_read_patches(), shared_patch(execute, "execute", _with_callbacks)]


def _with_callbacks(original: Any, handlers: dict[int, Any]) -> Any:
    return execute.execute_with_callbacks


def eager_functions(names: list[str]) -> contextlib.AbstractContextManager[None]:
    """While the block runs, the tf.functions this thread calls run eagerly; each call's name goes to ``names``.

    This is what ``tf.config.run_functions_eagerly(True)`` makes TensorFlow
    do, without that process-wide switch: other threads' functions keep
    running as graphs.
    """
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    return shared_patch(polymorphic_function.Function, "__call__", _eager_function_call).use(names)


def _eager_function_call(original: Any, names_by_thread: dict[int, list[str]]) -> Any:
    find = names_by_thread.get

    def __call__(fn: Any, *args: Any, **kwargs: Any) -> Any:
        names = find(get_ident())
        if names is None:
            return original(fn, *args, **kwargs)
        names.append(str(getattr(fn, "_name", None) or getattr(fn, "__name__", "function")))
        return fn._python_function(*args, **kwargs)  # what TensorFlow's __call__ does when run eagerly

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


# Threads running a capture now: a capture started inside a captured forward is refused.
_CAPTURING: set[int] = set()


_PREDICT = ("predict", "predict_on_batch", "predict_step")


_SUPPORTED = (
    "The tf backend traces Keras 3 models and layers (on TensorFlow), tf.Modules, tf.functions and "
    "plain Python functions that run TensorFlow ops, eagerly"
)


def _refuse(target: Any) -> None:
    """Targets that have no Python code to run eagerly, or run on another framework."""
    from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction

    if not context.executing_eagerly():
        raise UnsupportedError(
            f"tl.trace with the tf backend must be called eagerly, outside tf.function and "
            f"TF1 graph mode. {_SUPPORTED}."
        )
    fn = target
    if isinstance(target, tf.types.experimental.PolymorphicFunction):
        fn = getattr(target, "python_function", None)
        if fn is None or type(target).__name__ == "RestoredFunction":
            raise UnsupportedError(
                f"this tf.function was restored from a SavedModel: it holds a graph and no Python code to run "
                f"eagerly. {_SUPPORTED}: trace the original model or function instead."
            )
    if isinstance(target, ConcreteFunction) or type(target).__name__ in ("_WrapperFunction", "WrappedFunction"):
        raise UnsupportedError(
            f"a {type(target).__name__} (a concrete graph function, such as a SavedModel signature) has no Python "
            f"code to run eagerly, so its ops cannot be recorded one by one. {_SUPPORTED}: trace the model or "
            f"function it was made from."
        )
    owner = getattr(fn, "__self__", target)
    if type(owner).__name__ == "_UserObject":
        raise UnsupportedError(
            f"objects restored with tf.saved_model.load run graph functions and have no Python code to run "
            f"eagerly. {_SUPPORTED}: trace the original Keras model or Python function instead."
        )
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None and isinstance(owner, tf_keras.layers.Layer):
        raise UnsupportedError(f"Keras 2 (tf_keras) models are not supported. {_SUPPORTED}.")


def _call_plan(
    target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, tuple[Any, ...], dict[str, Any], str | None]:
    """What to call, with what; ``model.predict``-style calls become one eager model call."""
    owner = getattr(target, "__self__", None)
    name = getattr(target, "__name__", "")
    if owner is not None and is_keras_layer(owner) and name in _PREDICT:
        x = args[0] if args else kwargs.get("x", kwargs.get("data"))
        if name == "predict_step":
            return owner, (x,), {"training": False}, "model.predict_step(data) traced as model(data, training=False)"
        return (
            owner,
            (x,),
            {"training": False},
            (
                f"model.{name} runs a compiled tf.function over batches; traced instead as one eager call "
                f"model(x, training=False) on the whole input"
            ),
        )
    return target, args, kwargs, None


def _declare(builder: TraceBuilder, view: ModelView) -> None:
    for path, layer in view.layers:
        builder.add_module(path, type(layer).__name__)  # its variables: listed by the builder at the end
    for v, value in zip(view.variables, _snapshots([v.variable for v in view.variables])):
        shape, dtype, _ = _info(value)
        builder.add_param(
            ParamRecord(
                name=v.name,
                shape=shape,
                dtype=dtype,
                numel=math.prod(shape),
                trainable=v.trainable,
                module=v.module,
                is_buffer=v.is_buffer,
                value=value,
            )
        )


def _snapshots(variables: list[Any]) -> list[Any]:
    """Each variable's value now, read in one op per device (``_ReadVariablesOp``, which reads as
    ``ReadVariableOp`` does: hundreds of separate reads cost a large model more than its smaller layers).

    A read is a snapshot: a later write copies the buffer first (TensorFlow's copy-on-write).
    """
    by_device: dict[str, list[int]] = {}
    for i, variable in enumerate(variables):
        by_device.setdefault(variable.handle.device, []).append(i)
    values: list[Any] = [None] * len(variables)
    eager = context.context()
    for at in by_device.values():
        handles = [variables[i].handle for i in at]
        dtypes = [variables[i].dtype for i in at]
        try:  # quick_execute: no op callback (another thread's capture switches execute.execute to call them)
            read = execute.quick_execute(
                "_ReadVariablesOp",
                len(at),
                handles,
                ("N", len(at), "dtypes", [d.as_datatype_enum for d in dtypes]),
                eager,
            )
        except Exception:  # noqa: BLE001 - a device without that kernel: read one by one (an unreadable variable raises there)
            read = [gen_resource_variable_ops.read_variable_op(h, d) for h, d in zip(handles, dtypes)]
        for i, value in zip(at, read):
            values[i] = value
    return values


def _is_leaf(v: Any) -> bool:
    if isinstance(v, (tf.Tensor, tf.Variable)) or resource_variable(v) is not None:
        return True
    return type(v).__name__ == "KerasTensor"


def _add_argument_variables(view: ModelView, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Variables passed as arguments are parameters too, named by where they were passed."""
    known = {id(v.variable) for v in view.variables}
    for path, leaf in tree.leaves((args, kwargs), _is_leaf):
        variable = resource_variable(leaf)
        if variable is None or id(variable) in known:
            continue
        known.add(id(variable))
        name = ("args" if path[0] == 0 else "kwargs") + "".join(f".{k}" for k in path[1:])
        view.variables.append(VarInfo(name, variable, "", bool(variable.trainable), False))


def _inputs_as_tensors(args: Any, convert: bool) -> Any:
    if not convert:
        return args
    return tree.map_leaves(lambda v: tf.convert_to_tensor(v) if isinstance(v, np.ndarray) else v, args)


def _add_notes(builder: TraceBuilder, recorder: Recorder) -> None:
    notes = builder.notes
    functions = list(dict.fromkeys(recorder.tf_functions))
    if functions:
        notes["tf_function"] = (
            "run eagerly for the capture (as tf.config.run_functions_eagerly(True) would, in "
            "the capturing thread only): their ops are recorded one by one"
        )
        notes["tf_functions_run_eagerly"] = functions
    if recorder.graph_ops:
        notes["graph_ops_not_recorded"] = recorder.graph_ops
    if recorder.untracked:
        notes["untracked_variables"] = list(recorder.untracked)


def capture(
    target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None
) -> Trace | Recording:
    """Run ``target(*args, **kwargs)`` once, eagerly, under the recorder; return its Trace."""
    thread = get_ident()
    if thread in _CAPTURING:  # the outer capture would record the inner one's own work
        raise UnsupportedError(
            "a tf capture is already running in this thread: captures do not nest (call "
            "tl.trace outside the traced function)"
        )
    _CAPTURING.add(thread)
    try:
        return _capture(target, args, kwargs, options)
    finally:
        _CAPTURING.discard(thread)


def _capture(
    target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None
) -> Trace | Recording:
    _refuse(target)
    fn, args, kwargs, redirect = _call_plan(target, args, kwargs)
    run_target, owner, _ = unwrap(fn)
    if owner is not None and is_keras_layer(owner):
        check_keras_backend()
    view = view_model(fn)
    notes: dict[str, Any] = {"capture": "eager op callback (op_callbacks.add_op_callback)"}
    if redirect:
        notes["redirected"] = redirect
    is_keras = owner is not None and is_keras_layer(owner)
    # Keras accepts NumPy inputs and converts them itself; converting first makes them trace inputs.
    args, kwargs = _inputs_as_tensors((args, kwargs), convert=is_keras)
    if is_keras and not owner.built:
        # Keras creates a layer's weights on its first call: make them before the capture.
        owner(*args, **kwargs)
        notes["built_before_capture"] = "the model was unbuilt: one plain call created its weights first"
        view = view_model(fn)

    _add_argument_variables(view, args, kwargs)
    builder = TraceBuilder("tf", model_name=view.type_name, options=options)
    builder.notes.update(notes)
    _declare(builder, view)
    recorder = Recorder(builder, view)
    for path, leaf in tree.leaves((args, kwargs), _is_leaf):
        if resource_variable(leaf) is not None:
            continue  # a variable: a parameter, declared above
        if not _is_eager_tensor(leaf):
            where = ("args" if path[0] == 0 else "kwargs") + "".join(f"[{k!r}]" for k in path[1:])
            raise UnsupportedError(
                f"input {where} is a symbolic tensor ({type(leaf).__name__}); tl.trace runs "
                f"the model eagerly and needs concrete tensors (tf.constant, NumPy arrays)"
            )
        if recorder.producer(leaf) is not None:
            continue  # the same tensor passed twice is one input
        op = builder.add_input(leaf, *_info(leaf))
        recorder.produced(leaf, Ref(op.index))

    # Everything installed below is removed in the finally, whatever ends the
    # forward: its return, an exception, a KeyboardInterrupt, a refusal or
    # halt= (HaltCapture, raised from the op callback or a layer call, which
    # propagates to tl.trace: it finishes the trace from the builder).
    layer_calls = LayerCalls(
        view.paths, recorder.enter, recorder.leave, recorder.failed, recorder.splice if recorder.editing else None
    )
    installed = contextlib.ExitStack()
    error: BaseException | None = None
    try:
        installed.callback(layer_calls.restore)
        layer_calls.install()
        for patch in _patches():
            installed.enter_context(patch.use(recorder))
        installed.enter_context(eager_functions(recorder.tf_functions))
        if recorder.editing:
            installed.enter_context(gradients_through_edits(recorder.handover))
        if builder.options.save_grads is not False:  # the gradient replay needs them (torchlens_tf.custom_grads)
            installed.enter_context(noting_custom_gradients(recorder))
        eager = context.context()
        eager.add_op_callback(recorder)  # thread-local: sees this thread's ops only
        installed.callback(eager.remove_op_callback, recorder)
        try:
            output = run_target(*args, **kwargs)
        except BaseException as exc:
            # A refusal raised inside the callback may reach here wrapped (a
            # concrete function re-raises TypeErrors as its own): raise it as it was.
            error = recorder.failure
            if error is not None and error is not exc:
                raise error from exc
            raise
        recorder.raise_remembered()  # raised inside the callback (or a halt) and swallowed by the model
        if execute.execute is not execute.execute_with_callbacks:
            raise CaptureError(
                "TensorFlow's op callbacks were switched off for every thread during the capture "
                "(op_callbacks.remove_op_callback in another thread), so ops may be missing from "
                "it: trace again while no other thread adds or removes op callbacks"
            )
    finally:
        # The exception on its way out holds this frame (and the recorder's) in its
        # traceback: holding it here too would make a cycle that keeps every value
        # those frames saw, dropped ones included, alive until the cyclic GC runs.
        error = recorder.failure = None
        try:
            installed.close()
        finally:
            recorder.branches.close()
            recorder.sites.open.clear()  # frames of layer calls a halt left open: they hold the model's locals
            _add_notes(builder, recorder)  # a halted trace has them too

    with recorder.paused():  # reading a variable returned records no op
        template, output = recorder.returned(output, None)
    builder.add_outputs(template, values_now(output))
    return builder.finish()


def values_now(output: Any) -> Any:
    """``output`` with each variable in it replaced by its value now.

    A model (or a layer) that returns a variable returns an array that later
    writes change: the trace keeps the value it returned, as it keeps every
    other value as it ran (an output node holding the variable itself would
    follow the next ``assign``).
    """

    def now(leaf: Any) -> Any:
        variable = resource_variable(leaf)
        return leaf if variable is None else variable.read_value()

    return tree.map_leaves(now, output)


def compat_rows(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """tl.compat.report's rows: the capture's own refusals (graph functions, SavedModels, graph mode)."""
    from torchlens_core.views.compat import refusal_row

    return [
        refusal_row(
            "wrapper",
            type(target).__name__,
            lambda: _refuse(target),
            "eager Python (tf.function bodies run eagerly while captured): recorded as it runs",
        )
    ]
