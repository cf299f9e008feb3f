"""Runs the installed conformance suite from this checkout: ``pytest conformance --backend NAME``.

The checks and their parametrization live in the ``torchlens.conformance``
package (a pytest plugin: ``pytest --torchlens-backend NAME`` runs them from
anywhere). This conftest keeps this checkout's spelling of the options and
adds its expected failures, ``torchlens/conformance/expected_failures/<backend>.txt``.
"""

from __future__ import annotations

import pathlib

import pytest

# Loaded by the pytest11 entry point already when TorchLens is installed with its current metadata; named
# here too for an install made before the entry point existed (a no-op otherwise: the names are the same).
pytest_plugins = ["torchlens.conformance.plugin"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchlens conformance (this checkout)")
    group.addoption(
        "--backend", action="append", default=[], help="backend to check (repeatable); default: every available backend"
    )
    group.addoption(
        "--expected-failures",
        action="append",
        default=[],
        help="extra expected-failures file (lines 'case[::check]  # reason')",
    )
    group.addoption("--include-slow", action="store_true", help="also run cases marked slow")
    group.addoption(
        "--no-untraced",
        action="store_true",
        help="audit without the untraced rerun (trace.audit(untraced=True) is the default)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # imported here, not at the top: pytest imports (and assertion-rewrites) the pytest_plugins above itself
    from torchlens.conformance.plugin import BUILT_IN_EXPECTED_FAILURES, SuiteSettings, configure_suite

    extra = tuple(pathlib.Path(p) for p in config.getoption("--expected-failures"))
    configure_suite(
        config,
        SuiteSettings(
            backends=tuple(config.getoption("--backend")),
            expected_failures=(BUILT_IN_EXPECTED_FAILURES, *extra),
            include_slow=config.getoption("--include-slow"),
            untraced=not config.getoption("--no-untraced"),
        ),
    )
