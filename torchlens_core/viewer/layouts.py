"""Graphviz layouts of a trace, one per collapse depth, as SVG text for the page.

The page cannot run Graphviz, so every view it can switch to is laid out
here: ``collapse=d`` for each module depth ``d`` (modules that deep are one
box; the shallower ones are clusters the page can still fold in place) and the
fully expanded graph. The DOT is :func:`torchlens_core.views.draw.to_dot`'s, so
the viewer and ``trace.draw()`` show the same graph; the page finds ops,
module boxes and clusters by the ``<title>`` Graphviz gives each
(``op 12``, ``module layer1:1``, ``cluster layer1:1``). A trace of more than
``PAGE_LAYOUT_OPS`` ops gets none of these: the page lays out what it shows
(viewer.js), and only :func:`depth_sizes` is worked out here, to choose the
depth it opens at.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from torchlens_core.ir.errors import GraphvizNotFoundError, TorchLensError
from torchlens_core.viewer.data import pass_chains
from torchlens_core.views.draw import AUTO_NODE_BUDGET, to_dot, view

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace

# A layout with more nodes than this is left out (Graphviz takes minutes on tens of thousands); the page then
# cannot expand that far and says so.
MAX_LAYOUT_NODES = 20_000
# Over this many nodes Graphviz gets fewer rounds to untangle crossings (a 5,000-node layout: 10 s, not 40 s).
QUICK_LAYOUT_NODES = 1_500
QUICK_LAYOUT = ("-Gnslimit=1", "-Gmclimit=0.3")
# Over this many ops the page lays out only what it shows, itself: Graphviz would take minutes on every depth of
# a 50,000-op trace, and the file would hold tens of MB of SVG no one opens.
PAGE_LAYOUT_OPS = 2_000


def depth_sizes(trace: Trace, chains: dict[tuple[tuple[str, int], ...], int] | None = None) -> list[int]:
    """How many nodes the graph has with modules ``d`` deep folded, for d = 1 ... (deepest module + 1).

    Counted as :func:`torchlens_core.views.draw.view` draws (a module pass of one op is that op, never a
    box), without building the views. At depth ``d`` an op is drawn as the first pass of more than one op
    among its passes ``d`` deep or deeper, or as itself if none is: so a pass at position ``p`` of its ops'
    passes is a box at the depths from just below the pass of more than one op enclosing it (at ``q``) down
    to its own, ``q + 2 <= d <= p + 1``, and an op is its own node from just below its innermost such pass.
    One pass over the ops' chains of passes (:func:`~torchlens_core.viewer.data.pass_chains`, given as
    ``chains`` or worked out here) counts both, not one pass per depth.
    """
    chains = pass_chains(trace) if chains is None else chains
    depth = max(map(len, chains), default=0)
    single: dict[Any, int] = {}
    for chain, count in chains.items():
        for key in chain:
            single[key] = single.get(key, 0) + count
    starts = [0] * (depth + 3)  # +1 at the first depth a node is drawn, -1 after its last
    boxes: dict[Any, tuple[int, int]] = {}  # pass -> (its position, the enclosing box pass's, least over its ops)
    for chain, count in chains.items():
        q = -1
        for p, key in enumerate(chain):
            if single[key] > 1:
                first = boxes.get(key)
                if first is not None and first[0] != p:
                    return _depth_sizes_by_depth(trace, depth, single)  # (passes nest as a tree: never)
                if first is None or q < first[1]:
                    boxes[key] = (p, q)
                q = p
        starts[q + 2] += count
    for p, q in boxes.values():
        starts[q + 2] += 1
        starts[p + 2] -= 1
    sizes, shown = [], 0
    for d in range(1, depth + 2):
        shown += starts[d]
        sizes.append(shown)
    return sizes


def _depth_sizes_by_depth(trace: Trace, depth: int, single: dict[Any, int]) -> list[int]:
    """depth_sizes() one depth at a time: each op's node found by walking its passes."""
    sizes = []
    for d in range(1, depth + 2):
        reps: set[Any] = set()
        for op in trace.ops:
            rep: Any = op.index
            for i in range(d - 1, len(op.module_passes)):
                if single[op.module_passes[i]] > 1:
                    rep = op.module_passes[i]
                    break
            reps.add(rep)
        sizes.append(len(reps))
    return sizes


def start_depth(sizes: list[int], max_nodes: int) -> int:
    """The depth the page opens at, as ``collapse="auto"`` draws: the deepest within the drawing's node budget."""
    if sizes[0] > max_nodes:
        raise TorchLensError(
            f"even the most collapsed layout has {sizes[0]} nodes, over max_nodes={max_nodes}: "
            "raise max_nodes to lay it out"
        )
    within = [d for d, n in enumerate(sizes, start=1) if n <= AUTO_NODE_BUDGET]
    return within[-1] if within else 1


def layouts(
    trace: Trace, colors: dict[str, str] | None = None, max_nodes: int = MAX_LAYOUT_NODES
) -> tuple[list[dict[str, Any]], int]:
    """(layouts, index of the one to open with), shallowest first; the last is the expanded graph.

    Each layout is ``{"depth": d, "nodes": n, "svg": text}``: modules ``d`` deep are boxes (``d`` one more
    than the deepest module: the expanded graph); ``svg`` is None when over ``max_nodes``. A depth whose
    picture equals a shallower one's is left out: the page takes the deepest layout not deeper than it needs.
    The first shown is the one ``collapse="auto"`` draws: the deepest within the drawing's node budget.
    """
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizNotFoundError(
            "the viewer lays the graph out with the Graphviz 'dot' program, which is not on PATH: install "
            "Graphviz (apt-get install graphviz, brew install graphviz, conda install graphviz)"
        )
    depth = max((len(op.module_passes) for op in trace.ops), default=0)
    found: list[dict[str, Any]] = []
    seen: set[frozenset[str]] = set()
    for d in range(1, depth + 2):
        collapse = d if d <= depth else None  # one deeper than the deepest module: nothing collapsed
        nodes = frozenset(view(trace, collapse=collapse).nodes)
        if nodes in seen:
            continue  # the same picture as a shallower depth (a depth where every module is one op)
        seen.add(nodes)
        found.append({"depth": d, "nodes": len(nodes), "dot": to_dot(trace, collapse=collapse, colors=colors)})
    with ThreadPoolExecutor(max_workers=2) as pool:
        svgs = list(
            pool.map(lambda item: _svg(dot, item["dot"], item["nodes"]) if item["nodes"] <= max_nodes else None, found)
        )
    for item, svg in zip(found, svgs):
        del item["dot"]
        item["svg"] = svg
    within = [i for i, item in enumerate(found) if item["nodes"] <= AUTO_NODE_BUDGET and item["svg"] is not None]
    start = within[-1] if within else 0
    if found[start]["svg"] is None:
        raise TorchLensError(
            f"even the most collapsed layout has {found[start]['nodes']} nodes, over "
            f"max_nodes={max_nodes}: raise max_nodes to lay it out"
        )
    return found, start


def _svg(dot: str, source: str, nodes: int) -> str:
    quick = QUICK_LAYOUT if nodes > QUICK_LAYOUT_NODES else ()
    result = subprocess.run([dot, "-Tsvg", *quick], input=source.encode(), capture_output=True)
    if result.returncode != 0:
        raise TorchLensError(f"Graphviz failed to lay the trace out: {result.stderr.decode(errors='replace').strip()}")
    text = result.stdout.decode()
    # The page inlines the <svg> element itself: drop the XML prolog, doctype and comments.
    text = text[text.index("<svg") :]
    return re.sub(r"<!--.*?-->\n?", "", text, flags=re.S)
