"""Module paths normalized across frameworks, and "does this op lie in that module".

Written without any framework so that the comparison step (which loads saved
traces only) can use it: ``encoder.layer.0.intermediate``,
``encoder/layer_._0/intermediate`` and ``encoder.layers_0.intermediate`` are
one path once separators are unified, case folded and container names
(``layers``, ``block``...) dropped.
"""

from __future__ import annotations

import re

# Names that only hold a list of blocks: dropped, so that `layers.0` and `0` (or `h.0`) compare equal.
CONTAINERS = frozenset({"layers", "layer", "block", "blocks", "h", "albert", "layer_groups"})


def tokens(path: str) -> list[str]:
    """The normalized tokens of a module path; a pass suffix (``:2``) and a variable suffix are ignored."""
    path = path.split(":")[0].lower()
    return [t for t in re.split(r"[./_\s]+", path) if t and t not in CONTAINERS]


def normalize(path: str) -> str:
    return ".".join(tokens(path))


def within(path: str, site: str) -> bool:
    """Whether module ``path`` is ``site`` or inside it; the root site ("") holds only ops run in the root itself."""
    p, s = tokens(path), tokens(site)
    if not s:
        return not p
    return p[: len(s)] == s
