"""Why each known failure of the menagerie fails: the part of TorchLens at fault, or why the check cannot pass.

Rendered into docs/menagerie.md next to the failure. A diagnosis names a cause
found by reproducing the failure outside the harness; an entry that fails
with no diagnosis here is new and unexplained.
"""

from __future__ import annotations

# One cause can fail several entries: each cause is written once, here. Causes fixed since (torchvision's
# operators unsaveable, a lost-edge false positive on equal anchor constants, TorchLens's own copy recorded as two
# ops, Python types as dtypes, underscore ATen methods, value-dependent graphs counted as failures) are in git
# history and their entries verify.
_FUNC_TRANSFORM = (
    "transformers builds this model's attention mask under torch.vmap of its own mask functions "
    "(masking_utils._vmap_expansion_sdpa, closures such as and_masks' and_mask): the trace records it "
    "as one op that replays live (backends/torch/transforms.py), but a transform of a Python function "
    "cannot be rebuilt from a file, so the loaded trace cannot replay that op (round_trip)"
)

DIAGNOSES: dict[str, dict[str, str]] = {
    "torch": {
        "transformers/t5gemma2": _FUNC_TRANSFORM,
        "transformers/unlimited_ocr": _FUNC_TRANSFORM,
    },
}
