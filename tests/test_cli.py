"""The ``torchlens`` command on saved traces: summary, audit, compare, view (no framework needed to load).

References: the same calls made in Python on the loaded trace (the command must print what they give), and
exit codes that say passed (0), failed or diverged (1), not done (2).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tomllib

import torchlens as tl
from torchlens.cli import main

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "torch_mlp_trace"
ROOT = pathlib.Path(__file__).parent.parent


def test_the_command_is_installed_with_the_package() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["torchlens"] == "torchlens.cli:main"


def test_summary_prints_the_module_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(FIXTURE)]) == 0
    assert capsys.readouterr().out.strip() == tl.load(FIXTURE).summary().strip()
    assert main(["summary", str(FIXTURE), "--depth", "0"]) == 0
    assert capsys.readouterr().out.strip() == tl.load(FIXTURE).summary(depth=None).strip()


def test_compare_of_a_trace_with_itself_passes_and_of_a_changed_one_fails(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(FIXTURE), str(FIXTURE)]) == 0
    assert capsys.readouterr().out.strip() == str(tl.compare(tl.load(FIXTURE), tl.load(FIXTURE))).strip()
    changed = tl.load(FIXTURE)
    # a run whose last layer's weights were 3x: its logits, and the softmax and output computed from them
    last_linear, softmax, output = changed.ops[-3:]
    assert [op.func_name for op in changed.ops[-3:]] == ["linear", "softmax", "output"]
    logits = np.asarray(last_linear.out) * 3.0
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    like = last_linear.out  # NumPy without the framework, else the framework's tensor: saved as the trace's own
    logits, probabilities = (like.new_tensor(v) if hasattr(like, "new_tensor") else v for v in (logits, probabilities))
    last_linear.out, softmax.out, output.out = logits, probabilities, probabilities
    tl.save(changed, tmp_path / "changed")
    assert main(["compare", str(FIXTURE), str(tmp_path / "changed")]) == 1
    printed = capsys.readouterr().out
    assert printed.strip() == str(tl.compare(tl.load(FIXTURE), tl.load(tmp_path / "changed"))).strip()
    assert "diverges" in printed or "DIVERGE" in printed.upper()


def test_audit_says_what_it_needs_or_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", str(FIXTURE)])
    out, err = capsys.readouterr()
    try:
        import torch  # noqa: F401 - the trace's framework: audit replays
    except ImportError:
        assert code == 2 and "UnsupportedError" in err and "torch" in err
    else:
        assert code == 0 and "Audit: PASS" in out


def test_a_folder_that_is_not_a_trace_is_refused_with_exit_code_2(tmp_path: pathlib.Path) -> None:
    for command in (["summary", str(tmp_path)], ["audit", str(tmp_path)], ["compare", str(FIXTURE), str(tmp_path)]):
        done = subprocess.run([sys.executable, "-m", "torchlens", *command], capture_output=True, text=True)
        assert done.returncode == 2, (command, done.stderr)
        assert "TraceFileError" in done.stderr and done.stderr.startswith(f"python -m torchlens {command[0]}:")


@pytest.mark.skipif(shutil.which("torchlens") is None, reason="the package's scripts are not installed here")
def test_the_installed_script_runs() -> None:
    done = subprocess.run(["torchlens", "summary", str(FIXTURE)], capture_output=True, text=True)
    assert done.returncode == 0 and "fc1 (Linear)" in done.stdout
