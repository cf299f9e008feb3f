"""The menagerie's harness (bench/menagerie/): the fixed CI sample verified, and crashes, hangs and failed checks
each failing their own entry only, with the check named."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The entries run two at a time on a local Dask cluster (bench/menagerie/cluster.py), one per core CI has: each
# is a forked child either way, so the records are those of a serial run, in half the time.
_ENGINE = ("--dask-local", str(min(2, os.cpu_count() or 1)))
sys.path.insert(0, str(ROOT))

from bench.menagerie.diagnoses import DIAGNOSES  # noqa: E402
from bench.menagerie.entries import Entry, in_sample, parse_shard, select  # noqa: E402
from bench.menagerie.run import run_entry  # noqa: E402


def _entry(name: str, build) -> Entry:
    return Entry("torch", f"test/{name}", "test", "test", build)


def _linear():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(), (torch.randn(2, 4),), {}


def _run(entry: Entry, timeout: float = 120.0) -> dict:
    with open(os.devnull, "w") as log:
        return run_entry(entry, timeout, 4 * 2**30, log.fileno())


def test_a_plain_model_is_verified_by_every_check():
    result = _run(_entry("linear", _linear))
    assert result["status"] == "verified", result
    assert set(result["checks"].values()) == {"passed"}
    assert list(result["checks"]) == [
        "output_parity",
        "audit_clean",
        "module_outputs",
        "round_trip",
        "replay_on_other_inputs",
    ]


class _Drifting(torch.nn.Module):
    """Each call adds a counter it bumps: the untraced rerun and the replays disagree with the first call."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2 + self.calls


def test_a_failed_check_is_named_with_its_first_error_line():
    result = _run(_entry("drifting", lambda: (_Drifting(), (torch.ones(3),), {})))
    assert result["status"] == "failed"
    assert result["check"] == "output_parity"  # the trace ran the second call: 2x+2 against the model's 2x+1
    assert result["error"].startswith("AssertionError: trace output differs")


def test_a_model_that_cannot_run_is_excluded_not_failed():
    def build():
        return torch.nn.Linear(4, 3), (torch.randn(2, 5),), {}  # wrong width: the model's own call fails

    result = _run(_entry("misfit", build))
    assert result["status"] == "excluded"
    assert result["check"] == "untraced call"
    assert "mat1 and mat2" in result["reason"]


def test_a_crash_fails_its_entry_only():
    def build():
        os.kill(os.getpid(), signal.SIGKILL)

    result = _run(_entry("crash", build))
    assert (result["status"], result["check"]) == ("failed", "crash")
    assert "signal 9" in result["error"]


def test_a_hang_is_killed_at_the_time_limit():
    def build():
        time.sleep(600)

    result = _run(_entry("hang", build), timeout=2.0)
    assert (result["status"], result["check"]) == ("failed", "timeout")


def test_memory_beyond_the_limit_fails_its_entry():
    def build():
        return torch.nn.Identity(), (torch.empty(2**33, dtype=torch.uint8),), {}  # 8 GiB, over the 4 GiB given

    result = _run(_entry("hog", build))
    assert result["status"] != "verified"
    assert "allocate" in (result.get("reason") or result["error"])


def test_sample_and_shards_are_fixed_and_partition_the_entries():
    entries = [_entry(f"m{i}", _linear) for i in range(400)]
    sample = select(entries, sample=True)
    assert sample == [e for e in entries if in_sample(e)]  # a hash of the name: the same on every run
    assert 0.02 < len(sample) / len(entries) < 0.09
    shards = [select(entries, shard=(i, 3)) for i in (1, 2, 3)]
    assert sorted(e.name for s in shards for e in s) == sorted(e.name for e in entries)
    with pytest.raises(SystemExit, match="between 1 and n"):
        parse_shard("4/3")


def test_the_ci_sample_is_verified(tmp_path):
    """The fixed sample of the torch menagerie (about 5% of torchvision, timm and transformers), end to end: about
    a minute on two cores. A failure must be diagnosed (bench/menagerie/diagnoses.py), and a diagnosed one that
    passes must leave that list."""
    results = tmp_path / "sample.jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.menagerie",
            "--backend",
            "torch",
            "--sample",
            "--results",
            str(results),
            *_ENGINE,
        ],
        cwd=ROOT,
        check=True,
        timeout=1800,
    )
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert records, "the sample selected no entry"
    known = DIAGNOSES["torch"]  # diagnosed TorchLens bugs: expected to fail, strictly, as the conformance xfails
    failed = [
        f"{r['name']}: {r['check']}: {r['error']}"
        for r in records
        if r["status"] == "failed" and r["name"] not in known
    ]
    assert not failed, "undiagnosed failures:\n" + "\n".join(failed)
    fixed = [r["name"] for r in records if r["status"] == "verified" and r["name"] in known]
    assert not fixed, f"verified now: remove them from bench/menagerie/diagnoses.py: {fixed}"
    assert sum(r["status"] == "verified" for r in records) >= len(records) // 2
