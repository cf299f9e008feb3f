"""Framework pairs: which side builds first, which virtualenv runs each, and the builder of each side.

A :class:`Side` is one framework's implementation family (transformers'
PyTorch models, its Flax models...) and the module whose ``build(arch, folder)``
builds one architecture in the side's own process and virtualenv. Side a
writes the config, inputs and weights; side b reads them. A second pair (HF
PyTorch against HF TensorFlow, or Keras 3 on another backend) is another
:class:`FrameworkPair` here with its side b module; the runner, the converter,
the comparison and the report stay as they are.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Side:
    """``name`` is what ``--build-side`` takes; ``venv`` the nox session whose virtualenv runs the builder."""

    name: str
    label: str
    venv: str
    builder: str  # module with build(arch, folder) -> record

    def build_function(self) -> Callable[..., dict[str, Any]]:
        return importlib.import_module(self.builder).build


@dataclass(frozen=True)
class FrameworkPair:
    name: str
    a: Side
    b: Side
    archs: str  # module with ARCHS (list of rows with .name and .sample) and BY_NAME

    def architectures(self) -> list[Any]:
        return list(importlib.import_module(self.archs).ARCHS)

    def side(self, name: str) -> tuple[str, Side]:
        for role, side in (("a", self.a), ("b", self.b)):
            if side.name == name:
                return role, side
        raise SystemExit(f"pair {self.name} has sides {self.a.name} and {self.b.name}, not {name!r}")


HF_TORCH = Side("torch", "HF PyTorch", "torch", "bench.compare_menagerie.hf_torch")
HF_FLAX = Side("flax", "HF Flax", "jax", "bench.compare_menagerie.hf_flax")
KERAS_TF = Side("keras-tf", "Keras 3 on TensorFlow", "tf", "bench.compare_menagerie.keras_tf")
KERAS_TORCH = Side("keras-torch", "Keras 3 on PyTorch", "torch", "bench.compare_menagerie.keras_torch")
KERAS_JAX = Side("keras-jax", "Keras 3 on JAX", "jax", "bench.compare_menagerie.keras_jax")

PAIRS = {
    pair.name: pair
    for pair in (
        FrameworkPair("hf-torch-flax", HF_TORCH, HF_FLAX, "bench.compare_menagerie.hf_archs"),
        FrameworkPair("keras-tf-torch", KERAS_TF, KERAS_TORCH, "bench.compare_menagerie.keras_archs"),
        FrameworkPair("keras-tf-jax", KERAS_TF, KERAS_JAX, "bench.compare_menagerie.keras_archs"),
    )
}
DEFAULT_PAIR = "hf-torch-flax"
