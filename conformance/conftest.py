"""Collects (backend, case) pairs for the conformance suite."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

HERE = pathlib.Path(__file__).parent
# Each backend's zoo, asked for once a session: every check of a case then gets the same
# (backend, case) parameter, so the module-scoped capture in test_conformance.py is made once.
_ZOOS = pytest.StashKey[dict[str, list[Any]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchlens conformance")
    group.addoption("--backend", action="append", default=[],
                    help="backend to check (repeatable); default: every available backend")
    group.addoption("--expected-failures", action="append", default=[],
                    help="extra expected-failures file (lines 'case[::check]  # reason')")
    group.addoption("--include-slow", action="store_true", help="also run cases marked slow")
    group.addoption("--no-untraced", action="store_true",
                    help="audit without the untraced rerun (trace.audit(untraced=True) is the default)")


def _backends(config: pytest.Config) -> list[str]:
    from torchlens_core.backend.manager import backend_infos, resolve_backend

    wanted = config.getoption("--backend")
    if wanted:
        return [resolve_backend(name).name for name in wanted]
    return [info.name for info in backend_infos() if info.available]


def load_expected_failures(path: pathlib.Path) -> dict[str, str]:
    entries: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry, _, reason = line.partition("#")
            if entry.strip():
                entries[entry.strip()] = reason.strip() or "expected failure"
    return entries


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: the shared backend conformance suite")


def _zoo(config: pytest.Config, backend: str) -> list[Any]:
    from torchlens_core.backend.manager import hook

    zoos = config.stash.setdefault(_ZOOS, {})
    if backend not in zoos:
        zoos[backend] = list(hook().torchlens_conformance_cases(backend=backend) or [])
    return zoos[backend]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case_id" not in metafunc.fixturenames:
        return
    config = metafunc.config
    params = []
    for backend in _backends(config):
        xfails = load_expected_failures(HERE / "expected_failures" / f"{backend}.txt")
        for extra in config.getoption("--expected-failures"):
            xfails.update(load_expected_failures(pathlib.Path(extra)))
        for case in _zoo(config, backend):
            marks: list[Any] = []
            check = metafunc.function.__name__.removeprefix("test_")
            reason = xfails.get(f"{case.name}::{check}") or xfails.get(case.name)
            if reason:
                marks.append(pytest.mark.xfail(reason=reason, strict=True))
            if case.slow and not config.getoption("--include-slow"):
                marks.append(pytest.mark.skip(reason="slow case: run with --include-slow"))
            params.append(pytest.param((backend, case), id=f"{backend}-{case.name}", marks=marks))
    metafunc.parametrize("case_id", params, scope="module")
