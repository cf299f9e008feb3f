"""Keras 3 models run on PyTorch: their layers are recorded as module passes (issue 35's Keras pairs).

Keras keeps a model's layers in its own lists, not as torch submodules, so
``named_modules()`` sees the model alone. The torch backend names each Keras
layer by its nesting of layer names, as the TensorFlow backend does, and checks
here are against Keras's own layer objects (a torch forward hook on each).
Runs where Keras is installed beside torch (the comparison menagerie's
keras-tf-torch pair installs it); skipped elsewhere.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if os.environ.setdefault("KERAS_BACKEND", "torch") != "torch":
    pytest.skip("Keras runs on another backend in this process", allow_module_level=True)
keras = pytest.importorskip("keras")
if keras.backend.backend() != "torch":
    pytest.skip("Keras was imported on another backend", allow_module_level=True)

import torchlens as tl  # noqa: E402


def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    block = keras.Sequential([keras.layers.Dense(8, name="inner"), keras.layers.Dropout(0.1, name="drop")],
                             name="block")
    h = block(keras.layers.Dense(6, name="stem")(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(h))


def test_keras_layers_are_module_passes_with_the_outputs_their_forward_hooks_see():
    m = model()
    x = torch.randn(2, 6)
    seen = {}
    handles = [layer.register_forward_hook(lambda mod, args, out, name=name: seen.setdefault(name, out.detach()))
               for name, layer in (("stem", m.get_layer("stem")), ("block.inner", m.get_layer("block").layers[0]),
                                   ("head", m.get_layer("head")))]
    try:
        trace = tl.trace(m, x)
    finally:
        for handle in handles:
            handle.remove()
    assert {"stem", "block", "block.inner", "block.drop", "head"} <= set(trace.modules)
    for name, value in seen.items():
        op = next(op for op in trace.ops if f"{name}:1" in op.module_outputs)
        assert torch.equal(torch.as_tensor(op.out), value), name
