"""Replay on new inputs: ``trace.replay(*inputs, **kwargs)``.

The recorded graph is re-run with the new values in its input nodes. That is
faithful only where the graph does not depend on the old values in ways it
cannot recompute: a branch taken, a loop count, a number read out of an
array (``x.max().item()``) are baked into the graph as it was recorded. A
backend with the ``new_inputs`` capability reports every such conversion
(:meth:`TraceBuilder.to_python`), and replay converts the new value the same
way and compares: a mismatch raises :class:`GraphDoesNotHold` naming the op.
Traces from backends that do not report conversions, and traces whose
conversions were too large to keep, are refused when they hold any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from torchlens_core.backend.manager import backend_infos, backend_named
from torchlens_core.capture.conversions import CONVERSIONS
from torchlens_core.capture.rerun import RecordedCall
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ArgumentTypeError, GraphDoesNotHold, UnsupportedError
from torchlens_core.ir.records import OpRecord, ParamRecord, ParamRef, Ref
from torchlens_core.ir.trace import Trace

if TYPE_CHECKING:
    from torchlens_core.replay.evaluator import Observe

_Record = TypeVar("_Record", OpRecord, ParamRecord)

# CONVERSIONS (how a value was turned into a Python one -> the same conversion, on a replayed value) lives in
# the capture layer, whose wrapper arrays report by it; imported here, where replay applies it.


def with_inputs(trace: Trace, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Trace:
    """A copy of ``trace`` (sharing every record but its input nodes) whose inputs are the new values.

    The arguments are matched to the input nodes the way the model was
    called (``trace.call``), or, for a trace that does not know its call
    (loaded, recorded), the arrays among them in order; each must have its
    input node's shape and dtype.
    """
    inputs = [op for op in trace.ops if op.kind == "input"]
    values, params = _matched(trace, inputs, args, kwargs)
    info = backend_named(trace.backend, missing_ok=True).array_info
    for op in inputs:
        found = info(values[op.index])
        want = (tuple(op.shape or ()), op.dtype)
        if found is None or (tuple(found[0]), found[1]) != want:
            got = "not an array" if found is None else f"shape {list(found[0])} {found[1]}"
            raise ArgumentTypeError(
                f"the new value for {op.label} is {got}; the recorded graph takes shape "
                f"{list(want[0])} {want[1]} there (trace the model again for other shapes)"
            )
    check_convertible(trace)
    ops = [_evolve(op, out=values[op.index]) if op.kind == "input" else op for op in trace.ops]
    check = checking_conversions(trace, None)
    for op in inputs:  # replay observes ops, not input nodes: an input converted directly is checked here
        check(op, values[op.index])
    copy = Trace(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=ops,
        modules=dict(trace.modules),
        params={**trace.params, **params},
        output_template=trace.output_template,
        notes=dict(trace.notes),
        halted=trace.halted,
    )
    return copy


def _evolve(record: _Record, **changes: Any) -> _Record:
    import attrs

    return attrs.evolve(record, **changes)


def _matched(
    trace: Trace, inputs: list[OpRecord], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[dict[int, Any], dict[str, ParamRecord]]:
    """The new value of each input node, by op index; and new parameter records for parameters passed as arguments."""
    call = trace.call
    if isinstance(call, RecordedCall):
        template = (call.args, call.kwargs)
        given = (args, kwargs)
        if tree.children(args) is not None and len(args) != len(call.args) or set(kwargs) != set(call.kwargs):
            raise ArgumentTypeError(
                f"replay takes the inputs the model was called with: {len(call.args)} "
                f"positional and {sorted(call.kwargs) or 'no'} keyword arguments, "
                f"not {len(args)} and {sorted(kwargs) or 'none'}"
            )
        values: dict[int, Any] = {}
        for path, leaf in tree.leaves(template, lambda v: tree.children(v) is None):
            try:
                value = tree.get(given, path)
            except (IndexError, KeyError, TypeError, AttributeError):
                raise ArgumentTypeError(
                    f"replay: the new inputs have nothing where the model took {_where(path)}"
                ) from None
            if isinstance(leaf, Ref):
                if leaf.index in values and values[leaf.index] is not value:
                    raise ArgumentTypeError(
                        f"replay: the model was given one array twice "
                        f"({trace.ops[leaf.index].label}); the new inputs give two different "
                        f"ones there: trace the model with them instead"
                    )
                values[leaf.index] = value
            elif not isinstance(leaf, ParamRef) and not _same(value, leaf):
                # Not an array: the recorded graph has it baked in (a flag, a size, a scale).
                raise ArgumentTypeError(
                    f"replay: argument {_where(path)} was {_short(leaf)} when the model was "
                    f"traced and is {_short(value)} now; the recorded graph holds the old one: "
                    f"trace the model with the new one instead"
                )
        missing = [op.label for op in inputs if op.index not in values]
        if missing:
            raise UnsupportedError(f"replay cannot tell which new argument is {', '.join(missing)}")
        return values, _passed_params(trace, template, given)
    is_array = backend_named(trace.backend, missing_ok=True).array_info
    arrays = [v for _, v in tree.leaves((args, kwargs), lambda v: is_array(v) is not None)]
    if len(arrays) != len(inputs):
        raise ArgumentTypeError(
            f"replay on new inputs takes one array per input node ({len(inputs)}: "
            f"{', '.join(op.label for op in inputs)}), in order; got {len(arrays)}"
        )
    return {op.index: value for op, value in zip(inputs, arrays)}, {}


def _where(path: tuple[Any, ...]) -> str:
    """``args[1]`` / ``kwargs['scale']`` for a path into ``(args, kwargs)``."""
    head, *rest = path or (0,)
    return ("args" if head == 0 else "kwargs") + "".join(f"[{k!r}]" for k in rest)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - objects that cannot say are not the same
        return False


def _passed_params(trace: Trace, template: Any, given: Any) -> dict[str, ParamRecord]:
    """Parameters the model took as arguments (``model.apply(variables, x)``): the new ones replay uses."""
    info = backend_named(trace.backend, missing_ok=True).array_info
    new: dict[str, ParamRecord] = {}
    for path, ref in tree.leaves(template, lambda v: isinstance(v, ParamRef)):
        record = trace.params[ref.name]
        value = tree.get(given, path)
        found = info(value)
        if found is None or (tuple(found[0]), found[1]) != (tuple(record.shape), record.dtype):
            got = "not an array" if found is None else f"shape {list(found[0])} {found[1]}"
            raise ArgumentTypeError(
                f"the new value for parameter {ref.name} is {got}, not shape {list(record.shape)} {record.dtype}"
            )
        new[ref.name] = _evolve(record, value=value)
    return new


def check_convertible(trace: Trace) -> None:
    """Refuse a trace whose baked-in Python values replay cannot check."""
    info = next((i for i in backend_infos() if i.name == trace.backend), None)
    if info is not None and "new_inputs" in info.capabilities:
        too_big = [op.label for op in trace.ops for _, _, v in op.meta.get("to_python", ()) if v is None]
        if too_big:
            raise UnsupportedError(
                f"{too_big[0]}'s value was turned into a Python value too large to keep, so "
                f"replay cannot check it on new inputs: trace the model on them instead"
            )
        return
    deciding = sorted({i for op in trace.ops for i in op.condition_indices})
    if deciding:
        raise UnsupportedError(
            f"the {trace.backend} backend does not report every value the forward turned into "
            f"a Python value, and this trace branched on {trace.ops[deciding[0]].label}: replay "
            f"cannot check the graph holds for other values (new inputs, a fork's edits); run "
            f"the model on them instead (tl.trace, fork.rerun)"
        )


def checking_conversions(trace: Trace, observe: Observe | None) -> Observe:
    """An observer that checks each replayed value against the recorded forward, then calls ``observe``.

    Each value is converted the way the forward converted it, and must give
    the same Python value; and it must have its recorded shape: an op whose
    output shape depends on values (``nonzero``, boolean masks) would send
    arrays of other shapes into ops recorded for the old ones.
    """
    converted = {op.index: op.meta["to_python"] for op in trace.ops if op.meta.get("to_python")}
    info = backend_named(trace.backend, missing_ok=True).array_info

    def check(op: OpRecord, value: Any) -> None:
        for path, recorded in _recorded_shapes(op.shape):
            try:
                found = info(tree.get(value, path))
            except (IndexError, KeyError, TypeError, AttributeError):
                found = None
            if found is not None and tuple(found[0]) != recorded:
                at = "".join(f"[{k!r}]" for k in path)
                raise GraphDoesNotHold(
                    f"on these values {op.label}'s output{at} has shape {list(found[0])}, where the recorded "
                    f"forward's had {list(recorded)}: the graph was recorded for the old shapes, so it does not "
                    f"describe this forward; trace the model on these inputs"
                )
        for path, how, recorded in converted.get(op.index, ()):
            leaf = tree.get(value, path)
            now = CONVERSIONS[how](leaf)
            if now != recorded:
                raise GraphDoesNotHold(
                    f"on these inputs {op.label}'s value converts to {_short(now)} by {how}(), where the recorded "
                    f"forward got {_short(recorded)}: the graph took that value as fixed (a branch, a loop count, "
                    f"a number, what a collective sent to other ranks), so it does not describe the forward on "
                    f"these inputs; trace the model on them"
                )
        if observe is not None:
            observe(op, value)

    return check


def _recorded_shapes(shape: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], tuple[int, ...]]]:
    """``(path, shape)`` of every array an op recorded: one for a plain output, one per array of a tuple."""
    if shape is None:
        return []
    if all(isinstance(d, int) for d in shape):
        return [(path, tuple(shape))]
    return [
        found for i, s in enumerate(shape) if isinstance(s, (tuple, list)) for found in _recorded_shapes(s, (*path, i))
    ]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
