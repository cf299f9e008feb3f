"""A generic weight converter: one framework's named arrays onto another's parameter tree, by name and shape.

NumPy only, so every side can use it. Names are normalized on both sides
(separators ``.``/``/``/``_._``/``_0``, ``kernel``/``weight``/``scale``/
``gamma``/``embedding`` as one role, ``bias``/``beta`` as another, batch
statistics by role, torch's weight-norm parametrizations as ``weight_g``/
``weight_v``); each target parameter is matched by its full normalized name,
then by the longest unique name suffix, then by shape among what is left. A
``kernel`` taken from a torch ``weight`` is transposed (2-D) or permuted (conv
kernels: OIW -> WIO, OIHW -> HWIO). Every target parameter must get a value:
anything left over fails loudly, with the list.

Porting bugs are injected here too, as a converter would make them:
``untransposed`` names target paths copied without their transpose,
``unpermuted`` conv kernels reshaped into place instead of permuted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

# target leaf name -> its role; a source leaf of the same role is its value
ROLES = {
    "kernel": "weight",
    "weight": "weight",
    "scale": "weight",
    "gamma": "weight",
    "embedding": "weight",
    "embeddings": "weight",
    "bias": "bias",
    "beta": "bias",
    "mean": "running_mean",
    "running_mean": "running_mean",
    "moving_mean": "running_mean",
    "var": "running_var",
    "running_var": "running_var",
    "moving_variance": "running_var",
    "weight_g": "weight_g",
    "weight_v": "weight_v",
}
# conv kernel permutations, source (torch) layout -> target (channels-last kernel) layout, by rank
PERMUTE = {2: (1, 0), 3: (2, 1, 0), 4: (2, 3, 1, 0), 5: (2, 3, 4, 1, 0)}
# Module names one side spells otherwise (transformers 5's torch ViT says q_proj where its Flax port says query).
SYNONYMS = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "q": "query", "k": "key", "v": "value"}
# Names that only hold a list of blocks (`encoder.layer.0`, `layers.0`, `h.0`): not part of a normalized name.
CONTAINERS = frozenset({"layers", "layer", "block", "blocks", "h"})
SKIP_SOURCE = re.compile(r"(num_batches_tracked|position_ids|\.masked_bias|\.attn\.bias|inv_freq)$")


class ConversionError(Exception):
    """A target parameter got no value, or a value of the wrong shape."""


def source_name(name: str) -> str:
    """A torch state-dict name with weight-norm parametrizations spelled as the older ``weight_g``/``weight_v``."""
    name = re.sub(r"\.parametrizations\.(\w+)\.original0$", r".\1_g", name)
    return re.sub(r"\.parametrizations\.(\w+)\.original1$", r".\1_v", name)


def split(path: str | Iterable[str]) -> list[str]:
    """Path tokens: ``encoder/layer_._0/x:0``, ``encoder.layers_0.x`` and ``encoder.layer.0.x`` split alike."""
    text = path if isinstance(path, str) else ".".join(map(str, path))
    text = text.split(":")[0]
    out: list[str] = []
    for token in re.split(r"[./]+", text):
        token = token.strip("_")
        if not token:
            continue
        m = re.fullmatch(r"(.*?[a-zA-Z])_(\d+)", token)
        out.extend([m.group(1), m.group(2)] if m else [token])
    return [t.lower() for t in out]


def key(path: str | Iterable[str]) -> tuple[str, ...]:
    """The normalized name: container names dropped, synonyms unified, a name repeated at once kept once
    (``attention.attention``), and the leaf replaced by its role."""
    tokens = split(path)
    leaf = ROLES.get(tokens[-1], tokens[-1]) if tokens else None
    out: list[str] = []
    for token in tokens[:-1]:
        token = SYNONYMS.get(token, token)
        if token not in CONTAINERS and (not out or out[-1] != token):
            out.append(token)
    return (*out, leaf) if leaf is not None else ()


def _numbers(path: str) -> tuple[str, ...]:
    """The block indices in a path: two parameters of one block share them."""
    return tuple(t for t in split(path) if t.isdigit())


@dataclass
class Match:
    """How one target parameter got its value."""

    target: str
    source: str
    how: str  # "name", "suffix" or "shape"
    transform: str  # "copy", "transpose", "permute (2, 3, 1, 0)", or a bug's "untransposed"/"unpermuted"


@dataclass
class Conversion:
    """The converted arrays by target path, how each was matched, and the source arrays nothing took."""

    values: dict[str, np.ndarray] = field(default_factory=dict)
    matches: dict[str, Match] = field(default_factory=dict)
    unused: list[str] = field(default_factory=list)

    def source_of(self, target: str) -> str:
        return self.matches[target].source


def _transform(
    source_leaf: str, target_leaf: str, value: np.ndarray, shape: tuple[int, ...], bug: str | None
) -> tuple[np.ndarray, str] | None:
    """``value`` in the target's layout (or as the bug puts it), or None when no layout gives ``shape``."""
    if target_leaf == "kernel" and source_leaf == "weight" and value.ndim in PERMUTE:
        if bug is not None and value.size == int(np.prod(shape)):
            return value.reshape(shape), bug  # the bug: the source layout poured into the target's shape
        perm = PERMUTE[value.ndim]
        moved = value.transpose(perm)
        if moved.shape == tuple(shape):
            return moved, "transpose" if value.ndim == 2 else f"permute {perm}"
        return None  # a kernel never takes a torch weight in the torch layout
    if value.shape == tuple(shape):
        return value, "copy"
    return None


def convert(
    source: dict[str, np.ndarray],
    targets: dict[str, tuple[int, ...]],
    *,
    untransposed: Iterable[str] = (),
    unpermuted: Iterable[str] = (),
) -> Conversion:
    """Values for every path of ``targets`` (path -> shape) from ``source`` (name -> array); see the module doc."""
    bugs = {**{t: "untransposed" for t in untransposed}, **{t: "unpermuted" for t in unpermuted}}
    missing_bugs = set(bugs) - set(targets)
    if missing_bugs:
        raise ConversionError(f"bug sites that are not target parameters: {sorted(missing_bugs)}")
    names = {source_name(n): n for n in source if not SKIP_SOURCE.search(n)}
    by_key: dict[tuple[str, ...], list[str]] = {}
    for name in names:
        by_key.setdefault(key(name), []).append(name)
    result = Conversion()
    taken: set[str] = set()
    pending: list[str] = []

    def assign(target: str, name: str, how: str) -> bool:
        leaf_t, leaf_s = split(target)[-1], split(name)[-1]
        done = _transform(leaf_s, leaf_t, np.asarray(source[names[name]]), targets[target], bugs.get(target))
        if done is None:
            return False
        result.values[target], transform = done
        result.matches[target] = Match(target, names[name], how, transform)
        taken.add(name)
        return True

    for target in targets:  # 1: the whole normalized name
        found = [n for n in by_key.get(key(target), []) if n not in taken]
        if not (len(found) == 1 and assign(target, found[0], "name")):
            pending.append(target)
    left: list[str] = []
    for target in pending:  # 2: the longest name suffix (two tokens at least) that exactly one free name has
        tk = key(target)
        chosen = None
        for length in range(len(tk), 1, -1):
            found = [n for n in names if n not in taken and key(n)[-length:] == tk[-length:]]
            if found:
                chosen = found[0] if len(found) == 1 else None
                break
        if not (chosen is not None and assign(target, chosen, "suffix")):
            left.append(target)
    failed: list[str] = []
    # 3: a parameter whose sibling (same module, e.g. the kernel beside a bias) was matched takes from the sibling's
    # module; then shape (in the target's layout) and role among what is left, same block first. Kernels go first.
    left.sort(key=lambda t: key(t)[-1] != "weight")
    for target in left:
        role = key(target)[-1]
        module = target.rsplit(".", 1)[0]
        siblings = {result.matches[t].source.rsplit(".", 1)[0] for t in result.matches if t.rsplit(".", 1)[0] == module}
        found = [
            n
            for n in names
            if n not in taken
            and key(n)[-1] == role
            and _transform(split(n)[-1], split(target)[-1], np.asarray(source[names[n]]), targets[target], None)
            is not None
        ]
        by_sibling = [n for n in found if names[n].rsplit(".", 1)[0] in siblings]
        same_block = [n for n in found if _numbers(n) == _numbers(target)]
        for narrowed in (by_sibling, same_block):
            if len(narrowed) == 1:
                found = narrowed
                break
        if not (len(found) == 1 and assign(target, found[0], "shape")):
            failed.append(f"{target} {tuple(targets[target])} (candidates by shape: {found[:4]})")
    if failed:
        raise ConversionError(f"{len(failed)} of {len(targets)} target parameters got no value: " + "; ".join(failed))
    result.unused = sorted(names[n] for n in names if n not in taken)
    return result
