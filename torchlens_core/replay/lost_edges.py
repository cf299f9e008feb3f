"""Tripwires for lost edges: arrays a backend failed to link to the op that produced them.

A backend links each array the model computes to its op, so that a later op
reading it records a ``Ref`` (an edge). An array it fails to link (one that
came back through C++ as a new Python object, or the output of a call the
capture never saw) enters the reading op's arguments as a captured constant
instead. Replay on the recorded inputs cannot tell: the frozen constant holds
exactly the value that ran. Two signatures give such an edge away:

- **a constant equal to an earlier op's output** (:func:`constants_equal_to_outputs`,
  run by ``trace.audit()``): a floating-point array constant bitwise equal
  (shape, dtype, bytes) to the value of an op or input recorded before the op
  reading it. That is almost always the very array the backend failed to
  link. Left out, because they match by coincidence too often to mean
  anything: arrays of one element (a 0 or a 1), arrays whose elements are all
  equal (zeros, ones), and integer and boolean arrays (shapes such as
  ``[2, 16]``, index lists); the check below catches those edges. Matches
  with an op computed from constants alone are left out too: that is a second
  constant holding the same values, and replay loses nothing by it.
- **a constant that changes with the inputs** (:func:`constants_that_moved`,
  run by the conformance suite, which traces each model twice): a real
  constant of the model (a table, a mask, a normalisation's mean, the number
  in ``x + 1``) is the same whatever the inputs; an array that is an op's
  output in disguise is not. So every op of a trace on other inputs must
  read the constants it read before. This is also what makes a parentless op
  a declared source: one reading no array (``zeros(3)``), only parameters, or
  random draws, or one whose array constants do not move. An op computing
  from the output of a call the capture did not see (a framework function
  bound before the capture started) has constants that move.

Both name the op that reads the array, and where in its call it sits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.records import ParamRef, Ref

if TYPE_CHECKING:
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace
    from torchlens_core.replay.audit import Finding

CONSTANT_EQUALS_OUTPUT = "constants are not earlier outputs"
CONSTANT_MOVED = "constants do not change with the inputs"
_FLOATING = ("float", "half", "complex")  # in dtype names: float32, bfloat16, half, complex64...


def _is_placeholder(value: Any) -> bool:
    return isinstance(value, (Ref, ParamRef))


def array_constants(trace: Trace, op: OpRecord) -> list[tuple[tuple[Any, ...], Any, tuple[tuple[int, ...], str]]]:
    """The array constants among ``op``'s arguments: ``(path in (args, kwargs), value, (shape, dtype))``."""
    info = backend_named(trace.backend, missing_ok=True).array_info
    found = []
    for path, leaf in tree.leaves((op.args, op.kwargs), lambda v: _is_placeholder(v) or tree.children(v) is None):
        if _is_placeholder(leaf):
            continue
        described = info(leaf)
        if described is not None:
            found.append((path, leaf, (tuple(described[0]), str(described[1]))))
    return found


def where_in_call(path: tuple[Any, ...]) -> str:
    """``(0, 2)`` -> ``args[2]``; ``(1, "bias")`` -> ``kwargs['bias']``: where in the call a constant sits."""
    head = "args" if path[0] == 0 else "kwargs"
    return head + "".join(f"[{k!r}]" for k in path[1:])


def _numpy(trace: Trace, value: Any) -> Any:
    import numpy as np  # not at import: the core loads NumPy only when it reads values

    return np.ascontiguousarray(np.asarray(backend_named(trace.backend, missing_ok=True).to_numpy(value)))


def _digest(array: Any) -> bytes:
    return hashlib.blake2b(array.tobytes(), digest_size=16).digest()


def _telling(trace: Trace, value: Any, key: tuple[tuple[int, ...], str]) -> Any:
    """The constant as NumPy if its equality to an output would mean something, else None (see the module doc)."""
    shape, dtype = key
    if not any(kind in dtype for kind in _FLOATING):
        return None
    n = 1
    for size in shape:
        n *= int(size)
    if n < 2:
        return None
    array = _numpy(trace, value)
    flat = array.reshape(-1)
    if (flat == flat[0]).all() or (flat != flat).all():  # uniform (NaN everywhere counts too)
        return None
    return array


def constants_equal_to_outputs(trace: Trace) -> Iterator[Finding]:
    """Each telling array constant bitwise equal to the value of an earlier op or input."""
    from torchlens_core.replay.audit import Finding

    ops = [op for op in trace.ops if op.kind != "output"]
    readers = []
    for op in ops:
        # A collective's boundary node (tl.distributed) holds what its rank received as a constant on purpose:
        # it equals a local value by design (an all_gather's own slot, a broadcast from this rank).
        if op.kind != "op" or "collective" in op.meta:
            continue
        for path, value, key in array_constants(trace, op):
            array = _telling(trace, value, key)
            if array is not None:
                readers.append((op, path, key, _digest(array)))
    if not readers:
        return
    # Only values that could match are read and hashed: those of a telling constant's shape and dtype.
    wanted = {key for _, _, key, _ in readers}
    info = backend_named(trace.backend, missing_ok=True).array_info
    produced: dict[tuple[Any, ...], list[tuple[int, str]]] = {}
    for op in ops:
        if op.out is None:
            continue
        for path, leaf in tree.leaves(op.out, lambda v: info(v) is not None):
            described = info(leaf)
            assert described is not None  # a leaf info answered for, just above
            key = (tuple(described[0]), str(described[1]))
            if key in wanted:
                at = op.label + "".join(f"[{k!r}]" for k in path)
                produced.setdefault((*key, _digest(_numpy(trace, leaf))), []).append((op.index, at))
    varying = _varying(trace)
    for op, path, key, digest in readers:
        earlier = [at for index, at in produced.get((*key, digest), ()) if index < op.index and index in varying]
        if earlier:
            yield Finding(
                CONSTANT_EQUALS_OUTPUT,
                False,
                f"reads an array constant ({where_in_call(path)}, shape {key[0]}, {key[1]}) bitwise equal "
                f"to the output of {earlier[-1]}, recorded before it: almost always a lost edge (the "
                f"backend did not link the array {earlier[-1]} returned to that op, so replay freezes "
                "it as a constant)",
                op.label,
            )


def _varying(trace: Trace) -> set[int]:
    """Ops whose value depends on an input, a parameter or a random draw.

    The others compute from constants alone (torchvision's anchor generator
    turns its constant cell anchors into per-level tensors): a constant equal
    to one of those is a second constant with the same values, not a lost
    edge, and an edge to it would carry nothing replay could lose."""
    varying: set[int] = set()
    for op in trace.ops:
        if op.kind == "input" or op.params or op.source == "random" or any(i in varying for i in op.parent_indices):
            varying.add(op.index)
    return varying


def constants_that_moved(trace: Trace, other: Trace, again: Trace | None = None) -> Iterator[Finding]:
    """Array constants of ``trace`` that ``other`` (the same model traced on other inputs) read with other values.

    Ops are matched by label, so only where both traces ran the same ops
    (a forward that branched otherwise on the other inputs is compared up to
    where it did). ``again``: the model traced a second time on the first
    inputs; a constant that differs there too is not deterministic (an
    unrecorded random draw) and is left out rather than called an edge.
    """
    from torchlens_core.replay.audit import Finding

    theirs = {op.label: op for op in other.ops}
    repeat = {op.label: op for op in again.ops} if again is not None else {}
    for op in trace.ops:
        if op.kind != "op":
            continue
        mine = array_constants(trace, op)
        if not mine:
            continue
        twin = theirs.get(op.label)
        if twin is None or twin.func_name != op.func_name:
            continue
        paired = {path: value for path, value, _ in array_constants(other, twin)}
        for path, value, key in mine:
            if path not in paired:
                continue
            before, after = _numpy(trace, value), _numpy(other, paired[path])
            if before.shape == after.shape and before.dtype == after.dtype and _digest(before) == _digest(after):
                continue
            same_op = repeat.get(op.label)
            if same_op is not None and again is not None:  # `repeat` is empty without `again`
                replayed = {p: v for p, v, _ in array_constants(again, same_op)}.get(path)
                if replayed is None or _digest(_numpy(again, replayed)) != _digest(before):
                    continue  # not even the same inputs give it back: not a function of them
            yield Finding(
                CONSTANT_MOVED,
                False,
                f"reads an array constant ({where_in_call(path)}, shape {key[0]}, {key[1]}) that has "
                f"other values when the model runs on other inputs: it is computed from them, so it is "
                f"the output of an op the backend did not link or did not see (a lost edge)",
                op.label,
            )
