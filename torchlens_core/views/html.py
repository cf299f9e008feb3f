"""What a notebook shows for an op, a module pass, a summary, an audit, a comparison: tables, not one-liners.

Each ``_repr_html_`` is made from the same text or rows its ``print`` shows,
so the two never say different things: :func:`described` reads the
``    Key: value`` lines of ``print(op)``, :func:`boxed` the ``+---+`` table of
``summary()``, and :func:`~torchlens_core.ir.html.table` takes rows (in the IR, where every layer's reports can reach
it). Everything shown is escaped.
"""

from __future__ import annotations

import html

from torchlens_core.ir.html import STYLE, table


def described(text: str) -> str:
    """``print(op)``'s text as a table: its first line the caption, each ``    Key: value`` line a row (lines
    indented further, or without a key, continue the row above)."""
    lines = text.splitlines()
    if not lines:
        return table([])
    rows: list[list[str]] = []
    for line in lines[1:]:
        stripped = line.strip()
        key, colon, value = stripped.partition(": ")
        if line.startswith("    ") and not line.startswith("     ") and colon:
            rows.append([key, value])
        elif line.startswith("    ") and not line.startswith("     ") and stripped.endswith(":"):
            rows.append([stripped[:-1], ""])  # a heading of its own ("Related layers:")
        elif rows:
            rows[-1][1] = f"{rows[-1][1]}\n{stripped}" if rows[-1][1] else stripped
        else:
            rows.append(["", stripped])
    return table(rows, caption=lines[0])


def boxed(text: str) -> str:
    """``summary()``'s text: the ``+---+`` table as an HTML table (its first row the header), the lines before
    it the caption and the lines after it a second table of totals."""
    lines = text.splitlines()
    borders = [i for i, line in enumerate(lines) if line.startswith("+") and line.endswith("+")]
    if len(borders) < 2:
        return f'<pre style="{STYLE}">{html.escape(text)}</pre>'
    # "| name | shape |": each cell padded by one space each side; a name's indentation (its depth) is kept
    cells = [
        [c[1:].rstrip() for c in line[1:-1].split("|")]
        for line in lines[borders[0] + 1 : borders[-1]]
        if line.startswith("|")
    ]
    before = "\n".join(lines[: borders[0]])
    after = lines[borders[-1] + 1 :]
    parts = [table(cells[1:], header=cells[0] if cells else None, caption=before)]
    if after:
        parts.append(table([line.partition(": ")[::2] for line in after]))
    return "".join(parts)


class Text(str):
    """A text the library returns (a summary): ``print`` it, compare it as a str; a notebook shows it as a table
    (``boxed``) and a terminal's echo as the text itself, not a quoted one-liner."""

    __slots__ = ()

    def _repr_html_(self) -> str:
        return boxed(str(self))

    def __repr__(self) -> str:
        return str(self)
