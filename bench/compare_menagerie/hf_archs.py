"""The architectures of the Hugging Face pairs: one row per architecture, shared by every side that builds it.

A row holds only names and numbers (no framework is imported here), so the
torch side, the Flax side and a later TensorFlow or Keras side read the same
tiny config: 2 layers, hidden size 32, 4 heads, a vocabulary of 128, 8 tokens
(or a 32-pixel image, 800 audio samples). Each side looks its classes up by
name in its own ``transformers``; ``side_classes`` names them per side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VOCAB = 128
SEQ = 8
IMAGE = 32

_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
_SEQ2SEQ = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
)
_T5 = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    decoder_start_token_id=0,
)
_MISTRAL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
_VISION = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=IMAGE, patch_size=8
)


@dataclass(frozen=True)
class Arch:
    """One architecture: its ``model_type``, config class and kwargs, input kind, and class names per side.

    ``inputs`` is ``text``, ``seq2seq`` (text plus decoder tokens), ``image``, ``audio`` (raw samples) or
    ``speech`` (log-mel features plus decoder tokens). ``classes`` maps a side's framework ("torch", "flax",
    "tf") to the model class; missing sides default to the usual ``<Prefix><Name>Model`` spelling.
    """

    name: str
    config_class: str
    config: dict[str, Any]
    inputs: str = "text"
    model: str = ""  # the torch class; Flax and TF prefix it
    sample: bool = False
    note: str = ""
    classes: dict[str, str] = field(default_factory=dict)

    def side_class(self, framework: str) -> str:
        if framework in self.classes:
            return self.classes[framework]
        prefix = {"torch": "", "flax": "Flax", "tf": "TF"}[framework]
        return prefix + self.model


ARCHS: list[Arch] = [
    Arch("bert", "BertConfig", _TEXT, model="BertModel", sample=True),
    Arch("roberta", "RobertaConfig", {**_TEXT, "max_position_embeddings": 66, "pad_token_id": 1}, model="RobertaModel"),
    Arch(
        "xlm-roberta",
        "XLMRobertaConfig",
        {**_TEXT, "max_position_embeddings": 66, "pad_token_id": 1},
        model="XLMRobertaModel",
    ),
    Arch(
        "distilbert",
        "DistilBertConfig",
        dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
        model="DistilBertModel",
    ),
    Arch("albert", "AlbertConfig", {**_TEXT, "embedding_size": 16}, model="AlbertModel"),
    Arch("electra", "ElectraConfig", {**_TEXT, "embedding_size": 16}, model="ElectraModel"),
    Arch("big_bird", "BigBirdConfig", {**_TEXT, "attention_type": "original_full"}, model="BigBirdModel"),
    Arch("roformer", "RoFormerConfig", {**_TEXT, "embedding_size": 32}, model="RoFormerModel"),
    Arch(
        "gpt2",
        "GPT2Config",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        model="GPT2Model",
        sample=True,
    ),
    Arch(
        "gpt_neo",
        "GPTNeoConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            max_position_embeddings=64,
            window_size=4,
        ),
        model="GPTNeoModel",
    ),
    Arch(
        "gptj",
        "GPTJConfig",
        dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64),
        model="GPTJModel",
    ),
    Arch(
        "opt",
        "OPTConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            ffn_dim=64,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
        ),
        model="OPTModel",
    ),
    Arch("bloom", "BloomConfig", dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4), model="BloomModel"),
    Arch(
        "llama",
        "LlamaConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
        model="LlamaModel",
    ),
    Arch("mistral", "MistralConfig", _MISTRAL, model="MistralModel"),
    # Flax Mistral builds its mask as jnp.triu(causal, k=-(sliding_window or 0)): None (no window, to PyTorch)
    # leaves each token attending to itself alone; and a window of W keeps W + 1 positions where PyTorch keeps W.
    Arch(
        "mistral-window-none",
        "MistralConfig",
        {**_MISTRAL, "sliding_window": None},
        model="MistralModel",
        note="sliding_window=None",
    ),
    Arch(
        "mistral-window-4",
        "MistralConfig",
        {**_MISTRAL, "sliding_window": 4},
        model="MistralModel",
        note="sliding_window=4 (shorter than the 8 tokens)",
    ),
    Arch(
        "gemma",
        "GemmaConfig",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=64,
        ),
        model="GemmaModel",
    ),
    Arch(
        "xglm",
        "XGLMConfig",
        dict(vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, max_position_embeddings=64),
        model="XGLMModel",
    ),
    Arch("bart", "BartConfig", _SEQ2SEQ, "seq2seq", model="BartModel"),
    Arch("mbart", "MBartConfig", _SEQ2SEQ, "seq2seq", model="MBartModel"),
    Arch(
        "marian",
        "MarianConfig",
        {**_SEQ2SEQ, "decoder_vocab_size": VOCAB, "pad_token_id": 1, "decoder_start_token_id": 1},
        "seq2seq",
        model="MarianModel",
    ),
    Arch("pegasus", "PegasusConfig", _SEQ2SEQ, "seq2seq", model="PegasusModel"),
    Arch("blenderbot", "BlenderbotConfig", _SEQ2SEQ, "seq2seq", model="BlenderbotModel"),
    Arch("blenderbot-small", "BlenderbotSmallConfig", _SEQ2SEQ, "seq2seq", model="BlenderbotSmallModel"),
    Arch("t5", "T5Config", _T5, "seq2seq", model="T5Model"),
    Arch("mt5", "MT5Config", _T5, "seq2seq", model="MT5Model"),
    Arch(
        "longt5",
        "LongT5Config",
        {**_T5, "encoder_attention_type": "local", "local_radius": 4},
        "seq2seq",
        model="LongT5Model",
    ),
    Arch("vit", "ViTConfig", _VISION, "image", model="ViTModel", sample=True),
    Arch("beit", "BeitConfig", {**_VISION, "use_relative_position_bias": True}, "image", model="BeitModel"),
    Arch("dinov2", "Dinov2Config", _VISION, "image", model="Dinov2Model"),
    Arch("clip-vision", "CLIPVisionConfig", _VISION, "image", model="CLIPVisionModel"),
    Arch("clip-text", "CLIPTextConfig", {k: v for k, v in _TEXT.items()}, model="CLIPTextModel"),
    Arch(
        "resnet",
        "ResNetConfig",
        dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"),
        "image",
        model="ResNetModel",
        sample=True,
    ),
    Arch(
        "regnet",
        "RegNetConfig",
        dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, layer_type="y"),
        "image",
        model="RegNetModel",
    ),
    Arch(
        "wav2vec2",
        "Wav2Vec2Config",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            do_stable_layer_norm=True,
            feat_extract_norm="layer",
        ),
        "audio",
        model="Wav2Vec2Model",
        note="do_stable_layer_norm=True: the only variant Flax implements",
    ),
    Arch(
        "whisper",
        "WhisperConfig",
        dict(
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            num_mel_bins=16,
            max_source_positions=16,
            max_target_positions=32,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=3,
        ),
        "speech",
        model="WhisperModel",
    ),
]

BY_NAME = {arch.name: arch for arch in ARCHS}


def input_spec(arch: Arch, config: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The inputs of ``arch``: name -> (kind, shape), kind ``tokens`` (ids from 4 to the vocabulary, no special
    token) or ``normal`` (floats); each side draws them once and the other side reads them from the npz."""
    if arch.inputs in ("text", "seq2seq"):
        spec = {"input_ids": ("tokens", (1, SEQ))}
        if arch.inputs == "seq2seq":
            spec["decoder_input_ids"] = ("tokens", (1, SEQ - 2))
        return spec
    if arch.inputs == "image":
        return {"pixel_values": ("normal", (1, config.get("num_channels", 3), IMAGE, IMAGE))}
    if arch.inputs == "audio":
        return {"input_values": ("normal", (1, 800))}
    if arch.inputs == "speech":
        return {
            "input_features": ("normal", (1, config["num_mel_bins"], 2 * config["max_source_positions"])),
            "decoder_input_ids": ("tokens", (1, SEQ - 2)),
        }
    raise ValueError(f"unknown input kind {arch.inputs!r}")
