"""The JAX zoo for the conformance suite: small models, random weights, nothing downloaded.

Every case builds afresh. Plain functions take their parameters as an
argument (a dict); nnx and equinox models hold theirs. Models see unbatched
inputs where equinox layers want them, and use no ``jax.vmap`` around
submodule calls, whose outputs no framework hook could observe concretely.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchlens_core.backend.cases import Case

Built = tuple[Any, tuple[Any, ...], dict[str, Any]]


def _normal(key: Any, *shape: int, scale: float = 0.5) -> Any:
    import jax

    return scale * jax.random.normal(key, shape)


# -- plain jax.numpy functions --------------------------------------------------------------
def jnp_mlp() -> Built:
    import jax

    k = jax.random.split(jax.random.key(0), 5)
    params = {
        "fc1": {"w": _normal(k[0], 6, 16), "b": _normal(k[1], 16)},
        "fc2": {"w": _normal(k[2], 16, 3), "b": _normal(k[3], 3)},
    }

    def mlp(params: dict[str, Any], x: Any) -> Any:
        h = jax.nn.relu(x @ params["fc1"]["w"] + params["fc1"]["b"])
        return jax.nn.log_softmax(h @ params["fc2"]["w"] + params["fc2"]["b"])

    return mlp, (params, _normal(k[4], 4, 6)), {}


def jit_mlp() -> Built:
    import jax

    mlp, args, kwargs = jnp_mlp()
    return jax.jit(mlp), args, kwargs


def jnp_cnn() -> Built:
    import jax
    import jax.numpy as jnp

    k = jax.random.split(jax.random.key(1), 6)
    params = {
        "conv1": _normal(k[0], 4, 1, 3, 3),
        "conv2": _normal(k[1], 8, 4, 3, 3),
        "fc": {"w": _normal(k[2], 8 * 2 * 2, 5), "b": _normal(k[3], 5)},
    }

    def conv(x: Any, w: Any) -> Any:
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def pool(x: Any) -> Any:
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def cnn(params: dict[str, Any], x: Any) -> Any:
        x = pool(jax.nn.relu(conv(x, params["conv1"])))
        x = pool(jnp.tanh(conv(x, params["conv2"])))
        return x.reshape(x.shape[0], -1) @ params["fc"]["w"] + params["fc"]["b"]

    return cnn, (params, _normal(k[4], 2, 1, 8, 8, scale=1.0)), {}


def scan_rnn() -> Built:
    """An Elman RNN over a sequence with lax.scan, returning every hidden state and the last."""
    import jax
    import jax.numpy as jnp

    k = jax.random.split(jax.random.key(2), 4)
    params = {"w_x": _normal(k[0], 3, 8), "w_h": _normal(k[1], 8, 8), "b": _normal(k[2], 8)}

    def rnn(params: dict[str, Any], xs: Any) -> Any:
        def step(h: Any, x: Any) -> tuple[Any, Any]:
            h = jnp.tanh(x @ params["w_x"] + h @ params["w_h"] + params["b"])
            return h, h

        last, hs = jax.lax.scan(step, jnp.zeros((xs.shape[1], 8)), xs)
        return hs, last

    return rnn, (params, _normal(k[3], 5, 2, 3, scale=1.0)), {}


def cond_branch() -> Built:
    import jax
    import jax.numpy as jnp

    def branchy(x: Any) -> Any:
        return jax.lax.cond(x.sum() > 0, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.cos(v) - 1.0, x) + 1.0

    return branchy, (_normal(jax.random.key(3), 4, 3, scale=1.0) + 1.0,), {}


def while_loop() -> Built:
    """Halve a vector until its norm is below 1: the trip count depends on the data."""
    import jax
    import jax.numpy as jnp

    def shrink(x: Any) -> Any:
        def cond(s: tuple[Any, Any]) -> Any:
            return jnp.linalg.norm(s[1]) >= 1.0

        def body(s: tuple[Any, Any]) -> tuple[Any, Any]:
            return s[0] + 1, s[1] * 0.5

        n, y = jax.lax.while_loop(cond, body, (jnp.int32(0), x))
        return n, y

    return shrink, (_normal(jax.random.key(4), 6, scale=4.0),), {}


def custom_derivatives() -> Built:
    """custom_jvp (jax.nn.relu and a hand-written softplus), custom_vjp and jax.checkpoint."""
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def softplus(x: Any) -> Any:
        return jnp.logaddexp(x, 0.0)

    softplus.defjvp(lambda primals, tangents: (softplus(primals[0]), tangents[0] * jax.nn.sigmoid(primals[0])))

    @jax.custom_vjp
    def clip_grad(x: Any) -> Any:
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))

    def f(w: Any, x: Any) -> Any:
        h = jax.checkpoint(lambda v: jnp.tanh(v @ w))(x)
        return softplus(clip_grad(h)) + jax.nn.relu(h)

    k = jax.random.split(jax.random.key(5))
    return f, (_normal(k[0], 5, 4), _normal(k[1], 3, 5, scale=1.0)), {}


def linen_mlp() -> Built:
    """flax.linen: ``model.apply`` with the variables (parameters and batch statistics) first."""
    import flax.linen as nn
    import jax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.gelu(nn.Dense(16, name="fc1")(x))
            x = nn.BatchNorm(use_running_average=True, name="bn")(x)
            return nn.Dense(3, name="fc2")(x)

    model = MLP()
    x = _normal(jax.random.key(6), 4, 6, scale=1.0)
    variables = model.init(jax.random.key(7), x)
    return model.apply, (variables, x), {}


# -- flax.nnx -------------------------------------------------------------------------------
def nnx_mlp() -> Built:
    import jax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.fc1 = nnx.Linear(6, 16, rngs=rngs)
            self.fc2 = nnx.Linear(16, 16, rngs=rngs)
            self.fc3 = nnx.Linear(16, 3, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = nnx.relu(self.fc1(x))
            x = nnx.relu(self.fc2(x))
            return self.fc3(x)

    return MLP(nnx.Rngs(0)), (_normal(jax.random.key(10), 4, 6, scale=1.0),), {}


def nnx_cnn() -> Built:
    import jax
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.conv1 = nnx.Conv(1, 4, (3, 3), rngs=rngs)
            self.bn1 = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
            self.conv2 = nnx.Conv(4, 8, (3, 3), rngs=rngs)
            self.fc = nnx.Linear(8 * 2 * 2, 5, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = nnx.max_pool(nnx.relu(self.bn1(self.conv1(x))), (2, 2), (2, 2))
            x = nnx.max_pool(nnx.relu(self.conv2(x)), (2, 2), (2, 2))
            return self.fc(x.reshape(x.shape[0], -1))

    return CNN(nnx.Rngs(1)), (_normal(jax.random.key(11), 2, 8, 8, 1, scale=1.0),), {}


def nnx_attention() -> Built:
    """A pre-norm transformer block: nnx.MultiHeadAttention and an MLP, both residual."""
    import jax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.norm1 = nnx.LayerNorm(16, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=4, in_features=16, decode=False, rngs=rngs)
            self.norm2 = nnx.LayerNorm(16, rngs=rngs)
            self.up = nnx.Linear(16, 32, rngs=rngs)
            self.down = nnx.Linear(32, 16, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = x + self.attn(self.norm1(x))
            return x + self.down(nnx.gelu(self.up(self.norm2(x))))

    return Block(nnx.Rngs(2)), (_normal(jax.random.key(12), 2, 5, 16, scale=1.0),), {}


def nnx_residual() -> tuple[Any, tuple[Any, ...], dict[str, Any], Callable[[], None]]:
    """Residual blocks in nnx.Sequential, one shared projection called twice, dropout that is on.

    Also returns a reset function: dropout draws from the model's own RNG
    stream, which every plain call advances."""
    import jax
    from flax import nnx

    class ResBlock(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.lin1 = nnx.Linear(8, 8, rngs=rngs)
            self.lin2 = nnx.Linear(8, 8, rngs=rngs)
            self.norm = nnx.LayerNorm(8, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.norm(x + self.lin2(nnx.relu(self.lin1(x))))

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.proj = nnx.Linear(8, 8, rngs=rngs)
            self.blocks = nnx.Sequential(ResBlock(rngs), ResBlock(rngs))
            self.drop = nnx.Dropout(0.25, rngs=rngs)
            self.head = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = self.proj(x)
            x = self.drop(self.blocks(x))
            return self.head(self.proj(x))  # proj again: its second pass

    model = Net(nnx.Rngs(params=3, dropout=4))
    state = jax.tree.map(lambda a: a, nnx.state(model))  # new Variables: a snapshot, not a view
    return model, (_normal(jax.random.key(13), 4, 8, scale=1.0),), {}, lambda: nnx.update(model, state)


def nnx_scan_rnn() -> Built:
    """An RNN cell module called inside lax.scan: one pass of the cell per time step."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class Cell(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.ih = nnx.Linear(3, 8, rngs=rngs)
            self.hh = nnx.Linear(8, 8, use_bias=False, rngs=rngs)

        def __call__(self, h: Any, x: Any) -> Any:
            return jnp.tanh(self.ih(x) + self.hh(h))

    class RNN(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.cell = Cell(rngs)
            self.head = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, xs: Any) -> Any:
            def step(h: Any, x: Any) -> tuple[Any, Any]:
                h = self.cell(h, x)
                return h, h

            last, _ = jax.lax.scan(step, jnp.zeros((xs.shape[1], 8)), xs)
            return self.head(last)

    return RNN(nnx.Rngs(5)), (_normal(jax.random.key(14), 6, 2, 3, scale=1.0),), {}


# -- equinox --------------------------------------------------------------------------------
def eqx_mlp() -> Built:
    import equinox as eqx
    import jax

    model = eqx.nn.MLP(6, 3, width_size=16, depth=2, key=jax.random.key(20))
    return model, (_normal(jax.random.key(21), 6, scale=1.0),), {}


def eqx_cnn() -> Built:
    """Equinox layers take one example (channels first), so the input is one image."""
    import equinox as eqx
    import jax

    class CNN(eqx.Module):
        features: eqx.nn.Sequential
        fc: eqx.nn.Linear

        def __init__(self, key: Any) -> None:
            k1, k2, k3 = jax.random.split(key, 3)
            self.features = eqx.nn.Sequential(
                [
                    eqx.nn.Conv2d(1, 4, 3, padding=1, key=k1),
                    eqx.nn.Lambda(jax.nn.relu),
                    eqx.nn.MaxPool2d(2, 2),
                    eqx.nn.Conv2d(4, 8, 3, padding=1, key=k2),
                    eqx.nn.Lambda(jax.nn.relu),
                    eqx.nn.MaxPool2d(2, 2),
                ]
            )
            self.fc = eqx.nn.Linear(8 * 2 * 2, 5, key=k3)

        def __call__(self, x: Any) -> Any:
            return self.fc(self.features(x).reshape(-1))

    return CNN(jax.random.key(22)), (_normal(jax.random.key(23), 1, 8, 8, scale=1.0),), {}


def keras_cnn() -> Built:
    """A Keras 3 functional model on Keras's JAX backend: convolution, batch norm, a dropout (off), a head."""
    import jax
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.2, name="drop")(keras.layers.GlobalAveragePooling2D(name="pool")(h))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(h), name="keras_cnn")
    return model, (_normal(jax.random.key(30), 2, 8, 8, 3, scale=1.0),), {}


def keras_runs_on_jax() -> bool:
    """Whether Keras is installed and runs on JAX in this process (Keras picks its backend once, at import,
    from ``KERAS_BACKEND``): the Keras cases join the zoo only then."""
    import importlib.util
    import os
    import sys

    keras = sys.modules.get("keras")
    if keras is not None:
        return keras.backend.backend() == "jax"
    return os.environ.get("KERAS_BACKEND") == "jax" and importlib.util.find_spec("keras") is not None


def cases() -> list[Case]:
    """The JAX zoo. Functions have no modules to observe (``check_modules=False``); Keras's model joins where
    Keras runs on JAX (the jax session sets ``KERAS_BACKEND=jax``)."""
    residual: dict[str, Any] = {}

    def build_residual() -> Built:
        model, args, kwargs, reset = nnx_residual()
        residual["reset"] = reset
        return model, args, kwargs

    def reset_residual() -> None:  # dropout draws from the model's RNG stream: start every run alike
        if "reset" in residual:
            residual["reset"]()

    functions = [jnp_mlp, jit_mlp, jnp_cnn, scan_rnn, cond_branch, while_loop, custom_derivatives]
    return [
        *[Case(f.__name__, f, check_modules=False) for f in functions],
        Case("linen_mlp", linen_mlp),
        Case("nnx_mlp", nnx_mlp),
        Case("nnx_cnn", nnx_cnn),
        Case("nnx_attention", nnx_attention),
        Case("nnx_residual", build_residual, reset=reset_residual),
        Case("nnx_scan_rnn", nnx_scan_rnn),
        Case("eqx_mlp", eqx_mlp),
        Case("eqx_cnn", eqx_cnn),
        *([Case("keras_cnn", keras_cnn)] if keras_runs_on_jax() else []),
    ]
