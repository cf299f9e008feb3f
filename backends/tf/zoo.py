"""The TensorFlow / Keras 3 zoo for the conformance suite: random weights, nothing downloaded.

keras.applications models are built with ``weights=None``, ten classes and
the smallest input each accepts (32x32), so the zoo stays fast on a small
CPU. Every build seeds Keras first, so a case builds the same model each time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchlens_core.backend.cases import Case

Built = tuple[Any, tuple[Any, ...], dict[str, Any]]


def _seed(seed: int = 0) -> None:
    import keras

    keras.utils.set_random_seed(seed)


def _image(batch: int = 1, size: int = 32, channels: int = 3) -> Any:
    import tensorflow as tf

    return tf.random.stateless_uniform((batch, size, size, channels), seed=(1, 2), maxval=255.0)


def _normal(*shape: int, seed: int = 3) -> Any:
    import tensorflow as tf

    return tf.random.stateless_normal(shape, seed=(seed, 7))


def _application(name: str, size: int = 32, **kwargs: Any) -> Callable[[], Built]:
    def build() -> Built:
        import keras

        _seed()
        model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10, **kwargs)
        return model, (_image(size=size),), {}

    build.__name__ = f"build_{name}"
    return build


def sequential_mlp() -> Built:
    import keras

    _seed()
    model = keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(32, activation="relu", name="fc1"),
            keras.layers.Dense(32, activation="gelu", name="fc2"),
            keras.layers.Dropout(0.5, name="drop"),
            keras.layers.Dense(4, activation="softmax", name="head"),
        ],
        name="mlp",
    )
    return model, (_normal(3, 12),), {}


def sequential_cnn() -> Built:
    import keras

    _seed()
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1"),
            keras.layers.BatchNormalization(name="bn1"),
            keras.layers.MaxPooling2D(name="pool1"),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv2"),
            keras.layers.GlobalAveragePooling2D(name="gap"),
            keras.layers.Dense(5, name="head"),
        ],
        name="cnn",
    )
    return model, (_normal(2, 16, 16, 3),), {}


def functional_shared() -> Built:
    """Two branches, a concatenation, and one Dense layer called on both branches."""
    import keras

    _seed()
    inputs = keras.Input((10,), name="x")
    shared = keras.layers.Dense(8, activation="tanh", name="shared")
    left = keras.layers.Dense(8, activation="relu", name="left")(inputs)
    right = keras.layers.Dense(8, activation="sigmoid", name="right")(inputs)
    a = shared(left)
    b = shared(right)  # the same layer again: its second pass
    merged = keras.layers.Concatenate(name="merge")([a, b])
    added = keras.layers.Add(name="residual")([a, b])
    out = keras.layers.Dense(3, name="head")(keras.layers.Concatenate(name="cat2")([merged, added]))
    return keras.Model(inputs, out, name="branchy"), (_normal(4, 10),), {}


def _loop_model() -> Any:
    import keras
    import tensorflow as tf

    class HaltingLoop(keras.Model):
        """Applies one block until the activations' norm passes a threshold (at most 6 times)."""

        def __init__(self) -> None:
            super().__init__(name="halting_loop")
            self.embed = keras.layers.Dense(16, name="embed")
            self.block = keras.layers.Dense(16, activation="tanh", name="block")
            self.head = keras.layers.Dense(2, name="head")

        def call(self, x: Any) -> Any:
            h = self.embed(x)
            steps = 0
            # A data-dependent Python loop: each test turns a recorded tensor into a bool, which replay on
            # other inputs checks (float(tf.norm(h)) < 12.0 would bake in the norm itself: any change refused).
            while steps < 6 and tf.norm(h) < 12.0:
                h = self.block(h) * 2.0 + h
                steps += 1
            return self.head(h)

    return HaltingLoop()


def subclassed_loop() -> Built:
    _seed()
    model = _loop_model()
    x = _normal(3, 8)
    model(x)  # build
    return model, (x,), {}


def lstm() -> Built:
    import keras

    _seed()
    model = keras.Sequential(
        [
            keras.Input((6, 5)),
            keras.layers.LSTM(12, return_sequences=True, name="lstm1"),
            keras.layers.LSTM(8, name="lstm2"),
            keras.layers.Dense(3, name="head"),
        ],
        name="lstm_stack",
    )
    return model, (_normal(2, 6, 5),), {}


def gru() -> Built:
    import keras

    _seed()
    inputs = keras.Input((5, 4))
    seq, state = keras.layers.GRU(10, return_sequences=True, return_state=True, name="gru")(inputs)
    out = keras.layers.Dense(2, name="head")(keras.layers.Concatenate()([seq[:, -1], state]))
    return keras.Model(inputs, out, name="gru_model"), (_normal(2, 5, 4),), {}


def multi_head_attention() -> Built:
    """A post-norm transformer block around keras.layers.MultiHeadAttention, with a padding mask."""
    import keras
    import tensorflow as tf

    _seed()
    tokens = keras.Input((6, 16), name="tokens")
    mask = keras.Input((6, 6), dtype="bool", name="mask")
    attn = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4, name="attn")(tokens, tokens, attention_mask=mask)
    h = keras.layers.LayerNormalization(name="norm1")(tokens + attn)
    ff = keras.layers.Dense(32, activation="relu", name="ff1")(h)
    ff = keras.layers.Dense(16, name="ff2")(ff)
    out = keras.layers.LayerNormalization(name="norm2")(h + ff)
    model = keras.Model([tokens, mask], out, name="transformer_block")
    valid = tf.sequence_mask([6, 4], 6)
    mask_value = tf.logical_and(valid[:, None, :], valid[:, :, None])
    return model, ([_normal(2, 6, 16), mask_value],), {}


def attention_layer() -> Built:
    """A MultiHeadAttention layer traced on its own, with keyword inputs."""
    import keras

    _seed()
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")
    q, v = _normal(2, 3, 8), _normal(2, 5, 8, seed=4)
    layer(q, v)  # build
    return layer, (q,), {"value": v, "return_attention_scores": True}


def tf_function() -> Built:
    """A plain function under @tf.function, with its weights as closure variables."""
    import tensorflow as tf

    w1 = tf.Variable(tf.random.stateless_normal((6, 8), seed=(5, 1)), name="w1")
    b1 = tf.Variable(tf.zeros((8,)), name="b1")
    w2 = tf.Variable(tf.random.stateless_normal((8, 3), seed=(5, 2)), name="w2")

    @tf.function
    def mlp(x: Any) -> Any:
        h = tf.nn.relu(tf.matmul(x, w1) + b1)
        if tf.reduce_sum(h) > 0:  # autograph turns this into a tf.cond in the graph; eager, it is Python
            h = h * 0.5
        return tf.nn.log_softmax(tf.matmul(h, w2))

    return mlp, (_normal(4, 6),), {}


def tf_module() -> Built:
    """A tf.Module (not Keras) whose __call__ is a tf.function."""
    import tensorflow as tf

    class Affine(tf.Module):
        def __init__(self, n_in: int, n_out: int, seed: int) -> None:
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal((n_in, n_out), seed=(seed, 0)))
            self.b = tf.Variable(tf.random.stateless_normal((n_out,), seed=(seed, 1)))

        def __call__(self, x: Any) -> Any:
            return x @ self.w + self.b

    class Net(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = [Affine(5, 7, 1), Affine(7, 2, 2)]

        @tf.function
        def __call__(self, x: Any) -> Any:
            for layer in self.layers:
                x = tf.tanh(layer(x))
            return x

    return Net(), (_normal(3, 5),), {}


def _train_model() -> Any:
    import keras

    _seed()
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, name="fc"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Dropout(0.3, name="drop"),
            keras.layers.Dense(2, name="head"),
        ],
        name="train_mode",
    )


def cases() -> list[Case]:
    """The TensorFlow zoo. Plain functions and tf.Modules have no Keras layers to observe."""
    train: dict[str, Any] = {}

    def build_train() -> Built:
        model = _train_model()
        train["model"], train["state"] = model, [v.numpy() for v in model.variables]
        return model, (_normal(4, 8),), {"training": True}

    def reset_train() -> None:
        # Training mode writes BatchNorm statistics and the dropout seed: start every run alike.
        if "model" in train:
            for v, value in zip(train["model"].variables, train["state"]):
                v.assign(value)

    return [
        Case("mobilenet_v2", _application("MobileNetV2"), rtol=1e-4),
        Case("efficientnet_b0", _application("EfficientNetB0"), rtol=1e-4),
        Case("resnet50", _application("ResNet50"), rtol=1e-4),
        Case("densenet121", _application("DenseNet121"), rtol=1e-4),
        Case("convnext_tiny", _application("ConvNeXtTiny"), rtol=1e-4),
        Case("sequential_mlp", sequential_mlp),
        Case("sequential_cnn", sequential_cnn),
        Case("functional_shared", functional_shared),
        Case("subclassed_loop", subclassed_loop),
        Case("lstm", lstm),
        Case("gru", gru),
        Case("multi_head_attention", multi_head_attention),
        Case("attention_layer", attention_layer),
        Case("tf_function", tf_function, check_modules=False),
        Case("tf_module", tf_module, check_modules=False),
        Case("train_mode", build_train, reset=reset_train),
    ]
