"""The architectures of the Keras 3 pairs: one Keras source, lowered by three backends.

Each row is a model Keras builds from arguments alone (nothing is downloaded):
a ``keras_hub`` backbone, a ``keras.applications`` model with ``weights=None``,
or a small hand-written network. Side a runs it on the TensorFlow backend and
writes its weights (``model.save_weights``) and inputs; side b builds the same
row on the PyTorch or the JAX backend and ``load_weights`` them. The two sides
share the source, not the lowering: ops in another order, fused against
decomposed, NHWC against NCHW inside torch's convolutions, casts. No framework
is imported here, so the comparison step (NumPy and TorchLens only) can read
the rows.

Sizes: 2 layers, width 32, 4 heads, a vocabulary of 128 and 8 tokens, 32x32
images (71x71 for Xception, its smallest). A dropout rate above 0 is set where
the constructor takes one (inference ignores it; the ``dropout_on`` bug needs
it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VOCAB = 128
SEQ = 8
IMAGE = 32
FRAMES = 32  # Whisper: log-mel frames (its encoder halves them)

_TEXT = dict(
    vocabulary_size=VOCAB,
    num_layers=2,
    num_heads=4,
    hidden_dim=32,
    intermediate_dim=64,
    max_sequence_length=16,
    dropout=0.1,
)
_DECODER = dict(
    vocabulary_size=VOCAB,
    num_layers=2,
    num_query_heads=4,
    num_key_value_heads=2,
    hidden_dim=32,
    intermediate_dim=64,
    dropout=0.1,
)
_IMG = (IMAGE, IMAGE, 3)


@dataclass(frozen=True)
class KerasArch:
    """One architecture: where Keras builds it from and with what.

    ``source`` is ``hub`` (``keras_hub.models.<cls>(**kwargs)``), ``app`` (``keras.applications.<cls>(weights=None,
    **kwargs)``) or ``custom`` (a network written in :mod:`.keras_side`, named by ``cls``). ``shapes`` fixes an
    input's shape (batch included) where the model's input spec leaves a dimension free and the default (8 tokens,
    a 32-pixel side, 32 frames) does not fit.
    """

    name: str
    source: str
    cls: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sample: bool = False
    note: str = ""


ARCHS: list[KerasArch] = [
    # -- keras_hub text encoders ---------------------------------------------------------------------------------
    KerasArch("bert", "hub", "BertBackbone", _TEXT, sample=True),
    KerasArch("distilbert", "hub", "DistilBertBackbone", _TEXT),
    KerasArch("roberta", "hub", "RobertaBackbone", _TEXT),
    KerasArch("xlm-roberta", "hub", "XLMRobertaBackbone", _TEXT),
    KerasArch("albert", "hub", "AlbertBackbone", {**_TEXT, "embedding_dim": 16}),
    KerasArch("deberta-v3", "hub", "DebertaV3Backbone", {**_TEXT, "bucket_size": 4}),
    KerasArch(
        "electra",
        "hub",
        "ElectraBackbone",
        {**{k: v for k, v in _TEXT.items() if k != "vocabulary_size"}, "vocab_size": VOCAB, "embedding_dim": 16},
    ),
    # -- keras_hub decoders ----------------------------------------------------------------------------------------
    KerasArch("gpt2", "hub", "GPT2Backbone", _TEXT, sample=True),
    KerasArch("opt", "hub", "OPTBackbone", _TEXT),
    KerasArch("gpt-neox", "hub", "GPTNeoXBackbone", {**_TEXT, "dropout": 0.1}),
    KerasArch("llama", "hub", "LlamaBackbone", _DECODER),
    KerasArch("mistral", "hub", "MistralBackbone", {**_DECODER, "sliding_window": 16}),
    KerasArch("gemma", "hub", "GemmaBackbone", {**_DECODER, "num_key_value_heads": 1, "head_dim": 8}),
    KerasArch(
        "falcon",
        "hub",
        "FalconBackbone",
        dict(
            vocabulary_size=VOCAB,
            num_layers=2,
            num_attention_heads=4,
            hidden_dim=32,
            intermediate_dim=64,
            attention_dropout_rate=0.1,
            feedforward_dropout_rate=0.1,
        ),
    ),
    KerasArch(
        "phi3", "hub", "Phi3Backbone", {**_DECODER, "max_sequence_length": 16, "pretraining_sequence_length": 16}
    ),
    KerasArch("qwen", "hub", "QwenBackbone", _DECODER),
    KerasArch("qwen3", "hub", "Qwen3Backbone", {**_DECODER, "head_dim": 8}),
    # -- keras_hub encoder-decoders --------------------------------------------------------------------------------
    KerasArch("bart", "hub", "BartBackbone", _TEXT),
    KerasArch(
        "t5",
        "hub",
        "T5Backbone",
        {**{k: v for k, v in _TEXT.items() if k != "max_sequence_length"}, "key_value_dim": 8},
    ),
    KerasArch(
        "whisper",
        "hub",
        "WhisperBackbone",
        dict(
            vocabulary_size=VOCAB,
            num_layers=2,
            num_heads=4,
            hidden_dim=32,
            intermediate_dim=64,
            num_mels=16,
            dropout=0.1,
            max_encoder_sequence_length=FRAMES,
            max_decoder_sequence_length=16,
        ),
    ),
    # -- keras_hub vision ------------------------------------------------------------------------------------------
    KerasArch(
        "vit",
        "hub",
        "ViTBackbone",
        dict(image_shape=_IMG, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, dropout_rate=0.1),
        sample=True,
    ),
    KerasArch(
        "resnet-hub",
        "hub",
        "ResNetBackbone",
        dict(
            input_conv_filters=[64],
            input_conv_kernel_sizes=[3],
            stackwise_num_filters=[64, 16],
            stackwise_num_blocks=[1, 1],
            stackwise_num_strides=[1, 2],
            block_type="basic_block",
            image_shape=_IMG,
        ),
    ),
    KerasArch(
        "densenet-hub", "hub", "DenseNetBackbone", dict(stackwise_num_repeats=[1, 2], growth_rate=8, image_shape=_IMG)
    ),
    KerasArch(
        "cspnet-hub",
        "hub",
        "CSPNetBackbone",
        dict(
            stem_filters=8,
            stem_kernel_size=3,
            stem_strides=1,
            stackwise_depth=[1, 1],
            stackwise_strides=2,
            stackwise_num_filters=[8, 16],
            block_type="dark_block",
            stage_type="csp",
            down_growth=True,
            bottle_ratio=(0.5, 1.0),
            block_ratio=(1.0, 0.5),
            expand_ratio=(2.0, 1.0),
            stem_padding="same",
            image_shape=_IMG,
        ),
    ),
    KerasArch(
        "efficientnet-hub",
        "hub",
        "EfficientNetBackbone",
        dict(
            stackwise_kernel_sizes=[3, 3],
            stackwise_num_repeats=[1, 1],
            stackwise_input_filters=[8, 8],
            stackwise_output_filters=[8, 16],
            stackwise_expansion_ratios=[1, 4],
            stackwise_squeeze_and_excite_ratios=[0.0, 0.25],
            stackwise_strides=[1, 2],
            stackwise_block_types=["fused", "unfused"],
            stackwise_force_input_filters=[0, 0],
            stackwise_nores_option=[False, False],
            stackwise_width_coefficients=[1.0, 1.0],
            stackwise_depth_coefficients=[1.0, 1.0],
            num_features=32,
            input_shape=_IMG,
        ),
    ),
    KerasArch(
        "mobilenet-hub",
        "hub",
        "MobileNetBackbone",
        dict(
            stackwise_expansion=[[16], [24, 24]],
            stackwise_num_blocks=[1, 2],
            stackwise_num_filters=[[8], [16, 16]],
            stackwise_kernel_size=[[3], [5, 5]],
            stackwise_num_strides=[[2], [2, 1]],
            stackwise_se_ratio=[[None], [0.25, 0.25]],
            stackwise_activation=[["relu"], ["hard_swish", "hard_swish"], ["hard_swish"]],
            stackwise_padding=[[1], [2, 2]],
            output_num_filters=32,
            depthwise_filters=8,
            depthwise_stride=2,
            depthwise_residual=False,
            last_layer_filter=32,
            squeeze_and_excite=0.5,
            input_num_filters=8,
            image_shape=_IMG,
        ),
    ),
    KerasArch(
        "vgg-hub",
        "hub",
        "VGGBackbone",
        dict(stackwise_num_repeats=[1, 1], stackwise_num_filters=[8, 16], image_shape=_IMG),
    ),
    # -- keras.applications (weights=None, no top) ---------------------------------------------------------------
    KerasArch("resnet50", "app", "ResNet50", dict(include_top=False, pooling="avg", input_shape=_IMG)),
    KerasArch(
        "mobilenetv2", "app", "MobileNetV2", dict(include_top=False, pooling="avg", input_shape=_IMG, alpha=0.35)
    ),
    KerasArch("densenet121", "app", "DenseNet121", dict(include_top=False, pooling="avg", input_shape=_IMG)),
    KerasArch("efficientnetb0", "app", "EfficientNetB0", dict(include_top=False, pooling="avg", input_shape=_IMG)),
    KerasArch("convnext-tiny", "app", "ConvNeXtTiny", dict(include_top=False, pooling="avg", input_shape=_IMG)),
    KerasArch("vgg16", "app", "VGG16", dict(include_top=False, pooling="avg", input_shape=_IMG)),
    KerasArch(
        "xception",
        "app",
        "Xception",
        dict(include_top=False, pooling="avg", input_shape=(71, 71, 3)),
        note="71x71: Xception's smallest input",
    ),
    # -- hand-written ------------------------------------------------------------------------------------------------
    KerasArch(
        "small-cnn",
        "custom",
        "small_cnn",
        sample=True,
        note="Conv2D/BatchNormalization/ReLU x2, pooling, a square Dense with gelu, LayerNormalization",
    ),
]

BY_NAME = {arch.name: arch for arch in ARCHS}
