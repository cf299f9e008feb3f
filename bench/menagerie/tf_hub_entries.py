"""The keras_hub menagerie: every ``Backbone`` that ``keras_hub.models`` exports, built small from its signature.

keras_hub is Keras's own registry of architectures (BERT, GPT-2, Llama,
Whisper, ViT, SAM, ResNet...). The backbones are enumerated from the
``keras_hub.models`` namespace (its ``Backbone`` subclasses), so one keras_hub
adds joins by itself. Each is built with random weights, never from a preset
(nothing is downloaded), its constructor's arguments chosen from their names
(:func:`small_kwargs`: two layers and heads, hidden size 32, a vocabulary of
64, 32x32 images...), and fed inputs made from the functional model's own
input specs (:func:`inputs_for`: token ids within the vocabulary, padding
masks of ones, images, audio). Only what a signature cannot say (which
backbone a composite wraps, the stage lists of a conv net that must agree
with each other, per-layer lists) is in the per-backbone table
``_OVERRIDES``, each with the reason. A new backbone whose required arguments
no rule names is built by none: the runner records it as excluded, with
:class:`CannotShrink` naming the argument.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

from bench.menagerie.entries import Built, Entry

SEQUENCE = 8  # tokens per sequence, audio frames, ... (a free dimension of an input that is not an image side)
IMAGE = 32  # pixels per side of an image whose backbone fixes none
VOCABULARY = 64
AUDIO = 1600  # samples of raw audio (Moonshine's strided convolutions take 127 + 64 * 12 at the least)

# Argument name -> its small value: the first rule whose pattern the name matches decides. Every argument with no
# default gets one; an integer default larger than the rule's integer is cut to it (a long position table, 12 heads).
_RULES: tuple[tuple[str, Any], ...] = (
    (r"vocab(ulary)?_size", VOCABULARY),
    (r"num_key_value_heads$", 1),
    (r"(^|_)(num_)?(\w+_)?(attention_)?heads$", 2),
    (r"(^|_)(num_(\w+_)?layers|num_layers_\w+|layers|depth|depth_single_blocks)$", 2),
    (r"(head_dim|head_size|key_value_dim)$", 16),
    (r"(intermediate_dim|intermediate_size|mlp_dim|ffn_dim)$", 64),
    (r"(_dim|hidden_size|embed_dim)$", 32),
    (r"patch_size$", 4),
    (r"image_size$", IMAGE),
    (r"num_experts$", 4),
    (r"top_k$", 2),
    # position tables as long as the inputs: a model that adds its whole table needs exactly that length
    (r"max_(\w+_)?(sequence_length|position_embeddings)$", SEQUENCE),
    # required scalars that are not sizes: the values keras_hub's presets use
    (r"dropout", 0.0),
    (r"(eps|epsilon)$", 1e-6),
    (r"initializer_range$", 0.02),
    (r"(theta|wavelength)$", 10000.0),
    (r"partial_rotary_factor$", 1.0),
    (r"(^use_|_bias$)", True),
    (r"pad_token_id$", 0),
    (r"(hidden_)?act(ivation)?$", "gelu"),
)

# Arguments the backbone takes that are not architecture (handled by Keras's own machinery).
_SKIPPED = {"self", "dtype", "name"}


class CannotShrink(Exception):
    """A required argument of a backbone that neither the name rules nor the override table give a value for."""


def entries(backend: str = "tf") -> list[Entry]:
    import keras_hub

    found = []
    for name in sorted(dir(keras_hub.models)):
        cls = getattr(keras_hub.models, name)
        alias = name != getattr(cls, "__name__", name) and getattr(keras_hub.models, cls.__name__, None) is cls
        if _is_architecture(cls, keras_hub.models.Backbone) and not alias:  # SmolLMBackbone is SmolLM3Backbone
            found.append(
                Entry(
                    backend,
                    f"keras_hub/{name}",
                    "keras_hub",
                    f"keras_hub.{name}",
                    functools.partial(build, name),
                    rtol=1e-4,
                )
            )
    return found


def _is_architecture(cls: Any, base: type) -> bool:
    """A Backbone subclass that defines an architecture: not Backbone itself, nor a base taking only *args."""
    if not (isinstance(cls, type) and issubclass(cls, base)) or cls is base:
        return False
    params = inspect.signature(cls.__init__).parameters.values()
    return any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in _SKIPPED for p in params)


def build(name: str) -> Built:
    """The backbone ``keras_hub.models.<name>`` built small with random weights, and inputs for it."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = make(getattr(keras_hub.models, name))
    return backbone, (inputs_for(backbone),), {}


def make(cls: type, **given: Any) -> Any:
    """``cls`` built from :func:`small_kwargs`; ``given`` wins over both the rules and the override table."""
    return cls(**small_kwargs(cls, given))


def small_kwargs(cls: type, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """Constructor arguments for a small ``cls``: ``given``, then the override table's, then the name rules'."""
    overrides = {
        k: (v() if callable(v) else v)  # a part (_part) is built afresh for each backbone
        for k, v in _OVERRIDES.get(cls.__name__, {}).items()
        if k not in (given or {})
    }
    overrides.update(given or {})
    kwargs: dict[str, Any] = {}
    for param in inspect.signature(cls.__init__).parameters.values():
        if param.name in _SKIPPED or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name in overrides:
            continue
        value = _small(param.name, param.default)
        if value is not None:
            kwargs[param.name] = value
        elif param.default is inspect.Parameter.empty:
            raise CannotShrink(f"{cls.__name__}: no small value for its required argument {param.name!r}")
    return {**kwargs, **overrides}


def _small(name: str, default: Any) -> Any:
    """The small value for argument ``name`` (None: keep the default)."""
    required = default is inspect.Parameter.empty
    if name == "image_shape":
        if required:
            return (IMAGE, IMAGE, 3)
        if isinstance(default, tuple | list) and len(default) == 3 and all(isinstance(d, int) for d in default):
            return (IMAGE, IMAGE, default[-1])  # a fixed size the backbone was made for: the small one
        return None
    for pattern, small in _RULES:
        if re.search(pattern, name):
            if required:
                return small
            shrinks = type(default) is int and type(small) is int and default > small
            return small if shrinks else None
    return None


def inputs_for(backbone: Any) -> Any:
    """Inputs matching the functional model's own input specs: ids within the vocabulary, masks of ones, floats.

    A dimension the spec leaves free is an image side (IMAGE) in a batch of images, a number of audio samples
    (AUDIO) in raw audio, else a sequence length (SEQUENCE); ``_INPUT_SHAPES`` has what no spec says.
    """
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    vocabulary = _vocabulary(backbone)
    fixed = _INPUT_SHAPES.get(type(backbone).__name__, {})

    def make_one(spec: Any) -> Any:
        dtype, name = str(spec.dtype), spec.name or ""
        free = IMAGE if "float" in dtype and len(spec.shape) == 4 else AUDIO if "values" in name else SEQUENCE
        shape = fixed.get(name) or [1] + [free if d is None else d for d in spec.shape[1:]]
        if dtype == "bool" or "mask" in name or "label" in name:  # attend everywhere; a point or box in front
            value = np.ones(shape, dtype=dtype)
        elif "int" in dtype and "segment" in name:
            value = np.zeros(shape, dtype=dtype)
        elif "int" in dtype and "position" in name:  # positions in order
            value = np.broadcast_to(np.arange(shape[1]).reshape([1, -1] + [1] * (len(shape) - 2)), shape)
            value = value.astype(dtype)
        elif "int" in dtype:
            value = rng.integers(1, vocabulary, size=shape).astype(dtype)
        elif "box" in name or "point" in name:  # coordinates, in [0, 1) (SAM 3's first box entry: image 0)
            value = rng.uniform(0, 1, size=shape).astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(dtype)
        return keras.ops.convert_to_tensor(value)

    return keras.tree.map_structure(make_one, backbone.input)


def _vocabulary(backbone: Any) -> int:
    sizes = [
        v
        for k, v in backbone.get_config().items()
        if re.search(r"vocab(ulary)?_size$", k) and isinstance(v, int) and v > 1
    ]
    return min(sizes, default=VOCABULARY)


# -- what the signatures cannot say ---------------------------------------------------------------------------------
def _part(name: str, **given: Any) -> Callable[[], Any]:
    """A part a composite wraps (its signature says only ``image_encoder``): a keras_hub model or layer, built small."""

    def built() -> Any:
        import keras_hub

        cls = getattr(keras_hub.models, name, None) or getattr(keras_hub.layers, name)
        return make(cls, **given)

    return built


def _vae(**given: Any) -> Callable[[], Any]:
    """Stable Diffusion 3's autoencoder: keras_hub exports no VAEBackbone, only the model that needs one."""

    def built() -> Any:
        from keras_hub.src.models.vae.vae_backbone import VAEBackbone

        return make(VAEBackbone, **given)

    return built


# Input shapes no spec says: SAM's mask prompt is 4x its image embedding grid (8x8 here), one mask per image.
_INPUT_SHAPES: dict[str, dict[str, list[int]]] = {"SAMBackbone": {"masks": [1, 1, 32, 32, 1]}}

_OVERRIDES: dict[str, dict[str, Any]] = {
    # conv nets: per-stage lists, which must have one length and agree with each other (a stage's input width is
    # the last one's output), and block types the signature names no choice of
    "ResNetBackbone": {
        "input_conv_filters": [64],
        "input_conv_kernel_sizes": [3],
        # four stages: BASNet, RetinaNet and DeepLabV3 read its P2..P5 pyramid outputs; the first
        # stage's width is fixed at 64 (ResNetBackbone refuses any other), and the stem's must match it
        "stackwise_num_filters": [64, 16, 16, 16],
        "stackwise_num_blocks": [1, 1, 1, 1],
        "stackwise_num_strides": [1, 2, 2, 2],
        "block_type": "basic_block",
    },
    "VGGBackbone": {"stackwise_num_repeats": [1, 1], "stackwise_num_filters": [8, 16]},
    "DenseNetBackbone": {"stackwise_num_repeats": [1, 2], "growth_rate": 8},
    "XceptionBackbone": {"stackwise_conv_filters": [[8, 16], [16, 16]], "stackwise_pooling": [False, True]},
    # the per-stage ratios decide the split of the cross-stage channels: these are a combination keras_hub accepts
    "CSPNetBackbone": {
        "stem_filters": 8,
        "stem_kernel_size": 3,
        "stem_strides": 1,
        "stackwise_depth": [1, 1],
        "stackwise_strides": 2,
        "stackwise_num_filters": [8, 16],
        "block_type": "dark_block",
        "stage_type": "csp",
        "down_growth": True,
        "bottle_ratio": (0.5, 1.0),
        "block_ratio": (1.0, 0.5),
        "expand_ratio": (2.0, 1.0),
        "stem_padding": "same",
    },
    "EfficientNetBackbone": {
        "stackwise_kernel_sizes": [3, 3],
        "stackwise_num_repeats": [1, 1],
        "stackwise_input_filters": [8, 8],
        "stackwise_output_filters": [8, 16],
        "stackwise_expansion_ratios": [1, 4],
        "stackwise_squeeze_and_excite_ratios": [0.0, 0.25],
        "stackwise_strides": [1, 2],
        "stackwise_block_types": ["fused", "unfused"],
        "stackwise_force_input_filters": [0, 0],
        "stackwise_nores_option": [False, False],
        "num_features": 32,
        "width_coefficient": 1.0,
        "depth_coefficient": 1.0,
    },
    "MobileNetBackbone": {
        "stackwise_expansion": [[16], [24, 24]],
        "stackwise_num_blocks": [1, 2],
        "stackwise_num_filters": [[8], [16, 16]],
        "stackwise_kernel_size": [[3], [5, 5]],
        "stackwise_num_strides": [[2], [2, 1]],
        "stackwise_se_ratio": [[None], [0.25, 0.25]],
        "stackwise_activation": [["relu"], ["hard_swish", "hard_swish"], ["hard_swish"]],
        "stackwise_padding": [[1], [2, 2]],
        "output_num_filters": 32,
        "depthwise_filters": 8,
        "depthwise_stride": 2,
        "depthwise_residual": False,
        "last_layer_filter": 32,
        "squeeze_and_excite": 0.5,
        "input_num_filters": 8,
    },
    "MobileNetV5Backbone": {
        "stackwise_block_types": [["er"], ["uir", "uir"]],
        "stackwise_num_blocks": [1, 2],
        "stackwise_num_filters": [[16], [24, 24]],
        "stackwise_strides": [[2], [2, 1]],
        "stackwise_act_layers": [["relu"], ["relu", "relu"]],
        "stackwise_exp_ratios": [[4.0], [6.0, 6.0]],
        "stackwise_se_ratios": [[0.0], [0.0, 0.0]],
        "stackwise_dw_kernel_sizes": [[0], [5, 5]],
        "stackwise_dw_start_kernel_sizes": [[0], [0, 0]],
        "stackwise_dw_end_kernel_sizes": [[0], [0, 0]],
        "stackwise_exp_kernel_sizes": [[3], [0, 0]],
        "stackwise_pw_kernel_sizes": [[1], [0, 0]],
        "stackwise_num_heads": [[0], [0, 0]],
        "stackwise_key_dims": [[0], [0, 0]],
        "stackwise_value_dims": [[0], [0, 0]],
        "stackwise_kv_strides": [[0], [0, 0]],
        "stackwise_use_cpe": [[False], [False, False]],
        "stem_size": 8,
        "num_features": 32,
        "use_msfa": False,
    },
    "HGNetV2Backbone": {
        "stem_channels": [3, 8, 8],
        "stackwise_stage_filters": [[8, 8, 16, 1, 1, 3], [16, 8, 32, 1, 1, 3]],
        "apply_downsample": [False, True],
        "use_lightweight_conv_block": [False, False],
        "depths": [1, 1],
        "hidden_sizes": [16, 32],
        "embedding_size": 8,
        "use_learnable_affine_block": True,
        "hidden_act": "relu",
        "out_features": ["stage1", "stage2"],
    },
    # per-stage lists of hierarchical vision transformers (heads, reduction ratios, patch sizes per stage)
    "MiTBackbone": {
        "image_shape": (IMAGE, IMAGE, 3),  # its attention's reductions need the size up front
        "layerwise_depths": [1, 1],
        "hidden_dims": [8, 16],
        "num_layers": 2,
        "layerwise_num_heads": [1, 2],
        "layerwise_sr_ratios": [4, 2],
        "max_drop_path_rate": 0.0,
        "layerwise_patch_sizes": [7, 3],
        "layerwise_strides": [4, 2],
    },
    "SwinTransformerBackbone": {"depths": (1, 1), "num_heads": (2, 4), "window_size": 4, "drop_path": 0.0},
    # which of its layers attend globally (the rest in windows): indices below its layer count
    "ViTDetBackbone": {
        "global_attention_layer_indices": [1],
        "window_size": 4,
        "num_output_channels": 16,
        "image_shape": (IMAGE, IMAGE, 3),
    },  # its position table needs the size up front
    "VideoPrismBackbone": {"num_frames": 2},  # frames per clip: its temporal position table is that long
    # per-layer lists, one entry per layer (two), and the sliding windows shorter than the sequence (so they slide)
    "SmolLM3Backbone": {"rope_layer_enabled_list": [True, False], "layer_types": ["attention", "attention"]},
    "T5GemmaBackbone": {
        "encoder_layer_types": ["sliding_attention", "full_attention"],
        "decoder_layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 4,
        "cross_attention_hidden_size": 32,
    },
    "T5Gemma2Backbone": {
        "encoder_layer_types": ["sliding_attention", "full_attention"],
        "decoder_layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 4,
        "cross_attention_hidden_size": 32,
    },
    "Gemma3nBackbone": {
        "intermediate_size": [64, 64],
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 4,
        "hidden_size_per_layer_input": 4,
        "altup_num_inputs": 2,
        "laurel_rank": 2,
        "hidden_activation": "gelu_approximate",
    },
    "Qwen3_5Backbone": {"layer_types": ["linear_attention", "full_attention"]},
    "Qwen3_5MoeBackbone": {"layer_types": ["linear_attention", "full_attention"]},
    # the rotary axes split the head dimension (32 / 2 heads = 4 + 6 + 6); sequence shapes (tokens, channels)
    "FluxBackbone": {
        "input_channels": 16,
        "mlp_ratio": 2.0,
        "axes_dim": [4, 6, 6],
        "theta": 10000,
        "use_bias": True,
        "guidance_embed": True,
        "image_shape": (SEQUENCE, 16),
        "text_shape": (SEQUENCE, 16),
        "image_ids_shape": (SEQUENCE, 3),
        "text_ids_shape": (SEQUENCE, 3),
        "y_shape": (16,),
    },
    # composites: which backbones they wrap, and the sizes the parts must share
    "BASNetBackbone": {"image_encoder": _part("ResNetBackbone"), "num_classes": 1},
    # 64x64 images: the coarsest pyramid level (P5, 1/32) is then 2x2, not a single pixel
    "RetinaNetBackbone": {
        "image_encoder": _part("ResNetBackbone"),
        "min_level": 3,
        "max_level": 5,
        "use_p5": True,
        "image_shape": (64, 64, 3),
    },
    "DeepLabV3Backbone": {
        "image_encoder": _part("ResNetBackbone"),
        "spatial_pyramid_pooling_key": "P4",
        "low_level_feature_key": "P2",
        "upsampling_size": 4,
        "dilation_rates": [1, 2],
        "projection_filters": 8,
        "image_shape": (64, 64, 3),
    },
    "SegFormerBackbone": {"image_encoder": _part("MiTBackbone"), "projection_filters": 16},
    # four encoder layers, one per feature key; 9x9 patches, so that the coarsest reassembled map (x0.5) still
    # fits the fusion's 3x3 convolutions
    "DepthAnythingBackbone": {
        "image_encoder": _part(
            "DINOV2Backbone", num_layers=4, patch_size=14, image_shape=(126, 126, 3), apply_layernorm=True
        ),
        "reassemble_factors": [4, 2, 1, 0.5],
        "neck_hidden_dims": [8, 16, 16, 32],
        "fusion_hidden_dim": 16,
        "head_hidden_dim": 8,
        "head_in_index": -1,
        "feature_keys": ["stage1", "stage2", "stage3", "stage4"],
    },
    "CLIPBackbone": {"vision_encoder": _part("CLIPVisionEncoder"), "text_encoder": _part("CLIPTextEncoder")},
    "MetaCLIP2Backbone": {
        "vision_encoder": _part("MetaCLIP2VisionEncoder"),
        "text_encoder": _part("MetaCLIP2TextEncoder"),
    },
    "SigLIPBackbone": {"vision_encoder": _part("SigLIPVisionEncoder"), "text_encoder": _part("SigLIPTextEncoder")},
    "PARSeqBackbone": {
        "image_encoder": _part("ViTBackbone", image_shape=(16, 32, 3), patch_size=(4, 8), use_class_token=False),
        "max_label_length": SEQUENCE,
        "decoder_hidden_dim": 32,
    },  # the encoder's width
    "BLIP2Backbone": {
        "vision_encoder": _part("BLIP2VisionEncoder"),
        "qformer": _part("BLIP2QFormer", num_query_tokens=2, cross_attention_frequency=1),
        # the language model reads the query tokens before the text: its positions hold both
        "language_model": _part("BLIP2CustomOPT", num_query_tokens=2, max_sequence_length=32),
    },
    "SAMBackbone": {
        "image_encoder": _part("ViTDetBackbone", image_shape=(IMAGE, IMAGE, 3)),
        # the prompt encoder's embedding grid is the image encoder's (32 pixels / patch 4)
        "prompt_encoder": _part(
            "SAMPromptEncoder", image_embedding_size=(8, 8), input_image_size=(IMAGE, IMAGE), mask_in_channels=8
        ),
        "mask_decoder": _part("SAMMaskDecoder", num_multimask_outputs=3),
    },
    "SAM3PromptableConceptBackbone": {
        "vision_encoder": _part(
            "SAM3VisionEncoder",
            image_shape=(56, 56, 3),
            patch_size=14,
            fpn_scale_factors=[4.0, 2.0, 1.0, 0.5],
            pretrain_image_shape=(56, 56, 3),
            window_size=2,
            global_attn_indexes=[1],
        ),
        "text_encoder": _part("SAM3TextEncoder", max_sequence_length=SEQUENCE),
        "geometry_encoder": _part("SAM3GeometryEncoder", roi_size=2),
        "detr_encoder": _part("SAM3DetrEncoder"),
        "detr_decoder": _part("SAM3DetrDecoder", image_shape=(56, 56, 3), patch_size=14, num_queries=4),
        "mask_decoder": _part("SAM3MaskDecoder", num_upsampling_stages=2),
    },
    # the decoder reads the HGNetV2 stages' widths and strides; no denoising queries (they need labels)
    "DFineBackbone": {
        "backbone": _part("HGNetV2Backbone"),
        "decoder_in_channels": [16, 16],
        "encoder_hidden_dim": 16,
        "num_labels": 4,
        "num_denoising": 0,
        "learn_initial_query": False,
        "num_queries": 4,
        "anchor_image_size": (IMAGE, IMAGE),
        "feat_strides": [4, 8],
        "num_feature_levels": 2,
        "hidden_dim": 16,
        "encoder_in_channels": [16, 32],
        "encode_proj_layers": [1],
        "encoder_ffn_dim": 32,
        "num_encoder_layers": 1,
        "hidden_expansion": 0.5,
        "depth_multiplier": 0.5,
        "eval_idx": -1,
        "num_decoder_layers": 2,
        "decoder_ffn_dim": 32,
        "decoder_n_points": [2, 2],
        "lqe_hidden_dim": 16,
        "num_lqe_layers": 2,
        "out_features": ["stage1", "stage2"],
        "seed": 0,
    },
    # the autoencoder's group norms take 32 groups (so 32 filters at least); the position table covers the 4x4
    # latent of a 32x32 image; both text encoders are CLIP's, read at their second-to-last layer as SD 3 does
    "StableDiffusion3Backbone": {
        "mmdit_patch_size": 2,
        "mmdit_position_size": 16,
        "mmdit_qk_norm": None,
        "mmdit_dual_attention_indices": None,
        "image_shape": (IMAGE, IMAGE, 3),
        "vae": _vae(
            encoder_num_filters=[32, 32, 32, 32],
            encoder_num_blocks=[1, 1, 1, 1],
            decoder_num_filters=[32, 32, 32, 32],
            decoder_num_blocks=[1, 1, 1, 1],
            sampler_method="mode",
        ),
        "clip_l": _part("CLIPTextEncoder", intermediate_output_index=-2),
        "clip_g": _part("CLIPTextEncoder", intermediate_output_index=-2),
    },
}
