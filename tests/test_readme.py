"""The README as a new user meets it: every Python block pasted, in order, into one session after its install.

The blocks run in one fresh interpreter, statement by statement the way the
interactive prompt runs them (an expression statement shows its repr), in a
temporary working directory. What the README says is printed is checked:

- a comment ``# ... -> EXPECTED`` on a statement: what that statement printed
  or displayed is EXPECTED, where ``...`` stands for any text;
- a ```text block right after a Python block: lines that block printed, verbatim.

Every number a comment states is such an expectation, so no figure in a comment
can go stale unnoticed. The demo (``nox -s demo``) is run here too, with and
without Graphviz's ``dot`` on PATH.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tokenize
from typing import Any

import attrs
import pytest
from doc_checks import expectations, fits
from readme_session import run_session

pytest.importorskip("torch")
pytest.importorskip("torchvision")

if sys.version_info >= (3, 11):
    import tomllib
else:  # the project supports 3.10; tomllib came in 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="the README's prerequisites include Graphviz")


# -- reading the README -----------------------------------------------------------------------
@attrs.frozen
class Block:
    """One fenced code block: its language, its code and the README line its code starts on."""

    lang: str
    code: str
    line: int


def fenced_blocks(text: str) -> list[Block]:
    blocks, lang, start, body = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if lang is None and line.startswith("```"):
            lang, start, body = line[3:].strip(), number + 1, []
        elif lang is not None and line.startswith("```"):
            blocks.append(Block(lang, "\n".join(body) + "\n", start))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, "README.md has an unclosed code fence"
    return blocks


def unchecked_figures(code: str) -> list[str]:
    """Comments that state a number outside an expectation (``SHA-256``, ``conv2d``: names, not figures)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            description = token.string.split("-> ", 1)[0]
            if re.search(r"(?<![\w-])\d", description):
                found.append(token.string)
    return found


# -- running it -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def readme_blocks() -> list[Block]:
    return fenced_blocks(README.read_text())


@pytest.fixture(scope="module")
def session(readme_blocks: list[Block], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The README's Python blocks, pasted in order into one fresh Python session in an empty folder."""
    folder = tmp_path_factory.mktemp("readme")
    python = [attrs.asdict(b) for b in readme_blocks if b.lang == "python"]
    # The pinning block caches structures under $TORCHLENS_CACHE: keep that in the folder too.
    env = {**os.environ, "TORCHLENS_CACHE": str(folder / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "readme_session.py"), str(README), str(folder / "result.json")],
        input=json.dumps(python),
        text=True,
        cwd=folder,
        env=env,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((folder / "result.json").read_text())
    result["folder"] = folder
    return result


def test_every_python_block_runs_in_order(session: dict[str, Any], readme_blocks: list[Block]) -> None:
    errors = [s["error"] for s in session["statements"] if "error" in s]
    assert not errors, errors[0]
    python = [b for b in readme_blocks if b.lang == "python"]
    assert {s["block"] for s in session["statements"]} == set(range(len(python)))
    # What the blocks write lands in the working folder: traces, the activation store, drawings.
    written = {p.name for p in session["folder"].iterdir()}
    assert {"my_trace", "torchlens-activations", "ResNet_unrolled.pdf", "ResNet_layer2_unrolled.pdf"} <= written


def test_every_stated_output_is_what_was_printed(session: dict[str, Any], readme_blocks: list[Block]) -> None:
    python = [b for b in readme_blocks if b.lang == "python"]
    checked, wrong = 0, []
    for number, block in enumerate(python):
        statements = [s for s in session["statements"] if s["block"] == number]
        for line, expected in expectations(block.code).items():
            owner = [s for s in statements if s["first"] <= line <= s["last"]]
            assert owner, f"README.md:{block.line + line - 1}: an expectation on a line that is no statement"
            checked += 1
            if not fits(expected, owner[0]["output"]):
                wrong.append(
                    f"README.md:{block.line + line - 1}: says {expected!r}, "
                    f"printed {owner[0]['output'].strip()[:300]!r}"
                )
    assert not wrong, "\n".join(wrong)
    assert checked >= 20  # the README states the shapes, op counts and FLOPs it prints


def test_every_output_block_is_what_its_python_block_printed(
    session: dict[str, Any], readme_blocks: list[Block]
) -> None:
    python = [b for b in readme_blocks if b.lang == "python"]
    shown = 0
    for before, block in zip(readme_blocks, readme_blocks[1:]):
        if block.lang != "text" or before.lang != "python":
            continue
        number = python.index(before)
        printed = "".join(s["output"] for s in session["statements"] if s["block"] == number)
        assert block.code in printed, f"README.md:{block.line}: not what the block above prints:\n{printed}"
        shown += 1
    assert shown >= 1


def test_comments_state_no_unchecked_figures(readme_blocks: list[Block]) -> None:
    stale = [c for b in readme_blocks if b.lang == "python" for c in unchecked_figures(b.code)]
    assert not stale, f"numbers in comments are checked only after '->': {stale}"


def test_the_checks_catch_a_wrong_comment() -> None:
    """The machinery above fails on the kind of drift issue 12 found (a stale figure, a stale output)."""
    code = "x = 2 ** 10\nx  # -> 1024\nprint(f'{x / 1e3} k')  # -> 1.4 k\nx / 2  # -> 5...\n"
    result = run_session([{"code": code, "line": 1}], "<block>")
    outputs = {s["first"]: s["output"] for s in result["statements"]}
    verdicts = {line: fits(expected, outputs[line]) for line, expected in expectations(code).items()}
    assert verdicts == {2: True, 3: False, 4: True}
    assert unchecked_figures("y = 1  # costs 1.4 G\nz = 2  # a SHA-256 hash of conv2d -> 3\n") == ["# costs 1.4 G"]
    failing = run_session([{"code": "a = 1\nraise ValueError('boom')\nb = 2\n", "line": 10}], "<block>")
    assert "boom" in failing["statements"][-1]["error"] and len(failing["statements"]) == 2


# -- the install the README names -------------------------------------------------------------
def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _requirements(extras: set[str], optional: dict[str, list[str]]) -> set[str]:
    names: set[str] = set()
    for extra in extras:
        for requirement in optional[extra]:
            if _name(requirement) == "torchlens":  # torchlens[a,b]: those extras too
                names |= _requirements(set(re.search(r"\[(.*)\]", requirement).group(1).split(",")), optional)
            else:
                names.add(_name(requirement))
    return names


def test_the_readme_install_covers_every_optional_package_its_blocks_import(session: dict[str, Any]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    quick_start = README.read_text().split("## Quick start", 1)[1]
    named = re.search(r'pip install -e "\.\[([\w,]+)\]"', quick_start)
    assert named, "the Quick start names the install its blocks need"
    installed = _requirements(set(named.group(1).split(",")), optional)
    every_optional = _requirements(set(optional), optional)
    distributions = importlib.metadata.packages_distributions()
    used = {_name(dist) for module in session["modules"] if "." not in module for dist in distributions.get(module, [])}
    missing = (used & every_optional) - installed - {_name(r) for r in project["dependencies"]}
    assert not missing, (
        f'the README blocks import {sorted(missing)}, which pip install -e ".[{named.group(1)}]" does not install'
    )
    assert {"torch", "zarr", "pandas"} <= used  # the check above saw the imports that matter


# -- the demo (nox -s demo) -------------------------------------------------------------------
def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _demo(out: pathlib.Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "docs" / "demo.py"), "--out", str(out)],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
    )


@needs_dot
def test_demo_draws_into_its_scratch_folder_and_leaves_the_readme_picture_alone(tmp_path: pathlib.Path) -> None:
    picture = ROOT / "docs" / "images" / "resnet18.svg"
    before = _digest(picture)
    done = _demo(tmp_path / "out", os.environ["PATH"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "resnet18.svg").read_text().startswith("<?xml")
    assert f"Drew {tmp_path / 'out' / 'resnet18.svg'}" in done.stdout
    assert "Audit: PASS" in done.stdout and "Model: ResNet (torch)" in done.stdout
    assert _digest(picture) == before


def test_demo_without_dot_still_prints_the_summary_and_audit_and_says_how_to_draw(tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "bin"  # a PATH with no programs on it: no dot
    empty.mkdir()
    done = _demo(tmp_path / "out", str(empty))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Model: ResNet (torch)" in done.stdout and "Audit: PASS" in done.stdout
    assert "No picture" in done.stdout and "apt-get install graphviz" in done.stdout
    assert (tmp_path / "out" / "resnet18.dot").read_text().startswith("digraph")
    assert not (tmp_path / "out" / "resnet18.svg").exists()
