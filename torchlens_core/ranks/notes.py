"""A rank trace's notes: what a backend records while ``tl.distributed`` is armed, read without the framework.

The contract (the torch backend writes it; a loaded trace holds it as saved):

``trace.notes["distributed"]`` is a dict:

- ``rank``, ``world_size``: this process's global rank and the job's size;
- ``collectives``: every collective call of the forward, in order, each a
  dict with ``name`` (``"all_reduce"``...), ``group`` (the global ranks of
  its group, in group-rank order), ``op`` (a reduction's name or None),
  ``root`` (the global rank of ``src``/``dst``, or None), ``seq`` (its place
  among this rank's calls on that group), ``at`` (how many ops were recorded
  before it), ``index`` (its boundary node's position, or None when it wrote
  nothing on this rank: ``gather`` off the root, ``send``) and ``sent`` (the
  argument template of what this rank sent: Refs, ParamRefs, constants);
- ``refused``: ``{"kind", "what"}`` for each thing that makes the trace a
  shard of a larger graph (``dtensor``, ``fsdp``, ``tensor_parallel``) or a
  pipeline stage (``point_to_point``).

A boundary node is an op whose ``meta["collective"]`` describes its call and
whose arguments are ``(written, sent, received)``: what the collective wrote
into, what this rank sent, and what it received (a recorded constant, which
replay writes into ``written``). Its output is ``written``.
"""

from __future__ import annotations

from typing import Any

import attrs

from torchlens_core.ir.records import refs_in
from torchlens_core.ir.trace import Trace

NOTES = "distributed"
COLLECTIVE = "collective"  # op.meta key of a boundary node
WRITTEN, SENT, RECEIVED = 0, 1, 2  # a boundary node's arguments


@attrs.frozen(slots=True)
class Call:
    """One collective call of one rank."""

    name: str
    group: tuple[int, ...]
    op: str | None
    root: int | None
    seq: int
    at: int
    index: int | None
    sent: Any

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        """Which call of the job this is: the same on every rank of its group."""
        return self.group, self.seq

    def describe(self) -> str:
        extra = "".join(f", {k} {v}" for k, v in (("op", self.op), ("root", self.root)) if v is not None)
        return f"{self.name} #{self.seq} on group {list(self.group)}{extra}"


@attrs.frozen(slots=True)
class RankTrace:
    """A trace with its rank notes read and checked."""

    trace: Trace
    rank: int
    world_size: int
    calls: tuple[Call, ...]
    refused: tuple[tuple[str, str], ...]


def read(trace: Trace) -> RankTrace | str:
    """The trace's rank notes, or why it has none usable."""
    notes = trace.notes.get(NOTES)
    if notes is None:
        return (
            "it holds no rank notes: capture it with tl.distributed.arm() in effect, in an initialized "
            "process group (a merged trace cannot be merged again)"
        )
    try:
        rank, world = notes["rank"], notes["world_size"]
        if not (_is_int(rank) and _is_int(world) and 0 <= rank < world):
            return f"its rank notes give rank {rank!r} of world size {world!r}"
        calls = tuple(_call(c, trace, rank) for c in notes["collectives"])
        refused = tuple((_refusal(r["kind"]), str(r["what"])) for r in notes["refused"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"its rank notes are malformed ({type(exc).__name__}: {exc})"
    return RankTrace(trace, rank, world, calls, refused)


def _call(data: dict[str, Any], trace: Trace, rank: int) -> Call:
    group = tuple(data["group"])
    index, at, seq = data["index"], data["at"], data["seq"]
    if not (
        all(_is_int(r) for r in group) and rank in group and _is_int(at) and _is_int(seq) and 0 <= at <= len(trace.ops)
    ):
        raise ValueError(f"collective {data.get('name')!r}: group {list(group)}, at {at!r}, seq {seq!r}")
    if index is not None:
        op = trace.ops[index] if _is_int(index) and 0 <= index < len(trace.ops) else None
        if (
            op is None
            or index != at
            or not isinstance(op.meta.get(COLLECTIVE), dict)
            or len(op.args) != 3
            or op.func_name != data["name"]
        ):
            raise ValueError(f"collective {data.get('name')!r} names op #{index}, which is not its boundary node")
    sent = data["sent"]
    if not isinstance(sent, (list, tuple)) or any(not 0 <= r.index < len(trace.ops) for r in refs_in(sent)):
        raise ValueError(f"collective {data.get('name')!r}: what it sent is not a list of this trace's values")
    root = data.get("root")
    return Call(
        name=str(data["name"]),
        group=group,
        op=data.get("op"),
        root=root if _is_int(root) else None,
        seq=seq,
        at=at,
        index=index,
        sent=list(sent),
    )


def _is_int(value: Any) -> bool:
    return type(value) is int


REFUSALS = ("dtensor", "fsdp", "tensor_parallel", "point_to_point")


def _refusal(kind: Any) -> str:
    if kind not in REFUSALS:
        raise ValueError(f"unknown refusal {kind!r}")
    return str(kind)
