"""The torch menagerie's diffusion models: every model class diffusers exports, built from a tiny config.

Enumerated from the library's own registry (each ``ModelMixin`` subclass the
``diffusers`` package exports: U-Nets, VAEs, diffusion transformers,
ControlNets, adapters). A model's config is its constructor's defaults, shrunk
by name (:func:`small_config`): one or two layers, 32 to 64 channels, two heads
of 16, conditioning 32 wide, 16-pixel latents. Its inputs are made by the
forward's argument names, and tried in the layouts a diffusers model takes its
main input in (an image batch, a video batch either way round, a token
sequence, a 1-D signal) until the model's own call runs. Random weights;
nothing is downloaded (no ``from_pretrained``). A class that still cannot be
built small, or that no layout runs, is excluded with its error: TorchLens
never ran. ``MAX_PARAMETERS`` bounds the parameters a shrunk model may keep.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from bench.menagerie.entries import Built, Entry

SIDE, FRAMES, TOKENS, WIDTH, COND = 16, 3, 8, 32, 32  # latent side, video frames, text tokens, widths
MAX_PARAMETERS = 20_000_000  # parameters: a shrunk model above it kept a size its config's names did not say


def entries() -> list[Entry]:
    try:
        import diffusers
    except ImportError:
        return []
    found = []
    for name in sorted(n for n in dir(diffusers) if n[0].isupper()):
        cls = _model_class(diffusers, name)
        if cls is None:
            continue
        family = "diffusers." + cls.__module__.split(".")[2 if cls.__module__.startswith("diffusers.models.") else 1]
        found.append(Entry("torch", f"diffusers/{name}", "diffusers", family, functools.partial(_build, name)))
    return found


def _model_class(diffusers: Any, name: str) -> type | None:
    from diffusers import ModelMixin

    try:
        cls = getattr(diffusers, name)
    except Exception:  # noqa: BLE001 - an export whose optional dependency is missing
        return None
    if not (inspect.isclass(cls) and issubclass(cls, ModelMixin) and cls is not ModelMixin):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(cls.__init__).parameters.values()):
        return None  # a container of other models (MultiControlNetModel, MultiAdapter): no config of its own
    return cls


# -- the config ---------------------------------------------------------------------------------------------------
_DEPTH = {
    "num_layers": 2,
    "num_single_layers": 1,
    "num_mmdit_layers": 1,
    "num_single_dit_layers": 1,
    "num_hidden_layers": 2,
    "mmdit_layers": 1,
    "num_refiner_layers": 1,
    "n_refiner_layers": 1,
    "n_layers": 2,
    "num_res_blocks": 1,
    "layers_per_block": 1,
    "transformer_layers_per_block": 1,
    "decoder_layers_per_block": 1,
    "encoder_layers_per_block": 1,
    "layers_per_up_block": 1,
    "layers_per_down_block": 1,
    "num_blocks": 1,
    "num_encoder_blocks": 1,
    "num_decoder_blocks": 1,
    "motion_layers_per_block": 1,
    "decoder_num_layers": 1,
    "enc_num_layers": 1,
    "perceiver_num_layers": 1,
    "num_enc_blocks": 1,
    "num_dec_blocks": 1,
    "down_num_layers_per_block": 1,
    "up_num_layers_per_block": 1,
    "encoder_transformer_depths": 1,
    "approximator_layers": 1,
    "decoder_num_hidden_layers": 1,
    "encoder_num_hidden_layers": 1,
}
_HEADS = {
    "num_attention_heads": 2,
    "n_heads": 2,
    "num_heads": 2,
    "decoder_num_attention_heads": 2,
    "num_cross_attention_heads": 2,
    "block_num_heads": 2,
    "motion_num_attention_heads": 2,
    "attn_num_heads": 2,
    "cross_attn_num_heads": 2,
    "addition_embed_type_num_heads": 2,
}
_HEAD_DIM = {
    "attention_head_dim": 16,
    "head_dim": 16,
    "dim_heads": 16,
    "cross_attention_head_dim": 16,
    "cross_attn_dim_head": 16,
    "decoder_attention_head_dim": 16,
}
_WIDE = {
    "hidden_size",
    "dim",
    "model_dim",
    "inner_dim",
    "base_dim",
    "decoder_base_dim",
    "ch",
    "base_channels",
    "encoder_dim",
    "decoder_dim",
    "decoder_hidden_size",
    "encoder_hidden_size",
    "channels",
    "encoder_channels",
    "dec_dim",
    "enc_dim",
    "model_channels",
    "decoder_channels",
    "micro_cond_embed_dim",
    "time_embed_dim",
    "freq_dim",
    "time_embedding_dim",
    "timestep_guidance_channels",
    "addition_time_embed_dim",
    "time_dim",
    "adaln_lora_dim",
    "timestep_channels",
    "approximator_num_channels",
    "time_proj_dim",
    "embedding_dim",
    "cond_embed_dim",
    "micro_cond_encode_dim",
    "timestep_ratio_embedding_dim",
    "out_emb_channels",
}
_CONDITIONING = {
    "cross_attention_dim",
    "joint_attention_dim",
    "caption_channels",
    "text_embed_dim",
    "text_dim",
    "text_in_dim",
    "cap_feat_dim",
    "text_encoder_dim",
    "pooled_projection_dim",
    "caption_projection_dim",
    "text_hidden_dim",
    "encoder_hidden_states_channels",
    "crossattn_proj_in_channels",
    "cross_attention_dim_t5",
    "global_states_input_dim",
    "cross_attention_input_dim",
    "conditioning_dim",
    "clip_text_pooled_in_channels",
    "encoder_hid_dim",
    "text_embed_dim_t5",
    "condition_dim",
    "projection_class_embeddings_input_dim",
    "source_dim",
    "target_dim",
}
_FEEDFORWARD = {
    "intermediate_size",
    "ffn_dim",
    "ffn_hidden_size",
    "ff_dim",
    "decoder_intermediate_size",
    "approximator_hidden_dim",
    "enc_intermediate_dim",
}
_SIZE = {
    "sample_size": SIDE,
    "sample_height": SIDE,
    "sample_width": SIDE,
    "resolution": SIDE,
    "max_text_seq_length": TOKENS,
    "text_len": TOKENS,
    "text_len_t5": TOKENS,
    "sample_frames": FRAMES,
    "video_length": FRAMES,
}
_GROUPS = {"norm_num_groups", "max_norm_num_groups", "motion_norm_num_groups", "groups", "attn_norm_num_groups"}
_CHANNEL_LISTS = ("block_out_channels", "conditioning_embedding_out_channels")
_ROPE_AXES = {"axes_dims_rope", "axes_dims", "rope_axes_dim"}

# Constructor arguments a class needs beyond its shrunk defaults (defaults of None its forward cannot take).
_CLASS_CONFIG: dict[str, dict[str, Any]] = {
    "Transformer2DModel": {"in_channels": 8, "cross_attention_dim": COND},
    "TransformerTemporalModel": {"in_channels": 8},
    "DreamLiteTransformer2DModel": {"in_channels": 8, "cross_attention_dim": COND},
    "LatteTransformer3DModel": {
        "in_channels": 4,
        "out_channels": 4,
        "patch_size": 2,
        "cross_attention_dim": COND,
        "caption_channels": COND,
        "num_embeds_ada_norm": 1000,
        "norm_type": "ada_norm_single",
    },
    "HunyuanDiT2DModel": {"in_channels": 4, "patch_size": 2},
    "EasyAnimateTransformer3DModel": {"in_channels": 4, "out_channels": 4, "patch_size": 2},
    "UNet2DModel": {"sample_size": SIDE},
    # the Fourier time embedding (2 x the first block's channels) is concatenated to the input's channels
    "UNet1DModel": {"sample_size": 64, "extra_in_channels": 64},
    # three added time ids, each embedded addition_time_embed_dim wide (32 once shrunk)
    "UNetSpatioTemporalConditionModel": {"projection_class_embeddings_input_dim": 3 * WIDTH},
    "PriorTransformer": {"num_embeddings": TOKENS},  # its text tokens: encoder_hidden_states is TOKENS long
}


def _rank_map(values: tuple[int, ...]) -> tuple[int, ...]:
    """Channel counts per block cut to 32, 64, 64...: equal counts stay equal, a wider block stays wider (32: some
    blocks hard-code 32 normalisation groups)."""
    ranks = {v: i for i, v in enumerate(sorted(set(values)))}
    return tuple(32 if ranks[v] == 0 else 64 for v in values)


def _rope_axes(count: int, head_dim: int) -> tuple[int, ...]:
    """Rotary axes summing to the head dimension, each even (Flux asks sum(axes) == attention_head_dim)."""
    base = [2 * (head_dim // (2 * count))] * count
    base[-1] += head_dim - sum(base)
    return tuple(base)


def small_config(cls: type) -> dict[str, Any]:
    """``cls``'s constructor defaults, cut by argument name to a model of a few hundred thousand parameters."""
    config: dict[str, Any] = {}
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is p.empty:
            continue
        value = _shrink(p.name, p.default)
        if value is not p.default:
            config[p.name] = value
    head_dim = config.get("attention_head_dim", 16)
    for p in params:
        if p.name in _ROPE_AXES and isinstance(p.default, (tuple, list)) and len(p.default) > 1:
            config[p.name] = type(p.default)(_rope_axes(len(p.default), head_dim if isinstance(head_dim, int) else 16))
    if "block_out_channels" in config and "attention_head_dim" in config and "num_attention_heads" not in config:
        # a U-Net's attention_head_dim is its head count (diffusers' old naming): 8 heads of 2 or 4 channels
        config["attention_head_dim"] = _like(config["attention_head_dim"], 8)
    config.update(_CLASS_CONFIG.get(cls.__name__, {}))
    return config


def _like(value: Any, small: int) -> Any:
    return type(value)(small for _ in value) if isinstance(value, (tuple, list)) else small


def _shrink(name: str, value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    numbers = isinstance(value, int) or (
        isinstance(value, (tuple, list))
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not numbers:
        return value
    if (
        name in _CHANNEL_LISTS
        or name.endswith("_block_out_channels")
        or (name == "channels" and not isinstance(value, int))
    ):
        return type(value)(_rank_map(tuple(value))) if isinstance(value, (tuple, list)) else 32
    if name in _DEPTH:
        return _like(value, _DEPTH[name]) if isinstance(value, (tuple, list)) else min(value, _DEPTH[name])
    if name in _HEADS:
        return _like(value, _HEADS[name])
    if name in _HEAD_DIM:
        return _like(value, _HEAD_DIM[name])
    if name in _GROUPS:
        return 8 if isinstance(value, int) else value
    if isinstance(value, int):
        if name in _WIDE:
            return min(value, WIDTH)
        if name in _CONDITIONING:
            return COND
        if name in _FEEDFORWARD:
            return min(value, 2 * WIDTH)
        if name in _SIZE:
            return min(value, _SIZE[name])
        if name in ("num_key_value_heads", "num_kv_heads", "num_key_value_attention_heads"):
            return 1
    elif name == "sample_size":
        return type(value)(SIDE for _ in value)
    return value


def _parameters_when_built(cls: type, config: dict[str, Any]) -> int | None:
    """The parameter count of ``cls(**config)`` built on the meta device (no memory, no time), or None."""
    import torch

    try:
        with torch.device("meta"):
            model = cls(**config)
    except Exception:  # noqa: BLE001 - some constructors compute on their tensors: the real build tells
        return None
    return sum(p.numel() for p in model.parameters())


# -- the inputs -------------------------------------------------------------------------------------------------
def _channels(config: dict[str, Any]) -> int:
    for key in (
        "in_channels",
        "encoder_in_channels",
        "latent_channels",
        "input_channels",
        "num_channels",
        "audio_channels",
        "conv_in_channels",
        "in_visual_dim",
        "hidden_size",
        "embedding_dim",
    ):
        if isinstance(config.get(key), int):
            return config[key]
    return 4


def _layouts(cls: type, channels: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The main input's candidate shapes, the class name's hint first."""
    image = ("image", (1, channels, SIDE, SIDE))
    video = ("video", (1, channels, FRAMES, SIDE, SIDE))
    frames_first = ("frames-first", (1, FRAMES, channels, SIDE, SIDE))
    tokens = ("tokens", (1, SIDE * SIDE // 4, channels))
    signal = ("signal", (1, channels, 64))
    vector = ("vector", (1, channels))
    # a VAE of five or six levels, or an audio one striding by thousands, needs a larger input than a latent
    large = [("image", (1, channels, 4 * SIDE, 4 * SIDE)), ("signal", (1, channels, 4096))]
    name = cls.__name__
    if any(k in name for k in ("3D", "Video", "Motion", "Temporal", "I2V")):
        order = [video, frames_first, image, tokens, signal]
    elif any(k in name for k in ("1D", "Audio", "Oobleck", "Vocoder", "Music")):
        order = [signal, tokens, image, video]
    else:
        order = [image, tokens, video, frames_first, signal]
    yield from [*order, vector, *large]


def _argument(name: str, model: Any, config: dict[str, Any], layout: str, shape: tuple[int, ...]) -> Any:
    """A small value for the forward argument ``name``, consistent with the main input's shape; None: none in
    this layout; ``_UNKNOWN``: none in any."""
    import torch

    tokens = shape[1] if layout == "tokens" else None
    axes = len(config.get("axes_dims_rope") or (0, 0, 0))  # Flux's ids: one column per rotary axis
    values: dict[str, Callable[[], Any]] = {
        "timestep": lambda: torch.tensor([10.0]),
        "timesteps": lambda: torch.tensor([10.0]),
        "timestep_r": lambda: torch.tensor([5.0]),
        "r_timestep": lambda: torch.tensor([5.0]),
        "timestep_ratio": lambda: torch.tensor([0.5]),
        "encoder_hidden_states": lambda: torch.randn(1, TOKENS, COND),
        "encoder_hidden_states_t5": lambda: torch.randn(1, TOKENS, COND),
        "encoder_attention_mask": lambda: torch.ones(1, TOKENS),
        "text_embedding_mask": lambda: torch.ones(1, TOKENS),
        "text_embedding_mask_t5": lambda: torch.ones(1, TOKENS),
        "pooled_projections": lambda: torch.randn(1, COND),
        "global_hidden_states": lambda: torch.randn(1, 1, COND),
        "clip_text_pooled": lambda: torch.randn(1, 1, COND),
        "class_labels": lambda: torch.tensor([1]),
        "guidance": lambda: torch.tensor([3.5]),
        "style": lambda: torch.tensor([0]),
        "image_meta_size": lambda: torch.tensor([[SIDE, SIDE, SIDE, SIDE, 0, 0]], dtype=torch.float32),
        "original_size": lambda: torch.tensor([[SIDE * 8.0, SIDE * 8.0]]),
        "target_size": lambda: torch.tensor([[SIDE * 8.0, SIDE * 8.0]]),
        "crop_coords": lambda: torch.tensor([[0.0, 0.0]]),
        "fps": lambda: torch.tensor([8]),
        "img_ids": lambda: torch.zeros(tokens, axes) if tokens else None,
        "txt_ids": lambda: torch.zeros(TOKENS, axes),
        "img_shapes": lambda: [(1, SIDE // 2, SIDE // 2)] if tokens else None,
        "image_latents": lambda: torch.randn(*shape) if layout == "video" else None,
        # a U-Net ControlNet embeds an 8x larger image; a transformer's takes latents like its own input
        "controlnet_cond": lambda: (
            torch.randn(1, config.get("conditioning_channels", 3), 8 * SIDE, 8 * SIDE)
            if hasattr(model, "controlnet_cond_embedding") and layout == "image"
            else torch.randn(*shape)
        ),
        "proj_embedding": lambda: torch.randn(1, config.get("embedding_dim", WIDTH)),
        "added_time_ids": lambda: torch.randn(1, 3),
    }
    make = values.get(name)
    return _UNKNOWN if make is None else make()


_UNKNOWN = object()  # no small value for an argument of this name, in any layout


# Optional forward arguments passed all the same: what conditions a diffusion model; and, when the model's call
# fails without them, the masks and extra conditions some models need though their signature says optional.
_CONDITIONS = {"timestep", "encoder_hidden_states", "pooled_projections", "img_ids", "txt_ids"}
_IF_NEEDED = {
    "encoder_attention_mask",
    "encoder_hidden_states_t5",
    "text_embedding_mask",
    "text_embedding_mask_t5",
    "image_meta_size",
    "style",
    "global_hidden_states",
    "img_shapes",
}


def _inputs(cls: type, model: Any) -> Iterator[dict[str, Any]]:
    """Candidate keyword arguments, each layout with the conditions alone, then with the extra ones too."""
    import torch

    config = dict(model.config)
    params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    main = next((p.name for p in params if p.name in ("sample", "hidden_states", "x", "latents")), None)
    if main is None:
        raise TypeError(f"{cls.__name__}.forward takes no sample or hidden_states: no generic input")
    optional = set(_CONDITIONS)
    if "cross_attention_dim" in config and config["cross_attention_dim"] is None:
        optional.discard("encoder_hidden_states")  # no cross-attention: its blocks would attend to it as frames
    if config.get("num_embeds_ada_norm") or config.get("num_class_embeds"):
        optional.add("class_labels")
    if config.get("guidance_embeds"):
        optional.add("guidance")
    for layout, shape in _layouts(cls, _channels(config)):
        for passed in (optional, optional | _IF_NEEDED):
            kwargs: dict[str, Any] | None = {main: torch.randn(*shape)}
            for p in params:
                if p.name == main or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    continue
                if p.default is not p.empty and p.name not in passed:
                    continue
                value = _argument(p.name, model, config, layout, shape)
                if value is _UNKNOWN and p.default is p.empty:
                    raise TypeError(f"no small input for {cls.__name__}'s forward argument {p.name!r}")
                if value is None and p.default is p.empty:
                    kwargs = None  # a required argument this layout has no value for: not this layout
                    break
                if value is not None and value is not _UNKNOWN:
                    kwargs[p.name] = value
            if kwargs is not None:
                yield kwargs


def _build(name: str) -> Built:
    import diffusers
    import torch

    from torchlens_core.ir import tree

    cls = getattr(diffusers, name)
    config = small_config(cls)
    count = _parameters_when_built(cls, config)
    if count is not None and count > MAX_PARAMETERS:
        raise ValueError(f"still {count / 1e6:.0f}M parameters after shrinking the config by name")
    torch.manual_seed(0)
    model = cls(**config).eval()
    errors: list[str] = []
    for kwargs in _inputs(cls, model):
        try:
            with torch.no_grad():
                torch.manual_seed(0)
                output = model(**kwargs)
        except Exception as exc:  # noqa: BLE001 - this layout is not the model's: try the next
            errors.append(f"{type(exc).__name__}: {str(exc).strip()[:80]}")
            continue
        if not any(True for _ in tree.leaves(output, lambda v: isinstance(v, torch.Tensor))):
            # MotionAdapter: a holder of modules another model loads, whose forward does nothing
            raise TypeError(f"{name}.forward returns no tensor: nothing to trace")
        return model, (), kwargs
    raise RuntimeError(f"no input layout runs the model: {errors[0]} (first of {len(errors)} tried)")
