"""``tf.custom_gradient`` functions met during a capture, so that the gradient replay uses their gradients too.

In eager mode a ``@tf.custom_gradient`` function runs its ops as usual (the
capture records them), passes each output through an ``Identity`` op, and
then puts one operation on the tape over those outputs, from its inputs,
with its own gradient function (``record.record_operation``): that gradient
replaces the one of the ops inside (a straight-through estimator's, a
quantizer's). Replaying the recorded ops alone would differentiate what the
function computes instead, which is silently wrong; so, during a capture that
keeps gradients, the calls are noted (``trace.notes["custom_gradients"]``) and
:mod:`torchlens_tf.grads` puts the same operation on its tape over the
replayed values. The gradient function is a Python closure, which ``tl.save``
cannot keep: a loaded trace holding one refuses ``log_backward``.
"""

from __future__ import annotations

import contextlib
from threading import get_ident
from typing import TYPE_CHECKING, Any

import attrs
from tensorflow.python.eager import record

from torchlens_core.capture.threads import shared_patch
from torchlens_core.ir.records import Ref

if TYPE_CHECKING:
    from collections.abc import Callable

    from torchlens_tf.capture import Recorder

NOTE = "custom_gradients"  # trace.notes key: [CustomGradient, ...] in the order the functions ran


@attrs.frozen(slots=True)
class CustomGradient:
    """One call of a ``tf.custom_gradient`` function: its gradient function, and what it maps to what.

    ``outputs``: the Refs of the ``Identity`` ops that gave its outputs;
    ``inputs``: a Ref for each input a recorded op produced, the tensor itself
    for a constant. ``backward`` takes the outputs' gradients and returns the
    inputs', as TensorFlow's tape calls it.
    """

    name: str
    backward: Callable[..., Any] = attrs.field(repr=False)
    outputs: tuple[Ref, ...]
    inputs: tuple[Any, ...] = attrs.field(repr=False)

    @property
    def last(self) -> int:
        """The last op it maps, once run the operation can go on the tape (variables are read after the outputs)."""
        return max(ref.index for ref in (*self.outputs, *self.inputs) if isinstance(ref, Ref))


def noting_custom_gradients(recorder: Recorder) -> contextlib.AbstractContextManager[None]:
    """While the block runs, this thread's ``tf.custom_gradient`` calls are noted in the recorder's trace."""
    return shared_patch(record, "record_operation", _noting).use(recorder)


def _is_custom_gradient(backward: Any) -> bool:
    # custom_gradient's eager decorator wraps the user's gradient function in a local function of its own
    return getattr(backward, "__qualname__", "").startswith("_eager_mode_decorator.")


def _noting(original: Any, recorders: dict[int, Recorder]) -> Any:
    find = recorders.get

    def record_operation(
        op_type: Any, output_tensors: Any, input_tensors: Any, backward_function: Any, *args: Any, **kwargs: Any
    ) -> Any:
        recorder = find(get_ident())
        if recorder is not None and not recorder.depth and _is_custom_gradient(backward_function):
            outputs = [recorder.producer(t) for t in output_tensors]
            inputs = tuple(recorder.producer(t) or t for t in input_tensors)
            if outputs and all(ref is not None for ref in outputs):
                found = CustomGradient(str(op_type), backward_function, tuple(outputs), inputs)  # type: ignore[arg-type]
                recorder.builder.notes.setdefault(NOTE, []).append(found)
            else:  # outputs the capture did not see made: the replay cannot put the gradient where it belongs
                recorder.builder.notes.setdefault(NOTE, []).append(f"{op_type}: outputs not recorded")
        return original(op_type, output_tensors, input_tensors, backward_function, *args, **kwargs)

    record_operation.__wrapped__ = original  # type: ignore[attr-defined]
    return record_operation
