"""What the menagerie runs: entries enumerated from each framework's own registries, and which of them run now.

An :class:`Entry` names one model and how to build it (a ``Case`` build:
``() -> (model, args, kwargs)``, random weights, nothing downloaded). The
enumeration of a backend lives in ``<backend>_entries.py`` and is imported only
for that backend, so the harness loads one framework per process.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from typing import Any

import attrs

from bench.menagerie.exclusions import EXCLUDED

Built = tuple[Any, tuple[Any, ...], dict[str, Any]]

# backend -> the module whose entries() enumerates it
ENUMERATORS = {
    "torch": "bench.menagerie.torch_entries",
    "paddle": "bench.menagerie.paddle_entries",
    "tf": "bench.menagerie.tf_entries",
    "jax": "bench.menagerie.jax_entries",
    "tinygrad": "bench.menagerie.tinygrad_entries",
}

# The CI sample: one entry in SAMPLE_EVERY, picked by a hash of its name (the same entries on every machine and
# every run, and an entry keeps its place when others join or leave the registries).
SAMPLE_EVERY = 20


@attrs.frozen
class Entry:
    """One model of the menagerie: ``library`` (torchvision, timm...), ``family`` (its architecture) and a build."""

    backend: str
    name: str
    library: str
    family: str
    build: Callable[[], Built] = attrs.field(eq=False, repr=False)
    rtol: float = 1e-5
    # The second inputs of the replay-on-other-inputs check (Case.other_inputs); None: the suite's own nudge.
    other_inputs: Callable[[tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]] | None = (
        attrs.field(default=None, eq=False, repr=False)
    )


def entries(backend: str) -> list[Entry]:
    """Every entry of ``backend``, excluded ones included (the runner records them with their reason), by name."""
    if backend not in ENUMERATORS:
        raise SystemExit(f"no menagerie for backend {backend!r} yet: choose one of {sorted(ENUMERATORS)}")
    found = importlib.import_module(ENUMERATORS[backend]).entries()
    return sorted(found, key=lambda e: e.name)


def exclusion(entry: Entry) -> str | None:
    """Why ``entry`` is not run, or None."""
    return EXCLUDED.get(entry.backend, {}).get(entry.name)


def in_sample(entry: Entry) -> bool:
    """Whether ``entry`` belongs to the fixed CI sample (about 1 in SAMPLE_EVERY)."""
    digest = hashlib.sha256(f"{entry.backend}/{entry.name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SAMPLE_EVERY == 0


def _sample(found: list[Entry]) -> list[Entry]:
    """The entries in the fixed sample; a registry too small for any to hash in still gives its lowest hash."""
    chosen = [e for e in found if in_sample(e)]
    if not chosen and found:
        chosen = [min(found, key=lambda e: hashlib.sha256(f"{e.backend}/{e.name}".encode()).digest())]
    return chosen


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (1-based) -> (i, n), or SystemExit saying what is wrong."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise SystemExit(f"--shard {text!r}: expected i/n, e.g. 2/4") from None
    if not 1 <= i <= n:
        raise SystemExit(f"--shard {text!r}: i must be between 1 and n")
    return i, n


def select(
    found: list[Entry], shard: tuple[int, int] | None = None, sample: bool = False, only: list[str] | None = None
) -> list[Entry]:
    """The entries this run owns: the sample and/or a shard (round robin over the sorted names), or named ones."""
    chosen = _sample(found) if sample else list(found)
    if only:
        chosen = [
            e for e in chosen if any(e.name == o or e.name.startswith(o.rstrip("*")) and o.endswith("*") for o in only)
        ]
    if shard is not None:
        i, n = shard
        chosen = chosen[i - 1 :: n]
    return chosen
