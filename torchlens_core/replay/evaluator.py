"""The evaluator: re-execute a recorded trace op by op.

``interpret`` walks the ops in recorded order, resolves each op's argument
template (Refs to earlier values, ParamRefs to parameters, constants as they
were) and hands the call to ``run_op``, which is the backend's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ReplayError, UnsupportedError
from torchlens_core.ir.progress import progress
from torchlens_core.ir.records import OpRecord, ParamRef, Ref

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace

RunOp = Callable[[OpRecord, tuple[Any, ...], dict[str, Any]], Any]
Observe = Callable[[OpRecord, Any], None]

# Set by a caller that reads only what ``observe`` sees and the output nodes' values (audit()): then a replayed
# value whose recorded value lies on disk (save_to=, tl.load(lazy=True)) is let go once no later op reads it, so
# replaying a trace larger than memory holds only the values still to be read.
RELEASE_READ: ContextVar[bool] = ContextVar("RELEASE_READ", default=False)


def interpret(
    trace: Trace, run_op: RunOp, observe: Observe | None = None, copy_input: Callable[[Any], Any] | None = None
) -> list[Any]:
    """Replay every op of ``trace`` with ``run_op``; the values, by op index.

    Inputs take their recorded values (through ``copy_input``, for backends
    whose replay writes in place); output nodes pass their parent's value on.
    ``observe(op, value)`` sees each op's value the moment it is computed,
    before any later in-place op can change it.
    """
    values: list[Any] = [None] * len(trace.ops)
    params = trace.params
    last_read = _last_reads(trace) if RELEASE_READ.get() else None

    def resolve(leaf: Any) -> Any:
        if isinstance(leaf, Ref):
            return tree.get(values[leaf.index], leaf.path)
        if isinstance(leaf, ParamRef):
            return params[leaf.name].value
        return leaf

    with progress("replaying the trace", total=len(trace.ops)) as bar:  # shown only past a few seconds
        for op in bar.each(trace.ops):
            if op.kind == "input":
                values[op.index] = op.out if copy_input is None else copy_input(op.out)
                continue
            args = tree.map_leaves(resolve, op.args)
            if op.kind == "output":
                values[op.index] = args[0]
                continue
            if op.meta.get("identity"):
                value = args[0]
            else:
                kwargs = tree.map_leaves(resolve, op.kwargs)
                try:
                    value = run_op(op, args, kwargs)
                except Exception as exc:
                    raise ReplayError(f"replaying {op.label} ({op.func_name}) failed: {exc}") from exc
            for edit in op.edits:  # what intervene= did to this op's output, done again
                value = edit.apply(value)
            values[op.index] = value
            if observe is not None:
                observe(op, value)
            if last_read is not None:
                for index in last_read.pop(op.index, ()):
                    values[index] = None
    return values


def _last_reads(trace: Trace) -> dict[int, list[int]]:
    """op index -> the ops on disk (``op.stored``) whose value it is the last op to read."""
    last: dict[int, int] = {}
    for op in trace.ops:
        for parent in op.parent_indices:
            last[parent] = op.index
    released: dict[int, list[int]] = {}
    for index, reader in last.items():
        if trace.ops[index].stored is not None and trace.ops[index].kind == "op":
            released.setdefault(reader, []).append(index)
    return released


def replay_values(
    trace: Trace,
    observe: Observe | None = None,
    new_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
    check: bool = False,
) -> list[Any]:
    """Replay through the trace's backend; the value of every op, by index.

    ``new_inputs``: ``(args, kwargs)`` to run the graph on instead of the
    recorded inputs (none given: the recorded ones). ``check``: the values
    may differ from the recorded forward's for another reason (a fork's
    edits), so check them as for new inputs (see :mod:`torchlens_core.replay.inputs`).
    """
    missing = trace.notes.get("not_replayable")  # set by tl.load for ops it could not rebuild
    if missing:
        shown = "; ".join(f"{label}: {why}" for label, why in list(missing.items())[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise UnsupportedError(
            f"this loaded trace cannot be replayed: {len(missing)} ops were not rebuilt ({shown}{more})"
        )
    if new_inputs is not None and (new_inputs[0] or new_inputs[1]):
        from torchlens_core.replay.inputs import with_inputs

        trace, check = with_inputs(trace, *new_inputs), True
    if check:
        from torchlens_core.replay.inputs import check_convertible, checking_conversions

        check_convertible(trace)
        observe = checking_conversions(trace, observe)
    if trace.notes.get("loaded_from_file"):  # set by tl.load: stop at a value that disagrees with its record
        from torchlens_core.replay.checked import agreeing

        observe = agreeing(trace, observe)
    h = backend_named(trace.backend, missing_ok=True)
    values = h.replay_graph(trace, observe)
    if values is None:

        def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return h.replay_op(op, args, kwargs)

        values = interpret(trace, run_op, observe)
    return values
