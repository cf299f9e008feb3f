"""The framework-neutral FLOP building blocks and registry."""

from __future__ import annotations

import pytest

from torchlens_core.views import flops
from torchlens_core.views.flops import ArraySpec, OpCall, einsum_count, matmul_macs


def test_matmul_macs_follow_numpy_rules() -> None:
    assert matmul_macs((2, 3), (3, 4)) == 24
    assert matmul_macs((5, 1, 2, 3), (7, 3, 4)) == 5 * 7 * 2 * 3 * 4  # batch dims broadcast
    assert matmul_macs((3,), (3, 4)) == 12 and matmul_macs((2, 3), (3,)) == 6


def test_einsum_counts() -> None:
    assert einsum_count("ij,jk->ik", [(2, 3), (3, 4)]) == (48, 24)
    assert einsum_count("ij,jk", [(2, 3), (3, 4)]) == (48, 24)  # implicit output
    assert einsum_count("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 4)]) == (240, 120)
    assert einsum_count("ij->j", [(2, 3)]) == (6, 0)  # one operand: a sum
    # three operands contract pairwise, left to right
    assert einsum_count("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == (2 * (24 + 40), 24 + 40)


def test_op_call_reads_arguments() -> None:
    call = OpCall("conv", (ArraySpec((1, 3, 8, 8)), ArraySpec((4, 3, 3, 3))), {"stride": 2}, (1, 4, 3, 3))
    assert call.arg(1).shape == (4, 3, 3, 3) and call.arg(5, "stride") == 2 and call.arg(9) is None
    assert [a.numel for a in call.inputs] == [192, 108]
    assert call.out_numel == 36
    assert OpCall("split", (), {}, ((2, 3), (2, 5))).out_numel == 16


def test_registration_precedence() -> None:
    def everywhere(call: OpCall) -> tuple[int, int]:
        return 1, 0

    def only_numpy(call: OpCall) -> tuple[int, int]:
        return 2, 0

    try:
        flops.register_flops("made_up_op", everywhere)
        flops.register_flops("made_up_op", backend="numpy")(only_numpy)
        assert flops.formula_for("numpy", "made_up_op") is only_numpy
        assert flops.formula_for("elsewhere", "made_up_op") is everywhere
    finally:
        flops._USER.clear()
    with pytest.raises(TypeError):
        flops.register_flops("made_up_op", "not a function")  # type: ignore[arg-type]


def test_a_registration_overrides_the_backends_table_for_its_backend_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the backend files each checked on their own framework: the core's lookup, on the numpy plugin."""
    pytest.importorskip("torchlens_numpy")
    import numpy as np

    import torchlens as tl

    monkeypatch.setattr(flops, "_USER", {})  # registrations end with the test
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    table = tl.trace(lambda v: np.tanh(v) @ v.T, x, backend="numpy")
    assert (table["tanh_1_1"].flops, table["matmul_1_3"].macs) == (12, 3 * 4 * 3)  # the plugin's own table
    tl.register_flops("tanh", lambda call: (7 * call.out_numel, call.inputs[0].numel), backend="numpy")
    tl.register_flops("matmul", lambda call: (1, 0), backend="torch")  # another backend's: not used
    traced = tl.trace(lambda v: np.tanh(v) @ v.T, x, backend="numpy")
    ops = {op.func_name: op for op in traced.ops}
    assert (ops["tanh"].flops, ops["tanh"].macs) == (7 * 12, 12)
    assert (ops["matmul"].flops, ops["matmul"].macs) == (2 * 36, 36)
    tl.register_flops("tanh", lambda call: None, backend="numpy")  # a formula may decline: unknown
    assert flops.count(traced, ops["tanh"]) == (None, None)


def test_each_distinct_call_is_counted_once_per_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops of repeated layers show a formula the same call: it is asked once per distinct call of a trace.
    Calls that differ only in a constant's type (``1`` and ``1.0``, one dict key) or in a shape are asked apart,
    and each op gets its own call's count."""
    pytest.importorskip("torchlens_numpy")
    import numpy as np

    import torchlens as tl

    monkeypatch.setattr(flops, "_USER", {})
    asked: list[OpCall] = []

    def power(call: OpCall) -> tuple[int, int]:
        asked.append(call)
        return call.out_numel * (2 if isinstance(call.arg(1), float) else 1), 0

    tl.register_flops("power", power, backend="numpy")

    def repeated(v: np.ndarray) -> np.ndarray:
        for _ in range(10):
            v = np.power(v, 1)
        for _ in range(10):
            v = np.power(v, 1.0)
        return np.power(v[:2], 1)

    trace = tl.trace(repeated, np.ones((3, 4), dtype=np.float32), backend="numpy")
    ops = [op for op in trace.ops if op.func_name == "power"]
    assert [op.flops for op in ops] == [12] * 10 + [24] * 10 + [8]
    assert len(asked) == 3
