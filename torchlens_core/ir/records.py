"""The records a trace is made of: ops, modules, parameters, and argument placeholders.

Records are plain attrs classes with slots. Framework arrays stay the
framework's own; the core reads them only through a backend's hooks.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs

from torchlens_core.ir import tree

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace


@attrs.frozen(slots=True)
class Ref:
    """Argument placeholder: the output of op ``index``, or the leaf at ``path`` inside it."""

    index: int
    path: tuple[Any, ...] = ()


@attrs.frozen(slots=True)
class ParamRef:
    """Argument placeholder: the parameter (or buffer) named ``name``."""

    name: str


class CodeLocation(NamedTuple):
    """One frame of the user's code that led to an op.

    A NamedTuple, not an attrs class: capture makes several per op, and a
    tuple is built several times faster.
    """

    file: str
    line_number: int
    func_name: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line_number} in {self.func_name}"


@attrs.frozen(slots=True)
class EditRecord:
    """One intervention applied to an op's output: where, and the helpers that ran, in order.

    ``site`` is the key of the site (``"relu_1_2:1"`` for an op, ``"layer3:1"``
    for a module pass's output), ``path`` the leaf of the op's output it
    edited (``()``: the whole output). ``where`` is the site the helpers were
    given (a :class:`torchlens_core.capture.edits.Site`, which runs them and
    checks what they return): with it, :meth:`apply` does the edit again,
    which is how replay reproduces an edited run.
    """

    site: str
    kind: str  # "op" or "module"
    path: tuple[Any, ...]
    helpers: tuple[Any, ...]
    where: Any = attrs.field(default=None, repr=False)

    def apply(self, value: Any) -> Any:
        """``value`` (the op's whole output) with the helpers applied to the leaf at ``path``."""
        return tree.replace_at(value, {self.path: self.where.run(self.helpers, tree.get(value, self.path))})

    def __repr__(self) -> str:
        at = self.site + ("".join(f"[{k!r}]" for k in self.path) if self.path else "")
        return f"<Edit {', '.join(map(_helper_name, self.helpers))} at {at} ({self.kind} site)>"


def _helper_name(helper: Any) -> str:
    return repr(helper) if hasattr(type(helper), "__attrs_attrs__") else getattr(helper, "__name__", repr(helper))


# op.grad_status, after save_grads= and trace.log_backward:
GRAD_WAITING = "waiting for trace.log_backward(loss)"
GRAD_SAVED = "saved"
GRAD_NOT_SELECTED = "not selected by save_grads="
GRAD_NO_DEPENDENCE = "the loss does not depend on this value"
GRAD_NOT_DIFFERENTIABLE = "not differentiable (an integer or boolean value, or computed without gradients)"
GRAD_STATUSES = (GRAD_WAITING, GRAD_SAVED, GRAD_NOT_SELECTED, GRAD_NO_DEPENDENCE, GRAD_NOT_DIFFERENTIABLE)

OP_KINDS = ("input", "op", "output")
SOURCE_KINDS = ("constant", "parameter", "random")


@attrs.define(slots=True, eq=False, repr=False)
class OpRecord:
    """One executed operation (or an input / output node) of a trace.

    ``args`` and ``kwargs`` are the call as it ran, with every recorded array
    replaced by a :class:`Ref` and every parameter by a :class:`ParamRef`;
    ``call`` is what the backend needs to run it again (a function, a
    primitive...). Labels, passes, parents and children are filled in when the
    trace is finished.
    """

    index: int
    kind: str
    func_name: str
    call: Any = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = attrs.Factory(dict)
    # tl.trace(save_to=...): where ``out`` and ``pre_edit`` lie on disk (a torchlens_core.store.stream
    # StoredValue), read from there when read; None while they are held here. Before ``out``: __init__ sets it first.
    stored: Any = None
    out: Any = None
    shape: tuple[Any, ...] | None = None
    dtype: str | None = None
    device: str | None = None
    module_passes: tuple[tuple[str, int], ...] = ()
    params: tuple[str, ...] = ()
    source: str | None = None
    in_place: bool = False
    # The user's frames that led to this op, innermost first.
    code_context: tuple[CodeLocation, ...] = ()
    elapsed: float | None = None  # seconds the call took (None for input and output nodes)
    # Ops whose values decided a data-dependent branch this op ran inside.
    condition_indices: tuple[int, ...] = ()
    layer_key: Any = None
    meta: dict[str, Any] = attrs.Factory(dict)
    parent_indices: tuple[int, ...] = ()
    saved: bool = True  # False when save= left this op's value out (``out`` is None then)
    # Interventions (tl.trace(..., intervene=...)): what was done to this op's output, in order, and the
    # value before the first edit (None when save= left the op's value out). ``out`` is the edited value.
    edits: tuple[EditRecord, ...] = ()
    pre_edit: Any = None
    # save_grads=: the gradient of the loss given to trace.log_backward with respect to this op's output
    # (the structure of the output for several), and why there is none (GRAD_STATUSES).
    grad: Any = None
    grad_status: str | None = None
    # Filled as the trace is built and finished:
    label: str = ""
    layer_label: str = ""
    func_ordinal: int = 0
    pass_num: int = 1
    num_passes: int = 1
    parents: list[str] = attrs.Factory(list)
    children: list[str] = attrs.Factory(list)
    module_outputs: list[str] = attrs.Factory(list)
    conditions: list[str] = attrs.Factory(list)
    trace_ref: weakref.ref[Trace] | None = None
    cost: tuple[float | None, float | None] | None = None  # (flops, macs), worked out when first read

    @property
    def trace(self) -> Trace:
        trace = self.trace_ref() if self.trace_ref is not None else None
        if trace is None:
            raise ReferenceError(f"the trace of op {self.label} is gone; keep the trace to read it")
        return trace

    @property
    def flops(self) -> float | None:
        """Floating-point operations of this op; None when no formula knows it (see tl.register_flops)."""
        if self.cost is None:
            from torchlens_core.views.flops import count

            self.cost = count(self.trace, self)
        return self.cost[0]

    @property
    def macs(self) -> float | None:
        """Multiply-accumulates of this op (contractions only); None when unknown."""
        if self.cost is None:
            self.flops  # noqa: B018 - fills self.cost
        return self.cost[1]  # type: ignore[index]

    @property
    def num_bytes(self) -> int | None:
        """Bytes of the output (every output, for several), from shape and dtype; None if unknown."""
        return num_bytes(self.shape, self.dtype)

    @property
    def config(self) -> dict[str, Any]:
        """The call's arguments that are not arrays (kernel size, padding, axis...), by name where known."""
        from torchlens_core.views.metadata import config

        return config(self)

    @property
    def distances(self) -> Distances:
        """Shortest and longest paths, in edges, from any input and to any output (None: no path)."""
        return self.trace.distances()[self.index]

    @property
    def receptive_field(self) -> Any:
        """The input positions each position of this op reads, over every executed path (docs/fields.md)."""
        from torchlens_core.fields import receptive_field

        return receptive_field(self)

    @property
    def projective_field(self) -> Any:
        """The later ops' positions each position of this op reaches (``.at(position, target=op)``)."""
        from torchlens_core.fields import projective_field

        return projective_field(self)

    def set_grad(self, path: tuple[Any, ...], value: Any) -> None:
        """Store the gradient of one output (``path`` into a structured output; ``()`` for a plain one)."""
        if not path:
            self.grad = value
        else:
            grads = list(self.grad) if isinstance(self.grad, (list, tuple)) else [None] * (path[0] + 1)
            grads += [None] * (path[0] + 1 - len(grads))
            grads[path[0]] = value
            self.grad = tuple(grads)
        self.grad_status = GRAD_SAVED

    @property
    def edited(self) -> bool:
        """True if an intervention changed this op's output (``op.edits`` says how)."""
        return bool(self.edits)

    @property
    def in_branch(self) -> bool:
        """True if this op ran inside a data-dependent branch (``if`` on an array's value, ``cond``...)."""
        return bool(self.condition_indices)

    @property
    def code_site(self) -> CodeLocation | None:
        """The nearest user frame: ``code_context[0]``."""
        return self.code_context[0] if self.code_context else None

    @property
    def module(self) -> str | None:
        """Path of the innermost module this op ran inside (None at top level)."""
        return self.module_passes[-1][0] if self.module_passes else None

    @property
    def modules(self) -> list[str]:
        """``path:pass`` of every module this op ran inside, outermost first."""
        return [f"{path}:{n}" for path, n in self.module_passes]

    @property
    def is_source(self) -> bool:
        return self.kind == "op" and not self.parents

    # -- derived from the graph: read from trace.graph_index(), built once per trace (docs/metadata.md) --------
    @property
    def num_parents(self) -> int:
        """How many distinct values this op took from earlier ops (``len(op.parents)``)."""
        return len(self.parents)

    @property
    def num_children(self) -> int:
        """How many later ops (and output nodes) took this op's value."""
        return len(self.children)

    @property
    def has_parents(self) -> bool:
        return bool(self.parents)

    @property
    def has_children(self) -> bool:
        return bool(self.children)

    @property
    def is_input(self) -> bool:
        """True for an input node (one array the model was called with)."""
        return self.kind == "input"

    @property
    def is_output(self) -> bool:
        """True for an output node (one array the model returned)."""
        return self.kind == "output"

    @property
    def is_output_parent(self) -> bool:
        """True for an op whose value an output node holds: an op the model returned."""
        ops = self.trace.ops
        return any(ops[c].kind == "output" for c in self.trace.graph_index().children[self.index])

    @property
    def is_final_output(self) -> bool:
        """True for a value the model returned: an output node, or the op it holds."""
        return self.is_output or self.is_output_parent

    @property
    def input_ancestors(self) -> tuple[str, ...]:
        """Labels of the input nodes some path leads from to this op (an input node: itself), in order."""
        return self.trace.graph_index().input_ancestors(self.index)

    @property
    def has_input_ancestor(self) -> bool:
        """False for an op computed from parameters and constants alone (and for nothing it feeds)."""
        return bool(self.trace.graph_index().input_bits[self.index])

    @property
    def root_ancestors(self) -> tuple[str, ...]:
        """Labels of the ops with no parents (inputs, constants, random draws...) this op descends from."""
        return self.trace.graph_index().root_ancestors(self.index)

    @property
    def output_descendants(self) -> tuple[str, ...]:
        """Labels of the output nodes some path leads to from this op (an output node: itself), in order."""
        return self.trace.graph_index().output_descendants(self.index)

    @property
    def has_output_descendant(self) -> bool:
        """False for an op whose value nothing the model returned depends on (a dead end)."""
        return bool(self.trace.graph_index().output_bits[self.index])

    @property
    def siblings(self) -> tuple[str, ...]:
        """Labels of the other ops that took a value this op took too (ops sharing a parent), in order."""
        return self.trace.graph_index().siblings(self.index)

    @property
    def co_parents(self) -> tuple[str, ...]:
        """Labels of the other ops whose values went into an op this op's value went into, in order."""
        return self.trace.graph_index().co_parents(self.index)

    @property
    def lookup_keys(self) -> tuple[int | str, ...]:
        """Every key ``trace[key]`` finds this op by: its two positions, then labels and module paths, sorted
        (what ``print(op)`` lists as Lookup keys)."""
        trace = self.trace
        return (self.index - len(trace.ops), self.index, *sorted(trace.keys_of(self)))

    # -- parameters: op.params names parameters and buffers alike; these count the parameters, as print(op) --
    def _param_records(self) -> list[ParamRecord]:
        table = self.trace.params
        return [table[n] for n in self.params if n in table and not table[n].is_buffer]

    @property
    def param_names(self) -> tuple[str, ...]:
        """Names of the parameters (not buffers) this op used; ``op.params`` has the buffers too."""
        return tuple(p.name for p in self._param_records())

    @property
    def buffer_names(self) -> tuple[str, ...]:
        """Names of the buffers (batch norm's running statistics...) this op read."""
        table = self.trace.params
        return tuple(n for n in self.params if n in table and table[n].is_buffer)

    @property
    def param_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes of :attr:`param_names`, in the same order."""
        return tuple(p.shape for p in self._param_records())

    @property
    def num_params(self) -> int:
        """Elements of the parameters this op used (buffers not counted)."""
        return sum(p.numel for p in self._param_records())

    @property
    def num_params_trainable(self) -> int:
        return sum(p.numel for p in self._param_records() if p.trainable)

    @property
    def num_params_frozen(self) -> int:
        return sum(p.numel for p in self._param_records() if not p.trainable)

    @property
    def module_call_depth(self) -> int:
        """How many module calls this op ran inside (0: at the top level of the forward)."""
        return len(self.module_passes)

    @property
    def is_module_output(self) -> bool:
        """True if some module call returned this op's value (``op.module_outputs`` says which)."""
        return bool(self.module_outputs)

    # Other releases' names for fields recorded here under another one.
    @property
    def is_inplace(self) -> bool:
        """:attr:`in_place`: True if the op wrote its result into one of its arguments."""
        return self.in_place

    @property
    def flops_forward(self) -> float | None:
        """:attr:`flops`."""
        return self.flops

    @property
    def macs_forward(self) -> float | None:
        """:attr:`macs`."""
        return self.macs

    def __repr__(self) -> str:
        where = f" in {self.modules[-1]}" if self.module_passes else ""
        return f"<OpRecord {self.label} {self.func_name} shape={self.shape}{where}>"

    def __str__(self) -> str:
        from torchlens_core.views.summary import describe

        return describe(self)

    def _repr_html_(self) -> str:
        """A notebook shows ``print(op)`` as a table."""
        from torchlens_core.views.html import described
        from torchlens_core.views.summary import describe

        return described(describe(self))


def _on_disk(name: str) -> property:
    """``op.out`` / ``op.pre_edit`` as a property over the attrs slot: read from ``op.stored`` when the value
    lies on disk (save_to=), and written there while the capture that streams it is still writing."""
    slot = OpRecord.__dict__[name]  # the slot's own descriptor, which the property replaces on the class
    stored_slot = OpRecord.__dict__["stored"]
    get_slot, set_slot, get_stored = slot.__get__, slot.__set__, stored_slot.__get__

    def get(self: OpRecord) -> Any:
        value = get_slot(self)
        if value is None:
            stored = get_stored(self)
            if stored is not None:
                return stored.get(name)
        return value

    def put(self: OpRecord, value: Any) -> None:
        stored = get_stored(self)
        if stored is not None:
            stored, value = stored.put(name, value)  # (where it lies now, what stays in memory)
            stored_slot.__set__(self, stored)
        set_slot(self, value)

    return property(get, put, doc=slot.__doc__)


# The slots' own setters, for new_op (below), which writes a new record's value and dtype where no property needs to
# look at them: nothing lies on disk yet, and the dtype it is given is already a plain str.
_set_out, _set_pre_edit, _set_dtype = (OpRecord.__dict__[name].__set__ for name in ("out", "pre_edit", "dtype"))
#: ``op.out`` as the slot holds it: None where ``op.stored`` has the value on disk (save_to=).
raw_out = OpRecord.__dict__["out"].__get__

# properties over the slots: type checkers take them for class variables clashing with the slots
OpRecord.out = _on_disk("out")  # type: ignore[misc]
OpRecord.pre_edit = _on_disk("pre_edit")  # type: ignore[misc]


# Other names frameworks give a dtype (tinygrad's are C types): the name a trace records for it.
_DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "char": "int8",
    "short": "int16",
    "int": "int32",
    "long": "int64",
    "uchar": "uint8",
    "ushort": "uint16",
    "uint": "uint32",
    "ulong": "uint64",
}


def dtype_names_of(dtype: Any) -> tuple[str, ...]:
    """The names a trace may record for a framework's dtype object: ``torch.float32``, ``np.dtype("float32")``,
    ``np.float32``, ``jnp.float32``, ``tf.float32``, ``paddle.float32`` give ``"float32"``; none for an array or
    anything else that is no dtype. Framework-neutral: read from the object's name and its text, no import."""
    if isinstance(dtype, type):  # a scalar type: np.float32, jnp.float32
        found = [dtype.__name__]
    elif isinstance(dtype, str) or hasattr(dtype, "shape"):  # an array (or a NumPy scalar) is not its dtype
        return ()
    else:
        name = getattr(dtype, "name", None)  # NumPy, TensorFlow, tinygrad; Paddle's is its enum's, FLOAT32
        found = [name, str(dtype)] if isinstance(name, str) else [str(dtype)]  # torch.float32, paddle.float32
    names = (n.rsplit(".", 1)[-1].lower() for n in found)
    return tuple(_DTYPE_ALIASES.get(n, n) for n in names)


class DType(str):
    """``op.dtype``: the dtype's name (``"float32"``), a str that also equals the framework's dtype of that name.

    ``op.dtype == "float32"`` and ``op.dtype == torch.float32`` (or ``np.float32``, ``jnp.float32``,
    ``tf.float32``...) are both True. Against a str it is the plain string comparison, so hashing stays the
    str's; it pickles, and is saved, as a plain str.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return str.__eq__(self, other)
        names = dtype_names_of(other)
        return str(self) in names if names else NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = str.__hash__

    def __reduce__(self) -> tuple[Any, ...]:  # a pickled record holds a plain str: no class of ours to import
        return (str, (str(self),))


def _named_dtype(cls: type, name: str = "dtype") -> property:
    """``record.dtype`` as a :class:`DType` over the attrs slot, which keeps a plain str (what is saved)."""
    slot = cls.__dict__[name]
    get_slot, set_slot = slot.__get__, slot.__set__

    def get(self: Any) -> DType | None:
        value = get_slot(self)
        return DType(value) if type(value) is str else value

    def put(self: Any, value: Any) -> None:
        set_slot(self, str.__str__(value) if type(value) is DType else value)

    return property(get, put, doc=slot.__doc__)


#: The str an op's dtype slot keeps, read without the DType the property makes of it (for the schema's check).
raw_dtype = OpRecord.__dict__["dtype"].__get__
OpRecord.dtype = _named_dtype(OpRecord)  # type: ignore[assignment,misc]  # a property over the slot

_new_record = OpRecord.__new__


def new_op(
    index: int,
    kind: str,
    func_name: str,
    call: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    shape: Any,
    dtype: str | None,
    device: str | None,
    module_passes: tuple[tuple[str, int], ...],
    params: tuple[str, ...],
    source: str | None,
    in_place: bool,
    code_context: tuple[Any, ...],
    layer_key: Any,
    parent_indices: tuple[int, ...],
    meta: dict[str, Any],
    elapsed: float | None,
    condition_indices: tuple[int, ...],
) -> OpRecord:
    """``OpRecord(...)`` with these fields and every other at its default, as a capture makes one per op.

    The same record, made without the properties over ``out``, ``pre_edit`` and
    ``dtype`` (three Python calls an op): ``dtype`` must be a str or None here.
    ``tests/test_record_schema.py`` holds it equal to the constructor, field by field.
    """
    op = _new_record(OpRecord)
    op.index, op.kind, op.func_name, op.call, op.args, op.kwargs = index, kind, func_name, call, args, kwargs
    op.stored = None
    _set_out(op, out)
    _set_dtype(op, dtype)
    op.shape, op.device, op.module_passes, op.params, op.source = shape, device, module_passes, params, source
    op.in_place, op.code_context, op.elapsed, op.condition_indices = in_place, code_context, elapsed, condition_indices
    op.layer_key, op.meta, op.parent_indices = layer_key, meta, parent_indices
    op.saved, op.edits, op.grad, op.grad_status, op.trace_ref, op.cost = True, (), None, None, None, None
    _set_pre_edit(op, None)
    op.label = op.layer_label = ""
    op.func_ordinal, op.pass_num, op.num_passes = 0, 1, 1
    op.parents, op.children, op.module_outputs, op.conditions = [], [], [], []
    return op


def op_from_fields(values: Sequence[Any]) -> OpRecord:
    """``OpRecord(*values)``, ``values`` every field in order, made without the properties over ``out``,
    ``pre_edit`` and ``dtype``: the dtype must be a str or None, and nothing may lie on disk (``stored`` None).

    For a backend that makes new records from a remembered record's fields (JAX's capture cache: one a
    repeated op): a third of the constructor's time. ``tests/test_record_schema.py`` holds it equal to the
    constructor field by field (a field moved fails there; one added fails on every call).
    """
    op = _new_record(OpRecord)
    (
        op.index,
        op.kind,
        op.func_name,
        op.call,
        op.args,
        op.kwargs,
        op.stored,
        out,
        op.shape,
        dtype,
        op.device,
        op.module_passes,
        op.params,
        op.source,
        op.in_place,
        op.code_context,
        op.elapsed,
        op.condition_indices,
        op.layer_key,
        op.meta,
        op.parent_indices,
        op.saved,
        op.edits,
        pre_edit,
        op.grad,
        op.grad_status,
        op.label,
        op.layer_label,
        op.func_ordinal,
        op.pass_num,
        op.num_passes,
        op.parents,
        op.children,
        op.module_outputs,
        op.conditions,
        op.trace_ref,
        op.cost,
    ) = values
    _set_out(op, out)
    _set_dtype(op, dtype)
    _set_pre_edit(op, pre_edit)
    return op


@attrs.define(slots=True, eq=False, repr=False)
class ModulePass:
    """One call of a module: the ops that ran inside it and what it returned."""

    path: str
    pass_num: int
    out_template: Any = None
    ops: list[str] = attrs.Factory(list)
    # A weak reference: a trace holding its module passes holding the trace would be a
    # cycle, keeping a dropped trace's values alive until the cyclic GC ran.
    trace_ref: weakref.ref[Trace] | None = None
    # ``(args, kwargs)`` the module was called with, arrays as Refs and parameters as ParamRefs;
    # None where the backend does not record inputs or an argument was not plain data
    in_template: Any = None

    @property
    def trace(self) -> Trace:
        trace = self.trace_ref() if self.trace_ref is not None else None
        if trace is None:
            raise ReferenceError(f"the trace of module pass {self.label} is gone; keep the trace to read it")
        return trace

    @property
    def label(self) -> str:
        return f"{self.path}:{self.pass_num}"

    @property
    def out(self) -> Any:
        """The module's output, with the structure (tuple, dict, dataclass) it returned."""
        return self.trace.resolve(self.out_template)

    @property
    def inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """``(args, kwargs)`` the module was called with, as recorded; None where they were not recorded."""
        return None if self.in_template is None else self.trace.resolve(self.in_template)

    @property
    def grad(self) -> Any:
        """The gradients at what the module returned, with the structure it returned (save_grads=)."""

        def grad_of(leaf: Any) -> Any:
            if not isinstance(leaf, Ref):
                return None
            grad = self.trace.ops[leaf.index].grad
            return tree.get(grad, leaf.path) if grad is not None and leaf.path else grad

        return tree.map_leaves(grad_of, self.out_template)

    @property
    def output_ops(self) -> list[OpRecord]:
        return [self.trace.ops[r.index] for r in refs_in(self.out_template)]

    @property
    def num_ops(self) -> int:
        """How many ops ran inside this call (those of the modules it called included)."""
        return len(self.ops)

    @property
    def module_call_depth(self) -> int | None:
        """How many module calls this one ran inside, itself included (1: a module the model called itself);
        None for a call in which no op ran."""
        if not self.ops:
            return None
        key = (self.path, self.pass_num)
        return self.trace[self.ops[0]].module_passes.index(key) + 1

    @property
    def receptive_field(self) -> Any:
        """The receptive field of the pass's one output op (docs/fields.md)."""
        from torchlens_core.fields import receptive_field

        return receptive_field(self)

    @property
    def projective_field(self) -> Any:
        """The projective field of the pass's one output op (docs/fields.md)."""
        from torchlens_core.fields import projective_field

        return projective_field(self)

    @property
    def output_shapes(self) -> list[Any]:
        """The shape of each array the module returned (one element of a multi-output op, say)."""
        return [shape_at(self.trace.ops[r.index].shape, r.path) for r in refs_in(self.out_template)]

    @property
    def facets(self) -> Any:
        """Named views of this call's values: attention ``q``, ``pattern``..., LSTM ``h_n`` (docs/facets.md)."""
        from torchlens_core.views.facets import facets_of

        return facets_of(self)

    def __repr__(self) -> str:
        return f"<ModulePass {self.label} ({len(self.ops)} ops)>"

    def __str__(self) -> str:
        from torchlens_core.views.summary import describe_pass

        return describe_pass(self)

    def _repr_html_(self) -> str:
        """A notebook shows ``print(module_pass)`` as a table."""
        from torchlens_core.views.html import described
        from torchlens_core.views.summary import describe_pass

        return described(describe_pass(self))


@attrs.define(slots=True, eq=False, repr=False)
class ModuleRecord:
    """A module (layer) of the model: its path, type and every pass through it."""

    path: str
    type_name: str
    params: list[str] = attrs.Factory(list)  # every parameter and buffer below it
    passes: list[ModulePass] = attrs.Factory(list)
    num_params: int = 0  # parameters (not buffers) below it, counted when the trace is finished
    # The module's configuration (torch: the constructor's arguments the module keeps, ``out_channels=384,
    # kernel_size=(3, 3)``, those at their defaults left out), read from the module when first asked for
    # (:class:`Deferred`); None where the backend records none. Saved (format 6). print(op) shows it as Config.
    config: dict[str, Any] | None = None

    @property
    def num_passes(self) -> int:
        return len(self.passes)

    @property
    def facets(self) -> Any:
        """The facets of the module's one call (``passes[i].facets`` for a module called several times)."""
        from torchlens_core.views.facets import module_facets

        return module_facets(self)

    def __repr__(self) -> str:
        return f"<ModuleRecord {self.path} ({self.type_name}), {self.num_passes} passes>"


@attrs.define(slots=True, eq=False, repr=False)
class ParamRecord:
    """A parameter or buffer the traced model holds."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    trainable: bool
    module: str
    is_buffer: bool = False
    value: Any = None
    grad: Any = None  # after trace.log_backward: the loss's gradient with respect to this parameter

    def __repr__(self) -> str:
        kind = "buffer" if self.is_buffer else "param"
        return f"<ParamRecord {kind} {self.name} {self.shape}>"


#: The str a parameter's dtype slot keeps, read without making a DType of it (for the schema's check).
raw_param_dtype = ParamRecord.__dict__["dtype"].__get__
ParamRecord.dtype = _named_dtype(ParamRecord)  # type: ignore[assignment,misc]  # a property over the slot


class Deferred:
    """A record's field worked out when first read: metadata that costs more to read at every capture than most
    users ever ask for (a module's configuration). ``compute()`` gives the value, once."""

    __slots__ = ("compute",)

    def __init__(self, compute: Callable[[], Any]) -> None:
        self.compute = compute


def _deferred(cls: type, name: str) -> property:
    """``record.<name>`` over its attrs slot, which may hold a :class:`Deferred` until first read."""
    slot = cls.__dict__[name]
    get_slot, set_slot = slot.__get__, slot.__set__

    def get(self: Any) -> Any:
        value = get_slot(self)
        if type(value) is Deferred:
            value = value.compute()
            set_slot(self, value)
        return value

    return property(get, set_slot, doc=slot.__doc__)


ModuleRecord.config = _deferred(ModuleRecord, "config")  # type: ignore[assignment,misc]  # a property over the slot


class ParamTable(dict[str, ParamRecord]):
    """``trace.params``: parameter records by name, and ``.to_pandas()``."""

    def to_pandas(self) -> Any:
        """One row per parameter or buffer; columns in docs/tables.md."""
        from torchlens_core.views.tables import params_frame

        return params_frame(self)


class ModuleTable(dict[str, ModuleRecord]):
    """``trace.modules``: module records by path, and ``.to_pandas()``."""

    def to_pandas(self) -> Any:
        """One row per module; columns in docs/tables.md."""
        from torchlens_core.views.tables import modules_frame

        return modules_frame(self)


@attrs.frozen(slots=True)
class Distances:
    """Path lengths in edges: from the nearest and farthest input, to the nearest and farthest output."""

    min_from_input: int | None
    max_from_input: int | None
    min_to_output: int | None
    max_to_output: int | None


_ITEM_BITS = {"bool": 8, "complex64": 64, "complex128": 128}


def itemsize(dtype: str | None) -> int | None:
    """Bytes per element of a dtype named like ``float32``, ``bfloat16``, ``int8``, ``bool``."""
    if dtype is None:
        return None
    name = dtype.rsplit(".", 1)[-1].lower()
    bits = _ITEM_BITS.get(name)
    if bits is None:
        digits = "".join(c for c in name.split("_")[0] if c.isdigit())
        bits = int(digits) if digits else None
    if name in ("float", "double", "half", "long", "int"):  # framework aliases
        bits = {"float": 32, "double": 64, "half": 16, "long": 64, "int": 32}[name]
    return max(bits // 8, 1) if bits else None


def num_bytes(shape: Any, dtype: str | None) -> int | None:
    size = itemsize(dtype)
    if shape is None or size is None:
        return None
    if all(isinstance(d, int) for d in shape):
        n = 1
        for d in shape:
            n *= d
        return n * size
    total = 0
    for part in (num_bytes(s, dtype) for s in shape):
        if part is None:
            return None
        total += part
    return total


def shape_at(shape: Any, path: tuple[Any, ...]) -> Any:
    """The shape of the leaf at ``path`` of an op's (possibly structured) recorded shape."""
    if not path or shape is None:
        return shape
    try:
        return tree.get(shape, path)
    except (IndexError, KeyError, TypeError):
        return None


def refs_in(template: Any) -> list[Ref]:
    """Every :class:`Ref` inside an argument or output template, in order."""
    return [leaf for _, leaf in tree.leaves(template, lambda x: isinstance(x, Ref))]
