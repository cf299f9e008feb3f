"""``tl.merge_ranks(traces)``: one trace of the whole job, whose collectives join the ranks.

The merged trace holds every rank's ops as they ran, renamed by rank:

- op labels ``rank{r}/{label}`` (``"rank1/linear_1_1"``, ``"rank0/all_reduce_1_3"``);
- modules ``rank{r}`` (one per rank: its whole forward, one pass, returning
  what the rank returned) and ``rank{r}.{path}`` below it; parameters
  ``rank{r}.{name}``;
- ops ordered as the job ran: every rank's inputs, then each rank's ops up
  to its next collective, the collective's nodes on every rank of its group,
  and so on; every rank's output nodes last;
- a collective's node on each rank reads what every rank of its group sent:
  its ``sent`` argument becomes one list per group rank, so its parents are
  the values every rank sent (an ``all_reduce`` output has every rank's input
  as a parent); ``op.meta["collective"]["join"]`` lists the labels of the
  collective's nodes on every rank;
- ``trace.output`` is the list of the ranks' outputs, by rank;
- ``trace.notes["merged_ranks"]``: world size, ranks, and each join.

Replay re-runs every rank's ops; each collective node writes the values its
rank recorded as received (the check that those agree with what the ranks
sent is :func:`merge_report`'s, which ``merge_ranks`` runs first).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import attrs

from torchlens_core.ir import tree
from torchlens_core.ir.records import ModulePass, ModuleRecord, OpRecord, ParamRef, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.ranks.findings import RankMergeError
from torchlens_core.ranks.notes import COLLECTIVE, SENT, RankTrace
from torchlens_core.ranks.order import joins
from torchlens_core.ranks.report import diagnose

MERGED = "merged_ranks"  # trace.notes key of a merged trace


def merge_ranks(traces: Sequence[Any]) -> Trace:
    """Merge rank traces (one per rank, any order) into one Trace; raises RankMergeError if they cannot be."""
    found = diagnose(traces)
    if not found.report.mergeable:
        raise RankMergeError(f"these rank traces cannot be merged into one faithful graph:\n{found.report}")
    return _Merger(found.ranks).build(found.order)


def prefix(rank: int) -> str:
    """The module (and parameter prefix) of rank ``rank`` in a merged trace; op labels start ``rank{r}/``."""
    return f"rank{rank}"


class _Merger:
    def __init__(self, ranks: dict[int, RankTrace]) -> None:
        self.ranks = ranks
        self.new_index: dict[int, dict[int, int]] = {r: {} for r in ranks}  # rank -> old op index -> merged

    def build(self, order: list[tuple[int, int]]) -> Trace:
        for position, (rank, index) in enumerate(order):
            self.new_index[rank][index] = position
        join_of = self._joins()
        ops = [
            self._op(rank, self.ranks[rank].trace.ops[index], position, join_of.get((rank, index)))
            for position, (rank, index) in enumerate(order)
        ]
        modules, params = {}, {}
        for rank in sorted(self.ranks):
            trace = self.ranks[rank].trace
            params.update(
                {
                    f"{prefix(rank)}.{name}": attrs.evolve(
                        p, name=f"{prefix(rank)}.{name}", module=_under(rank, p.module)
                    )
                    for name, p in trace.params.items()
                }
            )
            modules.update(self._modules(rank, ops))
        outputs = [self._remap(rank, self.ranks[rank].trace.output_template) for rank in sorted(self.ranks)]
        merged = Trace(
            backend=self._any().backend,
            model_name=self._name(),
            ops=ops,
            modules=modules,
            params=params,
            output_template=outputs,
            model_output=[self.ranks[r].trace.model_output for r in sorted(self.ranks)],
            notes=self._notes(join_of, ops),
        )
        self._link(merged)
        return merged

    def _any(self) -> Trace:
        return self.ranks[min(self.ranks)].trace

    def _name(self) -> str:
        names = sorted({r.trace.model_name for r in self.ranks.values()})
        return f"{' / '.join(names)} on {len(self.ranks)} ranks"

    def _joins(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """(rank, boundary op index) -> the (rank, index) of every node of its collective, in group order."""
        found = {}
        for calls in joins(self.ranks).values():
            nodes = [
                (rank, call.index)
                for rank, call in sorted(calls.items(), key=lambda rc: rc[1].group.index(rc[0]))
                if call.index is not None
            ]
            for node in nodes:
                found[node] = nodes
        return found

    def _remap(self, rank: int, template: Any) -> Any:
        index = self.new_index[rank]

        def leaf(x: Any) -> Any:
            if isinstance(x, Ref):
                return Ref(index[x.index], x.path)
            if isinstance(x, ParamRef):
                return ParamRef(f"{prefix(rank)}.{x.name}")
            return x

        return tree.map_leaves(leaf, template)

    def _op(self, rank: int, op: OpRecord, position: int, join: list[tuple[int, int]] | None) -> OpRecord:
        args, meta = self._remap(rank, op.args), dict(op.meta)
        if join is not None:  # a collective: what every rank of its group sent, one list per group rank
            mine = next(c for c in self.ranks[rank].calls if c.index == op.index)
            sent = [self._remap(m, self._sent(m, mine)) for m in mine.group]
            args = tuple(sent if i == SENT else a for i, a in enumerate(args))
            meta = {
                **meta,
                COLLECTIVE: {
                    **meta[COLLECTIVE],
                    "join": [_label(r, self.ranks[r].trace.ops[i].label) for r, i in join],
                },
            }
        parents = tuple(dict.fromkeys(r.index for _, r in tree.leaves((args, op.kwargs), lambda x: isinstance(x, Ref))))
        inside = ((prefix(rank), 1),) if op.kind == "op" else ()
        return attrs.evolve(
            op,
            index=position,
            args=args,
            kwargs=self._remap(rank, op.kwargs),
            meta=meta,
            parent_indices=parents,
            condition_indices=tuple(self.new_index[rank][i] for i in op.condition_indices),
            module_passes=inside + tuple((_under(rank, path), n) for path, n in op.module_passes),
            params=tuple(f"{prefix(rank)}.{name}" for name in op.params),
            label=_label(rank, op.label),
            layer_label=_label(rank, op.layer_label),
            parents=[],
            children=[],
            conditions=[],
            module_outputs=[_under(rank, m) for m in op.module_outputs],
            trace_ref=None,
        )

    def _sent(self, rank: int, call: Any) -> Any:
        """What ``rank`` sent in the collective ``call`` (of another rank), from its notes."""
        return next(c.sent for c in self.ranks[rank].calls if c.key == call.key)

    def _modules(self, rank: int, ops: list[OpRecord]) -> dict[str, ModuleRecord]:
        trace = self.ranks[rank].trace
        out = tree.map_leaves(
            lambda x: trace.ops[x.index].args[0] if isinstance(x, Ref) else x, trace.output_template
        )  # what the rank's forward returned: the output nodes' values
        whole = ModuleRecord(
            path=prefix(rank),
            type_name=trace.model_name or "function",
            params=[f"{prefix(rank)}.{n}" for n in trace.params],
            passes=[ModulePass(path=prefix(rank), pass_num=1, out_template=self._remap(rank, out))],
        )
        found = {whole.path: whole}
        for path, module in trace.modules.items():
            new = _under(rank, path)
            found[new] = ModuleRecord(
                path=new,
                type_name=module.type_name,
                params=[f"{prefix(rank)}.{n}" for n in module.params],
                passes=[
                    ModulePass(path=new, pass_num=mp.pass_num, out_template=self._remap(rank, mp.out_template))
                    for mp in module.passes
                ],
            )
        for ref in tree.leaves(whole.passes[0].out_template, lambda x: isinstance(x, Ref)):
            ops[ref[1].index].module_outputs.append(f"{prefix(rank)}:1")
        return found

    def _notes(self, join_of: dict[tuple[int, int], list[tuple[int, int]]], ops: list[OpRecord]) -> dict[str, Any]:
        seen, listed = set(), []
        for nodes in join_of.values():
            if id(nodes) in seen:
                continue
            seen.add(id(nodes))
            first = self.ranks[nodes[0][0]].trace.ops[nodes[0][1]]
            listed.append(
                {
                    "collective": first.func_name,
                    "group": list(first.meta[COLLECTIVE].get("group", [])),
                    "nodes": [_label(r, self.ranks[r].trace.ops[i].label) for r, i in nodes],
                }
            )
        notes: dict[str, Any] = {
            MERGED: {"world_size": self._any_rank().world_size, "ranks": sorted(self.ranks), "joins": listed}
        }
        not_replayable = {
            _label(r, label): why
            for r in sorted(self.ranks)
            for label, why in self.ranks[r].trace.notes.get("not_replayable", {}).items()
        }
        if not_replayable:
            notes["not_replayable"] = not_replayable
        if any(r.trace.notes.get("loaded_from_file") for r in self.ranks.values()):
            notes["loaded_from_file"] = True  # replay checks each value against its record
        return notes

    def _any_rank(self) -> RankTrace:
        return self.ranks[min(self.ranks)]

    @staticmethod
    def _link(merged: Trace) -> None:
        """Labels of parents, children and conditions; each module pass's ops; the records' trace."""
        ops = merged.ops
        ref = weakref.ref(merged)
        for op in ops:
            op.parents = [ops[i].label for i in op.parent_indices]
            op.conditions = [ops[i].label for i in op.condition_indices]
            op.trace_ref = ref
        for op in ops:
            for i in op.parent_indices:
                ops[i].children.append(op.label)
            for path, n in op.module_passes:
                merged.modules[path].passes[n - 1].ops.append(op.label)
        for module in merged.modules.values():
            for mp in module.passes:
                mp.trace_ref = ref


def _label(rank: int, label: str) -> str:
    return f"{prefix(rank)}/{label}"


def _under(rank: int, path: str) -> str:
    """A module path (or a parameter's module) of rank ``rank``, in the merged trace."""
    return f"{prefix(rank)}.{path}" if path else prefix(rank)
