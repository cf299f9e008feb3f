"""The pytest plugin that runs the conformance suite against one backend, from any directory.

Installed with TorchLens under the ``pytest11`` entry point, so every pytest
run loads it; it stays inert (it adds its options, and collects nothing)
unless asked with ``--torchlens-backend``::

    pytest --torchlens-backend mybackend                                 # the suite alone
    pytest --torchlens-backend mybackend --torchlens-expected-failures xfails.txt
    pytest tests --torchlens-backend mybackend                           # your tests, then the suite

Asked, it adds the suite's module (:mod:`torchlens.conformance.checks`, inside
the installed package) to what pytest collects: alone when no paths were
given on the command line, after them otherwise. Pytest's rootdir, and so its
``.pytest_cache``, is the directory it runs in, never TorchLens's install; the
suite's module is imported before collection, not through pytest's assertion
rewriter, so pytest writes nothing there.

A checkout that keeps its own copy of the suite's test functions (TorchLens's
``conformance/`` does: ``pytest conformance --backend NAME``) hands its
settings to :func:`configure_suite` from its ``conftest.py`` instead.
"""

from __future__ import annotations

import importlib
import pathlib
from typing import Any

import attrs
import pytest

# The fixture every check takes: (backend name, Case). Named for TorchLens so that the parametrization
# below never touches another project's tests, which run with this plugin loaded too.
CASE_FIXTURE = "torchlens_case"
SUITE_MODULE = "torchlens.conformance.checks"


@attrs.frozen
class SuiteSettings:
    """What the suite runs: backends (empty: every available one), expected failures, slow cases, untraced."""

    backends: tuple[str, ...] = ()
    # files of 'case[::check]  # reason' lines, or directories holding one '<backend>.txt' file per backend
    expected_failures: tuple[pathlib.Path, ...] = ()
    include_slow: bool = False
    untraced: bool = True


# The built-in backends' expected failures ('<backend>.txt'), shipped with the suite: an installed run of
# `pytest --torchlens-backend torch` knows them as a checkout's `pytest conformance --backend torch` does.
BUILT_IN_EXPECTED_FAILURES = pathlib.Path(__file__).parent / "expected_failures"

_SETTINGS = pytest.StashKey[SuiteSettings]()
_SUITE_FILE = pytest.StashKey[str]()
# The suite's node id: its path inside TorchLens, whatever directory pytest runs in (a file outside the
# rootdir would otherwise get an empty one, and its checks read "::test_audit_clean[...]").
SUITE_NODEID = "torchlens/conformance/checks.py"
# Each backend's zoo, asked for once a session: every check of a case then gets the same (backend, case)
# parameter, so the module-scoped capture in checks.py is made once per case.
_ZOOS = pytest.StashKey[dict[str, list[Any]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchlens conformance", "TorchLens backend conformance suite")
    group.addoption(
        "--torchlens-backend",
        action="append",
        default=[],
        metavar="NAME",
        help="run TorchLens's conformance suite against this backend (repeatable)",
    )
    group.addoption(
        "--torchlens-expected-failures",
        action="append",
        default=[],
        metavar="PATH",
        help="expected failures: a file of 'case[::check]  # reason' lines, or a directory of "
        "'<backend>.txt' files (repeatable); entries are strict: a listed check that passes fails, but for one "
        "written '?case[::check]', which fails on some machines only",
    )
    group.addoption("--torchlens-include-slow", action="store_true", help="also run cases marked slow")
    group.addoption(
        "--torchlens-no-untraced",
        action="store_true",
        help="audit without the untraced rerun (trace.audit(untraced=True) is the default)",
    )


def configure_suite(config: pytest.Config, settings: SuiteSettings) -> None:
    """Settings for a checkout that collects the suite's checks itself (TorchLens's own ``conformance/``)."""
    config.stash[_SETTINGS] = settings


def suite_settings(config: pytest.Config) -> SuiteSettings:
    """The settings :func:`configure_suite` gave, or those of the ``--torchlens-*`` options."""
    if _SETTINGS in config.stash:
        return config.stash[_SETTINGS]
    return SuiteSettings(
        backends=tuple(config.getoption("torchlens_backend")),
        expected_failures=(
            BUILT_IN_EXPECTED_FAILURES,
            *(pathlib.Path(p) for p in config.getoption("torchlens_expected_failures")),
        ),
        include_slow=config.getoption("torchlens_include_slow"),
        untraced=not config.getoption("torchlens_no_untraced"),
    )


def suite_path() -> str:
    """The file of the installed suite's checks, imported now.

    Imported here, before collection, so that pytest collects the module
    already loaded instead of loading it through its assertion rewriter,
    which would write a cached copy next to it, into TorchLens's install.
    """
    return str(importlib.import_module(SUITE_MODULE).__file__)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: the shared backend conformance suite")
    for path in config.getoption("torchlens_expected_failures"):
        if not pathlib.Path(path).exists():
            raise pytest.UsageError(f"--torchlens-expected-failures {path}: no such file or directory")
    if not config.getoption("torchlens_backend"):
        return
    from torchlens_core.backend.manager import resolve_backend
    from torchlens_core.ir.errors import BackendNotFoundError

    for name in config.getoption("torchlens_backend"):
        try:
            resolve_backend(name)
        except BackendNotFoundError as exc:  # before collection: one line, not a traceback per check
            raise pytest.UsageError(f"--torchlens-backend {name}: {exc}") from exc
    suite = config.stash[_SUITE_FILE] = suite_path()
    if config.args_source == pytest.Config.ArgsSource.ARGS:  # paths given: the suite runs after them
        if suite not in config.args:
            config.args.append(suite)
    else:  # none given: the suite alone, not the testpaths or the directory pytest runs in
        config.args[:] = [suite]


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: pathlib.Path, parent: pytest.Collector) -> pytest.Module | None:
    if str(module_path) != parent.config.stash.get(_SUITE_FILE, None):
        return None
    return pytest.Module.from_parent(parent, path=module_path, nodeid=SUITE_NODEID)


# An entry starting with this fails on some machines only (a kernel the framework has on some CPUs): not strict.
MACHINE_DEPENDENT = "?"


def load_expected_failures(path: pathlib.Path) -> dict[str, str]:
    """``{"case" or "case::check": reason}`` from a file of ``case[::check]  # reason`` lines; an entry written
    ``?case[::check]`` keeps its ``?`` (:data:`MACHINE_DEPENDENT`) in front of its reason."""
    entries: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry, _, reason = line.partition("#")
            entry, reason = entry.strip(), reason.strip() or "expected failure"
            if entry.startswith(MACHINE_DEPENDENT):
                entry, reason = entry[1:].strip(), MACHINE_DEPENDENT + reason
            if entry:
                entries[entry] = reason
    return entries


def _expected_failures(settings: SuiteSettings, backend: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for path in settings.expected_failures:
        entries.update(load_expected_failures(path / f"{backend}.txt" if path.is_dir() else path))
    return entries


def _backends(settings: SuiteSettings) -> list[str]:
    from torchlens_core.backend.manager import backend_infos, resolve_backend

    if settings.backends:
        return [resolve_backend(name).name for name in settings.backends]
    return [info.name for info in backend_infos() if info.available]


def _zoo(config: pytest.Config, backend: str) -> list[Any]:
    from torchlens_core.backend.manager import backend_named

    zoos = config.stash.setdefault(_ZOOS, {})
    if backend not in zoos:
        zoos[backend] = list(backend_named(backend).conformance_cases() or [])
        if not zoos[backend]:
            raise pytest.UsageError(
                f"the {backend} backend has no conformance cases: implement "
                "torchlens_conformance_cases (Backend.conformance_cases) to return its zoo"
            )
    return zoos[backend]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CASE_FIXTURE not in metafunc.fixturenames:
        return
    config = metafunc.config
    settings = suite_settings(config)
    check = metafunc.function.__name__.removeprefix("test_")
    params = []
    for backend in _backends(settings):
        xfails = _expected_failures(settings, backend)
        for case in _zoo(config, backend):
            marks: list[Any] = []
            reason = xfails.get(f"{case.name}::{check}") or xfails.get(case.name)
            if reason:
                strict = not reason.startswith(MACHINE_DEPENDENT)
                marks.append(pytest.mark.xfail(reason=reason.removeprefix(MACHINE_DEPENDENT), strict=strict))
            if case.slow and not settings.include_slow:
                marks.append(pytest.mark.skip(reason="slow case: run with --torchlens-include-slow"))
            params.append(pytest.param((backend, case), id=f"{backend}-{case.name}", marks=marks))
    metafunc.parametrize(CASE_FIXTURE, params, scope="module")
