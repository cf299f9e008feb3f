"""The torch menagerie's graph networks: torch_geometric's ready models and its message-passing layers.

Enumerated from the library's own registries: every ``torch.nn.Module`` class
``torch_geometric.nn.models`` exports (family ``pyg.models``) and every layer of
``torch_geometric.nn.conv`` (family ``pyg.conv``). Each is built small from
its constructor's signature: a required argument gets the small value its name
calls for (``in_channels`` 8, ``hidden_channels`` 16, ``num_layers`` 2, ...),
or a value written for that class below where the name alone does not say
(a sub-network, a degree histogram). The forward gets one small random graph,
also by argument name: two graphs of six nodes each in one batch, node
features, ``edge_index``, edge features, positions and atom numbers for the
molecular models. A class that asks for something no name here provides (a
GPU-only kernel, a heterogeneous graph, an extension module that is not
installed) fails to build and is excluded with the error, as transformers'
are: TorchLens never ran.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from bench.menagerie.entries import Built, Entry

NODES_PER_GRAPH, GRAPHS = 6, 2
FEATURES, HIDDEN, OUT, EDGE_FEATURES = 8, 16, 4, 4


def entries() -> list[Entry]:
    try:
        import torch
        import torch_geometric.nn.conv as conv
        import torch_geometric.nn.models as models
    except ImportError:
        return []
    found = []
    for family, module in (("pyg.models", models), ("pyg.conv", conv)):
        for name in getattr(module, "__all__", dir(module)):
            cls = getattr(module, name, None)
            if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module)) or name == "MessagePassing":
                continue  # MessagePassing is the base class every layer derives from: no layer by itself
            found.append(
                Entry(
                    "torch",
                    f"torch_geometric/{name}",
                    "torch_geometric",
                    family,
                    functools.partial(_build, family, name),
                    other_inputs=_other_inputs,
                )
            )
    return found


# -- the graph --------------------------------------------------------------------------------------------------
def _graph() -> dict[str, Any]:
    """Two random graphs of NODES_PER_GRAPH nodes in one batch; every value a forward argument may be named."""
    import torch

    nodes = NODES_PER_GRAPH * GRAPHS
    edges = []
    for g in range(GRAPHS):  # each graph's edges stay inside it: pooling per graph means what it says
        src = torch.randint(0, NODES_PER_GRAPH, (3 * NODES_PER_GRAPH,))
        dst = (src + torch.randint(1, NODES_PER_GRAPH, src.shape)) % NODES_PER_GRAPH  # no self loops
        edges.append(torch.stack([src, dst]) + g * NODES_PER_GRAPH)
    edge_index = torch.cat(edges, dim=1)
    count = edge_index.shape[1]
    x = torch.randn(nodes, FEATURES)
    return {
        "x": x,
        "x_0": torch.randn(nodes, FEATURES),
        "edge_index": edge_index,
        "edge_attr": torch.randn(count, EDGE_FEATURES),
        "edge_weight": torch.rand(count),
        "edge_type": torch.randint(0, 3, (count,)),
        "batch": torch.arange(GRAPHS).repeat_interleave(NODES_PER_GRAPH),
        "pos": torch.randn(nodes, 3),
        "z": torch.randint(1, 10, (nodes,)),
        "pos_edge_index": edge_index[:, : count // 2],
        "neg_edge_index": edge_index[:, count // 2 :],
        "edge_label_index": edge_index[:, :8],
        "y": torch.randint(0, OUT, (nodes,)),
        "y_soft": torch.softmax(torch.randn(nodes, OUT), dim=-1),
        "mask": torch.arange(nodes) % 2 == 0,
        "xs": [torch.randn(nodes, HIDDEN) for _ in range(2)],
        "hyperedge_index": torch.stack([torch.arange(nodes), torch.arange(nodes) % 4]),
    }


# -- constructor arguments --------------------------------------------------------------------------------------
# A required constructor argument's small value, by its name.
_SMALL = {
    "in_channels": FEATURES,
    "hidden_channels": HIDDEN,
    "out_channels": OUT,
    "channels": FEATURES,
    "num_layers": 2,
    "edge_dim": EDGE_FEATURES,
    "num_timesteps": 2,
    "heads": 2,
    "K": 2,
    "alpha": 0.5,
    "depth": 2,
    "num_nodes": NODES_PER_GRAPH * GRAPHS,
    "embedding_dim": 8,
    "num_relations": 3,
    "num_rels": 3,
    "seq_len": 2,
    "num_blocks": 1,
    "num_bilinear": 2,
    "num_spherical": 3,
    "num_radial": 3,
    "int_emb_size": 8,
    "basis_emb_size": 4,
    "out_emb_channels": 8,
    "hidden_node_channels": 8,
    "hidden_edge_channels": 8,
    "num_filters": 8,
    "num_interactions": 2,
    "num_gaussians": 8,
    "num_classes": OUT,
    "dim": 3,
    "kernel_size": 2,
    "space_dimensions": 3,
    "propagate_dimensions": 4,
    "k": 3,
    "first_aggr": True,
    "filter_size": 2,
    "num_correction_layers": 2,
    "correction_alpha": 0.5,
    "num_smoothing_layers": 2,
    "smoothing_alpha": 0.5,
    "mode": "cat",
    "aggregators": ["mean", "max"],
    "scalers": ["identity", "amplification"],
}


def _linear(i: int, o: int) -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))


def _overrides(name: str) -> dict[str, Any]:
    """Arguments whose value the name does not give: sub-networks, a degree histogram, the width a layer needs."""
    import torch
    from torch_geometric.nn import GCN, MLP, GCNConv, GraphConv

    deg = torch.tensor([0, 2, 4, 6])  # a histogram of in-degrees: PNA's scalers normalise by it
    table: dict[str, Callable[[], dict[str, Any]]] = {
        "PNAConv": lambda: {"deg": deg, "edge_dim": EDGE_FEATURES},
        "PNA": lambda: {
            "deg": deg,
            "edge_dim": EDGE_FEATURES,
            "aggregators": ["mean", "max"],
            "scalers": ["identity", "amplification"],
        },
        "GAE": lambda: {"encoder": GCN(FEATURES, HIDDEN, 2)},
        "VGAE": lambda: {"encoder": _variational_encoder()},
        "ARGA": lambda: {"encoder": GCN(FEATURES, HIDDEN, 2), "discriminator": MLP([HIDDEN, HIDDEN, 1])},
        "ARGVA": lambda: {"encoder": _variational_encoder(), "discriminator": MLP([OUT, HIDDEN, 1])},
        "DeepGraphInfomax": lambda: {
            "encoder": GCN(FEATURES, HIDDEN, 2),
            "summary": _mean_summary,
            "corruption": _shuffled_nodes,
        },
        "MetaLayer": lambda: {"edge_model": _edge_update()},
        "Node2Vec": lambda: {"edge_index": _graph()["edge_index"], "walk_length": 4, "context_size": 2},
        "EGConv": lambda: {"num_heads": 2},
        "MaskLabel": lambda: {"out_channels": FEATURES},
        "DynamicEdgeConv": lambda: {"nn": _linear(2 * FEATURES, HIDDEN)},
        "PPFConv": lambda: {"local_nn": _linear(FEATURES + 4, HIDDEN), "global_nn": _linear(HIDDEN, OUT)},
        "HGTConv": lambda: {"in_channels": -1, "metadata": _HETERO_METADATA},
        "HANConv": lambda: {"in_channels": -1, "metadata": _HETERO_METADATA},
        "DeepGCNLayer": lambda: {
            "conv": GCNConv(FEATURES, FEATURES),
            "norm": torch.nn.LayerNorm(FEATURES),
            "act": torch.nn.ReLU(),
            "block": "res+",
        },
        # disable: without it, InvertibleFunction frees its input's storage to save memory (resize_(0) on the
        # caller's node features), so the model cannot run twice on one input, as every check does
        "GroupAddRev": lambda: {"conv": GraphConv(FEATURES // 2, FEATURES // 2), "num_groups": 2, "disable": True},
        "GINConv": lambda: {"nn": _linear(FEATURES, HIDDEN)},
        "GINEConv": lambda: {"nn": _linear(FEATURES, HIDDEN), "edge_dim": EDGE_FEATURES},
        "NNConv": lambda: {"nn": _linear(EDGE_FEATURES, FEATURES * OUT)},
        "EdgeConv": lambda: {"nn": _linear(2 * FEATURES, HIDDEN)},
        "PointNetConv": lambda: {"local_nn": _linear(FEATURES + 3, HIDDEN), "global_nn": _linear(HIDDEN, OUT)},
        "PointGNNConv": lambda: {
            "mlp_h": _linear(FEATURES, 3),
            "mlp_f": _linear(FEATURES + 3, FEATURES),
            "mlp_g": _linear(FEATURES, FEATURES),
        },
        "GPSConv": lambda: {"conv": GCNConv(FEATURES, FEATURES)},
        "DirGNNConv": lambda: {"conv": GCNConv(FEATURES, OUT)},
        "GCN2Conv": lambda: {"alpha": 0.1, "theta": 0.5, "layer": 1},
        "SSGConv": lambda: {"alpha": 0.1},
        "GATConv": lambda: {"edge_dim": EDGE_FEATURES},
        "GATv2Conv": lambda: {"edge_dim": EDGE_FEATURES},
        "TransformerConv": lambda: {"edge_dim": EDGE_FEATURES},
        "CGConv": lambda: {"dim": EDGE_FEATURES},
        "GMMConv": lambda: {"dim": EDGE_FEATURES},
        "GeneralConv": lambda: {"in_edge_channels": EDGE_FEATURES},
        "ResGatedGraphConv": lambda: {"edge_dim": EDGE_FEATURES},
        "PDNConv": lambda: {"edge_dim": EDGE_FEATURES},
        "AttentiveFP": lambda: {"edge_dim": EDGE_FEATURES},
        "GatedGraphConv": lambda: {"out_channels": FEATURES},  # its input is zero-padded up to out_channels
        "JumpingKnowledge": lambda: {"mode": "lstm", "channels": HIDDEN, "num_layers": 2},
        "MLP": lambda: {"channel_list": [FEATURES, HIDDEN, OUT]},
        "ViSNet": lambda: {"hidden_channels": HIDDEN, "num_heads": 2, "num_layers": 2, "num_rbf": 8},
        "GPSE": lambda: {"dim_in": FEATURES, "dim_inner": HIDDEN, "layers_mp": 2},
        "Polynormer": lambda: {"local_layers": 2, "global_layers": 1},
        "SchNet": lambda: {
            "hidden_channels": HIDDEN,
            "num_filters": 8,
            "num_interactions": 2,
            "num_gaussians": 8,
            "interaction_graph": _all_pairs,
        },
    }
    return table[name]() if name in table else {}


def _variational_encoder() -> Any:
    """VGAE's encoder: two GCN layers, for the mean and the log standard deviation of the node embeddings."""
    import torch
    from torch_geometric.nn import GCNConv

    class VariationalEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mu, self.logstd = GCNConv(FEATURES, OUT), GCNConv(FEATURES, OUT)

        def forward(self, x: Any, edge_index: Any) -> Any:
            return self.mu(x, edge_index), self.logstd(x, edge_index)

    return VariationalEncoder()


def _mean_summary(z: Any, *args: Any, **kwargs: Any) -> Any:
    import torch

    return torch.sigmoid(z.mean(dim=0))


def _shuffled_nodes(x: Any, edge_index: Any) -> Any:
    """DeepGraphInfomax's corruption: the node features permuted (a random draw, reseeded before every run)."""
    import torch

    return x[torch.randperm(x.size(0))], edge_index


def _all_pairs(pos: Any, batch: Any) -> tuple[Any, Any]:
    """SchNet's interaction graph: every ordered pair of atoms of one molecule, with their distance (the default
    finds neighbours within a cutoff through pyg-lib, which is not installable here)."""
    import torch

    same = (batch[:, None] == batch[None, :]) & ~torch.eye(batch.numel(), dtype=torch.bool)
    row, col = same.nonzero().t()
    return torch.stack([row, col]), (pos[row] - pos[col]).norm(dim=-1)


def _edge_update() -> Any:
    """MetaLayer's edge model: new edge features from both end nodes' features and the old edge features."""
    import torch

    class EdgeUpdate(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = torch.nn.Linear(2 * FEATURES + EDGE_FEATURES, EDGE_FEATURES)

        def forward(self, src: Any, dst: Any, edge_attr: Any, u: Any, batch: Any) -> Any:
            return torch.relu(self.mlp(torch.cat([src, dst, edge_attr], dim=1)))

    return EdgeUpdate()


def _constructor_kwargs(cls: type, name: str) -> dict[str, Any]:
    kwargs = _overrides(name)
    for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in kwargs:
            continue
        if param.default is param.empty:
            if param.name not in _SMALL:
                raise TypeError(f"no small value for {name}'s required argument {param.name!r}")
            kwargs[param.name] = _SMALL[param.name]
        elif param.name in _SMALL and param.name in ("num_layers", "depth", "num_blocks", "num_interactions"):
            kwargs[param.name] = _SMALL[param.name]  # a deep default (ViSNet's 6 layers) cut to the small one
    return kwargs


# -- forward arguments ------------------------------------------------------------------------------------------
# Optional forward arguments passed all the same: per-graph pooling (batch), the graph itself (PMLP's is optional
# but needed in inference), and edge features or types where the layer was built to read them.
_OPTIONAL_PASSED = {"batch", "edge_index"}
_READS_EDGE_FEATURES = {"CGConv", "GMMConv", "NNConv", "SplineConv", "MetaLayer"}

# Two node types, an edge type each way: HGTConv's and HANConv's heterogeneous graph.
_HETERO_METADATA = (["paper", "author"], [("author", "writes", "paper"), ("paper", "written_by", "author")])


def _inputs(name: str, graph: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The forward's arguments where the names alone do not give them, or None."""
    import torch

    x, edge_index = graph["x"], graph["edge_index"]
    if name in ("GAE", "VGAE", "ARGA", "ARGVA", "DeepGraphInfomax", "DeepGCNLayer", "GroupAddRev"):
        return (x, edge_index), {}  # forward(*args): the encoder's or the wrapped layer's
    if name == "CorrectAndSmooth":
        mask = graph["mask"]
        return (graph["y_soft"], graph["y"][mask], mask, edge_index), {}
    if name == "InnerProductDecoder":
        return (x, edge_index), {}  # z: node embeddings here, not atom numbers
    if name == "DNAConv":
        return (torch.randn(x.shape[0], 2, FEATURES), edge_index), {}  # every layer's features: [nodes, layers, C]
    if name == "WLConv":
        return (torch.randint(0, 3, (x.shape[0],)), edge_index), {}  # node colours, not features
    if name == "PPFConv":
        return (x, graph["pos"], torch.nn.functional.normalize(torch.randn(x.shape[0], 3), dim=1), edge_index), {}
    if name == "Node2Vec":
        return (torch.arange(4),), {}
    if name in ("HGTConv", "HANConv"):
        half = x.shape[0] // 2
        x_dict = {"paper": x[:half], "author": torch.randn(x.shape[0] - half, FEATURES + 2)}
        src, dst = edge_index % half
        edges = {
            ("author", "writes", "paper"): torch.stack([src, dst]),
            ("paper", "written_by", "author"): torch.stack([dst, src]),
        }
        return (x_dict, edges), {}
    return None


def _forward_kwargs(model: Any, built_with: dict[str, Any], graph: dict[str, Any]) -> dict[str, Any]:
    name = type(model).__name__
    forward = inspect.signature(type(model).forward)
    kwargs: dict[str, Any] = {}
    reads_edges = any(k in built_with for k in ("edge_dim", "in_edge_channels")) or name in _READS_EDGE_FEATURES
    for param in list(forward.parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        wanted = (
            param.default is param.empty
            or param.name in _OPTIONAL_PASSED
            or (param.name == "edge_attr" and reads_edges)
            or (param.name == "edge_type" and "num_relations" in built_with)
        )
        if not wanted:
            continue
        if param.name not in graph:
            raise TypeError(f"no small input for {name}'s forward argument {param.name!r}")
        kwargs[param.name] = graph[param.name]
    return kwargs


def _other_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The replay check's second graph: features nudged, node indices shuffled, but a sorted index vector (the
    batch assignment, which pooling and to_dense_batch require sorted) kept: shuffled, it would be another model
    input no graph can have, and the model's own call fails on it."""
    import torch

    from torchlens_core.ir import tree

    generator = torch.Generator().manual_seed(1)
    made: dict[int, Any] = {}

    def other(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.numel() < 2:
            return value
        if id(value) in made:  # one tensor passed twice stays one tensor
            return made[id(value)]
        if value.is_floating_point():
            new = value + 0.05 * value.std() * torch.randn(value.shape, generator=generator)
        elif value.dtype == torch.bool or (value.dim() == 1 and bool((value[1:] >= value[:-1]).all())):
            new = value
        else:
            new = value.flatten()[torch.randperm(value.numel(), generator=generator)].reshape(value.shape)
        made[id(value)] = new
        return new

    return tree.map_leaves(other, args), tree.map_leaves(other, kwargs)


def _build(family: str, name: str) -> Built:
    import torch
    import torch_geometric.nn.conv as conv
    import torch_geometric.nn.models as models

    torch.manual_seed(0)
    cls = getattr(models if family == "pyg.models" else conv, name)
    built_with = _constructor_kwargs(cls, name)
    model = cls(**built_with).eval()
    graph = _graph()
    given = _inputs(name, graph)
    if given is not None:
        return model, *given
    return model, (), _forward_kwargs(model, built_with, graph)
