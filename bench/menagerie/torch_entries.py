"""The torch menagerie: torchvision's builders, timm's smallest variant per family, transformers' model types;
torch_geometric's graph networks and diffusers' models come from their own modules (torch_graph_entries.py,
torch_diffusion_entries.py).

Each is enumerated from the library's own registry (``torchvision.models.list_models``,
``timm.list_models``, transformers' ``MODEL_MAPPING_NAMES``), so a model the
library adds joins by itself. Weights are random (seeded), inputs small,
nothing is downloaded. Builds import their library when called, in the
child process that runs the entry.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from bench.menagerie.entries import Built, Entry


def _seed() -> None:
    import torch

    torch.manual_seed(0)


def entries() -> list[Entry]:
    from bench.menagerie import torch_diffusion_entries, torch_graph_entries

    return (
        _torchvision()
        + _timm()
        + _transformers()
        + _transformers_eager()
        + torch_graph_entries.entries()
        + torch_diffusion_entries.entries()
    )


# -- torchvision --------------------------------------------------------------------------------------------------
# submodule of torchvision.models -> task
_TV_TASKS = {
    "": "classification",
    "detection": "detection",
    "segmentation": "segmentation",
    "video": "video",
    "optical_flow": "optical_flow",
    "quantization": "quantization",
}


def _torchvision() -> list[Entry]:
    import torchvision.models as tvm

    found = []
    for sub, task in _TV_TASKS.items():
        module = getattr(tvm, sub) if sub else tvm
        for name in tvm.list_models(module=module):
            arch = re.match(r"[a-z]+(?:_v\d)?", name.removeprefix("quantized_")).group(0)
            found.append(
                Entry(
                    "torch",
                    f"torchvision/{name}",
                    "torchvision",
                    f"torchvision.{task}.{arch}",
                    functools.partial(_build_torchvision, name, task),
                )
            )
    return found


def _vit_image_size(name: str) -> int:
    patch = int(re.search(r"_(\d+)$", name).group(1))  # vit_b_16: 16-pixel patches
    return 2 * patch


def _build_torchvision(name: str, task: str) -> Built:
    import torch
    import torchvision.models as tvm

    _seed()
    builder = tvm.get_model_builder(name)
    kwargs: dict[str, Any] = {"weights": None}
    size, batch_shape = 64, None
    if task == "classification":
        if name.startswith("vit_"):
            size = _vit_image_size(name)
            kwargs["image_size"] = size
        elif name == "inception_v3":
            size = 96  # its stem needs at least 75 pixels
            kwargs["init_weights"] = True
        elif name == "googlenet":
            kwargs["init_weights"] = True
        elif name.startswith("maxvit"):
            size, kwargs["input_size"] = 64, (64, 64)
    elif task == "quantization":
        kwargs["quantize"] = False  # the quantizable float model: quantize=True needs trained weights
        if name == "quantized_inception_v3":
            size = 96
        if name in ("quantized_googlenet", "quantized_inception_v3"):
            kwargs["init_weights"] = True
    elif task == "detection":
        kwargs["weights_backbone"] = None
        if not name.startswith("ssd"):
            kwargs.update(min_size=128, max_size=128)  # the transform would resize to 800 pixels
        model = builder(**kwargs).eval()
        return model, ([torch.rand(3, 128, 128)],), {}
    elif task == "segmentation":
        kwargs["weights_backbone"] = None
    elif task == "video":
        batch_shape = (1, 3, 8, 64, 64)
    elif task == "optical_flow":
        model = builder(**kwargs).eval()
        images = torch.rand(2, 1, 3, 128, 128)
        return model, (images[0], images[1]), {"num_flow_updates": 2}
    model = builder(**kwargs).eval()
    return model, (torch.randn(*(batch_shape or (1, 3, size, size))),), {}


# -- timm ---------------------------------------------------------------------------------------------------------
# Words timm uses for its variants' sizes, smallest first: the smallest variant of a family is the name with the
# earliest of these (then the shortest name).
_TIMM_SIZES = (
    "test",
    "atto",
    "femto",
    "pico",
    "zepto",
    "nano",
    "xxxs",
    "xxs",
    "xs",
    "micro",
    "mini",
    "tiny",
    "tn",
    "t",
    "small",
    "s",
    "lite",
    "b0",
    "light",
    "medium",
    "m",
    "base",
    "b",
    "large",
    "l",
    "huge",
    "h",
    "giant",
    "g",
)


def _timm_size_rank(name: str) -> tuple[int, int, int, str]:
    tokens = re.split(r"[_.]", name)
    ranks = [_TIMM_SIZES.index(t) for t in tokens if t in _TIMM_SIZES]
    numbers = [int(n) for n in re.findall(r"\d+", name.split(".")[0])]
    return (min(ranks, default=len(_TIMM_SIZES)), numbers[0] if numbers else 0, len(name), name)


def _timm() -> list[Entry]:
    try:
        import timm
    except ImportError:
        return []
    families: dict[str, list[str]] = {}
    for name in timm.list_models():
        families.setdefault(re.match(r"[a-z]+", name).group(0), []).append(name)
    return [
        Entry(
            "torch",
            f"timm/{min(names, key=_timm_size_rank)}",
            "timm",
            f"timm.{family}",
            functools.partial(_build_timm, min(names, key=_timm_size_rank)),
        )
        for family, names in families.items()
    ]


def _build_timm(name: str) -> Built:
    import timm
    import torch

    _seed()
    try:  # most fixed-size models (ViTs, Swins) take img_size: 64 pixels keeps them fast
        model = timm.create_model(name, pretrained=False, img_size=64).eval()
        x = torch.randn(1, model.pretrained_cfg.get("input_size", (3,))[0], 64, 64)
        with torch.no_grad():  # eval mode draws no random numbers: the model stays as seeded
            model(x)
        return model, (x,), {}
    except Exception:  # noqa: BLE001 - any refusal of the small size: fall back to the model's own input size
        model = None  # a large model must not be held twice
    _seed()
    model = timm.create_model(name, pretrained=False).eval()
    channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
    for side in (64, 128):  # convolutional models pool adaptively: try small inputs before the nominal one
        x = torch.randn(1, channels, side, side)
        try:
            with torch.no_grad():
                model(x)
            return model, (x,), {}
        except Exception:  # noqa: BLE001
            continue
    return model, (torch.randn(1, channels, height, width),), {}


# -- transformers -------------------------------------------------------------------------------------------------
def _transformers() -> list[Entry]:
    try:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    except ImportError:
        return []
    return [
        Entry(
            "torch",
            f"transformers/{model_type}",
            "transformers",
            "transformers",
            functools.partial(_build_transformers, model_type),
        )
        for model_type in MODEL_MAPPING_NAMES
    ]


_LAYERS = {
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "text_layers",
    "vision_layers",
    "depth",
    "num_blocks",
}
_HIDDEN = {
    "hidden_size",
    "d_model",
    "n_embd",
    "embed_dim",
    "dim",
    "hidden_dim",
    "word_embed_proj_dim",
    "projection_dim",
    "d_embed",
}
_INTERMEDIATE = {
    "intermediate_size",
    "ffn_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "n_inner",
    "d_ff",
    "intermediate_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
}
_HEADS = {"num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads", "num_heads"}


def _shrink(config: Any, seen: set[int] | None = None) -> None:
    """A config (and its sub-configs) cut to 2 layers, hidden size 64, 4 heads of 16, intermediate size 128."""
    from transformers import PretrainedConfig

    seen = set() if seen is None else seen
    if id(config) in seen:
        return
    seen.add(id(config))
    values = vars(config)
    heads_before = next((values[k] for k in _HEADS if isinstance(values.get(k), int)), None)
    for key, value in list(values.items()):
        if isinstance(value, PretrainedConfig):
            _shrink(value, seen)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if key in _LAYERS and value > 2:
                setattr(config, key, 2)
            elif key in _HIDDEN and value > 64:
                setattr(config, key, 64)
            elif key in _INTERMEDIATE and value > 128:
                setattr(config, key, 128)
            elif key in _HEADS and value > 4:
                setattr(config, key, 4)
            elif key == "num_key_value_heads" and value > 1:
                setattr(config, key, 4 if value == heads_before else 2)
            elif key == "head_dim" and value > 16:
                setattr(config, key, 16)
            elif key in ("num_experts", "num_local_experts", "n_routed_experts") and value > 4:
                setattr(config, key, 4)
            elif key in ("num_experts_per_tok", "moe_topk", "top_k") and value > 2:
                setattr(config, key, 2)
            elif key == "image_size" and value > 64:
                setattr(config, key, 64)
        elif key == "depths" and isinstance(value, list | tuple):
            setattr(config, key, type(value)(1 for _ in value))
    if hasattr(config, "use_cache"):
        config.use_cache = False  # the output stays tensors, not a Cache object


def _image_size(config: Any) -> int:
    for holder in (config, getattr(config, "vision_config", None)):
        size = getattr(holder, "image_size", None)
        if isinstance(size, int):
            return size
        if isinstance(size, list | tuple) and size:
            return int(size[0])
    return 64


def _build_transformers(model_type: str) -> Built:
    import torch
    from transformers import AutoConfig, AutoModel

    _seed()
    config = AutoConfig.for_model(model_type)
    _shrink(config)
    model = AutoModel.from_config(config).eval()
    inputs = _transformers_inputs(model, config)
    if "pixel_values" not in inputs and "pixel_values" in inspect.signature(model.forward).parameters:
        # text and image (CLIP-like): with an image when the model takes one so, else text alone
        with_image = {**inputs, "pixel_values": torch.randn(1, 3, _image_size(config), _image_size(config))}
        try:
            with torch.no_grad():
                model(**with_image)
            inputs = with_image
        except Exception:  # noqa: BLE001 - the image needs tokens or sizes of its own: text alone
            pass
    return model, (), inputs


def _transformers_inputs(model: Any, config: Any) -> dict[str, Any]:
    import torch

    main = getattr(model, "main_input_name", "input_ids")
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or 100
    inputs: dict[str, Any]
    if main == "input_ids":
        inputs = {"input_ids": torch.randint(0, min(int(vocab), 100), (1, 8))}
    elif main == "pixel_values":
        channels = getattr(config, "num_channels", None) or 3
        side = _image_size(config)
        inputs = {"pixel_values": torch.randn(1, channels, side, side)}
    elif main == "input_values":
        inputs = {"input_values": torch.randn(1, 4000)}
    elif main == "input_features":
        mels = getattr(config, "num_mel_bins", None) or 80
        frames = 2 * getattr(config, "max_source_positions", 50)
        inputs = {"input_features": torch.randn(1, mels, frames)}
    else:
        raise UnsupportedInput(f"main input {main!r} has no generic small input here")
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(0, min(int(vocab), 100), (1, 8))
    return inputs


# Decoders with eager attention (what output_attentions=True needs), on a left-padded batch of two: transformers 4.x
# builds their attention masks under torch.vmap (transformers.masking_utils), which a trace records as one op whose
# closure reads the padding mask (backends/torch/transforms.py); 5.x builds them without vmap. The padding mask is an
# input, which the replay-on-other-inputs check shuffles. (Whisper, whose default attention builds its decoder's
# mask under vmap on 4.x too, is transformers/whisper above.)
_EAGER = ("llama", "mistral", "gemma", "gpt2")


def _transformers_eager() -> list[Entry]:
    try:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    except ImportError:
        return []
    return [
        Entry(
            "torch",
            f"transformers-eager/{model_type}",
            "transformers",
            "transformers",
            functools.partial(_build_transformers_eager, model_type),
        )
        for model_type in _EAGER
        if model_type in MODEL_MAPPING_NAMES
    ]


def _build_transformers_eager(model_type: str) -> Built:
    import torch
    from transformers import AutoConfig, AutoModel

    _seed()
    config = AutoConfig.for_model(model_type)
    _shrink(config)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    ids = _transformers_inputs(model, config)["input_ids"]
    ids = torch.cat([ids, ids.flip(1)])  # a batch of two, the second left-padded by three tokens
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return model, (), {"input_ids": ids, "attention_mask": mask}


class UnsupportedInput(Exception):
    """The harness has no generic input for this model's main input: the entry is excluded, saying which."""
