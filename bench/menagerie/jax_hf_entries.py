"""The JAX menagerie's transformers entries: every Flax architecture transformers' own registry lists.

transformers 5 dropped its Flax models; the 4.x series still ships them, and
``FLAX_MODEL_MAPPING_NAMES`` is their registry (model type -> Flax class), so
an architecture it lists joins by itself. The menagerie session installs that
series into the JAX environment (noxfile, ``menagerie``); where transformers
is missing or is 5.x, there are no such entries. Each model is built from its
default config shrunk as the torch enumerator shrinks it (2 layers, hidden size
64, 4 heads), with random weights from a fixed key, and called on 8 random
tokens (or a small image, audio); nothing is downloaded.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from bench.menagerie.entries import Built, Entry

SEED = 0


def entries() -> list[Entry]:
    try:
        from transformers.models.auto.modeling_flax_auto import FLAX_MODEL_MAPPING_NAMES
    except ImportError:  # no transformers, or 5.x: no Flax models
        return []
    return [
        Entry(
            "jax",
            f"transformers/{model_type}",
            "transformers",
            "transformers",
            functools.partial(_build, model_type),
            rtol=1e-4,
        )
        for model_type in FLAX_MODEL_MAPPING_NAMES
    ]


def _build(model_type: str) -> Built:
    import jax
    import transformers
    from transformers import AutoConfig

    from bench.menagerie.torch_entries import _image_size, _shrink

    config = AutoConfig.for_model(model_type)
    _shrink(config)
    _shorten(config)
    name = transformers.models.auto.modeling_flax_auto.FLAX_MODEL_MAPPING_NAMES[model_type]
    model = getattr(transformers, name)(config, seed=SEED, _do_init=True)
    inputs = _inputs(model, config)
    if "pixel_values" not in inputs and "pixel_values" in inspect.signature(model.__call__).parameters:
        # text and image (CLIP-like): the call takes both
        side = _image_size(config)
        inputs["pixel_values"] = jax.random.normal(jax.random.key(SEED + 1), (1, 3, side, side))
    return model, (), inputs  # its call runs with train=False by default: no dropout


def _shorten(config: Any) -> None:
    """Position tables cut to 512: Flax models build their causal mask for every position in ``setup`` (Mistral's
    32,768 squared), and a trace keeps every value it computes."""
    for holder in (config, getattr(config, "text_config", None)):
        if isinstance(getattr(holder, "max_position_embeddings", None), int) and holder.max_position_embeddings > 512:
            holder.max_position_embeddings = 512


def _inputs(model: Any, config: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from bench.menagerie.torch_entries import UnsupportedInput, _image_size

    key = jax.random.key(SEED)
    main = getattr(model, "main_input_name", "input_ids")
    text = getattr(config, "text_config", None) or config
    vocab = min(int(getattr(text, "vocab_size", None) or 100), 100)
    if main == "input_ids":
        inputs = {"input_ids": jax.random.randint(key, (1, 8), 0, vocab)}
    elif main == "pixel_values":
        channels = getattr(config, "num_channels", None) or 3
        side = _image_size(config)
        inputs = {"pixel_values": jax.random.normal(key, (1, channels, side, side))}
    elif main == "input_values":
        inputs = {"input_values": jax.random.normal(key, (1, 4000))}
    elif main == "input_features":
        mels = getattr(config, "num_mel_bins", None) or 80
        frames = 2 * getattr(config, "max_source_positions", 50)
        inputs = {"input_features": jax.random.normal(key, (1, mels, frames))}
    else:
        raise UnsupportedInput(f"main input {main!r} has no generic small input here")
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = jnp.ones((1, 8), dtype=jnp.int32)
    return inputs
