"""Do the ranks' recorded values agree at a collective? What each received, against what its group sent.

Traces of one step of one job agree: an ``all_reduce`` received on every
rank the reduction of what the ranks sent, an ``all_gather`` every rank's
value in group order, a ``broadcast`` the root's. Traces of different steps,
runs or jobs put side by side do not, and merging them would draw edges that
never carried those values. The check is NumPy on the recorded values (no
framework needed); reductions of floats are compared within a rounding bound,
since the ranks may have added in another order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ranks.notes import RECEIVED, Call, RankTrace

# unit roundoff of the dtypes a recorded name may have (bfloat16 reads as float32 in NumPy)
_EPS = {
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
    "float32": 2.0**-23,
    "float64": 2.0**-52,
    "complex64": 2.0**-23,
    "complex128": 2.0**-52,
}
_ROOTED_TO_ONE = ("reduce", "gather", "gather_into_tensor", "gather_single")  # only the root receives


def check(ranks: dict[int, RankTrace], calls: dict[int, Call]) -> tuple[str | None, int | None, str | None, bool]:
    """``(message, rank, op label, compared)`` for one collective: message None when the values agree."""
    import numpy as np

    members = [r for r in next(iter(calls.values())).group]
    first = calls[members[0]]
    sent = {m: _values(ranks[m], calls[m].sent) for m in members}
    if any(v is None for vs in sent.values() for v in vs):
        return None, None, None, False
    n = len(members)
    for position, m in enumerate(members):
        call = calls[m]
        if call.index is None or (first.name in _ROOTED_TO_ONE and first.root != m):
            continue
        op = ranks[m].trace.ops[call.index]
        received = _numpy(ranks[m], op.args[RECEIVED])
        try:
            expected, terms = _expected(first, members, position, sent, np)
        except (ValueError, TypeError, IndexError) as exc:  # shapes no single call could have sent
            return (
                f"what the group sent by {first.describe()} cannot make what rank {m} received ({exc})",
                m,
                op.label,
                True,
            )
        if expected is None:
            return None, None, None, False
        eps = _EPS.get(op.dtype or "", 0.0) if first.op in ("SUM", "AVG", "PRODUCT") else 0.0
        worst = _mismatch(received, expected, terms, eps * 4 * n, np)
        if worst is not None:
            return (
                f"rank {m} received values {worst} from what its group sent by {first.describe()}: "
                f"these traces are not of one step of one job",
                m,
                op.label,
                True,
            )
    return None, None, None, True


def _values(rank: RankTrace, template: list[Any]) -> list[Any]:
    values = []
    for leaf in template:
        value = rank.trace.resolve(leaf)
        values.append(None if value is None else _numpy(rank, value))
    return values


def _numpy(rank: RankTrace, value: Any) -> Any:
    import numpy as np

    def convert(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return v
        found = backend_named(rank.trace.backend, missing_ok=True).to_numpy(v)
        return np.asarray(v) if found is None else found

    if isinstance(value, (list, tuple)):
        return [convert(v) for v in value]
    return tree.map_leaves(convert, value)


_REDUCE: dict[str, Callable[[Any, Any], Any]] = {
    "SUM": lambda np, x: np.sum(x, axis=0),
    "AVG": lambda np, x: np.mean(x, axis=0),
    "PRODUCT": lambda np, x: np.prod(x, axis=0),
    "MIN": lambda np, x: np.min(x, axis=0),
    "MAX": lambda np, x: np.max(x, axis=0),
    "BAND": lambda np, x: np.bitwise_and.reduce(x, axis=0),
    "BOR": lambda np, x: np.bitwise_or.reduce(x, axis=0),
    "BXOR": lambda np, x: np.bitwise_xor.reduce(x, axis=0),
}


def _expected(call: Call, members: list[int], me: int, sent: dict[int, list[Any]], np: Any) -> tuple[Any, Any]:
    """What group rank ``me`` should have received, and the terms of a reduction (for the rounding bound)."""
    name, n = call.name, len(members)
    if name not in ("broadcast", "scatter", "reduce_scatter", "all_to_all") and any(not sent[m] for m in members):
        return None, None
    first = [sent[m][0] for m in members if sent[m]]  # each rank's value sent (the one, for these collectives)
    if name in ("all_reduce", "reduce"):
        return _reduced(call, first, np)
    root = call.root
    if name == "broadcast":
        return (sent[root][0], None) if root is not None and sent.get(root) else (None, None)
    if name in ("all_gather", "gather"):
        return first, None
    if name in ("all_gather_into_tensor", "all_gather_single", "gather_into_tensor", "gather_single"):
        return np.concatenate([np.reshape(v, (-1, *np.shape(v)[1:])) for v in first], axis=0), None
    if name == "reduce_scatter":
        if any(len(sent[m]) != n for m in members):
            return None, None
        return _reduced(call, [sent[m][me] for m in members], np)
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        total, terms = _reduced(call, first, np)
        if total is None or np.shape(total)[0] % n:
            return None, None
        size = np.shape(total)[0] // n
        rows = slice(me * size, (me + 1) * size)
        return total[rows], (None if terms is None else terms[:, rows])
    if name == "scatter":
        return (sent[root][me], None) if root is not None and len(sent.get(root, ())) == n else (None, None)
    if name == "all_to_all":
        return ([sent[m][me] for m in members], None) if all(len(sent[m]) == n for m in members) else (None, None)
    return None, None  # all_to_all_single (splits), point-to-point: not compared


def _reduced(call: Call, values: list[Any], np: Any) -> tuple[Any, Any]:
    reduce = _REDUCE.get(call.op or "")
    if reduce is None or len({np.shape(v) for v in values}) != 1:
        return None, None
    stacked = np.stack(values)
    exact = stacked.dtype.kind not in "fc"
    wide = stacked if exact else stacked.astype(np.complex128 if stacked.dtype.kind == "c" else np.float64)
    # sums round by a fraction of the sum of magnitudes; a product relative to itself (terms None: |expected|)
    return reduce(np, wide), (wide if call.op in ("SUM", "AVG") and not exact else None)


def _mismatch(received: Any, expected: Any, terms: Any, bound: float, np: Any) -> str | None:
    """How far ``received`` is from ``expected`` (None: within the bound); lists compare element by element."""
    if isinstance(expected, list):
        if not isinstance(received, list) or len(received) != len(expected):
            return "of another structure"
        for r, e in zip(received, expected):
            found = _mismatch(r, e, None, bound, np)
            if found is not None:
                return found
        return None
    received, expected = np.asarray(received), np.asarray(expected)
    if received.shape != expected.shape:
        return f"of shape {list(received.shape)} where {list(expected.shape)} were sent"
    if received.dtype.kind not in "fc":
        return None if np.array_equal(received, expected) else "differing"
    r, e = received.astype(np.complex128 if received.dtype.kind == "c" else np.float64), expected
    same_nan = np.isnan(r) == np.isnan(e)
    allowed = bound * (np.sum(np.abs(terms), axis=0) if terms is not None else np.abs(e)) + 1e-300
    with np.errstate(invalid="ignore"):
        diff = np.where(r == e, 0.0, np.abs(np.where(np.isnan(r), 0, r) - np.where(np.isnan(e), 0, e)))
    if not same_nan.all() or (diff > allowed).any():
        return f"up to {float(np.max(diff)):.3g} away"
    return None
