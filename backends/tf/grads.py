"""Gradients on TensorFlow: the recorded graph replayed under a ``tf.GradientTape``.

An eager tensor keeps no record of how it was computed, so
``trace.log_backward`` takes the loss as a function of the output
(``lambda out: tf.reduce_sum(out)``) and replays the trace under a tape: the
floating-point inputs and the trainable parameters become fresh watched
tensors, and every wanted op's output gets a zero added
(:func:`torchlens_core.grads.backward.perturbed`), so that one
``tape.gradient`` call gives the gradient at every wanted op, input and
parameter. An op's own zero, not a watch on its tensor: an identity op, a
variable read or a layer returning its input shares its tensor with another
op, and a watch would give each the gradient of every use of the tensor.
The zeros are negative: ``x + -0.0`` is ``x`` bit for bit, signed zeros
included (``-0.0 + 0.0`` would be ``+0.0``), so the replay computes what the
forward did.

Replay runs ops with ``quick_execute``, which records nothing on a tape; each
op is recorded here with ``record_gradient``, as TensorFlow's generated op
wrappers do, with the attributes the capture left at their default filled
in (gradient functions read them). What gets a gradient is what the tape
gives one:

- a variable read gives its gradient to the variable's parameter; a value
  written to a variable passes none on (the tape does not differentiate
  through an assignment), and reads after a write still count for the
  variable. Any other op on a variable (``ResourceGather``, from
  ``tf.gather(variable, ids)``) runs on a temporary variable under an inner
  tape, whose gradient for it goes to the parameter;
- non-trainable parameters (BatchNorm statistics) get none, as the tape
  watches trainable variables only; ops without a gradient (``StopGradient``,
  comparisons, integer ops) pass none on.

A ``tf.custom_gradient`` function's gradient replaces that of the ops inside
it, as on TensorFlow's own tape: the capture notes each call
(:mod:`torchlens_tf.custom_grads`) and the replay puts the same operation on
the tape over the replayed values, once its last output and input are there.

Replay writes temporary variables only: the model's own (BatchNorm
statistics in training mode, seed generator states) are untouched.
"""

from __future__ import annotations

from typing import Any

import attrs
import tensorflow as tf
from tensorflow.python.eager import backprop, context, execute
from tensorflow.python.eager import record as tape_records
from tensorflow.python.framework import op_def_registry

from torchlens_core.grads.backward import float_leaves, perturbed
from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import replay_values
from torchlens_tf.custom_grads import NOTE, CustomGradient
from torchlens_tf.replay import DIFFERENTIATING, _as_tensor
from torchlens_tf.replay import run_op as replay_op
from torchlens_tf.saving import output_dtypes

Path = tuple[Any, ...]


def backward(trace: Trace, loss: Any, wanted: list[int]) -> dict[str, Any]:
    """Gradients of ``loss`` (a function of the trace's output) at the ``wanted`` ops and the trainable parameters."""
    if not callable(loss) or isinstance(loss, (tf.Tensor, tf.Variable)):
        raise UnsupportedError(
            f"on TensorFlow, log_backward takes the loss as a function of the trace's output "
            f"(lambda out: tf.reduce_sum(out)), not a {type(loss).__name__}: an eager tensor "
            f"keeps no record of how it was computed, so the trace is replayed under a "
            f"GradientTape and the function applied to the replayed output"
        )
    if not context.executing_eagerly():
        raise UnsupportedError("trace.log_backward must be called eagerly, outside tf.function and TF1 graph mode")
    wanted_set = set(wanted)
    inputs, params, graph = _with_leaves(trace)
    deltas = {
        (index, path): _negative_zero(trace.ops[index], path, dtype)
        for index in sorted(wanted_set)
        if trace.ops[index].kind == "op"
        for path, dtype in _float_outputs(trace, trace.ops[index])
    }
    runner = _Runner(
        params, _custom_gradients(trace), {op.index: _as_tensor(op.out) for op in graph.ops if op.kind == "input"}
    )
    graph = perturbed(graph, deltas)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        for leaf in [*inputs.values(), *params.values(), *deltas.values()]:
            tape.watch(leaf)
        token = DIFFERENTIATING.set(runner.run)
        try:
            values = replay_values(graph, runner.observe)
        finally:
            DIFFERENTIATING.reset(token)
        output = tree.map_leaves(
            lambda r: tree.get(values[r.index], r.path) if isinstance(r, Ref) else r, graph.output_template
        )
        target = loss(output)
    _check_loss(target)
    wanted_inputs = {index: leaf for index, leaf in inputs.items() if index in wanted_set}
    sources = [*deltas.values(), *wanted_inputs.values(), *params.values()]
    try:
        found = tape.gradient(target, sources, unconnected_gradients=tf.UnconnectedGradients.NONE)
    except LookupError as exc:  # an op on the loss's path without a registered gradient
        raise UnsupportedError(f"TensorFlow cannot differentiate the recorded graph: {exc}") from exc
    found = [None if g is None else tf.convert_to_tensor(g) for g in found]  # IndexedSlices made dense
    at_deltas, found = found[: len(deltas)], found[len(deltas) :]
    at_inputs, at_params = found[: len(wanted_inputs)], found[len(wanted_inputs) :]
    ops = _by_op(trace, zip(deltas, at_deltas))
    ops.update({index: g for index, g in zip(wanted_inputs, at_inputs) if g is not None})
    return {"ops": ops, "params": {name: g for name, g in zip(params, at_params) if g is not None}}


def _custom_gradients(trace: Trace) -> list[CustomGradient]:
    """The ``tf.custom_gradient`` calls of the forward (:mod:`torchlens_tf.custom_grads`), checked usable."""
    found = trace.notes.get(NOTE) or []
    for custom in found:
        if not isinstance(custom, CustomGradient):  # loaded from a file (a closure is not saved), or unmatched
            raise UnsupportedError(
                f"the forward called a tf.custom_gradient function ({custom}) whose gradient "
                f"this trace cannot apply: a saved trace does not keep the gradient function, "
                f"so capture the model again (tl.trace(..., save_grads=True)) to get gradients"
            )
        edited = [trace.ops[ref.index].label for ref in custom.outputs if trace.ops[ref.index].edits]
        if edited:
            raise UnsupportedError(
                f"intervene= edited {', '.join(edited)}, an output of the tf.custom_gradient "
                f"function {custom.name}: TensorFlow gave its gradient function the edited "
                f"value's gradient, which the replay cannot reproduce; edit another op"
            )
    return list(found)


def _with_leaves(trace: Trace) -> tuple[dict[int, Any], dict[str, Any], Trace]:
    """Fresh tensors for the float inputs and the trainable parameters, and the trace replaying them."""
    ops = list(trace.ops)
    inputs: dict[int, Any] = {}
    for op in trace.ops:
        if op.kind == "input":
            value = _as_tensor(op.out)
            if _is_float(value):
                inputs[op.index] = tf.identity(value)
                ops[op.index] = attrs.evolve(op, out=inputs[op.index])
    params: dict[str, Any] = {}
    records = dict(trace.params)
    for name, record in trace.params.items():
        value = record.value.read_value() if isinstance(record.value, tf.Variable) else record.value
        if record.trainable and not record.is_buffer and _is_float(value):
            params[name] = tf.identity(value)
            records[name] = attrs.evolve(record, value=params[name])
    graph = Trace(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=ops,
        modules=dict(trace.modules),
        params=records,
        output_template=trace.output_template,
        notes=dict(trace.notes),
    )
    graph.call = trace.call
    return inputs, params, graph


def _is_float(value: Any) -> bool:
    return isinstance(value, tf.Tensor) and (value.dtype.is_floating or value.dtype.is_complex)


def _check_loss(target: Any) -> None:
    if not isinstance(target, tf.Tensor):
        raise UnsupportedError(
            f"the loss function returned a {type(target).__name__}, not a TensorFlow tensor: "
            f"compute it with TensorFlow ops on the output, so that the tape can differentiate it"
        )
    if not (target.dtype.is_floating or target.dtype.is_complex):
        raise UnsupportedError(f"the loss is a {target.dtype.name} tensor, which has no gradient: make it a float")
    if target.shape.rank != 0:
        raise UnsupportedError(
            f"the loss must be one number, not an array of shape {tuple(target.shape)}: "
            f"reduce it (tf.reduce_sum, tf.reduce_mean)"
        )


def _float_outputs(trace: Trace, op: OpRecord) -> list[tuple[Path, Any]]:
    """``(path, dtype)`` of each floating-point array ``op`` produced (its outputs, then the states it wrote).

    A multi-output op's record gives the first one's dtype only: the others
    come from the op's definition, and a written state's from its parameter
    (or, failing those, from the recorded values).
    """
    if op.shape is None or all(isinstance(d, int) for d in op.shape):
        return [(path, tf.as_dtype(op.dtype)) for path in float_leaves(trace, op.index)]
    call = op.call
    dtypes = output_dtypes(call) if call is not None and call.kind in ("op", "variable") else None
    if dtypes is not None and len(dtypes) == call.num_outputs:
        names = op.meta.get("variables", [])
        for i in call.writes:
            k = call.variables.index(i)
            record = trace.params.get(names[k]) if k < len(names) else None
            dtypes.append(tf.as_dtype(record.dtype) if record is not None and record.dtype else None)
    if dtypes is None or len(dtypes) != len(op.shape) or None in dtypes:
        out = op.out if op.out is not None else op.meta.get("recorded_value")
        if not isinstance(out, (tuple, list)) or len(out) != len(op.shape):
            raise UnsupportedError(
                f"cannot tell the dtype of each output of {op.label} ({op.func_name}), which "
                f"its gradient needs: capture it again with its values saved (save=)"
            )
        dtypes = [t.dtype for t in out]
    return [((k,), dtype) for k, dtype in enumerate(dtypes) if dtype.is_floating or dtype.is_complex]


def _negative_zero(op: OpRecord, path: Path, dtype: Any) -> Any:
    assert op.shape is not None  # one of its floating-point outputs, recorded with their shapes
    shape = op.shape if not path else op.shape[path[0]]
    device = op.device or "cpu"
    with tf.device("/CPU:0" if device == "cpu" else device.upper()):
        return tf.fill(shape, -tf.zeros((), dtype=dtype))


def _by_op(trace: Trace, found: Any) -> dict[int, Any]:
    """``{index: gradient}``, with the output's structure (None for an array without one) for several outputs."""
    ops: dict[int, Any] = {}
    for (index, path), grad in found:
        if grad is None:
            continue
        if not path:
            ops[index] = grad
            continue
        slots = list(ops.get(index) or [None] * len(trace.ops[index].shape))
        slots[path[0]] = grad
        ops[index] = tuple(slots)
    return ops


class _Runner:
    """Runs each op of the replay as ``torchlens_tf.replay.run_op`` does, recording it on the tape."""

    def __init__(self, params: dict[str, Any], customs: list[CustomGradient], inputs: dict[int, Any]) -> None:
        self.params = params  # parameter name -> its watched tensor
        self.attrs: dict[int, tuple[Any, ...]] = {}  # id(call) -> its attributes for the tape
        # tf.custom_gradient calls, by the op after which their operation goes on the tape; the values they
        # map: their outputs as the ops gave them (a perturbation added later must pass through the custom
        # gradient), their inputs as later ops saw them (after intervene= and the perturbation)
        self.customs: dict[int, list[CustomGradient]] = {}
        for custom in customs:
            self.customs.setdefault(custom.last, []).append(custom)
        self.given: dict[int, Any] = {ref.index: None for c in customs for ref in c.outputs}
        self.seen: dict[int, Any] = {ref.index: None for c in customs for ref in c.inputs if isinstance(ref, Ref)}
        # input nodes are not observed: their values are the watched leaves (or, not float, as recorded)
        self.seen.update((index, value) for index, value in inputs.items() if index in self.seen)

    def run(self, op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = self._run(op, args, kwargs)
        if op.index in self.given:
            self.given[op.index] = out
        return out

    def observe(self, op: OpRecord, value: Any) -> None:
        """Keep what the custom gradients need; once the last output of one is there, put it on the tape."""
        if op.index in self.seen:
            self.seen[op.index] = value
        for custom in self.customs.get(op.index, ()):
            missing = [ref for ref in custom.outputs if self.given[ref.index] is None]
            if missing:
                raise UnsupportedError(
                    f"the output {missing[0]} of tf.custom_gradient function {custom.name} was "
                    f"not computed by an op of the replay, so its gradient cannot be applied"
                )
            outputs = [tree.get(self.given[ref.index], ref.path) for ref in custom.outputs]
            inputs = [
                tree.get(self.seen[ref.index], ref.path) if isinstance(ref, Ref) else ref for ref in custom.inputs
            ]
            tape_records.record_operation(custom.name, outputs, inputs, custom.backward)

    def _run(self, op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = op.call
        if call.kind == "op":
            out = replay_op(op, args, kwargs)
            self._record(call, list(args), out)
            return out
        if call.kind == "variable":
            return self._written(op, replay_op(op, args, kwargs)) if call.writes else self._on_variables(op, args)
        return replay_op(op, args, kwargs)  # a read (its state is the value) or a recorded random value

    def _record(self, call: Any, inputs: list[Any], out: Any) -> None:
        if execute.must_record_gradient():
            outputs = [out] if call.num_outputs == 1 else list(out)
            backprop.record_gradient(call.op_type, inputs, self._tape_attrs(call), outputs)

    def _tape_attrs(self, call: Any) -> tuple[Any, ...]:
        """The call's attributes with those the capture left at their default filled in (``op.get_attr`` needs all)."""
        found = self.attrs.get(id(call))
        if found is None:
            given = set(call.attrs[::2])
            extra: list[Any] = []
            for attr in op_def_registry.get(call.op_type).attr:
                if attr.name not in given and attr.HasField("default_value"):
                    extra += (attr.name, _attr_value(attr.default_value))
            found = self.attrs[id(call)] = (*call.attrs, *extra)
        return found

    def _written(self, op: OpRecord, out: Any) -> Any:
        """A write's values: what it wrote passes no gradient on, but later reads count for the variable."""
        call = op.call
        values = [out] if call.num_outputs + len(call.writes) == 1 else list(out)
        names = op.meta.get("variables", [])
        for k, i in enumerate(call.writes):
            at = call.num_outputs + k
            j = call.variables.index(i)
            param = self.params.get(names[j]) if j < len(names) else None
            state = values[at]
            same = param is not None and param.dtype == state.dtype and param.shape == state.shape
            values[at] = _read_of(param, state) if same else tf.stop_gradient(state)
        return values[0] if len(values) == 1 else tuple(values)

    def _on_variables(self, op: OpRecord, args: tuple[Any, ...]) -> Any:
        """An op on variables that writes none: run on temporary variables, the gradient for them to their states."""
        call = op.call
        held = set(call.variables)

        def forward(*xs: Any) -> Any:
            inputs = list(xs)
            temps: dict[int, Any] = {}
            with tf.GradientTape(watch_accessed_variables=False) as inner:
                for i, x in enumerate(xs):
                    if i in held:
                        temps[i] = tf.Variable(x, trainable=False)
                        inner.watch(temps[i])
                        inputs[i] = temps[i].handle
                    elif _is_float(x):
                        inner.watch(x)
                out = execute.quick_execute(call.op_type, call.num_outputs, inputs, call.attrs, context.context())
                self._record(call, inputs, out[0] if len(out) == 1 else out)

            # ``variables``: custom_gradient sees the temporaries watched, and asks for their gradients too,
            # which are their states' (given as inputs), not theirs as variables
            def grad(*upstream: Any, variables: list[Any] | None = None) -> Any:
                sources = {i: temps.get(i, x) for i, x in enumerate(xs) if i in temps or _is_float(x)}
                found = inner.gradient(
                    list(out),
                    list(sources.values()),
                    output_gradients=list(upstream),
                    unconnected_gradients=tf.UnconnectedGradients.NONE,
                )
                by_input = dict(zip(sources, found))
                grads = [None if by_input.get(i) is None else tf.convert_to_tensor(by_input[i]) for i in range(len(xs))]
                return grads if variables is None else (grads, [None] * len(variables))

            return (out[0] if len(out) == 1 else list(out)), grad

        result = tf.custom_gradient(forward)(*args)
        return tuple(result) if isinstance(result, list) else result


@tf.custom_gradient
def _read_of(variable: Any, state: Any) -> Any:
    """``state``, a variable's value after a write, whose gradient goes to the variable, not to what was written."""

    def grad(upstream: Any) -> tuple[Any, None]:
        return upstream, None

    return tf.identity(state), grad


def _attr_value(value: Any) -> Any:
    """An attribute's default (an ``AttrValue``) as ``record_gradient`` takes it."""
    which = value.WhichOneof("value")
    if which == "list":
        items = value.list
        for field in ("s", "i", "f", "b", "type", "shape", "tensor", "func"):
            if len(getattr(items, field)):
                return list(getattr(items, field))
        return []
    return getattr(value, which) if which else None


def reference_grads(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Path, Any]:
    """The input gradients of the summed float outputs, by a ``tf.GradientTape`` alone (the conformance reference)."""
    copies = {path: tf.identity(leaf) for path, leaf in tree.leaves((args, kwargs), _is_tensor) if _is_float(leaf)}
    if not copies:
        return {}
    new_args, new_kwargs = tree.replace_at((args, kwargs), copies)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        for leaf in copies.values():
            tape.watch(leaf)
        out = target(*new_args, **new_kwargs)
        arrays = [t for _, t in tree.leaves(out, _is_tensor)]
        if not arrays:
            raise UnsupportedError(
                f"the model returned no TensorFlow tensor ({type(out).__name__}): TensorFlow cannot differentiate it"
            )
        parts = [tf.reduce_sum(t) for t in arrays if _is_float(t)]
        if not parts:
            return {}
        total = parts[0]
        for part in parts[1:]:
            total = total + part
    try:
        grads = tape.gradient(total, list(copies.values()), unconnected_gradients=tf.UnconnectedGradients.NONE)
    except LookupError as exc:
        raise UnsupportedError(f"TensorFlow itself cannot differentiate this model: {exc}") from exc
    return {path: tf.convert_to_tensor(g) for path, g in zip(copies, grads) if g is not None}


def _is_tensor(value: Any) -> bool:
    return isinstance(value, tf.Tensor)
