import os
import pathlib
import warnings

import pytest

# A plugin that fails to load warns; the tests check backends one at a time.
warnings.filterwarnings("ignore", message="TorchLens backend plugin", category=RuntimeWarning)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow (or set TORCHLENS_RUNSLOW=1)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: minutes, not seconds; run with --runslow or TORCHLENS_RUNSLOW=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow") or os.environ.get("TORCHLENS_RUNSLOW"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or TORCHLENS_RUNSLOW=1")
    here = pathlib.Path(__file__).parent
    for item in items:
        if "slow" in item.keywords and here in item.path.parents:
            item.add_marker(skip)
