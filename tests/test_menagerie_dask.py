"""The menagerie on a Dask cluster (bench/menagerie/cluster.py): the same records as the single-process run, each
appended as it arrives (so --resume works), and a dying worker failing its entry only."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time

import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.menagerie import run  # noqa: E402
from bench.menagerie.entries import Entry  # noqa: E402

# The registry below is built in this module, which the workers cannot import: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _linear():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(), (torch.randn(2, 4),), {}


def _conv():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    ).eval()
    return model, (torch.randn(1, 3, 8, 8),), {}


def _drifting():
    class Drifting(torch.nn.Module):  # each call adds its call count: the trace's output is not the model's
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * 2 + self.calls

    return Drifting(), (torch.ones(3),), {}


def _unbuildable():
    raise ValueError("this model needs weights nobody has")


def _crashing_child():
    os.kill(os.getpid(), signal.SIGKILL)


def _worker_killer():
    os.kill(os.getppid(), signal.SIGKILL)  # the forked child's parent is the Dask worker itself
    time.sleep(5)  # orphaned now: it ends here, its result going nowhere


def _entry(name: str, build) -> Entry:
    return Entry("torch", f"test/{name}", "test", "test", build)


REGISTRY = [
    _entry("linear", _linear),
    _entry("conv", _conv),
    _entry("drifting", _drifting),
    _entry("unbuildable", _unbuildable),
    _entry("crashing", _crashing_child),
]


def _run(monkeypatch, registry, results: pathlib.Path, *flags: str) -> list[dict]:
    monkeypatch.setattr(run, "entries", lambda backend: sorted(registry, key=lambda e: e.name))
    assert (
        run.main(["--backend", "torch", "--results", str(results), "--memory-gb", "4", "--timeout", "120", *flags]) == 0
    )
    return [json.loads(line) for line in results.read_text().splitlines() if line.endswith("}")]


def _outcomes(records: list[dict]) -> dict[str, tuple]:
    return {r["name"]: (r["status"], r["check"], (r.get("error") or "")[:40], r.get("ops")) for r in records}


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes; a task whose worker dies is not rerun (as --dask-local sets)."""
    import dask

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as local,
    ):
        yield local


def test_a_dask_run_records_what_the_single_process_run_records(monkeypatch, tmp_path):
    here = _run(monkeypatch, REGISTRY, tmp_path / "here.jsonl")
    there = _run(monkeypatch, REGISTRY, tmp_path / "there.jsonl", "--dask-local", "2")
    assert sorted(r["name"] for r in there) == sorted(e.name for e in REGISTRY)  # each entry once
    assert _outcomes(there) == _outcomes(here)
    outcome = {name: value[:2] for name, value in _outcomes(there).items()}
    assert outcome == {
        "test/conv": ("verified", None),
        "test/linear": ("verified", None),
        "test/drifting": ("failed", "output_parity"),
        "test/unbuildable": ("excluded", "build"),
        "test/crashing": ("failed", "crash"),
    }
    unbuildable = next(r for r in there if r["name"] == "test/unbuildable")
    assert "needs weights nobody has" in unbuildable["reason"]
    log = (tmp_path / "there.log").read_text()  # the workers' child output reaches the driver's log
    assert "===== test/linear" in log and "===== test/conv" in log


def test_resume_on_dask_runs_only_the_entries_not_done(monkeypatch, tmp_path, cluster):
    results = tmp_path / "resumed.jsonl"
    done = {
        "backend": "torch",
        "name": "test/conv",
        "library": "test",
        "family": "test",
        "status": "verified",
        "check": None,
        "error": None,
        "marker": "from the interrupted run",
    }
    before = json.dumps(done) + "\n" + '{"backend": "torch", "name": "test/lin'  # the last line cut short
    results.write_text(before)
    records = _run(monkeypatch, REGISTRY, results, "--resume", "--dask", cluster.scheduler_address)
    text = results.read_text()
    assert text.startswith(before + "\n")  # appended to, never rewritten; the cut line ends where it was cut
    names = [r["name"] for r in records]
    assert names.count("test/conv") == 1 and records[0].get("marker") == "from the interrupted run"
    assert sorted(names) == sorted(e.name for e in REGISTRY)  # the cut-short entry ran again


def test_a_worker_that_dies_fails_its_entry_only(monkeypatch, tmp_path, cluster):
    registry = [_entry("worker-killer", _worker_killer), _entry("linear", _linear), _entry("conv", _conv)]
    records = _run(monkeypatch, registry, tmp_path / "killed.jsonl", "--dask", cluster.scheduler_address)
    outcome = {r["name"]: r for r in records}
    assert set(outcome) == {"test/worker-killer", "test/linear", "test/conv"}
    assert (outcome["test/worker-killer"]["status"], outcome["test/worker-killer"]["check"]) == ("failed", "crash")
    assert "did not return" in outcome["test/worker-killer"]["error"]
    assert outcome["test/linear"]["status"] == outcome["test/conv"]["status"] == "verified"


def test_the_engine_flags_are_checked(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(run, "entries", lambda backend: [])
    with pytest.raises(SystemExit):
        run.main(["--results", str(tmp_path / "x.jsonl"), "--dask", "tcp://127.0.0.1:1", "--dask-local", "2"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["--results", str(tmp_path / "x.jsonl"), "--dask-local", "0"])
    assert "at least 1" in capsys.readouterr().err
