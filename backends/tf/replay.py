"""Replaying recorded TensorFlow ops.

Each op runs again through ``execute.quick_execute`` with the op type and the
attributes it ran with (attributes left at their default arrive as None and
are not passed). TensorFlow tensors are immutable, so no op can change an
input, a parameter or a constant: replay needs no copies.

Variables: a ``ReadVariableOp``'s value is the variable state it was given (a
parameter's value before the forward, or what an earlier write left). Any
other op on variables (a gather from an embedding, an ``assign_add``, a
``tf.random.Generator`` draw) runs on temporary variables that hold the
recorded states; a write's new state is read back from its temporary. So
replay never touches the model's own variables.

Random ops whose generator state lives inside the op kernel (``tf.random.normal``
and the other legacy stateful random ops) cannot be run again to the same
numbers; their recorded values are replayed.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context, execute

from torchlens_core.ir.records import OpRecord
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.evaluator import Observe, RunOp, interpret
from torchlens_tf import meta_check
from torchlens_tf.saving import input_count

# Set by torchlens_tf.grads while it replays under its GradientTape: the run_op that records each op on the
# tape (quick_execute records nothing), used instead of init_scope, which would stop the tape recording.
DIFFERENTIATING: ContextVar[RunOp | None] = ContextVar("torchlens_tf_differentiating", default=None)


def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = op.call
    kind = call.kind
    expected = input_count(call) if kind in ("op", "variable") else None
    if expected is not None and len(args) != expected:  # the eager executor crashes on extra inputs
        raise ValueError(f"{call.op_type} takes {expected} inputs with these attributes, not {len(args)}")
    if kind == "op":
        meta_check.check_loaded(op, args)  # a loaded file's attributes go through TF's shape inference first
        out = execute.quick_execute(call.op_type, call.num_outputs, list(args), call.attrs, context.context())
        return out[0] if len(out) == 1 else tuple(out)
    if kind == "read":
        return args[0]
    if kind == "recorded":
        return op.meta.get("recorded_value", op.out)
    if call.op_type == "AssignVariableOp":  # the new state is the value assigned
        return args[1]
    inputs = list(args)
    temps = {}
    for i in call.variables:
        temps[i] = tf.Variable(args[i], trainable=False)
        inputs[i] = temps[i].handle
    out = list(execute.quick_execute(call.op_type, call.num_outputs, inputs, call.attrs, context.context()))
    out += [temps[i].read_value() for i in call.writes]
    return out[0] if len(out) == 1 else tuple(out)


def _as_tensor(value: Any) -> Any:
    """An input node's value for replay: a NumPy array or a variable given as a new input becomes a tensor.

    Ops take neither; a variable given for a tensor input is what the model would have read of it, its value.
    """
    if isinstance(value, np.ndarray):
        return tf.convert_to_tensor(value)
    if isinstance(value, tf.Variable):
        return value.read_value()
    return value


def replay_graph(trace: Trace, observe: Observe | None = None) -> list[Any]:
    differentiating = DIFFERENTIATING.get()
    if differentiating is not None:  # torchlens_tf.grads, which checked that it runs eagerly
        return interpret(trace, differentiating, observe, copy_input=_as_tensor)
    with tf.init_scope():  # eagerly, even when called while a tf.function is being traced
        return interpret(trace, run_op, observe, copy_input=_as_tensor)
