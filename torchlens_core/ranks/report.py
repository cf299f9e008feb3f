"""``tl.merge_report(traces)``: can these rank traces be merged into one graph, and do they agree?

Checked in order, each on what the earlier checks let through: every item is
a rank trace (captured with ``tl.distributed.arm()``), of one backend, not
halted; the ranks are each of the job's ranks once; nothing is a shard of a
larger graph or a pipeline stage; the collectives pair up across each group
(count, name, reduction, root, shapes) and meet in one order; what each rank
received agrees with what its group sent. Besides, ranks that ran different
ops are noted (merging keeps each rank's ops as they ran).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from torchlens_core.ir.errors import ArgumentTypeError
from torchlens_core.ir.records import ParamRef, Ref, shape_at
from torchlens_core.ir.trace import Trace
from torchlens_core.ranks.findings import MergeReport, RankFinding
from torchlens_core.ranks.notes import RankTrace, read
from torchlens_core.ranks.order import joins, schedule
from torchlens_core.ranks.values import check

# Collectives whose every rank sends and writes arrays of one shape.
_SAME_SHAPES = frozenset(
    {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather_into_tensor",
        "all_gather_single",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        "all_to_all_single",
    }
)


@attrs.define(slots=True)
class Diagnosis:
    """What merge_ranks needs from the checks: the report, the ranks by number, and the merged op order."""

    report: MergeReport
    ranks: dict[int, RankTrace] = attrs.Factory(dict)
    order: list[tuple[int, int]] = attrs.Factory(list)


def merge_report(traces: Sequence[Any]) -> MergeReport:
    """Diagnose a set of rank traces (one per rank, any order): see :class:`MergeReport`."""
    return diagnose(traces).report


def diagnose(traces: Sequence[Any]) -> Diagnosis:
    items = _traces(traces)
    findings: list[RankFinding] = []
    read_ranks: list[RankTrace] = []
    for position, trace in enumerate(items):
        found = read(trace)
        if isinstance(found, str):
            findings.append(RankFinding("not_a_rank_trace", f"trace #{position} ({trace.model_name}): {found}"))
        else:
            read_ranks.append(found)
    report = MergeReport(findings, [r.rank for r in read_ranks], read_ranks[0].world_size if read_ranks else None)
    if findings or not read_ranks:
        return Diagnosis(report)
    findings += _whole(read_ranks)
    for r in read_ranks:
        findings += [RankFinding(kind, f"{what}: {_WHY[kind]}", r.rank) for kind, what in r.refused]
    if findings:
        return Diagnosis(report)
    ranks = {r.rank: r for r in read_ranks}
    findings += _graphs(ranks)
    joined = joins(ranks)
    report.joins = len(joined)
    findings += [f for calls in joined.values() for f in _paired(ranks, calls)]
    if any(f.blocking for f in findings):
        return Diagnosis(report, ranks)
    order, stuck = schedule(ranks)
    if stuck is not None:
        findings.append(RankFinding("order", stuck))
        return Diagnosis(report, ranks)
    for calls in joined.values():
        message, rank, label, compared = check(ranks, calls)
        if message is not None:
            findings.append(RankFinding("values", message, rank, label))
        elif not compared:
            report.unchecked.append(next(iter(calls.values())).describe())
    return Diagnosis(report, ranks, order)


_WHY = {
    "dtensor": "its values are shards of DTensors whose other shards live on other ranks; merging rank traces "
    "joins only explicit collectives, not DTensor redistribution",
    "fsdp": "FSDP gathers and frees parameters around each module, outside the recorded graph; trace the "
    "unwrapped model on one rank instead",
    "tensor_parallel": "its parameters are DTensor shards (tensor parallel); merging rank traces joins only "
    "explicit collectives",
    "point_to_point": "point-to-point transfers make a pipeline, whose stages are not replicas to join at "
    "collectives; merging does not join them",
}


def _traces(traces: Sequence[Any]) -> list[Trace]:
    if isinstance(traces, (Trace, str, bytes)) or not isinstance(traces, Sequence) or not traces:
        raise ArgumentTypeError(
            f"tl.merge_report / tl.merge_ranks take a non-empty list of rank traces (one per "
            f"rank), not {type(traces).__name__}"
        )
    found = []
    for position, item in enumerate(traces):
        if hasattr(item, "to_trace"):  # a tl.record Recording
            item = item.to_trace()
        if not isinstance(item, Trace):
            raise ArgumentTypeError(
                f"item #{position} is a {type(item).__name__}, not a Trace: pass the traces of tl.trace or tl.load"
            )
        found.append(item)
    return found


def _whole(ranks: list[RankTrace]) -> list[RankFinding]:
    """One backend, not halted, every rank of one world once."""
    found = []
    backends = sorted({r.trace.backend for r in ranks})
    if len(backends) > 1:
        found.append(RankFinding("backend", f"traces of several backends ({', '.join(backends)})"))
    for r in ranks:
        if r.trace.halted:
            found.append(
                RankFinding(
                    "halted",
                    "halt= stopped this rank's forward: its later collectives are "
                    "missing; trace without halt= to merge",
                    r.rank,
                )
            )
    worlds = sorted({r.world_size for r in ranks})
    if len(worlds) > 1:
        found.append(RankFinding("ranks", f"the traces come from jobs of world sizes {worlds}"))
        return found
    seen: dict[int, int] = {}
    for r in ranks:
        seen[r.rank] = seen.get(r.rank, 0) + 1
    twice = sorted(rank for rank, n in seen.items() if n > 1)
    missing = sorted(set(range(worlds[0])) - set(seen))
    if twice:
        found.append(RankFinding("ranks", f"rank(s) {twice} given more than once: pass one trace per rank"))
    if missing:
        found.append(
            RankFinding(
                "ranks",
                f"rank(s) {missing} of the world of {worlds[0]} are missing: their "
                f"collectives could not be joined; pass every rank's trace",
            )
        )
    return found


def _graphs(ranks: dict[int, RankTrace]) -> list[RankFinding]:
    """Ranks whose ops differ from the lowest rank's (not blocking: each rank keeps its own ops)."""
    base_rank = min(ranks)
    base = ranks[base_rank].trace.ops
    found = []
    for rank in sorted(ranks)[1:]:
        ops = ranks[rank].trace.ops
        for mine, theirs in zip(ops, base):
            if _signature(mine) != _signature(theirs):
                found.append(
                    RankFinding(
                        "graph",
                        f"ran {_shown(mine)} at op #{mine.index}, where rank {base_rank} ran {_shown(theirs)}",
                        rank,
                        mine.label,
                    )
                )
                break
        else:
            if len(ops) != len(base):
                found.append(RankFinding("graph", f"ran {len(ops)} ops and nodes, rank {base_rank} {len(base)}", rank))
    return found


def _signature(op: Any) -> tuple[Any, ...]:
    return op.kind, op.label, op.func_name, _plain(op.shape), op.dtype


def _plain(shape: Any) -> Any:
    return tuple(_plain(s) for s in shape) if isinstance(shape, (list, tuple)) else shape


def _shown(op: Any) -> str:
    return f"{op.label} ({op.func_name}, shape {_plain(op.shape)})"


def _paired(ranks: dict[int, RankTrace], calls: dict[int, Any]) -> list[RankFinding]:
    """One collective: called by every rank of its group, alike."""
    first_rank = min(calls)
    first = calls[first_rank]
    missing = [m for m in first.group if m not in calls]
    if missing:
        return [
            RankFinding(
                "collective",
                f"rank {first_rank} called {first.describe()}; rank(s) {missing} of "
                f"the group have no such call (fewer collectives on that group)",
                missing[0],
            )
        ]
    found = []
    for rank, call in calls.items():
        if (call.name, call.op, call.root) != (first.name, first.op, first.root):
            found.append(
                RankFinding(
                    "collective",
                    f"called {call.describe()} where rank {first_rank} called {first.describe()}",
                    rank,
                    _label(ranks[rank], call),
                )
            )
    if found or first.name not in _SAME_SHAPES:
        return found
    shapes = {rank: _sent_shapes(ranks[rank], call) for rank, call in calls.items()}
    for rank, shape in shapes.items():
        if shape != shapes[first_rank]:
            found.append(
                RankFinding(
                    "collective",
                    f"sent shapes {shape} by {first.describe()}, rank {first_rank} {shapes[first_rank]}",
                    rank,
                    _label(ranks[rank], calls[rank]),
                )
            )
    return found


def _sent_shapes(rank: RankTrace, call: Any) -> list[Any]:
    shapes = []
    for leaf in call.sent:
        if isinstance(leaf, Ref):
            shapes.append(_plain(shape_at(rank.trace.ops[leaf.index].shape, leaf.path)))
        elif isinstance(leaf, ParamRef) and leaf.name in rank.trace.params:
            shapes.append(_plain(rank.trace.params[leaf.name].shape))
        else:
            shapes.append(_plain(getattr(leaf, "shape", None)))
    return shapes


def _label(rank: RankTrace, call: Any) -> str | None:
    return rank.trace.ops[call.index].label if call.index is not None else None
