"""The TensorFlow menagerie: every ``keras.applications`` model, and Keras's attention and recurrent layers as blocks.

The applications are enumerated from the ``keras.applications`` namespace (its
upper-case callables are the model builders), so a model Keras adds joins by
itself. Each is built with random weights (``weights=None``) at the smallest
input it accepts: 32x32, or the minimum Keras names when it refuses that
(``Input size must be at least 75x75``). Nothing is downloaded. Where
keras_hub is installed, its backbones join (:mod:`bench.menagerie.tf_hub_entries`).
The same entries run on the JAX backend where Keras runs on JAX
(:mod:`bench.menagerie.jax_entries`): one Keras source, lowered to each.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from typing import Any

from bench.menagerie.entries import Built, Entry


def entries() -> list[Entry]:
    return keras_entries("tf")


def keras_entries(backend: str) -> list[Entry]:
    """Keras's applications, blocks and (where installed) keras_hub backbones, as entries of ``backend``."""
    found = _applications(backend) + _blocks(backend)
    if importlib.util.find_spec("keras_hub") is not None:  # an optional library: the tf and jax sessions install it
        from bench.menagerie import tf_hub_entries

        found += tf_hub_entries.entries(backend)
    return found


def _applications(backend: str) -> list[Entry]:
    import keras

    found = []
    for name in sorted(dir(keras.applications)):
        builder = getattr(keras.applications, name)
        if not name[0].isupper() or not callable(builder):
            continue
        family = builder.__module__.rsplit(".", 1)[-1]  # Keras's own grouping: keras.src.applications.convnext
        found.append(
            Entry(
                backend,
                f"keras.applications/{name}",
                "keras.applications",
                f"keras.applications.{family}",
                functools.partial(_build_application, name),
                rtol=1e-4,
            )
        )
    return found


def _build_application(name: str) -> Built:
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    builder = getattr(keras.applications, name)
    size = 32
    try:
        model = builder(weights=None, input_shape=(size, size, 3))
    except ValueError as exc:  # the architecture's own minimum input size, as Keras states it
        found = re.search(r"at least (\d+)x(\d+)", str(exc))
        if found is None:
            raise
        size = int(found.group(1))
        model = builder(weights=None, input_shape=(size, size, 3))
    x = np.random.default_rng(0).standard_normal((1, size, size, 3)).astype("float32")
    return model, (keras.ops.convert_to_tensor(x),), {}


# -- Keras layers as blocks -----------------------------------------------------------------------------------------
_BLOCKS = {
    "multi_head_attention": "attention",
    "transformer_block": "transformer",
    "lstm": "recurrent",
    "bidirectional_gru": "recurrent",
    "conv_lstm": "recurrent",
    "group_query_attention": "attention",
}


def _blocks(backend: str) -> list[Entry]:
    return [
        Entry(
            backend,
            f"keras.layers/{name}",
            "keras.layers",
            f"keras.layers.{family}",
            functools.partial(_build_block, name),
            rtol=1e-4,
        )
        for name, family in _BLOCKS.items()
    ]


def _build_block(name: str) -> Built:
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    seq, d = 6, 16
    inputs = keras.Input((seq, d))
    x = rng.standard_normal((2, seq, d)).astype("float32")
    if name == "multi_head_attention":
        out = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inputs, inputs, use_causal_mask=True)
    elif name == "group_query_attention":
        out = keras.layers.GroupQueryAttention(head_dim=8, num_query_heads=4, num_key_value_heads=2)(inputs, inputs)
    elif name == "transformer_block":
        h = keras.layers.LayerNormalization()(inputs)
        h = inputs + keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(h, h)
        f = keras.layers.Dense(32, activation="gelu")(keras.layers.LayerNormalization()(h))
        out = h + keras.layers.Dense(d)(f)
    elif name == "lstm":
        out = keras.layers.LSTM(8, return_sequences=True)(inputs)
    elif name == "bidirectional_gru":
        out = keras.layers.Bidirectional(keras.layers.GRU(8))(inputs)
    elif name == "conv_lstm":
        inputs = keras.Input((3, 8, 8, 2))
        out = keras.layers.ConvLSTM2D(4, 3, padding="same")(inputs)
        x = rng.standard_normal((1, 3, 8, 8, 2)).astype("float32")
    else:
        raise KeyError(name)
    model: Any = keras.Model(inputs, out)
    return model, (keras.ops.convert_to_tensor(x),), {}
