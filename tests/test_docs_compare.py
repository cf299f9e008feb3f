"""docs/compare.md's worked port runs as written: torch side, JAX side, then the comparison with NumPy alone.

The two sides need their frameworks, which cannot be assumed in one
environment: ``nox -s compare`` sets ``TORCHLENS_PYTHON_TORCH`` and
``TORCHLENS_PYTHON_JAX`` to the interpreters of the torch and jax sessions.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "compare.md"


def scripts() -> dict[str, str]:
    """The doc's Python blocks that open with ``# name.py``, by name."""
    found = {}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        first = block.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            found[first[2:]] = block
    return found


def test_the_doc_names_its_three_scripts():
    assert sorted(scripts()) == ["compare.py", "jax_side.py", "torch_side.py"]


def test_the_worked_port_runs_as_written(tmp_path):
    pythons = {name: os.environ.get(f"TORCHLENS_PYTHON_{name.upper()}") for name in ("torch", "jax")}
    if not all(pythons.values()):
        pytest.skip("the torch and JAX sides run in their own environments: nox -s compare runs this")
    for name, text in scripts().items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    for python, name in (
        (pythons["torch"], "torch_side.py"),
        (pythons["jax"], "jax_side.py"),
        (sys.executable, "compare.py"),
    ):
        done = subprocess.run([python, name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    assert "torch" not in sys.modules and "jax" not in sys.modules
    # the doc's claim: the first divergence is the LayerNorm, found in the NumPy-only environment
    assert done.stdout.strip().splitlines()[-1] == "layer_norm_1_7 add_4_27 norm"
    assert "First divergence: layer_norm_1_7 ~ add_4_27 in norm" in done.stdout
