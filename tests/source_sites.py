"""Call-site checks against the source itself: a test marks a line with ``# site: <marker>`` and reads it back."""

from __future__ import annotations

from typing import Any


def marked_line(marker: str, path: str) -> int:
    """The line of ``path`` that ends with the comment ``# site: <marker>`` (exactly one must)."""
    with open(path) as f:
        found = [n for n, text in enumerate(f, 1) if text.rstrip().endswith(f"# site: {marker}")]
    assert len(found) == 1, marker
    return found[0]


def sites(op: Any) -> list[tuple[str, int, str]]:
    """An op's code context as (file, line, function) triples, innermost first."""
    return [(c.file, c.line_number, c.func_name) for c in op.code_context]
