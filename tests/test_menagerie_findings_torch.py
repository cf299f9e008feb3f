"""What the menagerie's graph and diffusion entries found in TorchLens (torch_geometric, diffusers), each reduced to
a small model and checked against a reference TorchLens does not compute: a forward hook, the untraced call."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import TraceFileError  # noqa: E402


# -- a module returning a dataclass whose __init__ checks its fields --------------------------------------------
# torch_geometric's pooling selectors return SelectOutput, a dataclass with its own __init__ that calls
# node_index.dim(): rebuilding it around the trace's Refs raised AttributeError and the whole capture failed.
@dataclasses.dataclass(init=False)
class Selection:
    node_index: torch.Tensor
    weight: torch.Tensor

    def __init__(self, node_index: torch.Tensor, weight: torch.Tensor) -> None:
        if node_index.dim() != 1:
            raise ValueError("node_index must be one-dimensional")
        self.node_index, self.weight = node_index, weight


class Select(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> Selection:
        score = self.score(x).squeeze(-1)
        return Selection(torch.topk(score, 3).indices, torch.sigmoid(score))


class Pool(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.select = Select()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = self.select(x)
        return x[chosen.node_index] * chosen.weight[chosen.node_index, None]


def test_a_module_output_dataclass_that_checks_its_fields_is_recorded() -> None:
    torch.manual_seed(0)
    model, x = Pool().eval(), torch.randn(6, 4)
    seen = {}
    handle = model.select.register_forward_hook(lambda module, args, out: seen.setdefault("select", out))
    try:
        own = model(x)
    finally:
        handle.remove()
    trace = tl.trace(model, x)
    assert torch.equal(trace.output, own)
    recorded = trace.modules["select"].passes[0].out
    assert type(recorded) is Selection  # the structure the module returned, not a dict or a tuple
    assert torch.equal(recorded.node_index, seen["select"].node_index)
    assert torch.equal(recorded.weight, seen["select"].weight)
    assert trace.audit(untraced=True)


# -- sparse tensors in a saved trace ----------------------------------------------------------------------------
# torch_geometric's GraphUNet squares its adjacency as a sparse CSR tensor: tl.save kept such a value as unsaved,
# and tl.load then refused the whole file ("its value has shape None, its record says (12, 12)").
class SparseAdjacency(torch.nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        sparse = adjacency.to_sparse_csr() if self.layout == "csr" else adjacency.to_sparse()
        return torch.relu(sparse @ self.lin(x))


@pytest.mark.parametrize("layout", ["csr", "coo"])
def test_a_sparse_value_survives_save_and_load(tmp_path: pathlib.Path, layout: str) -> None:
    torch.manual_seed(0)
    model = SparseAdjacency(layout).eval()
    x, adjacency = torch.randn(5, 4), (torch.rand(5, 5) > 0.6).float() * torch.rand(5, 5)
    own = model(x, adjacency)
    trace = tl.trace(model, x, adjacency)
    sparse_op = next(op for op in trace.ops if op.kind == "op" and op.out.layout != torch.strided)
    loaded = tl.load(tl.save(trace, tmp_path / layout))
    value = loaded[sparse_op.label].out
    assert value.layout == sparse_op.out.layout
    assert torch.equal(value.to_dense(), adjacency)  # the untraced conversion's values, independently of the trace
    assert torch.equal(loaded.replay(), own)
    assert loaded.audit()


def test_a_file_naming_an_unknown_layout_is_refused() -> None:
    from torchlens_torch.saving import from_numpy

    with pytest.raises(TraceFileError, match="sparse_bsr"):
        from_numpy(np.zeros((2, 2), dtype=np.float32), "float32:sparse_bsr", "cpu")


# -- the real models the findings came from ---------------------------------------------------------------------
def test_graph_unet_traces_saves_and_replays(tmp_path: pathlib.Path) -> None:
    """GraphUNet (both findings at once): top-k pooling's SelectOutput and the sparse squared adjacency."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GraphUNet

    torch.manual_seed(0)
    model = GraphUNet(8, 16, 4, depth=2).eval()
    x = torch.randn(12, 8)
    edge_index = torch.stack([torch.arange(12), (torch.arange(12) + 1) % 12])
    edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    seen = {}
    handle = model.pools[0].register_forward_hook(lambda module, args, out: seen.setdefault("pool", out))
    try:
        own = model(x, edge_index)
    finally:
        handle.remove()
    trace = tl.trace(model, x, edge_index)
    assert torch.equal(trace.output, own)
    recorded = trace.modules["pools.0"].passes[0].out
    assert all(torch.equal(a, b) for a, b in zip(recorded, seen["pool"]) if isinstance(a, torch.Tensor))
    assert trace.audit(untraced=True)
    loaded = tl.load(tl.save(trace, tmp_path / "graph-unet"))
    assert torch.equal(loaded.replay(), own)
