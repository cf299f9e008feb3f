"""audit() catches corrupted traces and names the fault."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        for _ in range(2):
            h = self.fc2(h) + x
        return h.sigmoid()


def fresh() -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(Net(), torch.randn(2, 4))


def test_clean_trace_passes() -> None:
    report = fresh().audit()
    assert report and not report.failures
    assert "PASS" in str(report)


def _drop_parents(t: tl.Trace) -> None:
    op = t["relu_1"]
    op.parents, op.parent_indices = [], ()


def _misorder(t: tl.Trace) -> None:
    t["relu_1"].parent_indices = (t["sigmoid_1"].index,)


def _duplicate_label(t: tl.Trace) -> None:
    t["sigmoid_1"].label = t["relu_1"].label


def _renumber_pass(t: tl.Trace) -> None:
    t["linear_2:2"].pass_num = 5


def _module_output_outside(t: tl.Trace) -> None:
    t["fc1"].module_passes = ()


def _wrong_shape(t: tl.Trace) -> None:
    t["relu_1"].shape = (9, 9)


def _wrong_value(t: tl.Trace) -> None:
    op = t["relu_1"]
    op.out = op.out + 1


def _wrong_function(t: tl.Trace) -> None:
    t["relu_1"].call = torch.tanh


def _wrong_output(t: tl.Trace) -> None:
    node = t["output_1"]
    node.out = node.out * 0


def _orphan_child(t: tl.Trace) -> None:
    t["relu_1"].children.append("sigmoid_1_7")


def _condition_after(t: tl.Trace) -> None:
    op = t["relu_1"]
    op.condition_indices, op.conditions = (t["sigmoid_1"].index,), [t["sigmoid_1"].label]


def _negative_macs(t: tl.Trace) -> None:
    t["linear_1"].cost = (10.0, -5.0)


CORRUPTIONS: dict[str, tuple[Callable[[tl.Trace], None], str, str | None]] = {
    "dropped parents": (_drop_parents, "sources declared", "relu_1_2"),
    "misordered graph": (_misorder, "acyclic and ordered", "relu_1_2"),
    "duplicate label": (_duplicate_label, "labels unique", "relu_1_2"),
    "bad pass number": (_renumber_pass, "passes consistent", None),
    "module output outside module": (_module_output_outside, "module outputs inside", "linear_1_1"),
    "wrong shape": (_wrong_shape, "shapes match", "relu_1_2"),
    "wrong saved value": (_wrong_value, "per-op replay parity", "relu_1_2"),
    "wrong function": (_wrong_function, "per-op replay parity", "relu_1_2"),
    "wrong output": (_wrong_output, "output parity", None),
    "child without parent": (_orphan_child, "edges agree", "relu_1_2"),
    "condition after the op": (_condition_after, "metadata sane", "relu_1_2"),
    "negative MACs": (_negative_macs, "metadata sane", "linear_1_1"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corruption_is_named(name: str) -> None:
    corrupt, check, op_label = CORRUPTIONS[name]
    trace = fresh()
    corrupt(trace)
    report = trace.audit()
    assert not report, f"audit missed: {name}"
    failing = {f.check for f in report.failures}
    assert check in failing, str(report)
    if op_label is not None:
        assert any(f.op == op_label for f in report.failures if f.check == check), str(report)
