"""What ``tl.merge_report`` finds about a set of rank traces, and the error ``tl.merge_ranks`` raises."""

from __future__ import annotations

import attrs

from torchlens_core.ir.errors import TorchLensError

# Finding kinds. Each blocks merging except "graph" (ranks may run different ops between collectives:
# each rank's ops are kept as they ran, only the collectives join them).
KINDS = (
    "input",  # not a list of traces
    "not_a_rank_trace",  # captured without tl.distributed.arm() in an initialized process group, or notes unreadable
    "backend",  # traces of different backends
    "halted",  # halt= stopped the forward: its later collectives are missing
    "ranks",  # a rank twice, a rank missing, world sizes that disagree
    "dtensor",
    "fsdp",
    "tensor_parallel",
    "point_to_point",  # a shard of a larger graph, or a pipeline
    "collective",  # the ranks' collectives do not pair up (count, name, reduce op, root, shapes)
    "order",  # no order of the ranks' ops meets every collective (ranks entered them in other orders)
    "values",  # what a rank received is not what its group sent: the traces are not of one step
    "graph",  # the ranks ran different ops (informational)
)
NOT_BLOCKING = frozenset({"graph"})


class RankMergeError(TorchLensError, ValueError):
    """``tl.merge_ranks``: these rank traces do not make one faithful graph; the message lists why."""


@attrs.frozen(slots=True)
class RankFinding:
    """One thing ``merge_report`` found: its ``kind`` (:data:`KINDS`), the rank and op it is about."""

    kind: str
    message: str
    rank: int | None = None
    op: str | None = None

    @property
    def blocking(self) -> bool:
        """Does it stop ``merge_ranks``? (All kinds but ``graph`` do.)"""
        return self.kind not in NOT_BLOCKING

    def __str__(self) -> str:
        where = "".join(
            f" [{part}]" for part in (f"rank {self.rank}" if self.rank is not None else None, self.op) if part
        )
        return f"{'REFUSE' if self.blocking else 'note  '} {self.kind}{where}: {self.message}"


@attrs.define(slots=True)
class MergeReport:
    """``tl.merge_report(traces)``: falsy when anything was found; :attr:`mergeable` when nothing blocks.

    ``joins`` counts the collective calls that merging joins (one per call,
    however many ranks took part); ``unchecked`` names the joins whose values
    could not be compared, because ``save=`` left out what was sent.
    """

    findings: list[RankFinding]
    ranks: list[int | None]
    world_size: int | None = None
    joins: int = 0
    unchecked: list[str] = attrs.Factory(list)

    def __bool__(self) -> bool:
        return not self.findings

    @property
    def mergeable(self) -> bool:
        return not self.blocking

    @property
    def blocking(self) -> list[RankFinding]:
        return [f for f in self.findings if f.blocking]

    def of_kind(self, kind: str) -> list[RankFinding]:
        return [f for f in self.findings if f.kind == kind]

    def __str__(self) -> str:
        verdict = "clean" if self else "mergeable, with notes" if self.mergeable else "NOT mergeable"
        lines = [
            f"Merge report: {len(self.ranks)} rank traces (ranks {self.ranks}, world size {self.world_size}), "
            f"{self.joins} collective calls to join: {verdict}"
        ]
        lines += [f"  {f}" for f in self.findings]
        if self.unchecked:
            lines.append(
                f"  values not compared (not saved) at {len(self.unchecked)} joins: "
                f"{', '.join(self.unchecked[:5])}{' ...' if len(self.unchecked) > 5 else ''}"
            )
        return "\n".join(lines)

    __repr__ = __str__
