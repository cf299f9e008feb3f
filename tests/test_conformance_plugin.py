"""The installed conformance suite (``pytest --torchlens-backend NAME``), run as a plugin author runs it.

Each test runs pytest in a subprocess, in a temporary directory, with nothing
installed: the entry points TorchLens's pyproject.toml declares (``pytest11``)
and the numpy plugin's ``torchlens.backends`` entry point are written into a
throwaway ``.dist-info`` on ``PYTHONPATH``, which is how an installed
distribution announces them. So the suite is found through the very entry
point a ``pip install torchlens`` registers, not through this checkout's
``conformance/`` folder.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

from conformance_plugin_checks import NUMPY_PLUGIN, ROOT, counts, make_site, pytest11, run_pytest


def test_the_entry_point_names_the_plugin_module() -> None:
    # The name equals the module, so conformance/conftest.py's pytest_plugins naming the module is a no-op
    # where the entry point already loaded it (pytest refuses one plugin registered under two names).
    assert pytest11() == {"torchlens.conformance.plugin": "torchlens.conformance.plugin"}


def test_the_installed_suite_runs_from_any_directory(tmp_path: pathlib.Path) -> None:
    site = make_site(tmp_path, {"numpy": "torchlens_numpy.plugin"})
    work = tmp_path / "my_plugin_repo"
    work.mkdir()
    (work / "test_mine.py").write_text("def test_mine():\n    assert True\n")  # the author's own tests
    package = ROOT / "torchlens" / "conformance"
    started = time.time()
    done = run_pytest(work, site, "--torchlens-backend", "numpy", "-rs", write_bytecode=True)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    found = counts(output)
    # every check of every case of the zoo: 14 cases x 9 checks, those that do not apply skipped with a reason
    assert found.get("passed", 0) + found.get("skipped", 0) >= 14 * 9, output[-2000:]
    assert found.get("passed", 0) >= 14 * 6, output[-2000:]
    assert "test_mine" not in output and "checks.py" in output  # no paths given: the suite alone
    assert (work / ".pytest_cache").is_dir()  # the rootdir is where pytest ran...
    written = [p for p in package.rglob("*") if p.stat().st_mtime >= started and "pytest" in p.name]
    assert not written, f"pytest wrote into TorchLens's package: {written}"  # ...never TorchLens's install
    # with paths given, the suite runs after them
    both = run_pytest(work, site, "test_mine.py", "--torchlens-backend", "numpy", "-k", "mine or mlp")
    assert both.returncode == 0, (both.stdout + both.stderr)[-3000:]
    assert counts(both.stdout)["passed"] >= 1 + 6, both.stdout[-2000:]


def test_the_plugin_is_inert_without_its_option(tmp_path: pathlib.Path) -> None:
    site = make_site(tmp_path, {"numpy": "torchlens_numpy.plugin"})
    (tmp_path / "test_mine.py").write_text(
        "def test_mine(request):\n    assert request.config.pluginmanager.has_plugin('torchlens.conformance.plugin')\n"
    )
    done = run_pytest(tmp_path, site, "test_mine.py")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert counts(done.stdout) == {"passed": 1}


def _mlp_parity_listed(tmp_path: pathlib.Path, entry: str, *options: str) -> subprocess.CompletedProcess[str]:
    """The numpy zoo's mlp output-parity check (which passes), run with ``entry`` as its expected failure."""
    site = make_site(tmp_path, {"numpy": "torchlens_numpy.plugin"})
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(entry + "\n")
    return run_pytest(
        tmp_path,
        site,
        "--torchlens-backend",
        "numpy",
        "--torchlens-expected-failures",
        str(xfails),
        "-k",
        "output_parity and mlp",
        *options,
    )


def test_expected_failures_are_strict(tmp_path: pathlib.Path) -> None:
    done = _mlp_parity_listed(tmp_path, "mlp::output_parity  # listed, but it passes: a strict entry fails the run")
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    assert "XPASS(strict)" in done.stdout and "listed, but it passes" in done.stdout


def test_an_expected_failure_of_some_machines_only_may_pass(tmp_path: pathlib.Path) -> None:
    """``?case::check``: a failure that depends on the machine (a kernel some CPUs have) is not strict."""
    done = _mlp_parity_listed(tmp_path, "?mlp::output_parity  # fails where a kernel is missing; passes here", "-rX")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert counts(done.stdout) == {"xpassed": 1} and "passes here" in done.stdout, done.stdout[-2000:]


# Deliberately broken copies of the numpy plugin. UNLINK: np.maximum's inputs reach the recorder unlinked, as
# arrays that came back through C++ as new Python objects would, so they enter the graph as constants.
# UNSEEN: np.tanh runs unrecorded, as a framework function a module bound before the capture would, so
# the matmul after it reads a constant that is really the tanh of the inputs.
BREAK = """
import pytest
from torchlens_numpy import capture

@pytest.fixture(autouse=True, scope="session")
def broken():
    original = capture.Recorder.call

    def call(self, name, fn, args, kwargs, targets, random=False):
        if name == {unlinked!r}:
            args = tuple(capture.plain_leaf(a) for a in args)  # the link to the producing op is lost
        if name == {unseen!r}:
            return fn(*(capture.plain_leaf(a) for a in args), **kwargs)  # never recorded
        return original(self, name, fn, args, kwargs, targets, random)

    capture.Recorder.call = call
    yield
    capture.Recorder.call = original
"""


def _mlp_label(site: pathlib.Path, func_name: str, nth: int = 1) -> str:
    """The label of the nth ``func_name`` op in the zoo's mlp, traced by the unbroken plugin in a clean process."""
    code = (
        "import torchlens as tl\nfrom torchlens_numpy.zoo import cases\n"
        "fn, args, kwargs = next(c for c in cases() if c.name == 'mlp').build()\n"
        "t = tl.trace(fn, *args, backend='numpy', **kwargs)\n"
        f"print([op.label for op in t.ops if op.func_name == {func_name!r}][{nth - 1}])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(site), str(NUMPY_PLUGIN)))}
    label = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert label.startswith(f"{func_name}_"), label
    return label


def _run_broken(tmp_path: pathlib.Path, unlinked: str = "", unseen: str = "") -> tuple[str, set[str]]:
    site = make_site(tmp_path, {"numpy": "torchlens_numpy.plugin"})
    work = tmp_path / "broken"
    work.mkdir()
    (work / "conftest.py").write_text(BREAK.format(unlinked=unlinked, unseen=unseen))
    done = run_pytest(work, site, "--torchlens-backend", "numpy", "-k", "mlp")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    return output, set(re.findall(r"FAILED \S*::test_(\w+)\[numpy-mlp\]", output))


def test_a_plugin_that_loses_an_edge_fails_naming_the_op(tmp_path: pathlib.Path) -> None:
    output, failed = _run_broken(tmp_path, unlinked="maximum")
    # the audit's tripwire (audit_clean) and the lost-edge check each catch it; replay on other inputs is skipped:
    # the broken plugin reads the value through tolist(), which the graph records, so replay refuses other inputs
    assert {"no_lost_edges", "audit_clean"} <= failed, output[-4000:]
    label = _mlp_label(tmp_path / "site", "maximum")
    add = _mlp_label(tmp_path / "site", "add", 2)  # h @ w2 + b2, whose output maximum reads
    assert (
        f"{label}: reads an array constant (args[0], shape (4, 16), float32) bitwise equal to the output of "
        f"{add}" in output
    ), output[-4000:]
    assert f"{label}: reads an array constant (args[0], shape (4, 16), float32) that has other values" in output
    assert "lost edge" in output


def test_a_plugin_that_misses_a_call_fails_naming_the_op_after_it(tmp_path: pathlib.Path) -> None:
    output, failed = _run_broken(tmp_path, unseen="tanh")
    # tanh's output equals no recorded value: only running on other inputs can tell it from a constant
    assert {"no_lost_edges", "replay_on_other_inputs"} <= failed, output[-4000:]
    # tanh(...) @ w2, reading what tanh gave: the second matmul (its index is one less, tanh being unrecorded)
    label = _mlp_label(tmp_path / "site", "matmul", 2).rpartition("_")[0]
    assert re.search(
        rf"{label}_\d+: reads an array constant \(args\[0\], shape \(4, 16\), float32\) that has other "
        "values",
        output,
    ), output[-4000:]


# The numpy plugin with its ArrayOps.mean broken (a sum where a mean is asked for), declaring ``contract``.
# Patched as conftest.py is imported, before the suite resolves the backend and caches what it declares.
BROKEN_MEAN = """
import attrs
from torchlens_core.backend import manager
from torchlens_numpy import arrays
from torchlens_numpy.plugin import NumpyBackend

declared = NumpyBackend.info
NumpyBackend.info = lambda self: attrs.evolve(declared(self), contract={contract})
manager._INFOS = None
arrays.ARRAY_OPS.mean = lambda x, axes: arrays.ARRAY_OPS.sum(x, axes[0])
"""


def _run_broken_mean(tmp_path: pathlib.Path, contract: int) -> tuple[int, str]:
    work = tmp_path / f"contract{contract}"
    work.mkdir()
    site = make_site(work, {"numpy": "torchlens_numpy.plugin"})
    (work / "conftest.py").write_text(BROKEN_MEAN.format(contract=contract))
    done = run_pytest(work, site, "--torchlens-backend", "numpy", "-k", "mlp and array_ops_agree_with_numpy", "-rfx")
    return done.returncode, done.stdout + done.stderr


def test_a_rule_of_contract_3_fails_a_backend_declaring_3_and_warns_one_declaring_2(tmp_path: pathlib.Path) -> None:
    """A new rule warns for one release before it fails (CHANGELOG.md, "For plugin authors"): the same broken
    ArrayOps fail the check under contract 3, and under contract 2 make it an xfail with a PluginContractWarning
    that names the check, what failed and the version to declare."""
    code, output = _run_broken_mean(tmp_path, 3)
    assert code == 1 and "FAILED" in output and "mean over (0,) of a float32 array is off NumPy's" in output, output[
        -3000:
    ]
    code, output = _run_broken_mean(tmp_path, 2)
    assert code == 0, output[-3000:]
    assert counts(output) == {"xfailed": 1}, output[-3000:]
    assert (
        "PluginContractWarning" in output
        and "declares plugin contract 2; test_array_ops_agree_with_numpy is a rule of contract 3" in output
        and "BackendInfo(contract=3)" in output
    ), output[-3000:]


def copy_template(where: pathlib.Path, package: str, backend: str) -> pathlib.Path:
    """The numpy plugin copied as docs/writing-a-backend.md says to start a backend: package and name renamed."""
    target = where / package
    for source in (NUMPY_PLUGIN / "torchlens_numpy").glob("*.py"):
        text = source.read_text().replace("torchlens_numpy", package)
        text = text.replace('NAME = "numpy"', f'NAME = "{backend}"')
        (target / source.name).parent.mkdir(parents=True, exist_ok=True)
        (target / source.name).write_text(text)
    return where


def test_a_plugin_copied_from_the_template_passes_the_installed_suite(tmp_path: pathlib.Path) -> None:
    code = copy_template(tmp_path / "src", "torchlens_mycopy", "mycopy")
    site = make_site(tmp_path, {"mycopy": "torchlens_mycopy.plugin"})
    work = tmp_path / "mycopy_repo"
    work.mkdir()
    done = run_pytest(work, site, "--torchlens-backend", "mycopy", extra_path=(code,))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    found = counts(output)
    assert found.get("passed", 0) >= 14 * 6 and "failed" not in found, output[-2000:]
    assert (
        "[mycopy-mlp]"
        in run_pytest(work, site, "--torchlens-backend", "mycopy", "--collect-only", extra_path=(code,)).stdout
    )


def test_this_checkouts_conformance_folder_runs_with_the_entry_point_installed(tmp_path: pathlib.Path) -> None:
    # `pytest conformance --backend NAME` (nox, .ci/run) where the pytest11 entry point has loaded the plugin
    # already: conftest.py's pytest_plugins must not register it twice, and --backend must still pick the zoo.
    site = make_site(tmp_path, {"numpy": "torchlens_numpy.plugin"})
    done = run_pytest(
        ROOT, site, str(ROOT / "conformance"), "--backend", "numpy", "-k", "mlp and parity", "-p", "no:cacheprovider"
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert counts(done.stdout) == {"passed": 1}, done.stdout[-2000:]
    assert "Module already imported" not in done.stdout + done.stderr


def test_a_missing_expected_failures_file_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    site = make_site(tmp_path, {"numpy": "torchlens_numpy.plugin"})
    done = run_pytest(
        tmp_path, site, "--torchlens-backend", "numpy", "--torchlens-expected-failures", str(tmp_path / "nope.txt")
    )
    assert done.returncode == 4, (done.stdout + done.stderr)[-2000:]  # pytest's usage error
    assert "nope.txt: no such file or directory" in done.stderr


def test_an_unknown_backend_is_named_with_the_registered_ones(tmp_path: pathlib.Path) -> None:
    site = make_site(tmp_path, {"numpy": "torchlens_numpy.plugin"})
    done = run_pytest(tmp_path, site, "--torchlens-backend", "mlx")
    assert done.returncode == 4, (done.stdout + done.stderr)[-2000:]  # pytest's usage error, before collection
    assert "--torchlens-backend mlx: no backend named 'mlx'" in done.stderr and "numpy (ready)" in done.stderr


def test_the_built_in_expected_failures_ship_with_the_suite() -> None:
    """An installed `pytest --torchlens-backend torch` applies torch's list, as `pytest conformance` does here."""
    import tomllib

    from torchlens.conformance.plugin import BUILT_IN_EXPECTED_FAILURES, SuiteSettings, _expected_failures

    entries = _expected_failures(SuiteSettings(expected_failures=(BUILT_IN_EXPECTED_FAILURES,)), "torch")
    assert "self_attention_fused::gradients_match_the_framework" in entries
    assert _expected_failures(SuiteSettings(expected_failures=(BUILT_IN_EXPECTED_FAILURES,)), "numpy") == {}
    root = pathlib.Path(__file__).parent.parent
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "*.txt" in data["torchlens.conformance.expected_failures"]  # a wheel carries the lists
