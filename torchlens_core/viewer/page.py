"""The one HTML file: the page's markup with its script, styles, data and layouts inlined (no network at view time).

Data travels in ``<script type="application/json">`` blocks and each layout's
SVG in its own ``<script type="image/svg+xml">`` block, so the browser parses
only the layout it shows, and the panel's details and value pictures of a
block of ops only when one of them is first shown in the panel. Those blocks, most of a large file, come
after the script: the browser runs it, and draws the graph, before it has read them.
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from typing import Any

from torchlens_core.compare.report import AGREES, DIVERGES, SHAPE, UNKNOWN
from torchlens_core.ir.errors import TorchLensError

# The colours Comparison.draw() fills ops with, named.
LEGEND = (
    '<span class="tl-legend">'
    + "".join(
        f'{name}<span style="background:{color}"></span>'
        for name, color in (("agrees", AGREES), ("diverges", DIVERGES[1]), ("shape", SHAPE), ("not compared", UNKNOWN))
    )
    + "</span>"
)


def page(title: str, data: dict[str, Any], svgs: list[str | None], blocks: dict[str, Any]) -> str:
    """The page's HTML text: ``data`` (parsed at once), layouts' SVG, and JSON ``blocks`` by element id (parsed
    by the page when it needs them)."""
    asset = resources.files("torchlens_core.viewer")
    script, style = (asset / "viewer.js").read_text(), (asset / "viewer.css").read_text()
    layouts = [
        f'<script id="tl-layout-{i}" type="image/svg+xml">{_raw(svg)}</script>'
        for i, svg in enumerate(svgs)
        if svg is not None
    ]
    json_blocks = [
        f'<script id="{name}" type="application/json">{_json(value)}</script>' for name, value in blocks.items()
    ]
    legend = LEGEND if data.get("comparison") else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; \
style-src 'unsafe-inline'; img-src data:">
<title>{html.escape(title)}</title>
<style>
{style}</style>
</head>
<body>
<header>
  <h1>{html.escape(title)}</h1>
  <input id="tl-search" type="search" placeholder="search label, function or module (Enter: next)">
  <span id="tl-status"></span>
  <select id="tl-depth" title="fold every module this deep or deeper"></select>
  <button id="tl-expand" type="button">Expand all</button>
  <button id="tl-collapse" type="button">Collapse all</button>
  <button id="tl-fit" type="button">Fit</button>
  {legend}
</header>
<main>
  <div id="tl-graph"></div>
  <aside id="tl-panel"><p class="tl-note">Click an op to see it; click a module's box to open it and a module's
  frame or title to fold it. Drag to pan, wheel to zoom.</p></aside>
</main>
<script id="tl-data" type="application/json">{_json(data)}</script>
{chr(10).join(layouts)}
<script>
{script}</script>
{chr(10).join(json_blocks)}
</body>
</html>
"""


def _json(value: Any) -> str:
    # "</" would end the <script> block early; "\u003c/" is the same string to JSON.parse. (No cycle check: the
    # page's data is lists, dicts and numbers made here, never a cycle.)
    try:  # nearly always finite: no walk over the whole value (seconds on 50,000 ops)
        text = json.dumps(value, separators=(",", ":"), default=_number, allow_nan=False, check_circular=False)
    except ValueError:
        text = json.dumps(_finite(value), separators=(",", ":"), default=_number, allow_nan=False, check_circular=False)
    return text.replace("</", "\\u003c/")


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such a number becomes null (the page shows it as unknown)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _number(value: Any) -> Any:
    """NumPy scalars and the like: as plain numbers."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def _raw(svg: str) -> str:
    # Graphviz escapes "<" in every label, so "</script" can only appear if the SVG itself were broken.
    if "</script" in svg.lower():
        raise TorchLensError("a layout's SVG holds '</script', which cannot be inlined")
    return svg
