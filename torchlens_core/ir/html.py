"""An HTML table, for what a notebook shows of a record or a report (each layer's ``_repr_html_`` uses it).

In the IR because reports of every layer (an audit's, a comparison's) show as
tables and may import nothing above their own layer; what turns ``print``'s
text into tables is :mod:`torchlens_core.views.html`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

# Small and neutral: notebooks style tables themselves; these only keep cells on one line and align numbers.
STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px"
_CELL = "padding:1px 8px;text-align:left;vertical-align:top;white-space:pre"


def table(
    rows: Sequence[Sequence[object]],
    header: Sequence[object] | None = None,
    caption: str = "",
    marks: Sequence[str | None] | None = None,
) -> str:
    """An HTML table of ``rows`` (cells shown as ``str``), with an optional header row and caption.

    ``marks``: per row, None or a CSS colour for the row's background (a failed check, a diverging pair).
    """
    parts = [f'<table style="{STYLE}">']
    if caption:
        parts.append(
            f'<caption style="text-align:left;font-weight:bold;white-space:pre-wrap">{html.escape(caption)}</caption>'
        )
    if header is not None:
        parts.append(
            "<thead><tr>" + "".join(f'<th style="{_CELL}">{html.escape(str(c))}</th>' for c in header) + "</tr></thead>"
        )
    parts.append("<tbody>")
    for i, row in enumerate(rows):
        mark = marks[i] if marks is not None else None
        style = f' style="background:{mark}"' if mark else ""
        parts.append(f"<tr{style}>" + "".join(f'<td style="{_CELL}">{html.escape(str(c))}</td>' for c in row) + "</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)
