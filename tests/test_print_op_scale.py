"""print(op) for every op of a trace is linear in the ops (issue 39): no count over the ops before it, no walk
over every lookup key, per op. As in test_linear_time.py, the work is counted, not timed: here the lines of
Python run (sys.settrace), which a walk per op adds in proportion to the trace's length."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402


def _trace(blocks: int) -> tl.Trace:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(blocks)))
    return tl.trace(model, torch.randn(2, 4))


def _lines_to_print_every_op(trace: tl.Trace) -> tuple[int, list[str]]:
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    trace.distances()  # worked out once per trace, linearly, either way: not what is counted here
    sys.settrace(tracer)
    try:
        texts = [str(op) for op in trace.ops]
    finally:
        sys.settrace(None)
    return count, texts


def test_printing_every_op_is_linear_in_the_ops() -> None:
    small, large = _trace(50), _trace(200)
    assert len(large.ops) > 3.9 * len(small.ops)
    work_small, _ = _lines_to_print_every_op(small)
    work_large, texts = _lines_to_print_every_op(large)
    # four times the ops, about four times the work; counting the ops before each op (and reading every key for
    # each) made it ten times here (200 blocks against 50), and more the longer the trace
    assert work_large / work_small < 4.6, (work_small, work_large)
    # what is printed is still right: each op's number among the ops, and its keys, found directly
    ops = [op for op in large.ops if op.kind == "op"]
    for number, op in enumerate(ops, 1):
        assert texts[op.index].startswith(f"Layer {op.label}, operation {number}/{len(ops)}:\n")
        keys = sorted(
            k
            for k in [
                op.label,
                op.layer_label,
                op.layer_label.rsplit("_", 1)[0] + ":1",
                op.layer_label.rsplit("_", 1)[0],
                *(f"{m}" for m in op.module_outputs),
                *(m.rpartition(":")[0] for m in op.module_outputs),
            ]
        )
        keys = sorted(set(keys) | {f"{op.layer_label}:1"})
        assert texts[op.index].endswith(f"Lookup keys: {op.index - len(large.ops)}, {op.index}, {', '.join(keys)}")
