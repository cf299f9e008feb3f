"""The hostile-folder fuzz suite (tests/fuzz_saving.py), for every backend installed here.

Each backend's run is a separate process, so a crash inside a framework
(which no exception handler sees) fails the test with the mutation that
caused it instead of taking the session down. Deterministic: seeded.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from fuzz_saving import SEEDS

from torchlens_core.backend.manager import backend_infos

BACKENDS = [i.name for i in backend_infos() if i.available and i.name in SEEDS]
HERE = pathlib.Path(__file__).parent


@pytest.mark.skipif(not BACKENDS, reason="no backend with a zoo is installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_mutation_escapes_as_anything_but_a_torchlens_error(backend: str) -> None:
    result = subprocess.run(
        [sys.executable, str(HERE / "fuzz_saving.py"), backend],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TORCHLENS_FUZZ_LOG": "1"},
    )
    if result.returncode != 0:
        tried = [line for line in result.stderr.splitlines() if ": " in line and not line.startswith(" ")]
        pytest.fail(
            f"the fuzz run died (exit {result.returncode}); last mutation: "
            f"{tried[-1] if tried else '?'}\n{result.stderr[-3000:]}"
        )
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["escapes"] == 0, "\n".join(counts["escape_details"][:10])
    # Damage the hashes see, and every link, special file, oversized file and manifest edit, are refused.
    assert counts["must_refuse_failures"] == [], counts["must_refuse_failures"]
    kinds = counts["by_kind"]
    assert kinds["links and special files"][0] == kinds["links and special files"][1] > 0
    assert kinds["manifest edits"][0] == kinds["manifest edits"][1] > 0
    assert kinds["memory bombs"][0] == kinds["memory bombs"][1] > 0
    assert kinds["unchanged"] == [len(SEEDS[backend]), 0]  # the folders as saved load, and are used
    # Enough mutations load to exercise every view, replay and audit on damaged traces.
    assert counts["loaded_and_used"] >= 40 and counts["tried"] >= 400
