"""What the TensorFlow menagerie (keras_hub's backbones) found in TorchLens, each reduced to a small Keras model and
checked against a reference TorchLens does not compute: the variables' own values, the model's untraced call."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.backend.arrays import max_error  # noqa: E402
from torchlens_core.backend.manager import backend_named  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")

ROOT = pathlib.Path(__file__).resolve().parents[1]
COS = np.arange(8, dtype="float32").reshape(4, 2) / 8
SIN = np.full((4, 2), 0.5, dtype="float32")


# -- a layer that returns its own variables ---------------------------------------------------------------------
# keras_hub's SAM 3 vision encoder (SAM3ViTRotaryEmbedding.call) returns its rotary tables, two Keras variables, as
# they are. Keras 3's variables are no tf.Variable, so the backend took them for non-arrays: the module-output check
# compared the trace's tensors with the hooks' variables and found them different in form (inf); a model returning
# one got an output node with no value, failed its own audit, and a tf.Variable returned stayed live in
# trace.output, following every later assign.
class RotaryTable(keras.layers.Layer):
    def build(self, input_shape: tuple[int, ...]) -> None:
        self.cos = self.add_weight(
            name="cos", shape=(4, 2), trainable=False, initializer=keras.initializers.Constant(COS)
        )
        self.sin = self.add_weight(
            name="sin", shape=(4, 2), trainable=False, initializer=keras.initializers.Constant(SIN)
        )

    def call(self, x: tf.Tensor) -> tuple[keras.Variable, keras.Variable]:
        return self.cos, self.sin


class Rotated(keras.Model):
    """Uses the tables; with ``bump``, writes the cosine table after the layer returned it."""

    def __init__(self, bump: bool = False) -> None:
        super().__init__()
        self.table = RotaryTable(name="table")
        self.bump = bump

    def call(self, x: tf.Tensor) -> tf.Tensor:
        cos, sin = self.table(x)
        if self.bump:
            self.table.cos.assign_add(tf.ones((4, 2)))
        return x * cos + sin


class ReturnsTable(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.table = RotaryTable(name="table")

    def call(self, x: tf.Tensor) -> tuple[keras.Variable, tf.Tensor]:
        cos, sin = self.table(x)
        return cos, x * sin


def _x() -> tf.Tensor:
    return tf.random.stateless_normal((4, 2), seed=(3, 1))


def _built(model: keras.Model) -> keras.Model:
    model(_x())  # Keras creates the weights on the first call
    model.table.cos.assign(COS)
    return model


def test_a_layer_returning_its_variables_has_the_outputs_the_hooks_see() -> None:
    model = _built(Rotated())
    x = _x()
    trace = tl.trace(model, x, backend="tf")
    recorded = trace.modules["table"].passes[0].out
    seen = backend_named("tf").observe_module_outputs(model, (x,), {})["table:1"]
    assert max_error("tf", recorded, seen) == 0.0  # was inf: the hooks' Keras variables were no arrays
    for value, reference in zip(recorded, (COS, SIN), strict=True):
        np.testing.assert_array_equal(np.asarray(value), reference)
    np.testing.assert_allclose(np.asarray(trace.output), np.asarray(model(x)), rtol=0, atol=0)


def test_the_module_outputs_are_the_values_returned_not_the_variables_written_later() -> None:
    model = _built(Rotated(bump=True))
    x = _x()
    trace = tl.trace(model, x, backend="tf")
    model.table.cos.assign(COS)
    seen = backend_named("tf").observe_module_outputs(model, (x,), {})["table:1"]
    assert np.allclose(model.table.cos.numpy(), COS + 1)  # the forward wrote the table after the layer returned it
    np.testing.assert_array_equal(np.asarray(seen[0]), COS)  # the hooks keep the value returned
    np.testing.assert_array_equal(np.asarray(trace.modules["table"].passes[0].out[0]), COS)
    np.testing.assert_allclose(np.asarray(trace.output), np.asarray(x) * (COS + 1) + SIN, rtol=1e-6)


def test_a_returned_keras_variable_is_an_output_with_its_value_then() -> None:
    model = _built(ReturnsTable())
    x = _x()
    trace = tl.trace(model, x, backend="tf")
    own = model(x)
    assert isinstance(own[0], keras.Variable)
    assert max_error("tf", trace.output, own) == 0.0
    report = trace.audit(untraced=True)
    assert report, str(report)  # failed: the output node had no value, the untraced run "returned 1 array"
    model.table.cos.assign(COS * 3)
    np.testing.assert_array_equal(np.asarray(trace.output[0]), COS)  # the value the forward returned
    np.testing.assert_array_equal(np.asarray(trace.replay()[0]), COS)


def test_a_returned_tf_variable_is_not_followed_by_later_writes() -> None:
    class Holder(tf.Module):
        def __init__(self) -> None:
            self.v = tf.Variable(COS)

        def __call__(self, x: tf.Tensor) -> tuple[tf.Variable, tf.Tensor]:
            return self.v, x * 2.0

    holder, x = Holder(), _x()
    trace = tl.trace(holder, x, backend="tf")
    holder.v.assign(COS * 3)
    np.testing.assert_array_equal(np.asarray(trace.output[0]), COS)  # followed the assign before
    report = trace.audit()
    assert report, str(report)


# -- the keras_hub enumeration ----------------------------------------------------------------------------------
def test_the_tf_menagerie_has_every_backbone_keras_hub_exports() -> None:
    keras_hub = pytest.importorskip("keras_hub")
    sys.path.insert(0, str(ROOT))
    from bench.menagerie.entries import entries

    found = {e.name.split("/", 1)[1] for e in entries("tf") if e.library == "keras_hub"}
    exported = {
        cls
        for name in dir(keras_hub.models)
        if isinstance(cls := getattr(keras_hub.models, name), type) and issubclass(cls, keras_hub.models.Backbone)
    }
    # every architecture: not the base classes, and each class once (SmolLMBackbone is SmolLM3Backbone)
    architectures = exported - {keras_hub.models.Backbone, keras_hub.models.FeaturePyramidBackbone}
    assert {getattr(keras_hub.models, name) for name in found} == architectures
    assert len(found) == len(architectures) >= 75
