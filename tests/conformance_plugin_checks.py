"""Helpers shared by tests/test_conformance_plugin.py and tests/test_plugin_docs_example.py: the installed suite, run.

``make_site`` writes a throwaway ``.dist-info`` holding the ``pytest11`` entry
point TorchLens's pyproject.toml declares and the given ``torchlens.backends``
entry points: on ``PYTHONPATH``, it is how an installed distribution announces
them, so nothing is installed. ``run_pytest`` runs pytest in a subprocess in a
given directory with it.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUMPY_PLUGIN = ROOT / "plugins" / "torchlens-numpy"


def pytest11() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]


def make_site(where: pathlib.Path, backends: dict[str, str], with_suite: bool = True) -> pathlib.Path:
    """A directory holding one distribution's metadata: the suite's pytest11 entry point and ``backends``."""
    site = where / "site"
    info = site / "torchlens_suite_probe-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchlens-suite-probe\nVersion: 0.0\n")
    lines = []
    if with_suite:
        lines += ["[pytest11]", *(f"{name} = {target}" for name, target in pytest11().items())]
    lines += ["[torchlens.backends]", *(f"{name} = {target}" for name, target in backends.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return site


def run_pytest(
    cwd: pathlib.Path,
    site: pathlib.Path,
    *args: str,
    extra_path: tuple[pathlib.Path, ...] = (),
    write_bytecode: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``pytest -q *args`` in ``cwd``; ``write_bytecode``: let Python and pytest write their caches as they would."""
    dropped = (
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
        "PYTEST_ADDOPTS",
        *(("PYTHONDONTWRITEBYTECODE",) if write_bytecode else ()),
    )
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (site, *extra_path, NUMPY_PLUGIN))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def counts(output: str) -> dict[str, int]:
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|error)", output)}
