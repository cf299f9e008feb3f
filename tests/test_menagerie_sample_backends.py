"""The fixed CI sample of each non-torch menagerie (about 5%, at least one entry), in that backend's session."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The entries run two at a time on a local Dask cluster (bench/menagerie/cluster.py), one per core CI has: each
# is a forked child either way, so the records are those of a serial run, in half the time.
_ENGINE = ("--dask-local", str(min(2, os.cpu_count() or 1)))
sys.path.insert(0, str(ROOT))

from bench.menagerie.diagnoses import DIAGNOSES  # noqa: E402

# The module that says the backend's session runs here: Keras 3 installs without TensorFlow (on torch or JAX), so
# the tf sample needs tensorflow itself.
FRAMEWORKS = {"jax": "flax", "tf": "tensorflow", "paddle": "paddle", "tinygrad": "tinygrad"}


@pytest.mark.parametrize("backend", sorted(FRAMEWORKS))
def test_the_ci_sample_is_verified(tmp_path: pathlib.Path, backend: str) -> None:
    if importlib.util.find_spec(FRAMEWORKS[backend]) is None:
        pytest.skip(f"{FRAMEWORKS[backend]} is not installed: the {backend} session runs this")
    results = tmp_path / "sample.jsonl"
    # Keras's models are sampled in the tf session; on JAX (where the jax session lets Keras run) they are in the
    # full menagerie, and in CI through the jax conformance zoo's Keras case and tests/test_keras_on_jax.py: the
    # applications the sample would pick cost minutes each there (ResNet101: 202 s on two shared cores).
    env = {k: v for k, v in os.environ.items() if not (backend == "jax" and k == "KERAS_BACKEND")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.menagerie",
            "--backend",
            backend,
            "--sample",
            "--results",
            str(results),
            *_ENGINE,
        ],
        cwd=ROOT,
        check=True,
        timeout=1800,
        env=env,
    )
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert records, "the sample selected no entry"
    known = DIAGNOSES.get(backend, {})
    failed = [
        f"{r['name']}: {r['check']}: {r['error']}"
        for r in records
        if r["status"] == "failed" and r["name"] not in known
    ]
    assert not failed, "undiagnosed failures:\n" + "\n".join(failed)
    assert any(r["status"] == "verified" for r in records), records  # excluded ones never ran
