"""Drawing: DOT from the IR alone, checked through Graphviz's own parse (dot -Tjson)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

import torchlens as tl
from torchlens_core.views import draw as drawing

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")


def parse(dot_source: str) -> dict[str, Any]:
    """Nodes, edges and clusters as Graphviz itself reads them."""
    out = subprocess.run(["dot", "-Tjson"], input=dot_source.encode(), capture_output=True, check=True)
    graph = json.loads(out.stdout)
    n_sub = graph.get("_subgraph_cnt", 0)
    objects = graph.get("objects", [])
    return {
        "clusters": [o["name"] for o in objects[:n_sub]],
        "nodes": {o["_gvid"]: o for o in objects[n_sub:]},
        "edges": [(e["tail"], e["head"]) for e in graph.get("edges", [])],
    }


# -- torch ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resnet() -> tl.Trace:
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return tl.trace(torchvision.models.resnet18(weights=None).eval(), torch.rand(1, 3, 64, 64))


@pytest.fixture(scope="module")
def recurrent() -> tl.Trace:
    torch = pytest.importorskip("torch")

    class SimpleRecurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(in_features=5, out_features=5)

        def forward(self, x):
            for _ in range(4):
                x = self.fc(x)
                x = x + 1
                x = x * 2
            return x

    return tl.trace(SimpleRecurrent(), torch.randn(6, 5))


@needs_dot
def test_unrolled_graph_has_every_op_and_edge(resnet: tl.Trace) -> None:
    g = parse(resnet.to_dot())
    assert len(g["nodes"]) == len(resnet.ops)
    assert len(g["edges"]) == resnet.num_edges
    # clusters are module passes; a module that is a single op is drawn as that op, named
    multi_op = {f"cluster {mp.label}" for m in resnet.modules.values() for mp in m.passes if len(mp.ops) > 1}
    assert set(g["clusters"]) == multi_op
    labels = [n["label"] for n in g["nodes"].values()]
    assert any(label.startswith("conv1 (Conv2d)\\nconv2d_1_1") for label in labels)


@needs_dot
def test_module_outputs_are_drawn_apart_from_functional_ops(resnet: tl.Trace) -> None:
    g = parse(resnet.to_dot())

    def node_of(label: str) -> dict[str, Any]:
        return next(n for n in g["nodes"].values() if label in n["label"].split("\\n"))

    add = next(op for op in resnet.ops if op.func_name == "add_")
    relu_out = resnet["layer1.0.relu:2"]
    assert node_of(add.label).get("peripheries") != "2"  # the residual add ends no module
    assert node_of(relu_out.label)["peripheries"] == "2"


def test_buffers_are_counted_apart_from_parameters_as_the_summary_counts(resnet: tl.Trace) -> None:
    """BatchNorm's running statistics are buffers: the drawing shows them apart and never adds them to params."""
    model = pytest.importorskip("torchvision").models.resnet18(weights=None)  # the reference counts
    labels = {node.label.split("\\n")[0]: node.label.split("\\n") for node in drawing.view(resnet).nodes.values()}
    bn1 = labels[resnet["bn1"].label]  # a one-op module: its op's box (titled "bn1 (BatchNorm2d)" in the DOT)
    in_params = sum(p.numel() for p in model.bn1.parameters())
    in_buffers = model.bn1.running_mean.numel() + model.bn1.running_var.numel()  # what batch_norm reads
    assert (in_params, in_buffers) == (128, 128)
    assert f"params: 64, 64 ({in_params})" in bn1 and f"buffers: 64, 64 ({in_buffers})" in bn1
    row = next(line for line in resnet.summary().splitlines() if line.startswith("| bn1 (BatchNorm2d)"))
    assert row.split("|")[3].strip() == str(in_params)  # the summary's count is the drawing's
    conv1 = labels[resnet["conv1"].label]
    assert not any(line.startswith("buffers") for line in conv1)

    boxes = {
        node.label.split("\\n")[0]: node.label.split("\\n")
        for node in drawing.view(resnet, collapse=1).nodes.values()
        if node.kind == "module"
    }
    layer1 = boxes["layer1"]
    assert f"params: {sum(p.numel() for p in model.layer1.parameters()) / 1e3:.1f}k" in layer1
    assert f"buffers: {sum(b.numel() for b in model.layer1.buffers())}" in layer1  # num_batches_tracked too


@needs_dot
def test_rolled_recurrent_has_one_linear_node_with_four_passes(recurrent: tl.Trace) -> None:
    g = parse(recurrent.to_dot(vis_mode="rolled"))
    linear = [n for n in g["nodes"].values() if "linear_1_1" in n["label"]]
    assert len(linear) == 1 and "linear x4" in linear[0]["label"]
    assert linear[0]["label"].startswith("fc x4 (Linear)")
    assert g["clusters"] == []  # the single-op module fc is folded into its op
    unrolled = parse(recurrent.to_dot(vis_mode="unrolled"))
    assert len(unrolled["nodes"]) == len(recurrent.ops)
    # the loop's functional x + 1 and x * 2 are layers of four passes too: input, linear, add, mul, output
    assert len(g["nodes"]) == 5
    # the loop is drawn back: the input and the mul layer (passes 1-3) feed linear
    linear_id = next(i for i, n in g["nodes"].items() if "linear_1_1" in n["label"])
    mul_id = next(i for i, n in g["nodes"].items() if "mul_1_3" in n["label"])
    into_linear = {g["nodes"][t]["label"].split("\\n")[0] for t, h in g["edges"] if h == linear_id}
    assert len(into_linear) == 2 and (mul_id, linear_id) in g["edges"]


@needs_dot
def test_collapse_by_depth_predicate_and_auto(resnet: tl.Trace) -> None:
    top = parse(resnet.to_dot(collapse=1))
    boxes = {n["label"].split("\\n")[0] for n in top["nodes"].values() if n.get("shape") == "box3d"}
    assert boxes == {"layer1", "layer2", "layer3", "layer4"}  # the top-level modules of several ops
    blocks = parse(resnet.to_dot(collapse=lambda m: m.type_name == "BasicBlock"))
    boxes = {n["label"].split("\\n")[0] for n in blocks["nodes"].values() if n.get("shape") == "box3d"}
    assert boxes == {f"layer{i}.{j}" for i in range(1, 5) for j in range(2)}
    assert len(drawing.view(resnet, collapse="auto").nodes) <= drawing.AUTO_NODE_BUDGET


@needs_dot
def test_module_focus_draws_only_that_subgraph(resnet: tl.Trace) -> None:
    g = parse(resnet.to_dot(module="layer2"))
    inside = [op for op in resnet.ops if any(p == "layer2" for p, _ in op.module_passes)]
    external = [n for n in g["nodes"].values() if n.get("style") == "dashed"]
    assert len(g["nodes"]) == len(inside) + len(external) and len(external) == 1
    assert all(c.startswith("cluster layer2") for c in g["clusters"])
    with pytest.raises(KeyError, match="layer2"):
        resnet.to_dot(module="layer22")


@needs_dot
@pytest.mark.parametrize("file_format", ["pdf", "svg", "png"])
def test_draw_writes_each_format(resnet: tl.Trace, tmp_path: Any, file_format: str) -> None:
    path = resnet.draw(str(tmp_path / "r18"), file_format=file_format, collapse="auto")
    assert path.endswith("." + file_format)
    head = open(path, "rb").read(8)
    assert head.startswith({"pdf": b"%PDF", "svg": b"<?xml", "png": b"\x89PNG"}[file_format])


def test_errors_are_typed(resnet: tl.Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(tl.UnsupportedError, match="vis_mode"):
        resnet.to_dot(vis_mode="sideways")
    with pytest.raises(tl.UnsupportedError, match="file_format"):
        resnet.draw(file_format="bmp")
    with pytest.raises(tl.UnsupportedError, match="collapse"):
        resnet.to_dot(collapse="everything")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(drawing.GraphvizNotFoundError, match="apt-get install graphviz"):
        resnet.draw()
    assert resnet.to_dot().startswith("digraph")  # DOT needs no Graphviz
    assert resnet._repr_svg_() is None


@needs_dot
def test_seed_draw_calls_run_as_written(
    resnet: tl.Trace, recurrent: tl.Trace, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    trace = log = resnet
    recurrent_log = recurrent
    drawing_path = trace.draw(collapse="auto", file_format="svg")
    trace.draw(module="layer2")
    log.draw()
    log.draw(vis_mode="rolled")
    log.draw(vis_mode="unrolled")
    recurrent_log.draw(vis_mode="rolled")
    assert drawing_path.endswith(".svg") and len(list(tmp_path.iterdir())) == 5
    assert "<svg" in trace._repr_svg_()


# -- jax ------------------------------------------------------------------------------------
@needs_dot
def test_jax_trace_draws_with_the_same_calls(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jax")
    from torchlens_jax.zoo import cases

    case = next(c for c in cases() if c.name == "nnx_residual")
    model, args, kwargs = case.build()
    trace = tl.trace(model, *args, backend="jax", **kwargs)
    monkeypatch.chdir(tmp_path)
    trace.draw(collapse="auto", file_format="svg")
    trace.draw()
    trace.draw(vis_mode="rolled")
    trace.draw(vis_mode="unrolled")
    module = next(iter(trace.modules))
    trace.draw(module=module)
    g = parse(trace.to_dot())
    assert len(g["nodes"]) == len(trace.ops) and len(g["edges"]) == trace.num_edges
    assert len(list(tmp_path.iterdir())) == 4  # draw() and vis_mode="unrolled" write the same file


# -- numpy (the core session: no framework installed) ----------------------------------------
@needs_dot
def test_numpy_plugin_trace_draws(tmp_path: Any) -> None:
    pytest.importorskip("torchlens_numpy")
    import numpy as np

    def mlp(x, w1, w2):
        h = np.maximum(x @ w1, 0)
        for _ in range(2):
            h = np.tanh(h @ w2) + h
        return h

    rng = np.random.default_rng(0)
    trace = tl.trace(mlp, rng.normal(size=(2, 4)), rng.normal(size=(4, 4)), rng.normal(size=(4, 4)), backend="numpy")
    g = parse(trace.to_dot())
    assert len(g["nodes"]) == len(trace.ops) and len(g["edges"]) == trace.num_edges
    assert trace.draw(str(tmp_path / "mlp"), file_format="svg").endswith(".svg")
    with pytest.raises(tl.UnsupportedError):
        trace.draw(file_format="jpeg")
