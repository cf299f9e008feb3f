"""docs/facets.md runs as written: its Python blocks, in order, in one namespace (their asserts are the checks)."""

from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "facets.md"


def test_the_facets_page_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("timm")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 4
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    printed = capsys.readouterr().out
    # the save= example prints the error, which names the op that holds q and what to do
    assert re.search(
        r"reads identity_\d+_\d+, whose value save= left out: capture with a save= that also picks", printed
    )
    assert namespace["patched"].interventions and namespace["ablated"].interventions
