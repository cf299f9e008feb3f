"""The graph facts of a trace that every op asks for: children by position, and which inputs, outputs and
roots (ops with no parents) each op is connected to.

Built once per trace (``trace.graph_index()``) in two passes over the ops, so that reading
``op.input_ancestors`` or ``op.siblings`` on every op of a trace costs time linear in its length (plus what
the answers themselves hold), not a graph walk per op. Ancestry is kept as Python ints used as bit sets,
one bit per input, output or (when first asked for) root, so a pass is one OR per edge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace


class GraphIndex:
    """Positions and bit sets worked out from ``op.parent_indices``; read through the op's fields."""

    __slots__ = ("_ops", "_root_bits", "children", "input_bits", "inputs", "output_bits", "outputs", "parents", "roots")

    def __init__(self, ops: list[OpRecord]) -> None:
        self._ops = ops
        n = len(ops)
        # An op may take one value twice (x * x): each parent and child is listed once, in execution order.
        self.parents: list[tuple[int, ...]] = [tuple(sorted(set(op.parent_indices))) for op in ops]
        children: list[list[int]] = [[] for _ in range(n)]
        for i, parents in enumerate(self.parents):  # i ascends: every child list comes out in order
            for p in parents:
                children[p].append(i)
        self.children: list[tuple[int, ...]] = [tuple(c) for c in children]
        self.roots: list[int] = [i for i in range(n) if not self.parents[i]]
        self.inputs: list[int] = [i for i in self.roots if ops[i].kind == "input"]
        self.outputs: list[int] = [op.index for op in ops if op.kind == "output"]
        # A few bits an op: the inputs and outputs of a model are few. Every root's bits (constants, draws,
        # ops on parameters alone: thousands in a big trace) only when op.root_ancestors is first read.
        self.input_bits = self._down(self.inputs)
        self.output_bits = self._up(self.outputs)
        self._root_bits: list[int] | None = None

    @property
    def root_bits(self) -> list[int]:
        if self._root_bits is None:
            self._root_bits = self._down(self.roots)
        return self._root_bits

    def _down(self, sources: list[int]) -> list[int]:
        """Bit k of op i's int: ``sources[k]`` is an ancestor of op i (or op i itself). One forward pass."""
        bits = [0] * len(self.parents)
        for bit, i in enumerate(sources):
            bits[i] = 1 << bit
        for i, parents in enumerate(self.parents):  # parents come before their children
            for p in parents:
                bits[i] |= bits[p]
        return bits

    def _up(self, sinks: list[int]) -> list[int]:
        """Bit k of op i's int: op i reaches ``sinks[k]`` (or is it). One backward pass."""
        bits = [0] * len(self.parents)
        for bit, i in enumerate(sinks):
            bits[i] = 1 << bit
        for i in range(len(bits) - 1, -1, -1):
            if bits[i]:
                for p in self.parents[i]:
                    bits[p] |= bits[i]
        return bits

    def labels(self, bits: int, positions: list[int]) -> tuple[str, ...]:
        """The labels of the ops whose bits are set in ``bits`` (bit k stands for ``positions[k]``)."""
        found = []
        while bits:
            low = bits & -bits
            found.append(self._ops[positions[low.bit_length() - 1]].label)
            bits ^= low
        return tuple(found)

    def input_ancestors(self, i: int) -> tuple[str, ...]:
        return self.labels(self.input_bits[i], self.inputs)

    def root_ancestors(self, i: int) -> tuple[str, ...]:
        return self.labels(self.root_bits[i], self.roots)

    def output_descendants(self, i: int) -> tuple[str, ...]:
        return self.labels(self.output_bits[i], self.outputs)

    def siblings(self, i: int) -> tuple[str, ...]:
        """Labels of the other ops that take one of op i's parents, in execution order."""
        return self._others(i, self.parents, self.children)

    def co_parents(self, i: int) -> tuple[str, ...]:
        """Labels of the other ops whose values one of op i's children takes, in execution order."""
        return self._others(i, self.children, self.parents)

    def _others(self, i: int, near: list[tuple[int, ...]], back: list[tuple[int, ...]]) -> tuple[str, ...]:
        found = {j for k in near[i] for j in back[k]}
        found.discard(i)
        return tuple(self._ops[j].label for j in sorted(found))


def build(trace: Trace) -> GraphIndex:
    """The graph index of ``trace`` (``trace.graph_index()`` builds it once and keeps it)."""
    return GraphIndex(trace.ops)
