"""Which calls of the ranks are one collective, and one order of every rank's ops that meets them all.

A collective is one call on every rank of its group: the ``seq``-th call on
that group (:attr:`Call.key`). A merged trace lists ops in an order where every
value comes before what reads it; a collective's boundary node on each rank
reads what every rank sent, so each rank's ops run up to the collective, then
the collective's nodes follow on every rank of the group, and so on, as the
job itself ran.
"""

from __future__ import annotations

from torchlens_core.ranks.notes import Call, RankTrace

Key = tuple[tuple[int, ...], int]


def joins(ranks: dict[int, RankTrace]) -> dict[Key, dict[int, Call]]:
    """Every collective of the job, in the order first seen: its call on each rank of its group that has one."""
    found: dict[Key, dict[int, Call]] = {}
    for rank in sorted(ranks):
        for call in ranks[rank].calls:
            found.setdefault(call.key, {})[rank] = call
    return found


def schedule(ranks: dict[int, RankTrace]) -> tuple[list[tuple[int, int]], str | None]:
    """``(rank, op index)`` in a merged order: every rank's inputs, its ops meeting at collectives, its outputs.

    The second item says where the ranks could not all go on (None when
    every op is placed): a collective one rank reached that another never
    reaches next, because the ranks called their collectives in other orders.
    """
    order = [(rank, op.index) for rank in sorted(ranks) for op in ranks[rank].trace.ops if op.kind == "input"]
    position = dict.fromkeys(ranks, 0)  # the next op of each rank to place
    next_call = dict.fromkeys(ranks, 0)

    def waiting(rank: int) -> Call | None:
        calls = ranks[rank].calls
        return calls[next_call[rank]] if next_call[rank] < len(calls) else None

    def run_to(rank: int, stop: int) -> bool:
        ops = ranks[rank].trace.ops
        moved = position[rank] < stop
        for index in range(position[rank], stop):
            if ops[index].kind == "op":
                order.append((rank, index))
        position[rank] = max(position[rank], stop)
        return moved

    while True:
        moved = False
        for rank in sorted(ranks):
            call = waiting(rank)
            moved |= run_to(rank, call.at if call is not None else len(ranks[rank].trace.ops))
        for rank in sorted(ranks):
            call = waiting(rank)
            if call is None:
                continue
            members = {m: waiting(m) if m in ranks else None for m in call.group}
            ready = {m: c for m, c in members.items() if c is not None and c.key == call.key and position[m] == c.at}
            if len(ready) == len(members):
                for m, c in ready.items():  # in group order
                    if c.index is not None:
                        order.append((m, c.index))
                        position[m] = c.index + 1
                    next_call[m] += 1
                moved = True
        if not moved:
            break
    stuck = [(rank, call) for rank in sorted(ranks) if (call := waiting(rank)) is not None]
    if stuck:
        shown = "; ".join(f"rank {rank} waits in {call.describe()}" for rank, call in stuck[:4])
        return order, f"the ranks' collectives cannot all meet: {shown}"
    order += [(rank, op.index) for rank in sorted(ranks) for op in ranks[rank].trace.ops if op.kind == "output"]
    return order, None
