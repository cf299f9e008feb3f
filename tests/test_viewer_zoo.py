"""The viewer opens every conformance-zoo trace of every backend installed here, in a real browser.

For each case: the page loads with no console error and no request, and expanded, it draws every op of the
trace as its own node. (Capturing the zoo is the conformance suite's job: a case whose capture fails here is
skipped, saying why.)
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from viewer_checks import Page, browser

import torchlens as tl
from torchlens_core.backend.manager import backend_infos, backend_named


def _cases() -> list[Any]:
    found = []
    for info in backend_infos():
        if not info.available:
            continue
        for case in backend_named(info.name).conformance_cases() or []:
            if not case.slow:
                found.append(pytest.param(info.name, case, id=f"{info.name}-{case.name}"))
    return found


@pytest.fixture(scope="module")
def chromium() -> Any:
    with browser() as found:
        yield found


@pytest.mark.parametrize(("backend", "case"), _cases())
def test_the_viewer_opens_every_zoo_trace(backend: str, case: Any, chromium: Any, tmp_path: pathlib.Path) -> None:
    model, args, kwargs = case.build()
    if case.reset is not None:
        case.reset()
    try:
        trace = tl.trace(model, *args, backend=backend, **kwargs)
    except tl.TorchLensError as error:
        pytest.skip(f"the capture fails here (the conformance suite reports it): {error}")
    page = Page(chromium, tl.view(trace, tmp_path / "zoo.html"))
    try:
        page.clean()
        page.page.click("#tl-expand")
        assert sorted(page.visible_ops()) == list(range(len(trace.ops)))
        page.clean()
    finally:
        page.close()
