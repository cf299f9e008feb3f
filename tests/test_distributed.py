"""tl.distributed, tl.merge_report, tl.merge_ranks: rank traces of real gloo jobs on the CPU.

Two jobs run once per session, in spawned processes (tests/rank_workers.py):
2 ranks (several models) and 4 ranks (with a subgroup collective). Each rank
saves its traces and its references (the untraced output, the activation a
forward hook saw entering the all_reduce); the tests here load the traces
and check every value against those references or against NumPy. Single-
process checks run in a world of one rank (gloo), in this process.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this PyTorch has no gloo backend", allow_module_level=True)

import rank_workers  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError  # noqa: E402
from torchlens_torch import distributed as torch_distributed  # noqa: E402


def _run_job(world: int, out: pathlib.Path) -> list[dict[str, Any]]:
    try:
        mp.spawn(rank_workers.worker, args=(world, rank_workers.free_init_method(), str(out)), nprocs=world)
    except mp.ProcessExitedException as exc:  # say what each rank had done when one died
        written = {f.name: f.read_text()[-2000:] for f in sorted(out.glob("results*.json"))}
        raise AssertionError(f"{exc}; the ranks' results files: {written or 'none written'}") from exc
    results = [json.loads((out / f"results{rank}.json").read_text()) for rank in range(world)]
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[0]
    return results


@pytest.fixture(scope="module")
def job2(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("job2")
    return out, _run_job(2, out)


@pytest.fixture(scope="module")
def job4(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("job4")
    _run_job(4, out)
    return out


def _job(request: pytest.FixtureRequest, world: int) -> pathlib.Path:
    return request.getfixturevalue("job2")[0] if world == 2 else request.getfixturevalue("job4")


def _load(out: pathlib.Path, case: str, world: int) -> list[tl.Trace]:
    return [tl.load(out / case / f"rank{rank}") for rank in range(world)]


def _np(value: Any) -> np.ndarray:
    return value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _ref(out: pathlib.Path, case: str, rank: int, name: str) -> np.ndarray:
    return np.load(out / case / f"rank{rank}" / f"{name}.npy")


# -- each rank's own trace -------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_trace_is_its_untraced_forward_and_replays(world: int, request: pytest.FixtureRequest) -> None:
    out = _job(request, world)
    for rank, trace in enumerate(_load(out, "clean", world)):
        plain = _ref(out, "clean", rank, "plain")
        np.testing.assert_array_equal(_np(trace.output), plain)  # traced output == untraced output
        np.testing.assert_array_equal(_ref(out, "clean", rank, "replayed"), plain)  # replay in the rank
        np.testing.assert_array_equal(_np(trace.replay()), plain)  # replay of the loaded trace, here
        assert (out / "clean" / f"rank{rank}" / "audit.txt").read_text().startswith("Audit: PASS")
        assert trace.audit()
        reduce = trace["all_reduce_1"]
        assert reduce.func_name == "all_reduce" and reduce.in_place
        assert reduce.meta["collective"]["group"] == list(range(world))
        assert reduce.meta["collective"]["rank"] == rank and reduce.meta["collective"]["op"] == "SUM"
        # the value entering the all_reduce was kept as it ran (copied before the collective wrote into it)
        relu = trace.ops[reduce.parent_indices[0]]
        np.testing.assert_array_equal(_np(relu.out), _ref(out, "clean", rank, "act"))


# -- merging ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 4])
def test_merged_collectives_join_every_rank(world: int, request: pytest.FixtureRequest) -> None:
    out = _job(request, world)
    traces = _load(out, "clean", world)
    report = tl.merge_report(traces[::-1])  # any order
    assert report and report.mergeable, str(report)
    assert report.joins == (2 if world == 2 else 4) and not report.unchecked  # 4 ranks: two pair all_reduces
    merged = tl.merge_ranks(traces)
    acts = [_ref(out, "clean", rank, "act") for rank in range(world)]
    total = np.sum(acts, axis=0)  # the all_reduce's result, from the untraced forwards' activations
    for rank in range(world):
        node = merged[f"rank{rank}/all_reduce_1"]
        # every rank's input is a parent of every rank's all_reduce output
        assert sorted(node.parents) == [f"rank{r}/relu_1_2" for r in range(world)]
        np.testing.assert_allclose(_np(node.out), total, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(
            _np(node.out), np.sum([_np(merged[p].out) for p in node.parents], axis=0), rtol=1e-6, atol=1e-6
        )
        gather = merged[f"rank{rank}/all_gather_1"]
        sent = [merged[f"rank{r}/mul_1"] for r in range(world)]
        assert set(gather.parents) >= {op.label for op in sent}
        for part, op in zip(gather.out, sent):  # all_gather gives every rank's value, in rank order
            np.testing.assert_array_equal(_np(part), _np(op.out))
        assert node.meta["collective"]["join"] == [f"rank{r}/all_reduce_1_3" for r in range(world)]
    outputs = merged.replay()
    for rank in range(world):
        np.testing.assert_array_equal(_np(outputs[rank]), _ref(out, "clean", rank, "plain"))
        np.testing.assert_array_equal(_np(merged.output[rank]), _ref(out, "clean", rank, "plain"))
    assert merged.audit()
    assert merged["rank1.fc1"].func_name == "linear" and "rank1.fc1.weight" in merged.params
    if world == 4:  # the subgroup all_reduce joins ranks {0, 1} and {2, 3} only
        for rank in range(world):
            pair = [r for r in range(world) if r // 2 == rank // 2]
            node = merged[f"rank{rank}/all_reduce_2"]
            before = [merged[f"rank{r}/linear_2"] for r in pair]
            assert sorted(node.parents) == [op.label for op in before]
            before = [_np(op.out) for op in before]
            np.testing.assert_allclose(_np(node.out), np.sum(before, axis=0), rtol=1e-6, atol=1e-6)


def test_broadcast_reduce_scatter_gather_join(job2: Any) -> None:
    out = job2[0]
    traces = _load(out, "more", 2)
    report = tl.merge_report(traces)
    # rank 0 alone reads the gathered values after the gather: another graph from there on, and nothing else
    assert report.mergeable and [f.kind for f in report.findings] == ["graph"], str(report)
    assert report.joins == 4 and not report.unchecked  # every join's values compared with NumPy, and agree
    assert [c["index"] is None for c in traces[1].notes["distributed"]["collectives"]] == [False] * 3 + [True]
    merged = tl.merge_ranks(traces)
    for rank in range(2):
        np.testing.assert_array_equal(_np(merged.replay()[rank]), _ref(out, "more", rank, "plain"))
        broadcast = merged[f"rank{rank}/broadcast_1"]
        np.testing.assert_array_equal(_np(broadcast.out), _np(merged["rank1/linear_1"].out))  # from src=1
        scattered = merged[f"rank{rank}/reduce_scatter_1"]
        written, sent, _ = scattered.args  # sent: what each rank sent (its list of chunks), in group order
        assert len(sent) == 2 and all(len(chunks) == 2 for chunks in sent)
        assert set(scattered.parents) == {merged.ops[ref.index].label for ref in [written, *sent[0], *sent[1]]}
        mine = [_np(merged.resolve(chunks[rank])) for chunks in sent]  # every rank's chunk for this rank
        np.testing.assert_allclose(_np(scattered.out), np.sum(mine, axis=0), rtol=1e-6, atol=1e-6)
        flat = merged[f"rank{rank}/all_gather_into_tensor_1"]
        mine = [_np(merged[f"rank{r}/reduce_scatter_1"].out) for r in range(2)]
        np.testing.assert_array_equal(_np(flat.out), np.concatenate(mine))
    gather = merged["rank0/gather_1"]  # the root's node reads what both ranks sent
    assert {merged[f"rank{r}/reduce_scatter_1"].label for r in range(2)} <= set(gather.parents)
    assert "rank1/gather_1" not in merged
    assert merged.audit()


def test_merged_trace_saves_and_loads(job2: Any, tmp_path: pathlib.Path) -> None:
    out = job2[0]
    merged = tl.merge_ranks(_load(out, "clean", 2))
    tl.save(merged, tmp_path / "merged")
    again = tl.load(tmp_path / "merged")
    for rank in range(2):
        np.testing.assert_array_equal(_np(again.replay()[rank]), _ref(out, "clean", rank, "plain"))
    assert tl.merge_report([again]).of_kind("not_a_rank_trace")  # a merged trace is not merged again


def test_merging_needs_no_framework(job2: Any) -> None:
    """Loaded where torch cannot be imported: the traces hold NumPy values, and still diagnose and merge."""
    code = f"""
import sys
sys.modules["torch"] = None  # import torch now fails, installed or not
import numpy as np
import torchlens as tl
from torchlens_core.ir.errors import MissingDependencyError
folder = {str(job2[0] / "clean")!r}
traces = [tl.load(f"{{folder}}/rank{{r}}") for r in range(2)]
report = tl.merge_report(traces)
assert report and not report.unchecked, report  # the values were compared, with NumPy
merged = tl.merge_ranks(traces)
node = merged["rank1/all_reduce_1"]
assert isinstance(node.out, np.ndarray)
acts = [np.load(f"{{folder}}/rank{{r}}/act.npy") for r in range(2)]
assert np.allclose(node.out, acts[0] + acts[1], rtol=1e-6, atol=1e-6)
assert not tl.distributed.armed()
try:
    tl.distributed.arm()
except MissingDependencyError as exc:
    assert "PyTorch" in str(exc)
else:
    raise AssertionError("arm() without torch")
assert not [m for m in sys.modules if m.startswith("torch.") and not m.startswith("torchlens")]
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


# -- what the report finds ------------------------------------------------------------------------------
def test_ranks_that_ran_another_graph_are_noted(job2: Any) -> None:
    report = tl.merge_report(_load(job2[0], "other_graph", 2))
    assert not report and report.mergeable
    (finding,) = report.findings
    assert finding.kind == "graph" and finding.rank == 1 and "tanh" in finding.message


def test_another_reduction_refuses(job2: Any) -> None:
    clean, maxed = _load(job2[0], "clean", 2), _load(job2[0], "max", 2)
    report = tl.merge_report([clean[0], maxed[1]])
    assert not report.mergeable
    assert [f.kind for f in report.blocking] == ["collective"] and "MAX" in report.blocking[0].message
    with pytest.raises(tl.RankMergeError, match="collective"):
        tl.merge_ranks([clean[0], maxed[1]])
    assert tl.merge_report(maxed)  # MAX on both ranks: clean, and the values agree with np.max


def test_traces_of_different_steps_refuse_on_values(job2: Any) -> None:
    clean, step2 = _load(job2[0], "clean", 2), _load(job2[0], "step2", 2)
    report = tl.merge_report([clean[0], step2[1]])
    # each collective: what rank 0 received is not what the two traces say was sent
    assert [(f.kind, f.op) for f in report.findings] == [("values", "all_reduce_1_3"), ("values", "all_gather_1_7")]
    assert "not of one step" in report.findings[0].message
    with pytest.raises(tl.RankMergeError):
        tl.merge_ranks([clean[0], step2[1]])


def test_ranks_missing_or_twice_refuse(job2: Any) -> None:
    clean = _load(job2[0], "clean", 2)
    assert "missing" in tl.merge_report([clean[1]]).of_kind("ranks")[0].message
    assert "more than once" in tl.merge_report([clean[0], clean[0]]).of_kind("ranks")[0].message
    with pytest.raises(ArgumentTypeError):
        tl.merge_report(clean[0])  # one trace, not a list
    with pytest.raises(ArgumentTypeError):
        tl.merge_report([clean[0], "rank1"])


def test_point_to_point_refuses(job2: Any) -> None:
    traces = _load(job2[0], "send_recv", 2)
    for rank in range(2):  # rank 1's received value is a boundary node: its own trace stays faithful
        np.testing.assert_array_equal(_np(traces[rank].replay()), _ref(job2[0], "send_recv", rank, "plain"))
    assert traces[1]["recv_1"].meta["collective"]["root"] == 0
    report = tl.merge_report(traces)
    assert {(f.kind, f.rank) for f in report.findings} == {("point_to_point", 0), ("point_to_point", 1)}
    with pytest.raises(tl.RankMergeError, match="point_to_point"):
        tl.merge_ranks(traces)


def test_tensor_parallel_and_fsdp_refuse(job2: Any) -> None:
    for results in job2[1]:  # each rank
        assert "tensor_parallel" in results["tensor_parallel"], results
        assert "fsdp_capture_error" not in results, results["fsdp_capture_error"]
        assert "fsdp" in results["fsdp"], results


# -- in this process: a world of one rank ----------------------------------------------------------------
@pytest.fixture
def world1(tmp_path: pathlib.Path) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with tl.distributed.arm():
            yield
    finally:
        dist.destroy_process_group()


class Doubler(nn.Module):
    """all_reduce in a world of one rank is the identity: the trace must still show it, and replay it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, async_op: bool = False) -> torch.Tensor:
        h = self.fc(x)
        view = h[0]  # a view: the collective's write must reach it in replay too
        work = dist.all_reduce(h, async_op=async_op)
        if work is not None:
            work.wait()
        return h * 2 + view


def test_arm_and_disarm() -> None:
    assert not tl.distributed.armed()
    with tl.distributed.arm() as armed:
        assert tl.distributed.armed() and "armed" in repr(armed)
        assert tl.distributed.arm().installed is False  # already armed: the inner arm leaves it to the outer
    assert not tl.distributed.armed()
    with pytest.raises(RuntimeError), tl.distributed.arm():
        raise RuntimeError("boom")
    assert not tl.distributed.armed()  # disarmed on the way out of an exception too
    tl.distributed.disarm()  # idempotent


def test_collectives_are_replaced_only_while_a_capture_runs(world1: Any) -> None:
    from torch.distributed import distributed_c10d as c10d

    original, seen = dist.all_reduce, []

    def model(x: torch.Tensor, fail: bool = False) -> torch.Tensor:
        seen.append((dist.all_reduce, c10d.all_reduce))
        y = x + 1
        dist.all_reduce(y)
        if fail:
            raise ValueError("in the model")
        return y

    tl.trace(model, torch.ones(2))
    assert seen[-1][0] is not original and seen[-1][1] is not original and seen[-1][0].__wrapped__ is original
    assert dist.all_reduce is original and c10d.all_reduce is original  # put back after the capture
    with pytest.raises(ValueError, match="in the model"):
        tl.trace(model, torch.ones(2), fail=True)
    assert dist.all_reduce is original and c10d.all_reduce is original  # and after an exception in the model


def test_collectives_outside_capture_run_untouched(world1: Any) -> None:
    t = torch.ones(3)
    assert dist.all_reduce(t) is None and torch.equal(t, torch.ones(3))
    assert dist.all_reduce(t, async_op=True).wait()


@pytest.mark.parametrize("async_op", [False, True])
def test_world_of_one_boundary_node(world1: Any, async_op: bool, tmp_path: pathlib.Path) -> None:
    model = Doubler()
    x = torch.randn(2, 3)
    with torch.no_grad():
        plain = model(x)
    trace = tl.trace(model, x, async_op=async_op)
    assert torch.equal(trace.output, plain) and torch.equal(trace.replay(), plain)
    node = trace["all_reduce_1"]
    assert (
        node.meta["collective"]["group"] == [0] and trace.notes["distributed"]["collectives"][0]["index"] == node.index
    )
    assert trace.audit()
    tl.save(trace, tmp_path / "t")
    loaded = tl.load(tmp_path / "t")
    assert loaded["all_reduce_1"].call is torch_distributed.RECEIVERS["all_reduce"]
    assert torch.equal(loaded.replay(), plain)


def test_replay_on_new_inputs_refuses_what_the_other_ranks_would_send(world1: Any) -> None:
    model = Doubler()
    x = torch.randn(2, 3)
    trace = tl.trace(model, x)
    assert torch.equal(trace.replay(x.clone()), trace.output)  # the same values sent: the recorded answer holds
    with pytest.raises(tl.GraphDoesNotHold):
        trace.replay(torch.randn(2, 3))  # other values sent: the other ranks would have answered otherwise


def test_a_large_send_refuses_replay_on_new_inputs(world1: Any) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        dist.all_reduce(y)  # 5000 values sent: too many to keep for the check on new inputs
        return y * 2

    x = torch.randn(5000)
    trace = tl.trace(model, x)
    assert torch.equal(trace.replay(), (x + 1) * 2)
    with pytest.raises(tl.UnsupportedError, match="too large"):
        trace.replay(torch.randn(5000))


def test_compiled_code_sees_the_original_collective(world1: Any) -> None:
    import torch._dynamo

    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    tl.trace(step, torch.ones(3))  # an armed capture came and went
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(torch.ones(3))
    assert (explained.graph_break_count, explained.graph_count) == (0, 1)  # as unarmed: dynamo knows all_reduce
    assert torch.equal(torch.compile(step, backend="eager")(torch.ones(3)), torch.full((3,), 3.0))


def test_other_threads_collectives_are_not_recorded(world1: Any) -> None:
    seen: list[Any] = []
    started, release = threading.Event(), threading.Event()

    def other() -> None:
        started.wait()
        t = torch.ones(2)
        dist.all_reduce(t)  # runs while the main thread captures: not part of its trace
        seen.append(t)
        release.set()

    def model(x: torch.Tensor) -> torch.Tensor:
        started.set()
        release.wait(30)
        return x + 1

    thread = threading.Thread(target=other)
    thread.start()
    trace = tl.trace(model, torch.zeros(2))
    thread.join()
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["add"] and len(seen) == 1
    assert trace.notes["distributed"]["collectives"] == []


def test_forks_replay_past_a_collective_but_not_through_a_changed_send(world1: Any) -> None:
    model = Doubler()
    x = torch.randn(2, 3)
    trace = tl.trace(model, x)
    after = trace.fork().when(tl.func("mul"), tl.zero_ablate()).replay()  # edits downstream of the all_reduce
    expected = trace["getitem_1"].out  # h * 2 zeroed: only the view is left
    assert torch.equal(after, expected.expand_as(after))
    with pytest.raises(tl.GraphDoesNotHold, match="collective"):  # what the rank sent changes: no answer
        trace.fork().when(tl.func("linear"), tl.zero_ablate()).replay()


def test_halted_and_recorded_rank_traces(world1: Any) -> None:
    model = Doubler()
    x = torch.randn(2, 3)
    halted = tl.trace(model, x, halt=tl.func("all_reduce"))
    assert halted.halted and halted.notes["distributed"]["collectives"][0]["index"] == halted["all_reduce_1"].index
    assert [f.kind for f in tl.merge_report([halted]).findings] == ["halted"]
    recording = tl.record(model, x)
    assert tl.merge_report([recording]) and tl.merge_ranks([recording]).num_ops == recording.num_ops


def test_a_saved_boundary_call_loads_only_from_the_receivers() -> None:
    from torchlens_core.ir.errors import TraceFileError

    all_gather = torch_distributed.RECEIVERS["all_gather"]
    assert torch_distributed.decode_call({"ns": "torchlens.collective", "name": "all_gather"}) is all_gather
    for hostile in (
        {"ns": "torchlens.collective", "name": "system"},
        {"ns": "torchlens.collective", "name": "all_reduce", "get": True},
    ):
        with pytest.raises(TraceFileError):
            torch_distributed.decode_call(hostile)
    assert torch_distributed.decode_call({"ns": "torch", "name": "relu"}) is torch.relu  # torch's own, as before


def test_a_trace_without_arm_is_not_a_rank_trace() -> None:
    trace = tl.trace(nn.Linear(2, 2), torch.randn(1, 2))
    report = tl.merge_report([trace])
    assert [f.kind for f in report.findings] == ["not_a_rank_trace"] and "arm" in report.findings[0].message
    with pytest.raises(tl.RankMergeError):
        tl.merge_ranks([trace])


def test_an_unarmed_collective_is_said_not_silently_dropped(tmp_path: pathlib.Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert not tl.distributed.armed()
        with pytest.warns(RuntimeWarning, match=r"all_reduce ran in the forward, and tl.distributed is not armed"):
            trace = tl.trace(Doubler(), torch.randn(2, 3))
        assert trace.notes["unrecorded_collectives"] == ["all_reduce"]
        assert [kind for kind, _ in tl.validate(trace).reasons] == ["collectives"]
    finally:
        dist.destroy_process_group()
