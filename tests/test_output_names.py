"""trace.draw() and tl.view(trace) without a path write one file in the working directory (issue 36 item 12).

The default name comes from the trace's model name, which for a loaded trace
its file chose: before, ``"../../somewhere/x"`` wrote outside the working
directory, and a NUL or an overlong name raised a raw ``ValueError`` or
``OSError``. Explicit paths the system refuses raise ``OutputPathError`` too.
The trace is the committed fixture (no framework needed); drawing needs
Graphviz's ``dot``.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

import torchlens as tl
from torchlens_core.ir.errors import OutputPathError
from torchlens_core.views.filenames import default_name

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "torch_mlp_trace"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot is not installed")
HOSTILE = [
    "../../escaped",
    "{tmp}/absolute-x",
    "..",
    ".",
    "a/b\\c",
    "x\0y",
    "é" * 300,
    "<lambda>",
    "CON",
    ".hidden",
    "../",
    "",
    "\n",
    "~/home",
]


def written(root: pathlib.Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def workdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    return here


@needs_dot
@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_a_default_name_is_one_file_in_the_working_directory(workdir: pathlib.Path, name: str) -> None:
    trace = tl.load(FIXTURE)
    root = workdir.parent.parent
    trace.model_name = name.format(tmp=root)  # "{tmp}/absolute-x": an absolute path inside tmp_path
    drawn = trace.draw(file_format="svg")
    page = tl.view(trace)
    for path in (drawn, page):
        assert os.path.basename(path) == path and not path.startswith("."), path
        assert (workdir / path).is_file()
    assert written(root) == {f"a/b/{drawn}", f"a/b/{page}"}  # nothing anywhere but the working directory


def test_default_names_keep_ordinary_names_as_they_were() -> None:
    assert default_name("ResNet", "layer2", "unrolled", suffix=".pdf") == "ResNet_layer2_unrolled.pdf"
    assert default_name("ResNet", None, "rolled", suffix=".svg") == "ResNet_rolled.svg"
    assert default_name("BertModel", suffix=".html") == "BertModel.html"
    assert default_name("../../x", suffix=".html") == "x.html"
    assert default_name("Модель", None, "unrolled", suffix=".pdf") == "trace_unrolled.pdf"
    assert default_name("<lambda>", suffix=".html") == "lambda.html"
    assert default_name("nul", suffix=".html") == "_nul.html"
    assert len(default_name("x" * 10_000, suffix=".html")) < 255


@needs_dot
def test_paths_the_system_refuses_are_typed_errors(workdir: pathlib.Path) -> None:
    trace = tl.load(FIXTURE)
    cases = [
        ("no/such/folder/x", "does not exist"),
        (str(workdir), "it is a folder"),
        ("x\0y", "NUL"),
        ("x" * 300, "too long"),
    ]
    for path, why in cases:
        with pytest.raises(OutputPathError, match=why) as info:
            tl.view(trace, path + ("" if why == "it is a folder" else ".html"))
        assert isinstance(info.value, tl.TorchLensError) and isinstance(info.value, OSError)
        with pytest.raises(tl.TorchLensError, match=why):
            trace.draw(path, file_format="svg")
    assert written(workdir) == set()


@needs_dot
def test_odd_model_names_draw_with_their_title(workdir: pathlib.Path) -> None:
    trace = tl.load(FIXTURE)
    trace.model_name = 'a "quoted" \\ name\nover lines'
    svg = pathlib.Path(trace.draw(file_format="svg")).read_text()
    assert "quoted" in svg and "over lines" in svg
