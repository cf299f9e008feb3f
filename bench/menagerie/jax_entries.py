"""The JAX menagerie: the architectures of flax's and equinox's examples, written with each library's own layers.

JAX's libraries keep no registry of model builders (flax's examples live in its
repository, not its wheel), so these are written here, small: an MLP, a CNN with batch norm, ResNet blocks, a
ViT, a GPT-style decoder, an MLP-Mixer, recurrent networks, a U-Net, an
encoder-decoder with cross-attention; each in flax.nnx, most also in
flax.linen (through ``model.apply``) and equinox. Every layer comes from the
library, so a layer that changes upstream changes here. Weights are random
(fixed keys), nothing is downloaded, models are in inference mode. transformers'
Flax architectures, enumerated from its own registry, come from jax_hf_entries.py. Where Keras 3 runs on JAX
(``KERAS_BACKEND=jax``: the jax session sets it), Keras's applications, blocks and keras_hub backbones join, as
the TensorFlow menagerie enumerates them (tf_entries.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from bench.menagerie.entries import Built, Entry


def entries() -> list[Entry]:
    from bench.menagerie.jax_hf_entries import entries as transformers_entries
    from bench.menagerie.tf_entries import keras_entries
    from torchlens_jax.zoo import keras_runs_on_jax

    written = [
        Entry(
            "jax",
            f"{library}/{name}",
            library,
            f"{library}.{name}",
            functools.partial(_build, library, name),
            rtol=1e-4,
        )
        for library, builders in (("flax.nnx", _NNX), ("flax.linen", _LINEN), ("equinox", _EQX))
        for name in builders
    ]
    return written + transformers_entries() + (keras_entries("jax") if keras_runs_on_jax() else [])


def _build(library: str, name: str) -> Built:
    return {"flax.nnx": _NNX, "flax.linen": _LINEN, "equinox": _EQX}[library][name]()


def _x(*shape: int, key: int = 0) -> Any:
    import jax

    return jax.random.normal(jax.random.key(100 + key), shape)


def _tokens(*shape: int, vocab: int = 50) -> Any:
    import jax

    return jax.random.randint(jax.random.key(7), shape, 0, vocab)


# -- flax.nnx -------------------------------------------------------------------------------------------------------
def _nnx_mlp() -> Built:
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.layers = nnx.List(
                [nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs), nnx.Linear(16, 4, rngs=rngs)]
            )

        def __call__(self, x: Any) -> Any:
            for layer in self.layers[:-1]:
                x = nnx.gelu(layer(x))
            return self.layers[-1](x)

    return MLP(nnx.Rngs(0)), (_x(3, 8),), {}


def _nnx_cnn() -> Built:
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.conv1 = nnx.Conv(3, 8, (3, 3), rngs=rngs)
            self.bn1 = nnx.BatchNorm(8, use_running_average=True, rngs=rngs)
            self.conv2 = nnx.Conv(8, 16, (3, 3), strides=2, rngs=rngs)
            self.bn2 = nnx.BatchNorm(16, use_running_average=True, rngs=rngs)
            self.head = nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = nnx.avg_pool(nnx.relu(self.bn1(self.conv1(x))), (2, 2), (2, 2))
            x = nnx.relu(self.bn2(self.conv2(x)))
            return self.head(x.mean(axis=(1, 2)))

    return CNN(nnx.Rngs(1)), (_x(2, 16, 16, 3),), {}


def _nnx_resnet() -> Built:
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, c_in: int, c_out: int, stride: int, rngs: nnx.Rngs) -> None:
            self.conv1 = nnx.Conv(c_in, c_out, (3, 3), strides=stride, use_bias=False, rngs=rngs)
            self.bn1 = nnx.BatchNorm(c_out, use_running_average=True, rngs=rngs)
            self.conv2 = nnx.Conv(c_out, c_out, (3, 3), use_bias=False, rngs=rngs)
            self.bn2 = nnx.BatchNorm(c_out, use_running_average=True, rngs=rngs)
            self.down = (
                nnx.Conv(c_in, c_out, (1, 1), strides=stride, use_bias=False, rngs=rngs)
                if stride != 1 or c_in != c_out
                else None
            )

        def __call__(self, x: Any) -> Any:
            h = nnx.relu(self.bn1(self.conv1(x)))
            h = self.bn2(self.conv2(h))
            return nnx.relu(h + (x if self.down is None else self.down(x)))

    class ResNet(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.stem = nnx.Conv(3, 8, (3, 3), rngs=rngs)
            self.blocks = nnx.Sequential(Block(8, 8, 1, rngs), Block(8, 16, 2, rngs), Block(16, 16, 1, rngs))
            self.head = nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.head(self.blocks(nnx.relu(self.stem(x))).mean(axis=(1, 2)))

    return ResNet(nnx.Rngs(2)), (_x(2, 16, 16, 3),), {}


def _nnx_encoder_block(d: int, rngs: Any) -> Any:
    from flax import nnx

    class EncoderBlock(nnx.Module):
        def __init__(self) -> None:
            self.norm1 = nnx.LayerNorm(d, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=d, decode=False, rngs=rngs)
            self.norm2 = nnx.LayerNorm(d, rngs=rngs)
            self.fc1 = nnx.Linear(d, 2 * d, rngs=rngs)
            self.fc2 = nnx.Linear(2 * d, d, rngs=rngs)

        def __call__(self, x: Any, mask: Any = None) -> Any:
            x = x + self.attn(self.norm1(x), mask=mask)
            return x + self.fc2(nnx.gelu(self.fc1(self.norm2(x))))

    return EncoderBlock()


def _nnx_vit() -> Built:
    import jax.numpy as jnp
    from flax import nnx

    class ViT(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.patch = nnx.Conv(3, 16, (4, 4), strides=4, padding="VALID", rngs=rngs)
            self.cls = nnx.Param(jnp.zeros((1, 1, 16)))
            self.pos = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (1, 17, 16)))
            self.blocks = nnx.List([_nnx_encoder_block(16, rngs) for _ in range(2)])
            self.norm = nnx.LayerNorm(16, rngs=rngs)
            self.head = nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            p = self.patch(x)
            p = p.reshape(p.shape[0], -1, p.shape[-1])
            h = jnp.concatenate([jnp.broadcast_to(self.cls[...], (p.shape[0], 1, 16)), p], axis=1) + self.pos[...]
            for block in self.blocks:
                h = block(h)
            return self.head(self.norm(h)[:, 0])

    return ViT(nnx.Rngs(3)), (_x(2, 16, 16, 3),), {}


def _nnx_gpt() -> Built:
    import jax.numpy as jnp
    from flax import nnx

    class GPT(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.tokens = nnx.Embed(50, 16, rngs=rngs)
            self.positions = nnx.Embed(16, 16, rngs=rngs)
            self.blocks = nnx.List([_nnx_encoder_block(16, rngs) for _ in range(2)])
            self.norm = nnx.LayerNorm(16, rngs=rngs)

        def __call__(self, ids: Any) -> Any:
            h = self.tokens(ids) + self.positions(jnp.arange(ids.shape[1]))
            mask = nnx.make_causal_mask(ids)
            for block in self.blocks:
                h = block(h, mask)
            return self.tokens.attend(self.norm(h))  # tied output embedding

    return GPT(nnx.Rngs(4)), (_tokens(2, 8),), {}


def _nnx_mixer() -> Built:
    from flax import nnx

    class MixerBlock(nnx.Module):
        def __init__(self, tokens: int, channels: int, rngs: nnx.Rngs) -> None:
            self.norm1 = nnx.LayerNorm(channels, rngs=rngs)
            self.token_mlp = nnx.Sequential(
                nnx.Linear(tokens, 8, rngs=rngs), nnx.gelu, nnx.Linear(8, tokens, rngs=rngs)
            )
            self.norm2 = nnx.LayerNorm(channels, rngs=rngs)
            self.channel_mlp = nnx.Sequential(
                nnx.Linear(channels, 32, rngs=rngs), nnx.gelu, nnx.Linear(32, channels, rngs=rngs)
            )

        def __call__(self, x: Any) -> Any:
            x = x + self.token_mlp(self.norm1(x).swapaxes(1, 2)).swapaxes(1, 2)
            return x + self.channel_mlp(self.norm2(x))

    class Mixer(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.stem = nnx.Conv(3, 16, (4, 4), strides=4, padding="VALID", rngs=rngs)
            self.blocks = nnx.Sequential(MixerBlock(16, 16, rngs), MixerBlock(16, 16, rngs))
            self.head = nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            p = self.stem(x)
            return self.head(self.blocks(p.reshape(p.shape[0], -1, p.shape[-1])).mean(axis=1))

    return Mixer(nnx.Rngs(5)), (_x(2, 16, 16, 3),), {}


def _nnx_rnn(cell: str) -> Callable[[], Built]:
    def build() -> Built:
        from flax import nnx

        class Recurrent(nnx.Module):
            def __init__(self, rngs: nnx.Rngs) -> None:
                make = {"lstm": nnx.LSTMCell, "gru": nnx.GRUCell, "simple": nnx.SimpleCell}[cell]
                self.rnn = nnx.RNN(make(6, 12, rngs=rngs))
                self.head = nnx.Linear(12, 3, rngs=rngs)

            def __call__(self, x: Any) -> Any:
                return self.head(self.rnn(x)[:, -1])

        return Recurrent(nnx.Rngs(6)), (_x(2, 5, 6),), {}

    return build


def _nnx_unet() -> Built:
    import jax.numpy as jnp
    from flax import nnx

    class UNet(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.down1 = nnx.Conv(2, 8, (3, 3), rngs=rngs)
            self.down2 = nnx.Conv(8, 16, (3, 3), strides=2, rngs=rngs)
            self.norm = nnx.GroupNorm(16, num_groups=4, rngs=rngs)
            self.up = nnx.ConvTranspose(16, 8, (2, 2), strides=(2, 2), rngs=rngs)
            self.out = nnx.Conv(16, 2, (1, 1), rngs=rngs)

        def __call__(self, x: Any) -> Any:
            a = nnx.silu(self.down1(x))
            b = nnx.silu(self.norm(self.down2(a)))
            return self.out(jnp.concatenate([a, self.up(b)], axis=-1))

    return UNet(nnx.Rngs(7)), (_x(1, 16, 16, 2),), {}


def _nnx_seq2seq() -> Built:
    from flax import nnx

    class Seq2Seq(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(50, 16, rngs=rngs)
            self.encoder = _nnx_encoder_block(16, rngs)
            self.self_attn = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, rngs=rngs)
            self.cross_attn = nnx.MultiHeadAttention(num_heads=2, in_features=16, decode=False, rngs=rngs)
            self.norm = nnx.RMSNorm(16, rngs=rngs)
            self.out = nnx.Linear(16, 50, rngs=rngs)

        def __call__(self, src: Any, tgt: Any) -> Any:
            memory = self.encoder(self.embed(src))
            h = self.embed(tgt)
            h = h + self.self_attn(h, mask=nnx.make_causal_mask(tgt))
            h = h + self.cross_attn(h, memory)
            return self.out(self.norm(h))

    return Seq2Seq(nnx.Rngs(8)), (_tokens(2, 7), _tokens(2, 5)), {}


_NNX: dict[str, Callable[[], Built]] = {
    "mlp": _nnx_mlp,
    "cnn": _nnx_cnn,
    "resnet": _nnx_resnet,
    "vit": _nnx_vit,
    "gpt": _nnx_gpt,
    "mixer": _nnx_mixer,
    "lstm": _nnx_rnn("lstm"),
    "gru": _nnx_rnn("gru"),
    "simple_rnn": _nnx_rnn("simple"),
    "unet": _nnx_unet,
    "seq2seq": _nnx_seq2seq,
}


# -- flax.linen: traced as model.apply(variables, x) ------------------------------------------------------------------
def _linen(module: Any, *inputs: Any) -> Built:
    import jax

    variables = module.init(jax.random.key(9), *inputs)
    return module.apply, (variables, *inputs), {}


def _linen_cnn() -> Built:
    import flax.linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(8, (3, 3))(x)))
            x = nn.max_pool(x, (2, 2), (2, 2))
            x = nn.relu(nn.Conv(16, (3, 3), strides=2)(x))
            return nn.Dense(10)(x.reshape(x.shape[0], -1))

    return _linen(CNN(), _x(2, 16, 16, 3))


def _linen_transformer() -> Built:
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = x + nn.SelfAttention(num_heads=2)(nn.LayerNorm()(x))
            return x + nn.Dense(16)(nn.gelu(nn.Dense(32)(nn.LayerNorm()(x))))

    class Encoder(nn.Module):
        @nn.compact
        def __call__(self, ids: Any) -> Any:
            h = nn.Embed(50, 16)(ids)
            for _ in range(2):
                h = Block()(h)
            return nn.Dense(50)(h)

    return _linen(Encoder(), _tokens(2, 8))


def _linen_lstm() -> Built:
    import flax.linen as nn

    class Recurrent(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(3)(nn.RNN(nn.OptimizedLSTMCell(12))(x)[:, -1])

    return _linen(Recurrent(), _x(2, 5, 6))


def _linen_mlp() -> Built:
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            for width in (16, 16):
                x = nn.swish(nn.Dense(width)(x))
            return nn.Dense(4)(nn.LayerNorm()(x))

    return _linen(MLP(), _x(3, 8))


_LINEN: dict[str, Callable[[], Built]] = {
    "mlp": _linen_mlp,
    "cnn": _linen_cnn,
    "transformer": _linen_transformer,
    "lstm": _linen_lstm,
}


# -- equinox: layers take one example ---------------------------------------------------------------------------------
def _eqx_keys(n: int) -> Any:
    import jax

    return jax.random.split(jax.random.key(11), n)


def _eqx_mlp() -> Built:
    import equinox as eqx
    import jax

    return eqx.nn.MLP(8, 4, width_size=16, depth=3, activation=jax.nn.gelu, key=_eqx_keys(1)[0]), (_x(8),), {}


def _eqx_cnn() -> Built:
    import equinox as eqx
    import jax

    k = _eqx_keys(3)
    model = eqx.nn.Sequential(
        [
            eqx.nn.Conv2d(3, 8, 3, padding=1, key=k[0]),
            eqx.nn.GroupNorm(4, 8),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.MaxPool2d(2, 2),
            eqx.nn.Conv2d(8, 16, 3, stride=2, key=k[1]),
            eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.AdaptiveAvgPool2d(1),
            eqx.nn.Lambda(lambda h: h.reshape(-1)),
            eqx.nn.Linear(16, 10, key=k[2]),
        ]
    )
    return model, (_x(3, 16, 16),), {}


def _eqx_attention() -> Built:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    class Block(eqx.Module):
        norm1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        norm2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP

        def __init__(self, key: Any) -> None:
            k1, k2 = jax.random.split(key)
            self.norm1, self.norm2 = eqx.nn.LayerNorm(16), eqx.nn.LayerNorm(16)
            self.attn = eqx.nn.MultiheadAttention(2, 16, key=k1)
            self.mlp = eqx.nn.MLP(16, 16, width_size=32, depth=1, activation=jax.nn.gelu, key=k2)

        def __call__(self, x: Any) -> Any:
            h = jax.vmap(self.norm1)(x)
            mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
            x = x + self.attn(h, h, h, mask=mask)
            return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))

    return Block(_eqx_keys(1)[0]), (_x(6, 16),), {}


def _eqx_gru() -> Built:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    class Recurrent(eqx.Module):
        cell: eqx.nn.GRUCell
        head: eqx.nn.Linear

        def __init__(self, key: Any) -> None:
            k1, k2 = jax.random.split(key)
            self.cell = eqx.nn.GRUCell(6, 12, key=k1)
            self.head = eqx.nn.Linear(12, 3, key=k2)

        def __call__(self, xs: Any) -> Any:
            def step(h: Any, x: Any) -> tuple[Any, None]:
                return self.cell(x, h), None

            last, _ = jax.lax.scan(step, jnp.zeros(12), xs)
            return self.head(last)

    return Recurrent(_eqx_keys(1)[0]), (_x(5, 6),), {}


_EQX: dict[str, Callable[[], Built]] = {"mlp": _eqx_mlp, "cnn": _eqx_cnn, "attention": _eqx_attention, "gru": _eqx_gru}
