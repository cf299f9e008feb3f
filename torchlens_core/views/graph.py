"""``trace.to_networkx()``: the op graph as a networkx DiGraph, for graph analysis with networkx's algorithms."""

from __future__ import annotations

from typing import Any

from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.trace import Trace


def to_networkx(trace: Trace) -> Any:
    """A ``networkx.DiGraph`` with one node per op (keyed by label) and an edge from each parent to its child.

    Graph attributes: ``framework`` (the trace's backend) and ``model_name``.
    Node attributes: ``index`` (execution position), ``kind``, ``func_name``,
    ``module_passes`` (the ``(path, pass)`` stack the op ran in), ``module``
    (the innermost path, "" outside modules), ``shape`` and ``dtype``. An op
    that reads one parent twice (``x * x``) has one edge, with ``count=2``.
    """
    try:
        import networkx
    except ImportError as err:
        raise UnsupportedError("trace.to_networkx() needs networkx: pip install networkx") from err
    graph = networkx.DiGraph()
    # networkx's DiGraph(backend=...) picks a networkx dispatch backend: set the attribute after
    graph.graph.update(framework=trace.backend, model_name=trace.model_name)
    for op in trace.ops:
        graph.add_node(
            op.label,
            index=op.index,
            kind=op.kind,
            func_name=op.func_name,
            module_passes=tuple(op.module_passes),
            module=op.module_passes[-1][0] if op.module_passes else "",
            shape=None if op.shape is None else tuple(op.shape),
            dtype=op.dtype,
        )
    for op in trace.ops:
        for parent in op.parent_indices:
            source = trace.ops[parent].label
            if graph.has_edge(source, op.label):
                graph.edges[source, op.label]["count"] += 1
            else:
                graph.add_edge(source, op.label, count=1)
    return graph
