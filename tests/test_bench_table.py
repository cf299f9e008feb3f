"""bench/backend_table.py and bench/all_backends.py: the figures they compute are the right ones (no timings)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import all_backends  # noqa: E402 - from bench/, which is not a package


def _torch_parts():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    import backend_table

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = torch.nn.Linear(8, 16)
            self.second = torch.nn.Linear(16, 3)

        def forward(self, x):  # type: ignore[no-untyped-def]
            h = torch.relu(self.first(x))
            flat = h.view(-1)  # a view: shares h's memory, costs no bytes
            return self.second(flat.view(4, 16))

    torch.manual_seed(0)
    return torch, backend_table, Net().eval(), torch.rand(4, 8)


def test_saved_bytes_counts_each_storage_once() -> None:
    torch, backend_table, net, x = _torch_parts()
    import torchlens as tl

    trace = tl.trace(net, x)
    # by hand: the input's copy (4x8), linear (4x16), relu (4x16), linear (4x3), float32; the views share relu's
    expected = (4 * 8 + 4 * 16 + 4 * 16 + 4 * 3) * 4
    assert backend_table.saved_bytes(trace, "torch") == expected


def test_halt_at_a_quarter_stops_at_that_op() -> None:
    torch, backend_table, net, x = _torch_parts()
    import torchlens as tl

    full = tl.trace(net, x)
    ops = [op for op in full.ops if op.kind not in ("input", "output")]
    label, count = backend_table.quarter_label(full)
    assert count == len(ops) and label == ops[len(ops) // 4].label
    halted = tl.trace(net, x, halt=tl.label(label))
    assert [op.label for op in halted.ops if op.kind not in ("input", "output")] == [
        op.label for op in ops[: len(ops) // 4 + 1]
    ]


def test_the_patch_site_is_the_largest_module_call_ending_mid_trace() -> None:
    torch, backend_table, _, _ = _torch_parts()
    import torchlens as tl

    blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(4)])
    trace = tl.trace(blocks, torch.rand(2, 8))  # 8 ops between an input and an output: blocks end at 2, 4, 6, 8
    assert backend_table.patch_site(trace) == "1"  # blocks 1 and 2 end at ops 4 and 6 of 10, as near the middle
    trace.modules.pop("1")  # as if block 1 had more than one pass: block 2 is the next best
    assert backend_table.patch_site(trace) == "2"
    assert backend_table.patch_site(tl.trace(torch.nn.Linear(8, 8), torch.rand(2, 8))) is None


@pytest.mark.skipif(sys.platform != "linux", reason="peak RSS is read from Linux's /proc/self")
def test_peak_meter_sees_a_transient_allocation() -> None:
    """32 MiB allocated and freed inside the run: the peak sees them, and a run that allocates nothing adds
    almost nothing. In a fresh process, since the meter changes glibc's settings for the whole process."""
    pytest.importorskip("numpy")
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(BENCH)!r})
        import numpy as np
        from backend_table import PeakMeter
        meter = PeakMeter("numpy")
        big, _ = meter.measure(lambda: float(np.ones(2**22).sum()))  # 4 Mi float64: 32 MiB, freed at once
        kept, held = meter.measure(lambda: np.ones(2**21))  # 16 MiB, still held when read
        nothing, _ = meter.measure(lambda: None)
        print(json.dumps([big, kept, nothing]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    big, kept, nothing = json.loads(done.stdout.splitlines()[-1])
    mib = 2**20
    assert 31 * mib <= big <= 40 * mib
    assert 15 * mib <= kept <= 24 * mib
    assert nothing <= 2 * mib


def test_missing_virtualenv_is_a_row_and_no_goal_is_claimed(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "table.md"
    subprocess.run(
        [
            sys.executable,
            str(BENCH / "all_backends.py"),
            "--envs",
            str(tmp_path / "none"),
            "--backends",
            "tf",
            "paddle",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    table = out.read_text()
    assert f"| tf | — | | | | | | | | | | | no virtualenv {tmp_path / 'none' / 'tf'}: run `nox -s tf` first |" in table
    assert "Not measured: tf, paddle." in table and "goal met" not in table
    assert json.loads(out.with_suffix(".json").read_text())[1]["backend"] == "paddle"


def test_goals_are_checked_against_each_figure() -> None:
    row = {
        "plain_ms": 10.0,
        "trace_ms": 12.5,
        "ratio": 1.25,
        "floor_ratio": 1.1,
        "vs_floor": 1.25 / 1.1,
        "recorder_us": 10.0,
        "units": 140,
        "unit_ops": 100,
        "passes": 40,
        "halt_ratio": 0.3,
        "memory_ratio": 1.2,
        "saved_mib": 5.0,
        "peak_ratio": 1.3,
        "per_op_us": 25.0,
        "ops": 100,
        "record_ratio": 1.1,
    }
    assert all_backends.goals("tf", row)[1] == [
        "capture 1.25x (floor 1.10x, recorder 10 µs × 140 units)",
        "memory 1.20x",
    ]
    assert all_backends.goals("tf", {**row, "floor_ratio": 1.22})[1][0] == "capture 1.25x (the floor 1.22x stops it)"
    # the least recorder (the floor and one small record per op) over a goal against the plain call stops it
    assert all_backends.goals("tf", {**row, "least_ratio": 1.21})[1][0] == (
        "capture 1.25x (floor 1.10x; the least recorder 1.21x the plain call, over the goal: it stops it)"
    )
    assert all_backends.goals("paddle", {**row, "least_ratio": 1.15})[1][0] == (
        "capture 1.25x (floor 1.10x, recorder 10 µs × 140 units; the least recorder 1.15x the plain call, "
        "under the goal)"
    )
    # torch's goal is against its floor (1.14x here), not its plain call
    assert all_backends.goals("torch", {**row, "memory_ratio": 1.0})[1] == [
        "capture/floor 1.14x (recorder 10 µs × 140 units; floor 1.10x)"
    ]
    assert all_backends.goals("torch", {**row, "vs_floor": 1.09, "memory_ratio": 1.0})[1] == []
    # a trace of kilobytes: no memory verdict
    assert all_backends.goals("tf", {**row, "ratio": 1.1, "saved_mib": 0.01})[1] == []
    jax = {**row, "memory_ratio": 0.9, "vs_jit": 3.0, "jit_ms": 4.0, "jit_trace_vs_jit": 2.5, "jit_floor_ratio": 2.2}
    assert all_backends.goals("jax", jax)[1] == ["jitted target 2.50x the jitted call (the floor 2.20x stops it)"]
    result = {"backend": "jax", "framework": "jax 0", "memory_method": "rss", "models": {"m": {**jax, "ratio": 2.5}}}
    table = all_backends.markdown([result], repeats=3)
    assert (
        "| jax | m | 10.0 | 1.10x | 2.50x | 1.14x | 10 µs | 100 + 40 | 0.30x | — | 0.90x "
        "| capture ≤ 2.0x, jitted ≤ 2x, memory ≤ 1.10x | no: capture 2.50x (floor 1.10x, recorder 10 µs × 140 "
        "units); jitted target 2.50x the jitted call (the floor 2.20x stops it) |"
    ) in table
    assert "Goals missed: jax m: capture 2.50x" in table
    result["models"]["m"].update(ratio=1.5, jit_trace_vs_jit=1.5)
    assert "Every goal met." in all_backends.markdown([result], repeats=3)
    patched = {**row, "patch_ratio": 1.25, "patch_site": "h.5"}
    assert all_backends._missed_earlier("torch", "gpt2", patched) == ["torch gpt2 patch 1.25x > 1.2x"]
    assert all_backends._missed_earlier("torch", "resnet18", patched) == []  # the patching goal is GPT-2's


def test_units_are_the_ops_and_module_passes_a_recorder_handled() -> None:
    torch, _, net, x = _torch_parts()
    import capture_floor

    import torchlens as tl

    # by hand: linear, relu, view, view, linear; one pass each of `first` and `second`
    assert capture_floor.units(tl.trace(net, x)) == (5, 2)
    relu = torch.nn.ReLU()
    twice = torch.nn.Sequential(net.first, relu, torch.nn.Linear(16, 16), relu)
    # one module called twice is two passes; the traced model itself is no pass
    assert capture_floor.units(tl.trace(twice, x)) == (4, 1 + 2 + 1)


def test_torch_floor_keeps_every_output_and_copies_before_a_write() -> None:
    torch, _, _, _ = _torch_parts()
    import capture_floor

    def forward(x):  # type: ignore[no-untyped-def]
        y = x * 2
        y.add_(1)  # in place: the floor keeps y as it was, as the capture's saved value is
        return torch.relu(y)

    x = torch.rand(3)
    kept = capture_floor.torch_modes(forward, (x,), {})["hold"]().kept
    # mul, the copy before add_, add_, relu
    assert len(kept) == 4
    assert torch.equal(kept[1], x * 2) and torch.equal(kept[3], torch.relu(x * 2 + 1))


def test_jax_capture_parts_times_the_cached_capture_of_the_jitted_target() -> None:
    pytest.importorskip("jax")
    pytest.importorskip("equinox")
    import jax_capture_parts
    from capture_overhead import builders, jitted_target

    import torchlens as tl

    us = jax_capture_parts.parts("eqx_mlp", rounds=3)
    model, args, kwargs = builders("jax", ["eqx_mlp"])["eqx_mlp"]()
    target, targs = jitted_target(model, args)
    assert us["ops"] == len(tl.trace(target, *targs, backend="jax", **kwargs).ops)
    assert all(us[part] > 0 for part in ("jit", "trace", "key", "executable", "remember"))
    assert us["trace"] > us["executable"]  # the capture runs the executable, and more


def test_tf_least_recorder_keeps_one_record_per_op_linked_to_its_inputs() -> None:
    tf = pytest.importorskip("tensorflow")
    import capture_floor

    def forward(x):  # type: ignore[no-untyped-def]
        y = tf.nn.relu(x * 2.0)
        return tf.reduce_sum(y + x)

    x = tf.constant([[1.0, -2.0], [3.0, -4.0]])
    _, records = capture_floor.tf_modes(forward, (x,), {})["least"]()
    # by hand: mul (of x and the constant 2), relu (of mul), add (of relu and x), sum (of add and its axes)
    types = [r.func for r in records]
    assert types[-4:] == ["Mul", "Relu", "AddV2", "Sum"], types
    mul, relu, add, total = records[-4:]
    base = len(records) - 4
    assert relu.parents == (base,) and add.parents == (base + 1,) and total.parents[0] == base + 2
    assert (
        mul.shape == (2, 2)
        and total.shape == ()
        and float(total.out[0]) == float(tf.reduce_sum(tf.nn.relu(x * 2.0) + x))
    )


def test_paddle_least_recorder_keeps_one_record_per_op_linked_to_its_inputs() -> None:
    paddle = pytest.importorskip("paddle")
    import capture_floor

    class Net(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(3, 2)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return paddle.nn.functional.relu(self.fc(x)) * 2.0

    net, x = Net(), paddle.rand([4, 3])
    _, records = capture_floor.paddle_modes(net, (x,), {})["least"]()
    names = [r.func.name for r in records]
    # by hand: linear (of x and the parameters), relu (of linear), the product (of relu)
    assert len(records) == 3, names
    assert records[1].parents == (0,) and records[2].parents == (1,) and records[0].parents == ()
    assert all(r.shape == (4, 2) for r in records)
    expected = paddle.nn.functional.relu(net.fc(x)) * 2.0
    assert bool(paddle.allclose(records[2].out, expected))
