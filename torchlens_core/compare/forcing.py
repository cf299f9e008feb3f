"""Teacher forcing: ``b``'s aligned groups run again on ``a``'s values, to tell own errors from inherited ones.

A port that diverges at one op diverges at every op after it; the pairs
after it *inherit* the error. To say which op *introduced* it, each pair's
group of ``b`` ops is run again (with ``b``'s framework, through the
backend's ``torchlens_replay_op``) on the values ``a`` computed for the
group's inputs — put in ``b``'s layout, dtype and device — instead of ``b``'s
own. The forced output against ``a``'s is the group's own error
(``pair.local``); the error of its inputs is what it inherited
(``pair.inherited``, the largest relative error among the pairs feeding it);
``pair.amplification`` is how much the group grew that error.

Group inputs that are not the output of an aligned pair (an op inside an
earlier group) keep ``b``'s recorded value; ``pair.forced`` says whether every
input of the group was forced.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torchlens_core.backend.manager import backend_named
from torchlens_core.compare.metrics import agreement, as_numpy, tolerance_for
from torchlens_core.compare.points import array_value
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ReplayError, UnsupportedError
from torchlens_core.ir.records import ParamRef, Ref
from torchlens_core.ir.trace import Trace

if TYPE_CHECKING:
    from torchlens_core.compare.report import AlignedPair


def force(
    a: Trace,
    b: Trace,
    pairs: list[AlignedPair],
    a_anchor: list[int],
    b_anchor: list[int],
    b_groups: list[list[int]],
    upstream: list[list[int]],
    rtol: float | None,
    atol: float | None,
) -> None:
    """Fill ``local``, ``inherited``, ``amplification``, ``forced`` and ``origin`` of each pair with values.

    A group that cannot run on ``a``'s values (its inputs arrive in a shape its
    ops do not take, an op refuses them) keeps ``local`` None and says why in
    its note. ``origin`` is set only where the pair's alignment rests on
    values: its own (basis ``values`` or ``inputs``: every input agreed), or
    the forced run's (``a``'s values through ``b``'s group agree with ``a``).
    """
    h = backend_named(b.backend, missing_ok=True)
    _check_replayable(b)
    pair_of_b = {(index, pair.b_path): n for n, (index, pair) in enumerate(zip(b_anchor, pairs))}
    a_values: dict[int, Any] = {}  # pair -> a's value in b's layout (NumPy), for the pairs compared
    for n, pair in enumerate(pairs):
        if pair.agreement is None:
            continue
        value = array_value(a, a.ops[a_anchor[n]])
        try:
            a_values[n] = pair.layout.apply(value)
        except ValueError:  # a broadcast whose larger side is a's: a's value does not fit b's shape
            continue
    for n, pair in enumerate(pairs):
        if n not in a_values:
            continue
        try:
            values, forced = _run_group(h, b, sorted(b_groups[n]), pair_of_b, a_values)
            out = as_numpy(tree.get(values[b_anchor[n]], pair.b_path), b.backend)
        except (ReplayError, UnsupportedError) as exc:
            pair.note = f"{pair.note}; could not force: {exc}" if pair.note else f"could not force: {exc}"
            continue
        if out.shape != a_values[n].shape:
            note = f"could not force: b's group made {tuple(out.shape)} from a's values, not {a_values[n].shape}"
            pair.note = f"{pair.note}; {note}" if pair.note else note
            continue
        assert pair.agreement is not None
        agreed = pair.agreement  # a pair with values to force was compared
        tolerance = (
            agreed.tolerance
            if rtol is None and atol is None
            else tolerance_for(a.ops[a_anchor[n]].dtype, b.ops[b_anchor[n]].dtype, rtol=rtol, atol=atol)
        )
        pair.local = agreement(a_values[n], out, tolerance)
        pair.forced = forced
        inherited = [g.relative for u in upstream[n] if (g := pairs[u].agreement) is not None]
        pair.inherited = max(inherited, default=0.0)
        total = agreed.relative
        pair.amplification = total / pair.inherited if pair.inherited > 0 else (math.inf if total > 0 else 1.0)
        if pair.diverges and (pair.basis != "structure" or pair.local.ok):
            pair.origin = "introduced" if not pair.local.ok else "inherited"


def _run_group(
    h: Any, b: Trace, group: list[int], pair_of_b: dict[tuple[int, Any], int], a_values: dict[int, Any]
) -> tuple[dict[int, Any], bool]:
    """Run ``b``'s ops of one group, reading ``a``'s value wherever an input is an aligned pair's output."""
    values: dict[int, Any] = {}
    forced = True

    def resolve(leaf: Any) -> Any:
        nonlocal forced
        if isinstance(leaf, ParamRef):
            return b.params[leaf.name].value
        if not isinstance(leaf, Ref):
            return leaf
        if leaf.index in values:
            return tree.get(values[leaf.index], leaf.path)
        source = pair_of_b.get((leaf.index, tuple(leaf.path)))
        op = b.ops[leaf.index]
        if source is not None and source in a_values:
            dtype = op.dtype if not leaf.path else _leaf_dtype(h, b, tree.get(op.out, leaf.path))
            return _to_backend(h, b.backend, _cast(a_values[source], dtype), dtype, op.device)
        forced = False
        return tree.get(_copy(h, b, op.out), leaf.path)  # a copy: an in-place op must not write the trace

    for k in group:
        op = b.ops[k]
        if op.kind == "input":
            values[k] = _copy(h, b, op.out)
            continue
        args = tree.map_leaves(resolve, op.args)
        if op.kind == "output" or op.meta.get("identity"):
            values[k] = args[0]
            continue
        kwargs = tree.map_leaves(resolve, op.kwargs)
        try:
            values[k] = h.replay_op(op, args, kwargs)
        except Exception as exc:
            raise ReplayError(
                f"teacher forcing: running {op.label} ({op.func_name}) of b on a's values failed: {exc}"
            ) from exc
        for edit in op.edits:
            values[k] = edit.apply(values[k])
    return values, forced


def _leaf_dtype(h: Any, trace: Trace, value: Any) -> Any:
    info = h.array_info(value)
    return None if info is None else info[1]


def _check_replayable(b: Trace) -> None:
    from torchlens_core.backend.manager import backend_infos

    info = next((i for i in backend_infos() if i.name == b.backend), None)
    if info is None or not info.available:
        raise UnsupportedError(
            f"teacher_forcing=True runs b's ops again with {b.backend}, which is not installed "
            f"here: compare where {b.backend} is installed, or swap a and b"
        )
    missing = b.notes.get("not_replayable")
    if missing:
        raise UnsupportedError(
            f"teacher_forcing=True runs b's ops again, and {len(missing)} of them could not be "
            f"rebuilt when b was loaded (first: {next(iter(missing))})"
        )


def _copy(h: Any, trace: Trace, value: Any) -> Any:
    info = h.array_info(value)
    if info is None:
        return value
    _, dtype, device = info
    import numpy as np

    return _to_backend(h, trace.backend, np.array(h.to_numpy(value)), dtype, device)


def _to_backend(h: Any, backend: str, array: Any, dtype: Any, device: Any) -> Any:
    """A NumPy array as the backend's array; a backend without ``torchlens_from_numpy`` computes on NumPy."""
    made = h.from_numpy(array, str(dtype), str(device))
    return array if made is None else made


def _cast(array: Any, dtype: Any) -> Any:
    """``array`` as ``torchlens_from_numpy`` takes a value of ``dtype``: bfloat16 as its raw 16 bits."""
    import numpy as np

    from torchlens_core.compare.metrics import dtype_name

    name = dtype_name(dtype)
    if name == "bfloat16":  # round to nearest even, keep the upper half of the float32 bits
        bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.ascontiguousarray(array, dtype=name or "float32")
