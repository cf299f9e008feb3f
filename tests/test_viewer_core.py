"""The viewer without a framework: value pictures against NumPy, the page's text, errors, and a trace loaded
from disk with no framework installed, through the command line and in a real browser."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
from viewer_checks import Page, assert_not_blank, browser

import torchlens as tl
from torchlens_core.ir.errors import ArgumentTypeError, GraphvizNotFoundError, TorchLensError
from torchlens_core.viewer import pictures
from torchlens_core.viewer.page import page

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
needs_dot = pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="Graphviz is not installed")


# -- pictures -----------------------------------------------------------------------------------
def test_the_histogram_is_numpys() -> None:
    values = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
    found = pictures.picture(values)
    counts, edges = np.histogram(values.astype(np.float64), bins=pictures.HISTOGRAM_BINS)
    assert found["hist"]["counts"] == counts.tolist()
    assert (found["hist"]["lo"], found["hist"]["hi"]) == (edges[0], edges[-1])
    assert found["stats"]["mean"] == pytest.approx(values.astype(np.float64).mean())


def test_the_fast_histogram_counts_as_numpy_does_on_edges_and_narrow_spreads() -> None:
    rng = np.random.default_rng(2)
    cases = [rng.normal(size=n) for n in (1, 2, 33, 1000)] + [
        np.arange(33.0),
        np.linspace(-1, 1, 97),
        np.array([5.0] * 7),
        rng.integers(-3, 4, 500).astype(float),
        np.array([0.1, 0.2, 0.3]) * 1e-300,
        np.array([1e300, -1e300]),
        np.linspace(0, 1, 33) ** 3,
        np.array([1.0, np.nextafter(1.0, 2.0)] * 3),  # too narrow for 32 bins: both raise
    ]
    for values in cases:
        try:
            expected = np.histogram(values, bins=pictures.HISTOGRAM_BINS)
        except ValueError:
            with pytest.raises(ValueError):
                pictures.histogram(values)
            continue
        counts, edges = pictures.histogram(values)
        assert counts.tolist() == expected[0].tolist() and edges.tolist() == expected[1].tolist()


def test_a_small_matrix_is_its_own_heatmap_scaled_to_bytes() -> None:
    found = pictures.picture(np.arange(12.0).reshape(3, 4))["heatmaps"]
    assert (found["rows"], found["cols"], found["count"]) == (3, 4, 1)
    pixels = np.frombuffer(base64.b64decode(found["slices"][0]["data"]), np.uint8).reshape(3, 4)
    assert pixels.tolist() == np.rint(np.arange(12.0).reshape(3, 4) / 11 * 255).astype(int).tolist()


def test_a_large_image_is_shown_as_block_means_one_channel_per_slice() -> None:
    values = np.random.default_rng(1).normal(size=(1, 3, 64, 96))
    found = pictures.picture(values)["heatmaps"]
    assert (found["rows"], found["cols"], found["count"], found["lead_shape"]) == (32, 32, 3, [1, 3])
    channel = values[0, 2].reshape(32, 2, 32, 3).mean(axis=(1, 3))  # 2x3 blocks, by hand
    lo, hi = channel.min(), channel.max()
    pixels = np.frombuffer(base64.b64decode(found["slices"][2]["data"]), np.uint8).reshape(32, 32)
    assert np.abs(pixels.astype(int) - np.rint((channel - lo) / (hi - lo) * 255)).max() <= 1
    assert found["slices"][2]["lo"] == pytest.approx(lo)


def test_nonfinite_values_are_counted_not_pictured() -> None:
    found = pictures.picture(np.array([1.0, np.nan, np.inf, 3.0]))
    assert found["nonfinite"] == 2
    assert (found["stats"]["min"], found["stats"]["max"]) == (1.0, 3.0)
    assert "heatmaps" not in found  # 1-D: a histogram only


def test_a_spread_too_narrow_for_the_bins_is_one_bin() -> None:
    values = np.array([1.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 2.0)])  # numpy cannot cut it in 32 bins
    found = pictures.picture(values)
    assert found["hist"] == {"counts": [3], "lo": 1.0, "hi": float(values[1])}


def test_what_has_no_numbers_has_no_picture() -> None:
    assert pictures.picture(np.array([], dtype=np.float32)) is None
    assert pictures.picture(np.array(["a", "b"])) is None
    assert pictures.picture(np.array([True, False, True]))["stats"]["mean"] == pytest.approx(2 / 3)
    assert pictures.picture(np.array([3 + 4j]))["stats"]["max"] == 5.0  # complex: the magnitude


def test_pictures_of_stacked_values_are_each_values_own_to_the_bit() -> None:
    """pictures() stacks small values by shape and dtype; every number must be picture()'s for that value alone
    (JSON text compared, so -0.0 and the last bit count), whichever path a value takes: finite or not, equal
    values, spreads too narrow for the bins, denormal and huge ones, integers, booleans, several windows."""
    rng = np.random.default_rng(0)
    values = []
    for shape in [(), (1,), (9,), (2, 16), (3, 5), (1, 33), (40, 2), (2, 3, 4, 5), (129,), (4096,), (64, 64)]:
        for dtype in (np.float32, np.float64, np.float16, np.int8, np.bool_):
            for kind in range(9):
                a = rng.normal(size=shape) * 10 ** rng.uniform(-4, 4)
                coin = rng.random(shape) < 0.5
                a = [
                    a,
                    np.full(shape, rng.normal()),
                    np.round(a),
                    np.where(coin, 1.0, np.nextafter(1.0, 2.0)),
                    a * 1e-310,
                    np.where(coin, 1e308, -1e308),
                    -np.zeros(shape),
                    a,
                    a,
                ][kind]
                a = np.array(a, dtype=np.float64)
                if kind == 7 and a.size:
                    a.flat[0] = np.nan
                if kind == 8 and a.size:
                    a.flat[-1] = -np.inf
                with np.errstate(all="ignore"):
                    values.append(a.astype(dtype))
    values += [np.array([1 + 2j, 3j]), np.array(["a"]), np.zeros((0, 3))]
    items = [(i, ("out", 1) if i % 3 == 0 else None, v) for i, v in enumerate(values)]
    for budget, window in ((0, pictures.STACK_ELEMENTS), (3000, 500), (1 << 30, pictures.STACK_ELEMENTS)):
        expected, spent = {}, 0
        with np.errstate(all="ignore"):
            for key, path, value in items:
                one = pictures.picture(value, with_heatmap=spent < budget)
                if one is not None:
                    if path:
                        one["path"] = list(map(str, path))
                    spent += sum(len(s["data"]) for s in one.get("heatmaps", {}).get("slices", []))
                    expected[key] = one
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(pictures, "STACK_ELEMENTS", window)
                found = pictures.pictures(iter(items), budget)
        assert list(found) == list(expected)
        assert [json.dumps(found[k]) for k in found] == [json.dumps(expected[k]) for k in expected]


# -- the page's text ----------------------------------------------------------------------------
def test_text_that_would_end_a_script_block_is_escaped() -> None:
    hostile = "</script><script>alert(1)</script>"
    text = page(hostile, {"title": hostile, "ops": [{"label": hostile}]}, [], {"tl-ops-0": [{"label": hostile}]})
    assert text.count("</script>") == 3  # the ends of the data, details and code blocks, and no other
    assert "<title>&lt;/script&gt;" in text
    for block in ("tl-data", "tl-ops-0"):
        data = re.search(rf'<script id="{block}" type="application/json">(.*?)</script>', text, re.S).group(1)
        found = json.loads(data)
        assert (found["ops"] if block == "tl-data" else found)[0]["label"] == hostile


# -- a trace loaded with no framework -----------------------------------------------------------
@pytest.fixture(scope="module")
def loaded() -> tl.Trace:
    return tl.load(FIXTURES / "torch_mlp_trace")


@needs_dot
def test_the_file_needs_nothing_from_the_network(loaded: tl.Trace, tmp_path: pathlib.Path) -> None:
    text = pathlib.Path(tl.view(loaded, tmp_path / "mlp.html")).read_text()
    assert not re.search(r"<(link|img|iframe)\b|<script[^>]*\bsrc=", text)
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", text))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls  # SVG namespaces only


@needs_dot
def test_the_command_line_in_a_browser(loaded: tl.Trace, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "mlp.html"
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", "view", str(FIXTURES / "torch_mlp_trace"), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    expected = json.loads((FIXTURES / "torch_mlp_expected.json").read_text())
    with browser() as chromium:
        shown = Page(chromium, out)
        try:
            assert sorted(shown.visible_ops()) == list(range(len(expected["labels"])))
            assert shown.page.eval_on_selector_all(
                "#tl-graph g.node[data-op]", "els => els.map(e => e.querySelector('text').textContent)"
            )  # drawn with labels
            output = np.array(expected["output"])
            shown.click_op(len(expected["labels"]) - 1)
            panel = shown.panel()
            assert panel["label"] == expected["labels"][-1] and panel["Shape"] == str(output.shape)
            assert shown.stats()["min"] == pytest.approx(output.min(), rel=1e-3)
            assert shown.stats()["max"] == pytest.approx(output.max(), rel=1e-3)
            assert shown.search("linear") == "2 ops match"
            assert shown.search("fc2") == "1 op matches"
            assert_not_blank(shown.page.screenshot())
            shown.clean()
        finally:
            shown.close()


def test_the_command_line_refuses_a_folder_that_is_not_a_trace(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", "view", str(tmp_path), "-o", str(tmp_path / "x.html")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2  # not done (1: done, and a check failed)
    assert "TraceFileError" in done.stderr and "tl.save" in done.stderr
    assert not (tmp_path / "x.html").exists()


# -- errors -------------------------------------------------------------------------------------
def test_only_traces_and_comparisons_are_viewed(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ArgumentTypeError, match="shows a Trace .* not dict"):
        tl.view({}, tmp_path / "x.html")
    assert issubclass(ArgumentTypeError, TorchLensError)


def test_without_graphviz_the_error_says_how_to_install_it(
    loaded: tl.Trace, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    with pytest.raises(GraphvizNotFoundError, match="apt-get install graphviz"):
        tl.view(loaded, tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()
    assert os.environ["PATH"] == str(tmp_path)


# -- show() -------------------------------------------------------------------------------------
@needs_dot
def test_show_outside_a_notebook_opens_a_temporary_file(loaded: tl.Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    path = loaded.show()
    try:
        assert opened == [pathlib.Path(path).resolve().as_uri()]
        assert "<title>MLP (torch)</title>" in pathlib.Path(path).read_text()
    finally:
        os.remove(path)


@needs_dot
def test_show_in_a_notebook_displays_the_page_in_an_iframe(loaded: tl.Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    import html
    import types

    class ZMQInteractiveShell:  # what a Jupyter kernel's get_ipython() returns
        pass

    shown: list[Any] = []
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    display = types.ModuleType("IPython.display")
    display.display = shown.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    monkeypatch.setattr("webbrowser.open", lambda url: pytest.fail("a notebook opens no browser"))
    assert loaded.show() is None
    [inline] = shown
    text = inline._repr_html_()
    srcdoc = re.fullmatch(r'<iframe srcdoc="(.*)" style="[^"]*"></iframe>', text, re.S).group(1)
    assert '"' not in srcdoc
    page_text = html.unescape(srcdoc)
    assert page_text.startswith("<!DOCTYPE html>") and "<title>MLP (torch)</title>" in page_text


@needs_dot
def test_show_in_a_notebook_warns_nothing(
    loaded: tl.Trace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """IPython's own display machinery: HTML() holding an iframe warns (use IFrame); show() must not."""
    pytest.importorskip("IPython")
    from torchlens_core import viewer

    monkeypatch.setattr(viewer, "_in_notebook", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loaded.show() is None
    assert "_Inline" in capsys.readouterr().out  # outside a kernel, display() prints the object's plain repr
