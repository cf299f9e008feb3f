"""``intervene=`` on TensorFlow: where an edited value takes the place of what an op or a layer produced.

Ops. TensorFlow's eager op callbacks cannot return replacement outputs
("not implemented yet" for eager execution), but both ways an eager op runs
hand the callback the very list the op's call then returns to the model:
``execute.execute_with_callbacks`` (the Python fallback path) returns the
``tensors`` list it gave the callbacks, and the C++ fast path
(``TFE_Py_FastPathExecute``) builds its result from the flat output list it
gave them, after they ran. So the op callback puts the edited tensor into
that list, and the op's call returns it: no wrapper around any op, and a
capture without edits pays one attribute test per op. The capture also
keeps a weak reference to each tensor it replaced: should one reach a later
op, a layer's output or the model's output (a TensorFlow whose calls stopped
returning that list), the capture fails with ``CaptureError`` rather than
record a forward that did not see the edit.

Gradients. Under a ``tf.GradientTape`` the fast path records the op on the
tape before the callbacks run, so the tape sees the op produce the original
and the helpers' ops (recorded too) turn it into the edit: gradients flow
through the edit as through a hand-made one. The fallback path records the
op only after ``execute`` returned, with that same list, which by then holds
the edit; and the helpers' ops, run before, were not recorded (their input
was not yet on the tape). So in an editing capture, an op on the fallback
path is recorded on the tape before its callback runs the helpers, and the
late recording (of that very list) is skipped (:func:`gradients_through_edits`).

Variables. An op that writes a variable (``assign``, ``assign_add``, a
generator draw) has the variable's new state as its value; later reads go to
the variable, so an edit of that state is assigned to the variable itself
(unrecorded), and later ops read the edited state, as replay does.

Layers. What a Keras layer's ``__call__`` returned is edited when its pass
closes (:meth:`torchlens_core.capture.recorder.Recorder.exit_pass`, from the
layer wrapper of :mod:`torchlens_tf.layers`), which returns the edited value
to the caller; a Keras mask the layer set on a tensor is carried over to its
edit. ``tl.splice_module`` runs the replacement instead of the layer's
``__call__``, with the arguments the layer was called with.

Helpers run inside the op callback or the layer wrapper while the recorder's
depth is above 0, so their own TensorFlow ops are not recorded as the model's.
"""

from __future__ import annotations

import contextlib
import weakref
from threading import get_ident
from typing import TYPE_CHECKING, Any

from tensorflow.python.eager import backprop, execute
from tensorflow.python.ops import gen_resource_variable_ops

from torchlens_core.capture.threads import shared_patch
from torchlens_core.ir.errors import CaptureError, InterventionError, UnsupportedError
from torchlens_core.ir.records import OpRecord

if TYPE_CHECKING:
    from torchlens_tf.capture import Recorder


def _is_eager_tensor(x: Any) -> bool:
    import tensorflow as tf

    return isinstance(x, tf.Tensor) and hasattr(x, "numpy")


class Handover:
    """Hands the model the values ``intervene=`` edited, for one capture's Recorder."""

    __slots__ = ("builder", "replaced", "recorded_early")

    def __init__(self, recorder: Recorder) -> None:
        # Not the recorder itself: it holds this object, and a reference back would be a cycle that keeps the
        # recorder, its builder and an entry per op alive until the cyclic GC (7,800 objects on ResNet50).
        self.builder = recorder.builder
        # id(op output the model must no longer see) -> (weakref to it, index of its op)
        self.replaced: dict[int, tuple[weakref.ref[Any], int]] = recorder.replaced
        # the output list of the last fallback-path op already recorded on the gradient tape
        self.recorded_early: list[Any] | None = None

    # -- ops ----------------------------------------------------------------------------------
    def op_output(
        self,
        op: OpRecord,
        out: Any,
        values: list[Any],
        outputs: Any,
        n_out: int,
        var_args: list[tuple[int, Any]],
        writes: tuple[int, ...],
    ) -> list[Any]:
        """``values`` (the op's outputs, then the states it wrote) as the model sees them after the edits.

        ``outputs`` is the list the op callback was given: an edited output
        is put in its place, so the op's call returns it. An edited state is
        assigned to its variable; the variable's value read back stands for
        it in what is returned (the capture keeps where a variable's buffer
        is, and the assignment copies).
        """
        seen = self.builder.seen_value(op, out)
        if seen is out:
            return values
        edited = list(seen) if len(values) > 1 else [seen]
        for k in range(len(values)):
            if edited[k] is not values[k] and not _is_eager_tensor(edited[k]):
                raise InterventionError(
                    f"intervene= at {op.layer_label}:{op.pass_num}: a helper returned "
                    f"{type(edited[k]).__name__}, not a TensorFlow tensor; return one "
                    f"(tf.constant(...), or arithmetic on the value it was given)"
                )
        for k in range(n_out):
            if edited[k] is values[k]:
                continue
            try:
                outputs[k] = edited[k]
            except TypeError:  # not a list: this TensorFlow gives the callback a copy of the outputs
                raise UnsupportedError(
                    "this TensorFlow gives op callbacks the op's outputs as a "
                    f"{type(outputs).__name__}, which cannot be changed: intervene= cannot hand "
                    f"an edited value to the model on it (tested with TensorFlow 2.21)"
                ) from None
            self.replaced[id(values[k])] = (weakref.ref(values[k]), op.index)
        k = n_out
        for i, var in var_args:
            if i not in writes:
                continue
            if edited[k] is not values[k]:
                # inside the op callback: neither the write nor the read back is recorded
                gen_resource_variable_ops.assign_variable_op(var.handle, edited[k])
                edited[k] = gen_resource_variable_ops.read_variable_op(var.handle, edited[k].dtype)
            k += 1
        return edited

    def record_gradient_first(self, op_type: bytes, inputs: Any, attrs: Any, outputs: Any) -> None:
        """For an op on the fallback path, before its callback edits it: record it on the tape, if one records."""
        self.recorded_early = None
        if outputs and execute.must_record_gradient():
            backprop.record_gradient(op_type.decode(), inputs, attrs, list(outputs))
            self.recorded_early = outputs  # the list the op's caller will hand record_gradient

    def check_not_replaced(self, t: Any) -> None:
        """Fail if ``t`` is an op output whose edit the model should have seen instead."""
        found = self.replaced.get(id(t))
        if found is not None and found[0]() is t:
            op = self.builder.ops[found[1]]
            raise CaptureError(
                f"the model went on with the value of {op.layer_label}:{op.pass_num} from before "
                f"its edit: TensorFlow did not return the edited tensor the op callback put in "
                f"its place, so intervene= cannot be honoured on this TensorFlow"
            )


def gradients_through_edits(handover: Handover) -> contextlib.AbstractContextManager[None]:
    """While the block runs, this thread's ops already on the tape (``record_gradient_first``) are not recorded twice.

    The generated fallback functions call ``execute.record_gradient`` with the
    very list ``execute`` returned, which is the list the callback was given:
    it is matched by identity.
    """
    return shared_patch(execute, "record_gradient", _skipping_recorded).use(handover)


def _skipping_recorded(original: Any, handovers: dict[int, Handover]) -> Any:
    find = handovers.get

    def record_gradient(op_name: Any, inputs: Any, attrs: Any, outputs: Any, *args: Any, **kwargs: Any) -> Any:
        handover = find(get_ident())
        if handover is not None and outputs is handover.recorded_early and outputs is not None:
            handover.recorded_early = None
            return None
        return original(op_name, inputs, attrs, outputs, *args, **kwargs)

    record_gradient.__wrapped__ = original  # type: ignore[attr-defined]
    return record_gradient
