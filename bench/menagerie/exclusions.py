"""Entries the menagerie does not run, each with its reason: the one place they are listed.

An entry whose model cannot be built, or whose own untraced call fails at
the small size it is given, is excluded at run time instead, with the error
as its reason (``verify.ModelDoesNotRun``): TorchLens never ran. Anything
listed here counts against no share, so each reason says why the model
itself, not TorchLens, is the obstacle.
"""

from __future__ import annotations

_HUGE = (
    "over 600M parameters: random initialisation alone takes minutes and gigabytes on the 2 shared CPU "
    "cores the menagerie runs on"
)

EXCLUDED: dict[str, dict[str, str]] = {
    "torch": {
        "torchvision/vit_h_14": _HUGE,
        "torchvision/regnet_y_128gf": _HUGE,
        "timm/deepseek_vit_412m": (
            "412M parameters at a fixed input size: its own untraced forward needs more than "
            "the 6 GiB per entry (the family's only variant)"
        ),
    },
}
