"""The interactive trace viewer: one self-contained HTML file per trace or comparison (docs/viewer.md).

``view(trace, "trace.html")`` writes it; ``show(trace)`` displays it in a
notebook, or writes it to a temporary file and opens a browser elsewhere.
Graphviz lays a small trace's graph out at export time; a large one (over
``PAGE_LAYOUT_OPS`` ops) is laid out by the page, only the part shown. The
page (vanilla JavaScript, inlined) adds pan and zoom, folding modules, search,
path highlighting and the op panel, whose details it reads lazily. Values
are pictured from NumPy, so every backend works, and so do loaded traces.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
import webbrowser
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torchlens_core.capture.threads import pause_gc, resume_gc
from torchlens_core.compare.report import Comparison, colors
from torchlens_core.ir.errors import ArgumentTypeError
from torchlens_core.ir.trace import Trace
from torchlens_core.viewer.data import CHUNK, module_passes, op_blocks, op_graph, op_pictures, pass_chains
from torchlens_core.viewer.layouts import MAX_LAYOUT_NODES, PAGE_LAYOUT_OPS, depth_sizes, layouts, start_depth
from torchlens_core.viewer.page import page
from torchlens_core.viewer.pictures import picture_block
from torchlens_core.views.filenames import checked_output, default_name, write_error

if TYPE_CHECKING:
    from torchlens_core.compare.report import AlignedPair

__all__ = ["render_html", "show", "view"]


def render_html(
    target: Trace | Comparison, *, side: str = "a", values: bool = True, max_nodes: int = MAX_LAYOUT_NODES
) -> str:
    """The viewer's HTML text for a trace, or for one side of a ``tl.compare`` result.

    A comparison colours each op by its pair's error (as ``Comparison.draw`` does) and opens on the first
    divergence. ``values=False`` leaves the value pictures out (a smaller file). Layouts with more than
    ``max_nodes`` nodes are left out (Graphviz is slow on them, and so is the browser): the page then cannot
    expand that far.
    """
    with _collector_paused():
        return _render(target, side, values, max_nodes)


def _render(target: Trace | Comparison, side: str, values: bool, max_nodes: int) -> str:
    trace, comparison = _trace_of(target, side)
    fills = colors(comparison, side) if comparison is not None else None
    pictures = op_pictures(trace, with_values=values)  # stacked values' pictures as rows of their stacks
    chains = pass_chains(trace)
    modules = module_passes(trace, chains)
    title = f"{trace.model_name or 'function'} ({trace.backend})"
    data: dict[str, Any] = {
        "graph": op_graph(trace, modules, fills),
        "modules": modules,
        "chunk": CHUNK,
        "focus": None,
        "comparison": None,
        "max_nodes": max_nodes,
        "sizes": depth_sizes(trace, chains),
    }
    svgs: list[str | None] = []
    if len(trace.ops) > PAGE_LAYOUT_OPS:  # the page lays out what it shows (docs/viewer.md, "Scale")
        data["layouts"], data["start"] = None, start_depth(data["sizes"], max_nodes)
    else:
        laid_out, start = layouts(trace, colors=fills, max_nodes=max_nodes)
        data["start"] = laid_out[start]["depth"]
        data["layouts"] = [
            {"depth": item["depth"], "nodes": item["nodes"], "available": item["svg"] is not None} for item in laid_out
        ]
        svgs = [item["svg"] for item in laid_out]
    if comparison is not None:
        data["comparison"] = _pairs(comparison, side)
        first = comparison.first_divergence
        data["focus"] = None if first is None else (first.a if side == "a" else first.b)
        title = f"{title} compared with {_name(comparison.b if side == 'a' else comparison.a)}"
    elif trace.interventions:
        data["focus"] = next(op.label for op in trace.ops if op.edits)
    # The panel's details and the value pictures in blocks of CHUNK ops, each parsed when first needed.
    blocks: dict[str, Any] = {}
    for k, details in enumerate(op_blocks(trace)):
        blocks[f"tl-ops-{k}"] = details
        blocks[f"tl-pictures-{k}"] = picture_block(pictures, k * CHUNK, min((k + 1) * CHUNK, len(trace.ops)))
    return page(title, data, svgs, blocks)


def view(
    target: Trace | Comparison,
    path: str | os.PathLike[str] | None = None,
    *,
    side: str = "a",
    values: bool = True,
    max_nodes: int = MAX_LAYOUT_NODES,
    open_browser: bool = False,
) -> str:
    """Write the viewer for ``target`` (a trace or a ``tl.compare`` result) to ``path``; returns the path.

    ``path`` defaults to ``<model name>.html`` in the working directory (the name made one path component:
    a loaded trace's model name comes from its file); ``open_browser=True`` opens it.
    """
    trace, _ = _trace_of(target, side)
    path = checked_output(
        path if path is not None else default_name(trace.model_name or "trace", suffix=".html"), "the viewer page"
    )
    text = render_html(target, side=side, values=values, max_nodes=max_nodes)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except (OSError, ValueError) as exc:
        raise write_error(path, "the viewer page", exc) from None
    if open_browser:
        webbrowser.open(pathlib.Path(path).resolve().as_uri())
    return path


def show(target: Trace | Comparison, **options: Any) -> str | None:
    """Show the viewer: inline in a Jupyter notebook, else in a browser from a temporary file (its path returned).

    ``options`` are :func:`view`'s (``side``, ``values``, ``max_nodes``).
    """
    if _in_notebook():
        from IPython.display import display

        text = render_html(target, **options)
        # An iframe keeps the page's script and styles apart from the notebook's. (Displayed through an object of
        # our own: IPython's HTML() warns about any iframe, pointing to IFrame(), which needs a URL, not a page.)
        srcdoc = text.replace("&", "&amp;").replace('"', "&quot;")
        display(_Inline(f'<iframe srcdoc="{srcdoc}" style="width:100%;height:720px;border:1px solid #ccc"></iframe>'))
        return None
    handle, path = tempfile.mkstemp(suffix=".html", prefix="torchlens-")
    os.close(handle)
    return view(target, path, open_browser=True, **options)


class _Inline:
    """HTML a notebook displays as it is (``_repr_html_``)."""

    def __init__(self, markup: str) -> None:
        self.markup = markup

    def _repr_html_(self) -> str:
        return self.markup


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while the page is built: the export makes a few small containers per op
    (records, pictures, JSON), none in a cycle, and each collection they set off walks every object the trace
    holds (hundreds of thousands on a large trace): left on, it took more than half of exporting one. Counted
    with the captures' pauses (:func:`~torchlens_core.capture.threads.pause_gc`): a capture or an export in
    another thread does not switch it back on under this one."""
    pause_gc()
    try:
        yield
    finally:
        resume_gc()


def _trace_of(target: Any, side: str) -> tuple[Trace, Comparison | None]:
    if isinstance(target, Comparison):
        if side not in ("a", "b"):
            raise ArgumentTypeError(f"side= is 'a' or 'b', not {side!r}")
        return (target.a if side == "a" else target.b), target
    if isinstance(target, Trace):
        return target, None
    raise ArgumentTypeError(
        f"the viewer shows a Trace (tl.trace, tl.load) or a tl.compare result, not {type(target).__name__}"
    )


def _pairs(comparison: Comparison, side: str) -> dict[str, dict[str, Any]]:
    """Op label -> how its pair compared: verdict, max |diff|, relative error, the other side's op."""
    found: dict[str, dict[str, Any]] = {}
    for pair in comparison.pairs:
        info = _pair_info(pair, side)
        for label in pair.a_group if side == "a" else pair.b_group:
            found[label] = info
    return found


def _pair_info(pair: AlignedPair, side: str) -> dict[str, Any]:
    g = pair.agreement
    return {
        "verdict": pair.verdict,
        "partner": pair.b if side == "a" else pair.a,
        "max_abs": None if g is None else g.max_abs,
        "relative": None if g is None else g.relative,
    }


def _name(trace: Trace) -> str:
    return f"{trace.model_name or 'function'} ({trace.backend})"


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
