"""The shared weights and inputs of the port tests, in NumPy only: every builder ports from these.

Names and layouts are torch's (``conv1.weight`` is ``[out, in, kh, kw]``,
``fc.weight`` is ``[out, in]``, the image input is NCHW); each builder
converts them to its framework's layout, which is what a user porting a model
does. Values come from one seeded generator, so the four builders, run in four
separate virtual environments, start from the same numbers.

Scales are chosen so that each injected porting bug is visible above float32
tolerance (``tl.compare`` flags elements off by more than about ``1e-4`` of
their scale): the block's input is small (std 0.05), so that LayerNorm's
epsilon (1e-5 against 1e-6) matters next to the variance it is added to, and
the MLP's first Linear is scaled so that GELU sees values out to about 4,
where the tanh approximation is furthest from the exact form.
"""

from __future__ import annotations

import numpy as np

SEED = 20240616
ARCHITECTURES = ("cnn", "block", "deep")
# Variants each port builds, by architecture; torch builds only "correct" (the reference).
BUGS = {
    "cnn": ("lost_padding", "nhwc_flatten"),
    "block": ("gelu_tanh", "ln_eps", "transposed_weight", "dropout_train"),
    "deep": (),  # the timing case: DEPTH blocks in a row, about 500 torch ops (GPT-2 small's count)
}
CHANNELS_LAST_ONLY = frozenset({"nhwc_flatten"})  # a bug only a channels-last port can have

# cnn: conv3x3(3->8, pad 1) -> relu -> maxpool2 -> conv3x3(8->16, pad 1) -> relu -> flatten -> linear(->10)
IMAGE = (1, 3, 8, 8)
CLASSES = 10
FLAT = 16 * 4 * 4  # conv2's output, flattened
FLAT_UNPADDED = 16 * 2 * 2  # conv2 without padding: 4x4 -> 2x2; the port's Linear takes the first inputs

# block: pre-norm transformer block on a 1x6x16 sequence, one head
SEQUENCE = (1, 6, 16)
WIDTH, HIDDEN = 16, 32
LN_EPS, LN_EPS_BUG = 1e-5, 1e-6
DROPOUT = 0.1
DEPTH = 29  # deep: blocks.0 ... blocks.28, each a block: 495 torch ops


def variants(framework: str, arch: str) -> tuple[str, ...]:
    """The variants ``framework`` builds for ``arch``: the correct port and the bugs that apply to it."""
    if framework == "torch":
        return ("correct",)
    channels_last = framework in ("jax", "keras")
    return ("correct", *(b for b in BUGS[arch] if channels_last or b not in CHANNELS_LAST_ONLY))


def _normal(rng: np.random.Generator, *shape: int, scale: float) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def cnn_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {
        "conv1.weight": _normal(rng, 8, 3, 3, 3, scale=(1 / 27) ** 0.5),
        "conv1.bias": _normal(rng, 8, scale=0.1),
        "conv2.weight": _normal(rng, 16, 8, 3, 3, scale=(1 / 72) ** 0.5),
        "conv2.bias": _normal(rng, 16, scale=0.1),
        "fc.weight": _normal(rng, CLASSES, FLAT, scale=(1 / FLAT) ** 0.5),
        "fc.bias": _normal(rng, CLASSES, scale=0.1),
    }


def cnn_input() -> np.ndarray:
    """The image, NCHW."""
    return _normal(np.random.default_rng(SEED + 1), *IMAGE, scale=1.0)


def block_weights(seed: int = SEED + 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    found = {}
    for norm in ("norm1", "norm2"):
        found[f"{norm}.weight"] = (1.0 + _normal(rng, WIDTH, scale=0.1)).astype(np.float32)
        found[f"{norm}.bias"] = _normal(rng, WIDTH, scale=0.1)
    for name, n_in, n_out, scale in (
        ("q", WIDTH, WIDTH, 1.0),
        ("k", WIDTH, WIDTH, 1.0),
        ("v", WIDTH, WIDTH, 1.0),
        ("out", WIDTH, WIDTH, 1.0),
        ("up", WIDTH, HIDDEN, 2.0),
        ("down", HIDDEN, WIDTH, 1.0),
    ):
        found[f"{name}.weight"] = _normal(rng, n_out, n_in, scale=scale / n_in**0.5)
        found[f"{name}.bias"] = _normal(rng, n_out, scale=0.1)
    return found


def deep_weights() -> dict[str, np.ndarray]:
    return {f"blocks.{n}.{name}": value for n in range(DEPTH) for name, value in block_weights(SEED + 100 + n).items()}


def block_input() -> np.ndarray:
    """The token sequence, [batch, tokens, features]: small, so that LayerNorm's epsilon shows."""
    return _normal(np.random.default_rng(SEED + 3), *SEQUENCE, scale=0.05)


def state_dict(arch: str) -> dict[str, np.ndarray]:
    """The weights of ``arch`` by torch name, in torch layouts."""
    return {"cnn": cnn_weights, "block": block_weights, "deep": deep_weights}[arch]()


def model_input(arch: str) -> np.ndarray:
    """The input of ``arch`` in torch's layout (NCHW for the image)."""
    return {"cnn": cnn_input, "block": block_input, "deep": block_input}[arch]()


def norm1_eps(variant: str) -> float:
    """The first LayerNorm's epsilon: torch's 1e-5, or 1e-6 in the ``ln_eps`` bug."""
    return LN_EPS_BUG if variant == "ln_eps" else LN_EPS


def fc_inputs(variant: str) -> int:
    """The cnn's Linear input size: conv2's output flattened, smaller when conv2 lost its padding."""
    return FLAT_UNPADDED if variant == "lost_padding" else FLAT
