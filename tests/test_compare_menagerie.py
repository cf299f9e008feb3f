"""The comparison menagerie's CI sample: independently written ports, compared where no framework is installed.

``nox -s compare`` builds the sample of ``bench/compare_menagerie`` (BERT, GPT-2,
ViT and ResNet as transformers' PyTorch models and as its Flax ports, weights
copied across by name and shape, each Flax port also built once per injected
porting bug) with the torch and jax sessions' virtualenvs, and points
``TORCHLENS_MENAGERIE_TRACES`` at them. These tests compare the saved traces.

Independent references: the builders checked the untraced outputs of each
correct port against side a's (so "no divergence" is the right answer) and of
each bug against them (so a divergence is); where each bug is comes from how
it was injected (bench/compare_menagerie/bugs.py), never from TorchLens.
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import pytest

import torchlens as tl

ENV = "TORCHLENS_MENAGERIE_TRACES"
REPO = pathlib.Path(__file__).resolve().parents[1]
PAIR = "hf-torch-flax"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    value = os.environ.get(ENV)
    if not value:
        pytest.skip(f"{ENV} is not set: `nox -s compare` builds the menagerie's sample and runs these tests")
    sys.path.insert(0, str(REPO))
    try:
        from bench.compare_menagerie.cli import selected
        from bench.compare_menagerie.common import read_json
        from bench.compare_menagerie.compare import compare_all
        from bench.compare_menagerie.pairs import PAIRS
    finally:
        sys.path.remove(str(REPO))
    root = pathlib.Path(value)
    pair = PAIRS[PAIR]
    archs = selected(pair, None, sample=True)
    assert compare_all(pair, root, archs) == 0
    found = read_json(root / PAIR / "results.json")["architectures"]
    missing = [a.name for a in archs if a.name not in found]
    assert not missing, f"the sample's builders wrote nothing for {missing}: run `nox -s compare`"
    return {a.name: found[a.name] for a in archs}


def test_every_sampled_port_was_built_and_agrees_untraced(results: dict[str, Any]) -> None:
    for name, entry in results.items():
        assert entry["a"].get("status") == "built", (name, entry["a"])
        correct = entry["variants"]["correct"]
        assert correct.get("status") == "built", (name, correct)  # "disagrees" would make "none" the wrong answer


def test_a_correct_port_written_by_other_people_has_no_divergence(results: dict[str, Any]) -> None:
    for name, entry in results.items():
        row = entry["variants"]["correct"]
        assert row["first_divergence"] is None, (name, row["first_divergence"])
        assert row["verdicts"].get("diverges", 0) == row["verdicts"].get("shape", 0) == 0, (name, row["verdicts"])


def test_each_visible_porting_bug_is_located_at_its_module_with_everything_before_agreeing(
    results: dict[str, Any],
) -> None:
    checked = 0
    for name, entry in results.items():
        for variant, row in entry["variants"].items():
            if variant == "correct" or row.get("status") != "built":
                continue  # not visible at the output, or not applicable to this architecture
            located = row["located"]
            assert located["outcome"].startswith("located"), (name, variant, located)
            assert row["first_divergence"]["before_all_agree"], (name, variant)
            checked += 1
    assert checked >= 10  # the sample's four architectures inject at least this many visible bugs


def test_traces_load_and_compare_with_no_framework_installed(results: dict[str, Any]) -> None:
    for module in ("torch", "jax", "flax", "tensorflow", "paddle"):
        assert module not in sys.modules, f"{module} was imported: the comparison must need none"
    root = pathlib.Path(os.environ[ENV]) / PAIR / "bert"
    cmp = tl.compare(tl.load(root / "a" / "trace"), tl.load(root / "b" / "correct" / "trace"))
    assert cmp.coverage["a"].compared > 0 and cmp.first_divergence is None
