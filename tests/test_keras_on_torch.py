"""Keras 3 models run on PyTorch: their layers are recorded as module passes (issue 35's Keras pairs).

Keras keeps a model's layers in its own lists, not as torch submodules, so
``named_modules()`` sees the model alone. The torch backend names each Keras
layer by its nesting of layer names, as the TensorFlow backend does. The check
is against Keras's own layer objects (a torch forward hook on each), in a child
process with ``KERAS_BACKEND=torch`` (Keras picks its backend once per process).
Runs where Keras is installed beside torch (the comparison menagerie's
keras-tf-torch pair installs it); skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("keras") is None:
    pytest.skip("Keras is not installed beside torch here", allow_module_level=True)

CHECK = r"""
import keras, torch, torchlens as tl

keras.utils.set_random_seed(0)
inputs = keras.Input((6,))
block = keras.Sequential([keras.layers.Dense(8, name="inner"), keras.layers.Dropout(0.1, name="drop")], name="block")
model = keras.Model(inputs, keras.layers.Dense(3, name="head")(block(keras.layers.Dense(6, name="stem")(inputs))))
x = torch.randn(2, 6)
seen = {}
layers = {"stem": model.get_layer("stem"), "block.inner": block.layers[0], "head": model.get_layer("head")}
handles = [layer.register_forward_hook(lambda mod, args, out, name=name: seen.setdefault(name, out.detach()))
           for name, layer in layers.items()]
try:
    trace = tl.trace(model, x)
finally:
    for handle in handles:
        handle.remove()
missing = {"stem", "block", "block.inner", "block.drop", "head"} - set(trace.modules)
assert not missing, missing
assert set(seen) == set(layers), seen
for name, value in seen.items():
    op = next(op for op in trace.ops if f"{name}:1" in op.module_outputs)
    assert torch.equal(torch.as_tensor(op.out), value), name
print("ok")
"""


def test_keras_layers_are_module_passes_with_the_outputs_their_forward_hooks_see() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KERAS_BACKEND": "torch"},
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
