"""Drawings of big traces: collapse="auto" stays within its node budget whatever the model's size, and an
unrolled drawing Graphviz would take long over warns or refuses, saying how long and what to draw instead."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import warnings
from typing import Any

import pytest

import torchlens as tl
from torchlens_core.views import draw as drawing

torch = pytest.importorskip("torch")

BLOCKS = 500  # 4 ops each: 2,000 ops in all
BUDGET = 60  # the bound docs/drawing.md promises for collapse="auto"
NODE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)" \[label="((?:[^"\\]|\\.)*)", ([^\n]*)\];$', re.M)
EDGE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)" -> "((?:[^"\\]|\\.)*)";$', re.M)


def nodes_of(dot: str) -> dict[str, tuple[str, str]]:
    """Node id -> (label, style), read from the DOT source."""
    return {m[1]: (m[2], m[3]) for m in NODE.finditer(dot)}


def edges_of(dot: str) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in EDGE.finditer(dot)]


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: Any, s: Any) -> Any:
        # ``s`` feeds every block, as a decoder's position embeddings do: edges across the whole drawing.
        return x + torch.relu(self.lin(x)) * s


class Body(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))

    def forward(self, x: Any, s: Any) -> Any:
        for block in self.blocks:
            x = block(x, s)
        return x


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.lin(x))


class Deep(torch.nn.Module):
    """A body of many same-type blocks between a stem and a head, as a decoder stack is."""

    def __init__(self) -> None:
        super().__init__()
        self.body = Body()
        self.head = Head()

    def forward(self, x: Any) -> Any:
        s = torch.sigmoid(x.mean())
        return self.head(self.body(x * 2, s))


class Flat(torch.nn.Module):
    """Thousands of ops and no submodule at all: no collapse depth can make it small."""

    def forward(self, x: Any) -> Any:
        for _ in range(1_000):
            x = torch.sin(x) + 1
        return x


@pytest.fixture(scope="module")
def deep() -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(Deep().eval(), torch.rand(3, 4))


@pytest.fixture(scope="module")
def flat() -> tl.Trace:
    return tl.trace(Flat(), torch.rand(3))


def test_auto_draws_a_run_of_blocks_as_one_box_inside_its_module(deep: tl.Trace) -> None:
    assert drawing.AUTO_NODE_BUDGET == BUDGET
    dot = deep.to_dot(collapse="auto")
    nodes = nodes_of(dot)
    assert len(nodes) <= BUDGET
    runs = [label for label, style in nodes.values() if f"{BLOCKS} x Block" in label]
    params = BLOCKS * (4 * 4 + 4)  # each block's Linear(4, 4)
    assert runs == [f"body.blocks.0 .. body.blocks.{BLOCKS - 1}\\n{BLOCKS} x Block\\n3x4\\nparams: {params / 1e3:.1f}k"]
    # As deep as fits: the body is a cluster (depth 2), its blocks one box, the head expanded to its ops.
    assert 'subgraph "cluster body:1"' in dot
    assert any(label.startswith("head.lin (Linear)") for label, _ in nodes.values())
    run_id = next(i for i, (label, _) in nodes.items() if f"{BLOCKS} x Block" in label)
    edges = edges_of(dot)
    into_run = {a for a, b in edges if b == run_id}
    assert len(into_run) == 2  # x * 2, and the sigmoid every block reads
    assert len(edges) == len(set(edges))


def test_auto_is_within_the_budget_at_every_focus_and_mode(deep: tl.Trace) -> None:
    for options in ({}, {"vis_mode": "rolled"}, {"module": "body"}):
        nodes = nodes_of(deep.to_dot(collapse="auto", **options))
        assert 0 < len(nodes) <= BUDGET, options
    # Without runs, the shallowest collapse is over the budget: the bound comes from the runs.
    assert len(nodes_of(deep.to_dot(collapse=1, module="body"))) > BUDGET


def test_auto_bounds_a_graph_without_modules_by_segments(flat: tl.Trace) -> None:
    assert len(flat.ops) == 2_002  # input, 1,000 x (sin, add), output
    dot = flat.to_dot(collapse="auto")
    nodes = nodes_of(dot)
    assert len(nodes) <= BUDGET
    kinds = {i: style for i, (_, style) in nodes.items()}
    segments = [i for i, style in kinds.items() if "dashed" in style]
    # Every op drawn once: the segments' op counts and the two ovals add up to the trace.
    counts = [int(re.search(r"\\n([\d,]+) ops$", nodes[i][0])[1].replace(",", "")) for i in segments]
    assert sum(counts) + 2 == len(flat.ops)
    assert len(nodes) == len(segments) + 2
    # Consecutive segments: one chain from the input oval to the output oval.
    edges = edges_of(dot)
    succ = {a: b for a, b in edges}
    assert len(succ) == len(edges) == len(nodes) - 1
    node, seen = next(i for i in nodes if i not in {b for _, b in edges}), 1
    while node in succ:
        node, seen = succ[node], seen + 1
    assert seen == len(nodes)


def test_layout_size_counts_a_bend_for_every_rank_an_edge_crosses() -> None:
    # A source feeding every node of a chain of k: the edge to the i-th node crosses i - 1 ranks.
    k = 30
    chain = [f"c{i}" for i in range(1, k + 1)]
    nodes = {i: drawing.Node(i, i, "op", ()) for i in ["s", *chain]}
    edges = [("s", c) for c in chain] + list(zip(chain, chain[1:]))
    v = drawing.View(nodes, edges, {}, False, {})
    assert drawing.layout_size(v) == (k + 1) + k * (k - 1) // 2
    if shutil.which("dot") is None:
        return
    # Graphviz ranks the same graph the same way: the bends it lays out are the ranks its edges cross.
    source = "digraph { " + " ".join(f"{a} -> {b};" for a, b in edges) + " }"
    plain = subprocess.run(["dot", "-Tplain"], input=source.encode(), capture_output=True, check=True).stdout.decode()
    y = {line.split()[1].strip('"'): float(line.split()[3]) for line in plain.splitlines() if line.startswith("node")}
    rank = {n: r for r, level in enumerate(sorted(set(y.values()), reverse=True)) for n in y if y[n] == level}
    assert len(y) + sum(rank[b] - rank[a] - 1 for a, b in edges) == drawing.layout_size(v)


def test_an_unrolled_drawing_over_max_nodes_is_refused_before_graphviz(
    deep: tl.Trace, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(drawing, "render", lambda *a, **k: pytest.fail("Graphviz ran on a refused drawing"))
    with pytest.raises(tl.DrawingTooLargeError) as caught:
        deep.draw(str(tmp_path / "full"), file_format="svg", max_nodes=1_000)
    text = str(caught.value)
    auto = len(nodes_of(deep.to_dot(collapse="auto")))
    assert f"{len(deep.ops):,} nodes" in text and "max_nodes=1,000" in text
    assert re.search(r"about \d+ (s|min|h)", text)
    assert f'collapse="auto" draws it as {auto} nodes' in text and "max_nodes=None" in text
    with pytest.raises(tl.UnsupportedError, match="max_nodes"):
        deep.draw(str(tmp_path / "full"), max_nodes=0)


def test_a_slow_unrolled_drawing_warns_with_its_estimate(
    deep: tl.Trace, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered: list[bool] = []
    monkeypatch.setattr(drawing, "render", lambda source, path, fmt, quick=False: rendered.append(quick))
    size = drawing.layout_size(drawing.view(deep))
    # Every block reads the one sigmoid: hundreds of thousands of bends, minutes of Graphviz.
    assert size > 100 * len(deep.ops)
    minutes = drawing.layout_seconds(len(deep.ops), size) / 60
    assert minutes * 60 > drawing.WARN_SECONDS
    with pytest.warns(tl.LargeDrawingWarning) as caught:
        deep.draw(str(tmp_path / "full"), file_format="svg")
    text = str(caught[0].message)
    assert f"drawing {len(deep.ops):,} nodes" in text
    assert (f"about {minutes * 60:.0f} s" if minutes < 1.5 else f"about {minutes:.0f} min") in text
    assert 'collapse="auto" draws it as' in text
    assert rendered == [True]  # laid out with Graphviz's quick settings
    # The auto drawing neither warns nor takes the quick settings.
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.LargeDrawingWarning)
        deep.draw(str(tmp_path / "auto"), file_format="svg", collapse="auto")
    assert rendered == [True, False]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_auto_drawings_of_big_traces_render_quickly(deep: tl.Trace, flat: tl.Trace, tmp_path: Any) -> None:
    for name, trace in (("deep", deep), ("flat", flat)):
        start = time.perf_counter()
        path = trace.draw(str(tmp_path / name), file_format="svg", collapse="auto")
        assert time.perf_counter() - start < 20  # 0.5 s here; the old auto drawing of `flat` had all 2,002 nodes
        svg = open(path).read()
        assert 0 < svg.count('class="node"') <= BUDGET  # as Graphviz drew it
        assert svg.count('class="node"') == len(nodes_of(trace.to_dot(collapse="auto")))
