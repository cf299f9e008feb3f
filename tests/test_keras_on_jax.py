"""Keras 3 models run on JAX: their variables are parameters and their layers module passes (issues 35 and 36).

Before, a Keras model traced with ``backend="jax"`` was a plain function: its
weights were constants of the jaxpr, no layer was a module (0 modules on
MobileNetV3Small, where TensorFlow records 163), and a training-mode dropout
raised JAX's UnexpectedTracerError (the seed generator's state was assigned a
tracer). The references are Keras's own: layers called one by one outside any
capture, ``model.stateless_call`` with the variables' values before the capture,
``model.count_params()``. Each check runs in a child process with
``KERAS_BACKEND=jax`` (Keras picks its backend once per process). Runs where Keras
is installed beside JAX (the jax session installs it); skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
if importlib.util.find_spec("keras") is None:
    pytest.skip("Keras is not installed beside JAX here", allow_module_level=True)

PREAMBLE = r"""
import numpy as np, keras, torchlens as tl
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
"""

NESTED_LAYERS = (
    PREAMBLE
    + r"""
inputs = keras.Input((6,))
block = keras.Sequential([keras.layers.Dense(8, name="inner"), keras.layers.Dropout(0.1, name="drop")], name="block")
model = keras.Model(inputs, keras.layers.Dense(3, name="head")(block(keras.layers.Dense(6, name="stem")(inputs))))
x = rng.standard_normal((2, 6)).astype("float32")
trace = tl.trace(model, x, backend="jax")
missing = {"stem", "block", "block.inner", "block.drop", "head"} - set(trace.modules)
assert not missing, (missing, list(trace.modules))
# Keras's own layers, called one by one, are the reference for each module pass's output.
stem = model.get_layer("stem")(x)
inner = block.layers[0](stem)
expected = {"stem": stem, "block.inner": inner, "block": inner, "head": model.get_layer("head")(inner)}
for path, value in expected.items():
    op = next(op for op in trace.ops if f"{path}:1" in op.module_outputs)
    assert np.array_equal(np.asarray(op.out), np.asarray(value)), path
names = set(trace.params)
assert {"stem.kernel", "stem.bias", "block.inner.kernel", "head.kernel"} <= names, names
assert np.array_equal(np.asarray(trace.output), np.asarray(model(x)))
assert trace.audit()
print("ok")
"""
)

TRAINING_DROPOUT = (
    PREAMBLE
    + r"""
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="d1"),
                          keras.layers.Dropout(0.5, name="drop"), keras.layers.BatchNormalization(name="bn"),
                          keras.layers.Dense(4, name="d2")])
x = rng.standard_normal((4, 8)).astype("float32")
before = [np.asarray(v.value) for v in model.variables]
trainable = [v.value for v in model.trainable_variables]
non_trainable = [v.value for v in model.non_trainable_variables]
trace = tl.trace(model, x, backend="jax", training=True)
# Keras's own stateless call with the variables as they were: the same dropout mask, the same batch statistics.
expected, _ = model.stateless_call(trainable, non_trainable, x, training=True)
assert np.array_equal(np.asarray(trace.output), np.asarray(expected))
assert np.count_nonzero(np.asarray(trace["drop"].out) == 0) > 0  # the dropout was on
# The capture assigned nothing: the seed state and the batch statistics are as they were.
for v, old in zip(model.variables, before):
    assert np.array_equal(np.asarray(v.value), old), v.path
assert trace.audit()
print("ok")
"""
)

APPLICATION = (
    PREAMBLE
    + r"""
import tempfile
model = keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3), include_preprocessing=False)
x = rng.standard_normal((1, 32, 32, 3)).astype("float32")
trace = tl.trace(model, x, backend="jax")
assert len(trace.modules) > 100, len(trace.modules)
# Keras's weights (its count) and the dropouts' seed states (buffers Keras does not count)
weights = [p for p in trace.params.values() if not p.name.endswith("seed_generator.state")]
assert sum(p.numel for p in weights) == model.count_params()
assert np.array_equal(np.asarray(trace.output), np.asarray(model(x)))
x2 = rng.standard_normal((1, 32, 32, 3)).astype("float32")
assert np.allclose(np.asarray(trace.replay(x2)), np.asarray(model(x2)), rtol=1e-5, atol=1e-6)
folder = tempfile.mkdtemp() + "/trace"
tl.save(trace, folder)
assert tl.load(folder).audit()
print("ok")
"""
)


@pytest.mark.parametrize(
    "name, check",
    [("nested_layers", NESTED_LAYERS), ("training_dropout", TRAINING_DROPOUT), ("application", APPLICATION)],
)
def test_keras_models_on_jax_record_their_layers_and_variables(name: str, check: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "KERAS_BACKEND": "jax"},
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
