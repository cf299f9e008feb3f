"""The tf capture on the shared recorder base (torchlens_core.capture.recorder): what the port changed or must keep.

References are Keras's own calls of the same layers, run without TorchLens.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402

import torchlens as tl  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras runs on another backend")


class Same(keras.layers.Layer):
    def call(self, x: Any) -> Any:
        return x  # returned, not computed: a pass-through op stands for it


class PassThrough(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.same = Same(name="same")
        self.fc = keras.layers.Dense(2, name="fc", bias_initializer="ones")

    def call(self, x: Any) -> Any:
        return self.fc(self.same(x) * 2.0)


def test_an_edit_of_a_pass_through_op_is_what_the_model_goes_on_with() -> None:
    model = PassThrough()
    x = tf.constant([[1.0, -2.0, 3.0]])
    model(x)
    traced = tl.trace(model, x, intervene=tl.when(tl.func("identity"), tl.zero_ablate()))
    # by hand: the layer's output zeroed, and the rest of the model run on it
    np.testing.assert_allclose(traced.output.numpy(), model.fc(tf.zeros_like(x) * 2.0).numpy(), rtol=1e-6)
    assert not np.allclose(traced.output.numpy(), model(x).numpy())


class Forgiving(keras.Model):
    """Catches anything its first layer raises, a halt included, and goes on."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = keras.layers.Dense(3, name="fc1")
        self.fc2 = keras.layers.Dense(3, name="fc2")

    def call(self, x: Any) -> Any:
        try:
            h = self.fc1(x)
        except BaseException:  # noqa: BLE001 (what the test is about)
            h = x[:, :3]
        return self.fc2(tf.nn.relu(h))


def test_a_halt_raised_as_a_layer_call_closes_stops_the_capture_even_if_the_model_catches_it() -> None:
    model = Forgiving()
    x = tf.constant([[1.0, -2.0, 3.0, 0.5]])
    model(x)
    trace = tl.trace(model, x, save=tl.module("fc1"), halt=tl.module("fc1"))
    assert trace.halted and trace.modules["fc2"].num_passes == 0
    assert trace.ops[-1].func_name == "bias_add" and "fc1:1" in trace.ops[-1].module_outputs  # nothing after it
    np.testing.assert_allclose(trace["fc1"].out, model.fc1(x).numpy(), rtol=1e-6)
