"""Where the builders write: ``OUT_DIR/<framework>/<arch>/<variant>`` (a ``tl.save`` folder) for each port.

Beside each trace folder, ``<variant>.untraced.npy`` holds the model's output
from a plain call without TorchLens: the test compares the ports' plain
outputs with each other (is the "correct" port really correct, does each bug
really change the output?) independently of anything TorchLens recorded.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from weights import ARCHITECTURES, variants


def out_dir(framework: str) -> pathlib.Path:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python {sys.argv[0]} OUT_DIR  (writes OUT_DIR/{framework}/<arch>/<variant>)")
    return pathlib.Path(sys.argv[1]) / framework


def build_all(framework: str, build: Callable[[str, str], tuple[Any, np.ndarray]]) -> None:
    """For every architecture and variant: ``build(arch, variant)`` gives (trace, plain output); save both."""
    import torchlens as tl

    root = out_dir(framework)
    for arch in ARCHITECTURES:
        for variant in variants(framework, arch):
            trace, plain = build(arch, variant)
            folder = root / arch / variant
            tl.save(trace, folder)
            np.save(root / arch / f"{variant}.untraced.npy", np.asarray(plain, dtype=np.float32))
            print(f"{framework}/{arch}/{variant}: {len(trace.ops)} ops -> {folder}")
