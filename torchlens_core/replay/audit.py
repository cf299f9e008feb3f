"""audit(): is this trace faithful? Replay parity plus invariant tripwires.

Each check yields Findings; a failing finding names the op at fault. The
report is falsy when any check fails.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.backend.arrays import is_array_of, max_error
from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import SOURCE_KINDS, ParamRef, refs_in
from torchlens_core.replay.lost_edges import constants_equal_to_outputs

if TYPE_CHECKING:
    from torchlens_core.ir.trace import Trace


@attrs.frozen
class Finding:
    check: str
    ok: bool
    detail: str = ""
    op: str | None = None


@attrs.define
class AuditReport:
    findings: list[Finding]

    def __bool__(self) -> bool:
        return all(f.ok for f in self.findings)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    def __str__(self) -> str:
        lines = [f"Audit: {'PASS' if self else 'FAIL'} ({len(self.failures)} of {len(self.findings)} checks failed)"]
        for f in self.findings:
            where = f" [{f.op}]" if f.op else ""
            lines.append(f"  {'ok  ' if f.ok else 'FAIL'} {f.check}{where}: {f.detail}")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        """A notebook shows the checks as a table, failures marked."""
        from torchlens_core.ir.html import table

        head = f"Audit: {'PASS' if self else 'FAIL'} ({len(self.failures)} of {len(self.findings)} checks failed)"
        return table(
            [("ok" if f.ok else "FAIL", f.check, f.op or "", f.detail) for f in self.findings],
            header=("", "check", "op", "detail"),
            caption=head,
            marks=[None if f.ok else "#fdd" for f in self.findings],
        )


def audit(trace: Trace, rtol: float = 1e-5, untraced: bool = False) -> AuditReport:
    """Every check; ``untraced``: also compare with one untraced run of the model (replay/untraced.py)."""
    findings: list[Finding] = []
    missing = _framework_missing(trace)  # a trace loaded where its framework is not installed
    for check in (
        _acyclic_and_ordered,
        _edges_agree,
        _sources_declared,
        _labels_unique,
        _passes_consistent,
        _module_outputs_inside,
        _shapes_match,
        _constants_are_not_earlier_outputs,
        _values_intact,
        _counts_agree,
        _metadata_sane,
    ):
        if check in (_shapes_match, _constants_are_not_earlier_outputs) and missing:  # they read values
            continue
        try:
            failures = list(check(trace))
        except ImportError as exc:  # the backend reads arrays with its framework, which failed to import
            missing = str(exc)
            continue
        name = check.__name__.strip("_").replace("_", " ")
        findings += failures or [Finding(name, True, "ok")]
    if not missing:
        try:
            findings += _replay_parity(trace, rtol)
        except ImportError as exc:
            missing = str(exc)
    if missing:
        error = UnsupportedError(
            f"audit() replays the trace, which needs the {trace.backend} backend's framework here ({missing}): "
            f"install it to audit this trace. The checks that need no framework ran first:\n{AuditReport(findings)}"
        )
        error.report = AuditReport(findings)  # type: ignore[attr-defined]
        raise error
    if untraced:
        from torchlens_core.replay.untraced import untraced_parity

        findings += untraced_parity(trace, rtol)
    return AuditReport(findings)


def _framework_missing(trace: Trace) -> str | None:
    """Why the trace's framework cannot run here (its backend not installed, or tl.load found it missing)."""
    from torchlens_core.backend.manager import backend_infos

    info = next((i for i in backend_infos() if i.name == trace.backend), None)
    if info is None or not info.available:
        return f"the {trace.backend} backend is not installed"
    return None


def _metadata_sane(trace: Trace) -> Iterator[Finding]:
    """Conditions ran before what they decided; costs and times are non-negative; distances ordered."""
    name = "metadata sane"
    distances = trace.distances()
    for op in trace.ops:
        if any(not 0 <= i < op.index for i in op.condition_indices):
            yield Finding(name, False, "a branch condition does not run before the op it decides", op.label)
        if op.conditions != [trace.ops[i].label for i in op.condition_indices]:
            yield Finding(name, False, "condition labels disagree with condition indices", op.label)
        if op.elapsed is not None and not op.elapsed >= 0:
            yield Finding(name, False, f"time elapsed {op.elapsed} is negative", op.label)
        flops, macs = op.flops, op.macs
        if (
            (flops is not None and not flops >= 0)
            or (macs is not None and not macs >= 0)
            or (flops is not None and macs is not None and 2 * macs > flops)
        ):
            yield Finding(name, False, f"FLOPs {flops} / MACs {macs}: negative, or fewer FLOPs than 2 x MACs", op.label)
        d = distances[op.index]
        for lo, hi in ((d.min_from_input, d.max_from_input), (d.min_to_output, d.max_to_output)):
            if (lo is None) != (hi is None) or (lo is not None and hi is not None and not 0 <= lo <= hi):
                yield Finding(name, False, f"distances out of order: {d}", op.label)


def _acyclic_and_ordered(trace: Trace) -> Iterator[Finding]:
    for position, op in enumerate(trace.ops):
        if op.index != position:
            yield Finding("acyclic and ordered", False, f"index {op.index} is not its position {position}", op.label)
        for i in op.parent_indices:
            if not 0 <= i < op.index:
                yield Finding(
                    "acyclic and ordered",
                    False,
                    f"parent #{i} does not run before it (a cycle or a misordered graph)",
                    op.label,
                )


def _edges_agree(trace: Trace) -> Iterator[Finding]:
    """Parents are the ops whose outputs the call reads; children mirror parents."""
    ops, name = trace.ops, "edges agree"
    by_label = {op.label: op for op in ops}
    for op in ops:
        from_args = sorted({r.index for r in refs_in((op.args, op.kwargs))})
        if sorted(set(op.parent_indices)) != from_args:
            yield Finding(name, False, f"parents {list(op.parent_indices)} but arguments read {from_args}", op.label)
        if op.parents != [ops[i].label for i in op.parent_indices if 0 <= i < len(ops)]:
            yield Finding(name, False, f"parent labels {op.parents} disagree with the graph", op.label)
        for child in op.children:
            c = by_label.get(child)
            if c is None or op.label not in c.parents:
                yield Finding(name, False, f"child {child} does not list it as a parent", op.label)
        for parent in op.parents:
            p = by_label.get(parent)
            if p is None or op.label not in p.children:
                yield Finding(name, False, f"parent {parent} does not list it as a child", op.label)


def _sources_declared(trace: Trace) -> Iterator[Finding]:
    """An op without parents must be a declared source, and its call must agree."""
    for op in trace.ops:
        if op.kind == "input" or op.parents:
            continue
        if op.kind == "output":
            yield Finding("sources declared", False, "output node without a parent", op.label)
        elif op.source not in SOURCE_KINDS:
            yield Finding(
                "sources declared",
                False,
                "has no parents and is not a declared source (constant, parameter, random)",
                op.label,
            )
        elif op.source == "parameter" and not any(
            True for _ in tree.leaves((op.args, op.kwargs), lambda x: isinstance(x, ParamRef))
        ):
            yield Finding("sources declared", False, "declared a parameter source but reads no parameter", op.label)


def _constants_are_not_earlier_outputs(trace: Trace) -> Iterator[Finding]:
    """An array constant bitwise equal to an earlier op's output is a lost edge (replay/lost_edges.py)."""
    return constants_equal_to_outputs(trace)


def _labels_unique(trace: Trace) -> Iterator[Finding]:
    seen: set[str] = set()
    for op in trace.ops:
        if not op.label or op.label in seen:
            yield Finding("labels unique", False, f"label {op.label!r} is empty or repeated", op.label)
        seen.add(op.label)


def _passes_consistent(trace: Trace) -> Iterator[Finding]:
    layers: dict[str, list[Any]] = {}
    for op in trace.ops:
        layers.setdefault(op.layer_label, []).append(op)
    for label, ops in layers.items():
        nums = [op.pass_num for op in ops]
        if nums != list(range(1, len(ops) + 1)) or any(op.num_passes != len(ops) for op in ops):
            yield Finding("passes consistent", False, f"layer {label} has passes {nums}", ops[0].label)
        if len({op.func_name for op in ops}) > 1:
            yield Finding("passes consistent", False, f"layer {label} mixes functions", ops[0].label)
    for module in trace.modules.values():
        if [p.pass_num for p in module.passes] != list(range(1, module.num_passes + 1)):
            yield Finding("passes consistent", False, f"module {module.path} passes are misnumbered")


def _module_outputs_inside(trace: Trace) -> Iterator[Finding]:
    for module in trace.modules.values():
        for mp in module.passes:
            for ref in refs_in(mp.out_template):
                op = trace.ops[ref.index]
                if (mp.path, mp.pass_num) not in op.module_passes:
                    yield Finding(
                        "module outputs inside", False, f"output of {mp.label} was computed outside it", op.label
                    )


def _shapes_match(trace: Trace) -> Iterator[Finding]:
    """Recorded shapes are the values' shapes (a structured output: one entry per element, None for non-arrays)."""
    info = backend_named(trace.backend, missing_ok=True).array_info

    def shape(value: Any) -> tuple[int, ...] | None:
        found = info(value)
        return None if found is None else tuple(found[0])

    for op in trace.ops:
        if op.out is None or op.shape is None:
            continue
        kids = tree.children(op.out)
        expected = shape(op.out) if kids is None else tuple(shape(v) for _, v in kids)
        if tuple(op.shape) != expected:
            yield Finding("shapes match", False, f"recorded {op.shape}, value has {expected}", op.label)


def _values_intact(trace: Trace) -> Iterator[Finding]:
    for op in trace.ops:
        if op.meta.get("mutated_after_recording"):
            yield Finding("values intact", False, "saved value was changed in place after it was recorded", op.label)


def _counts_agree(trace: Trace) -> Iterator[Finding]:
    n_parent_edges = sum(len(op.parents) for op in trace.ops)
    n_child_edges = sum(len(op.children) for op in trace.ops)
    if n_parent_edges != n_child_edges:
        yield Finding("counts agree", False, f"{n_parent_edges} parent edges but {n_child_edges} child edges")
    n_outputs = len(refs_in(trace.output_template))
    if n_outputs != len(trace.output_labels):
        yield Finding("counts agree", False, f"{n_outputs} outputs returned, {len(trace.output_labels)} output nodes")
    inside_of: dict[tuple[str, int], list[str]] = {}  # one walk over the ops, not one per module pass
    for op in trace.ops:
        for key in dict.fromkeys(op.module_passes):  # an op lists a pass once, however often it names it
            inside_of.setdefault(key, []).append(op.label)
    for module in trace.modules.values():
        for mp in module.passes:
            inside = inside_of.get((mp.path, mp.pass_num), [])
            if inside != mp.ops:
                yield Finding("counts agree", False, f"{mp.label} lists {len(mp.ops)} ops, {len(inside)} ran inside it")


def _replay_parity(trace: Trace, rtol: float) -> list[Finding]:
    from torchlens_core.replay.evaluator import ReplayError, replay_values

    worst, worst_op, compared = 0.0, None, 0

    def observe(op: Any, value: Any) -> None:
        nonlocal worst, worst_op, compared
        if op.kind != "op" or op.out is None:
            return
        e = max_error(trace.backend, value, op.out)
        compared += 1
        if not e <= worst:  # NaN and inf count as worst
            worst, worst_op = e, op.label

    from torchlens_core.replay.evaluator import RELEASE_READ

    token = RELEASE_READ.set(True)  # only the outputs' replayed values are read below
    try:
        values = replay_values(trace, observe)
    except ReplayError as exc:
        return [Finding("replay", False, str(exc))]
    finally:
        RELEASE_READ.reset(token)

    def error(actual: Any, expected: Any) -> float:
        return max_error(trace.backend, actual, expected)

    per_op = Finding(
        "per-op replay parity",
        worst <= rtol,
        f"{compared} ops replayed, worst error {worst:.3g}" + (f" at {worst_op}" if worst_op else ""),
        worst_op if worst > rtol else None,
    )
    if trace.halted:
        return [per_op, Finding("output parity", True, "halted before the model returned: no output to compare")]
    replayed = [values[r.index] for r in refs_in(trace.output_template)]
    recorded = [trace.ops[r.index].out for r in refs_in(trace.output_template)]
    model = [v for _, v in tree.leaves(trace.model_output, is_array_of(trace.backend))]
    e_replay = max((error(a, b) for a, b in zip(replayed, recorded)), default=0.0)
    same_count = len(model) == len(recorded)
    e_model = max((error(a, b) for a, b in zip(recorded, model)), default=0.0) if same_count else math.inf
    ok = e_replay <= rtol and e_model <= rtol
    return [
        per_op,
        Finding(
            "output parity",
            ok,
            f"replayed vs recorded {e_replay:.3g}, recorded vs model {e_model:.3g}"
            + ("" if same_count else f" ({len(recorded)} recorded, {len(model)} returned)"),
        ),
    ]
