"""Every docs page as a reader meets it: its Python blocks pasted, in order, into one fresh session per page.

Each page sets up what it uses (imports, a model, inputs): its ```python
blocks run in a fresh interpreter, statement by statement as the interactive
prompt runs them (tests/readme_session.py, as for the README), in an empty
temporary folder. A block right after ``<!-- example: NAME.py -->`` is a file
the reader saves: it is written to the folder as NAME.py and imported there.
A comment ``# ... -> EXPECTED`` states what its statement printed or showed
(``...`` is any text), and a ```text block right after a Python block what
that block printed, checked as in tests/test_readme.py.

Code not meant to run as written (shell commands, sketches with placeholders,
per-framework variants of a line) is fenced as something other than
```python: ```text, ```bash, ```python-sketch.

A page that needs a framework runs in the nox session whose virtualenv has it
(PAGES below) and is skipped elsewhere, so each session (core, torch, jax, tf,
paddle, tinygrad) runs the pages it can.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import attrs
import pytest
from doc_checks import expectations, fits
from readme_session import run_session

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@attrs.frozen
class Page:
    """What a page's blocks need, beyond torchlens and NumPy."""

    modules: tuple[str, ...] = ()  # importable modules: the page is skipped where one is missing
    programs: tuple[str, ...] = ()  # programs on PATH (dot: the page draws)
    session: str = "torch"  # the nox session whose virtualenv runs it (all of them run tests/: the others skip it)
    delegated: str = ""  # a test that runs the page's blocks itself, in the environments they need
    pending: str = ""  # a known failure, owned elsewhere: the page runs, expected to fail, until fixed


TORCHVISION = ("torch", "torchvision")
PAGES = {
    "api.md": Page(session="core"),
    "backends.md": Page(session="core"),
    "backend-paddle.md": Page(("paddle",), ("dot",), session="paddle"),
    "backend-tf.md": Page(("tensorflow", "keras"), ("dot",), session="tf"),
    "backend-tinygrad.md": Page(("tinygrad",), ("dot",), session="tinygrad"),
    "backward.md": Page(TORCHVISION),
    # three scripts, for the torch, JAX and NumPy-only environments: nox -s compare runs them
    "compare.md": Page(session="compare", delegated="tests/test_docs_compare.py"),
    "distributed.md": Page(("torch",)),
    "extract.md": Page((*TORCHVISION, "zarr", "dask", "distributed")),
    "facets.md": Page(("torch", "timm", "transformers")),
    "fields.md": Page(TORCHVISION),
    "intervention_api.md": Page((*TORCHVISION, "pandas")),
    "metadata.md": Page(("torch",)),
    "saving.md": Page(TORCHVISION),
    "selective-capture.md": Page(TORCHVISION),
    "viewer.md": Page(TORCHVISION, ("dot",)),
    "writing-a-backend.md": Page(session="core"),  # NumPy only: every session runs it
}


# -- reading a page -------------------------------------------------------------------------------
@attrs.frozen
class Block:
    """One fenced block: its info string, code, the page line its code starts on, the comment just above it."""

    lang: str
    code: str
    line: int
    label: str


def fenced_blocks(text: str) -> list[Block]:
    """The page's backtick-fenced blocks, indented ones (in a list item) included, dedented.

    As in CommonMark, a fence is three or more backticks whose info string holds no backtick (so a line of
    prose that starts with inline code is no fence), closed by at least as many backticks and nothing else.
    """
    blocks: list[Block] = []
    fence, start, body, indent, above, lang = "", 0, [], 0, "", ""
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip()
        opening = re.fullmatch(r"(`{3,})([^`]*)", stripped)
        if not fence and opening:
            fence, lang, start, body = opening.group(1), opening.group(2).strip(), number + 1, []
            indent, above = len(line) - len(stripped), lines[number - 2].strip() if number > 1 else ""
        elif fence and re.fullmatch(rf"{fence}`*\s*", stripped):
            blocks.append(Block(lang, "\n".join(body) + "\n", start, above))
            fence = ""
        elif fence:
            body.append(line[indent:] if line[:indent].isspace() else line)
    assert not fence, "an unclosed code fence"
    return blocks


def python_blocks(page: str) -> list[Block]:
    return [b for b in fenced_blocks((DOCS / page).read_text()) if b.lang == "python"]


def example_file(block: Block) -> str | None:
    """NAME.py for a block the page introduces with ``<!-- example: NAME.py -->``: a file to save."""
    found = re.fullmatch(r"<!-- example: (\w+\.py) -->", block.label)
    return found.group(1) if found else None


# -- running one --------------------------------------------------------------------------------
def run_page(page: str, folder: pathlib.Path) -> tuple[list[Block], dict]:
    """The page's blocks in one fresh interpreter in ``folder``: example files saved and imported, the rest pasted."""
    blocks = python_blocks(page)
    pasted = []
    for block in blocks:
        name = example_file(block)
        if name is None:
            pasted.append({"code": block.code, "line": block.line})
        else:  # the reader saves it beside their session and imports it
            (folder / name).write_text(block.code)
            pasted.append({"code": f"import {name[:-3]}\n", "line": block.line})
    path = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]  # the saved files import, as from `python`
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "TORCHLENS_CACHE": str(folder / "cache"),
        "OMP_NUM_THREADS": "1",
        "BROWSER": "true",
    }  # trace.show() outside Jupyter opens a browser: here, a program that does nothing
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "readme_session.py"), str(DOCS / page), str(folder / "result.json")],
        input=json.dumps(pasted),
        text=True,
        cwd=folder,
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return blocks, json.loads((folder / "result.json").read_text())


def failures(page: str, blocks: list[Block], result: dict) -> list[str]:
    """The first error, every statement whose output is not what its comment states, and every ```text block
    right after a Python block that is not what that block printed. ``blocks``: all the page's fenced blocks."""
    wrong = [f"docs/{page}: {s['error']}" for s in result["statements"] if "error" in s]
    python = [b for b in blocks if b.lang == "python"]
    for number, block in enumerate(python):
        if example_file(block) is not None:
            continue
        statements = [s for s in result["statements"] if s["block"] == number]
        for line, expected in expectations(block.code).items():
            owner = [s for s in statements if s["first"] <= line <= s["last"]]
            if not owner and not any("error" in s for s in result["statements"]):
                wrong.append(f"docs/{page}:{block.line + line - 1}: an expectation on a line that is no statement")
            elif owner and not fits(expected, owner[0]["output"]):
                wrong.append(
                    f"docs/{page}:{block.line + line - 1}: says {expected!r}, "
                    f"printed {owner[0]['output'].strip()[:300]!r}"
                )
    for before, after in zip(blocks, blocks[1:]):
        if before.lang == "python" and after.lang == "text":
            printed = "".join(s["output"] for s in result["statements"] if s["block"] == python.index(before))
            if after.code not in printed:
                wrong.append(f"docs/{page}:{after.line}: not what the block above prints:\n{printed[-2000:]}")
    return wrong


def _params() -> list:
    params = []
    for page, needs in PAGES.items():
        marks = [pytest.mark.xfail(reason=needs.pending, strict=False)] if needs.pending else []
        params.append(pytest.param(page, marks=marks, id=page))
    return params


@pytest.mark.parametrize("page", _params())
def test_the_page_runs_as_written(page: str, tmp_path: pathlib.Path) -> None:
    needs = PAGES[page]
    if needs.delegated:
        pytest.skip(f"{needs.delegated} runs docs/{page} (nox -s {needs.session})")
    missing = [m for m in needs.modules if importlib.util.find_spec(m) is None]
    missing += [p for p in needs.programs if shutil.which(p) is None]
    if missing:
        pytest.skip(f"docs/{page} needs {', '.join(missing)}: nox -s {needs.session} runs it")
    blocks, result = run_page(page, tmp_path)
    wrong = failures(page, fenced_blocks((DOCS / page).read_text()), result)
    assert not wrong, "\n".join(wrong)
    assert {s["block"] for s in result["statements"]} == set(range(len(blocks)))


# -- the table above covers the docs ---------------------------------------------------------------
def test_every_page_with_python_blocks_is_listed() -> None:
    with_python = {p.name for p in DOCS.glob("*.md") if python_blocks(p.name)}
    assert with_python == set(PAGES), (
        "PAGES must name exactly the docs pages with ```python blocks: "
        f"unlisted {sorted(with_python - set(PAGES))}, "
        f"without any {sorted(set(PAGES) - with_python)}"
    )


def test_every_page_is_run_by_a_nox_session() -> None:
    """Each page's session runs tests/ (core and one per backend), or names the test that runs the page."""
    noxfile = (ROOT / "noxfile.py").read_text()
    for page, needs in PAGES.items():
        if needs.delegated:
            assert f"docs/{page}" in (ROOT / needs.delegated).read_text(), f"{needs.delegated} no longer runs {page}"
            assert f'"{needs.delegated}"' in noxfile, f"no nox session runs {needs.delegated}"
        else:  # BACKENDS in noxfile.py: name -> (extras, program); each such session and core run tests/
            assert needs.session == "core" or f'"{needs.session}": (' in noxfile, f"no nox session {needs.session}"


def test_the_checks_catch_a_failing_block_and_a_wrong_comment(tmp_path: pathlib.Path) -> None:
    """The machinery fails a page whose block raises, and one whose comment states what was not printed."""
    code = "x = 2 ** 10\nx  # -> 1024\nx + 1  # -> 1024\nprint(x - 1)\n"
    blocks = [Block("python", code, 5, ""), Block("text", "1022\n", 11, "")]
    result = run_session([{"code": code, "line": 5}], "<page>")
    assert failures("fake.md", blocks, result) == [
        "docs/fake.md:7: says '1024', printed '1025'",
        "docs/fake.md:11: not what the block above prints:\n1024\n1025\n1023\n",
    ]
    raising = [Block("python", "import torchlens_core\nundefined_name\n", 3, "")]
    result = run_session([{"code": b.code, "line": b.line} for b in raising], "<page>")
    assert "NameError" in failures("fake.md", raising, result)[0]
    labelled = fenced_blocks(
        "<!-- example: mod.py -->\n```python\nA = 1\n```\n  ```python-sketch\n  f(...)\n  ```\n"
        "```` ```text ```` is prose\n````markdown\n```python\n````\n"
    )
    assert [example_file(b) for b in labelled] == ["mod.py", None, None] and labelled[1].code == "f(...)\n"
    assert labelled[2] == Block("markdown", "```python\n", 10, "```` ```text ```` is prose")
