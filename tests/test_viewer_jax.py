"""The viewer in a real browser on a JAX (flax nnx) trace: values against the model's own untraced submodules."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
from viewer_checks import Page, assert_not_blank, browser

import torchlens as tl

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")


class Net(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.fc1 = nnx.Linear(6, 16, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.fc2 = nnx.Linear(16, 16, rngs=rngs)
        self.head = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        h = self.norm(jnp.tanh(self.fc1(x)))
        return self.head(jnp.tanh(self.fc2(h)) + h)


@pytest.fixture(scope="module")
def chromium() -> Any:
    with browser() as found:
        yield found


@pytest.fixture(scope="module")
def page(chromium: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    net = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (4, 6))
    trace = tl.trace(net, x)
    # the untraced submodules' outputs, by hand
    reference = {"fc1": net.fc1(x), "norm": net.norm(jnp.tanh(net.fc1(x)))}
    path = tl.view(trace, tmp_path_factory.mktemp("viewer") / "jax.html")
    found = Page(chromium, path)
    yield trace, found, reference
    found.close()


def test_page_loads_offline_and_draws_every_op(page: Any) -> None:
    trace, shown, _ = page
    shown.clean()
    shown.page.click("#tl-expand")
    assert sorted(shown.visible_ops()) == list(range(len(trace.ops)))
    assert_not_blank(shown.page.locator("#tl-graph").screenshot())
    shown.clean()


def test_clicking_an_op_shows_label_shape_module_and_value(page: Any) -> None:
    trace, shown, reference = page
    shown.page.click("#tl-expand")
    for module in ("fc1", "norm"):
        op = trace[module]
        value = np.asarray(reference[module], dtype=np.float64)
        shown.click_op(op.index)
        panel = shown.panel()
        assert panel["label"] == op.label
        assert panel["Shape"] == str(value.shape)
        assert panel["Module"] == f"{module}:1"
        stats = shown.stats()
        assert stats["min"] == pytest.approx(value.min(), rel=1e-3)
        assert stats["max"] == pytest.approx(value.max(), rel=1e-3)
        assert shown.page.locator("#tl-panel canvas.tl-heatmap").count() == 1  # 2-D: the matrix itself
    shown.clean()


def test_folding_a_module_hides_its_ops_and_shows_one_box(page: Any) -> None:
    trace, shown, _ = page
    shown.page.click("#tl-expand")
    inside = {trace[label].index for label in trace.modules["norm"].passes[0].ops}
    assert len(inside) > 5 and sorted(shown.visible_ops(inside)) == sorted(inside)
    shown.page.evaluate("i => window.torchlensViewer.center(i)", min(inside))
    shown.page.locator('#tl-graph g.cluster[data-cluster="norm:1"] > text').click()
    assert shown.visible_ops(inside) == [] and shown.boxes("norm:1") == 1
    assert len(shown.visible_ops()) == len(trace.ops) - len(inside)
    shown.clean()


def test_search_finds_an_op(page: Any) -> None:
    trace, shown, _ = page
    shown.page.click("#tl-expand")
    assert shown.search("rsqrt") == "1 op matches"
    assert shown.panel()["label"] == next(op.label for op in trace.ops if op.func_name == "rsqrt")
    assert shown.search("dot_general") == "3 ops match"  # fc1, fc2, head
    shown.clean()


def test_a_loaded_jax_trace(page: Any, chromium: Any, tmp_path: pathlib.Path) -> None:
    trace, _, reference = page
    tl.save(trace, tmp_path / "saved")
    loaded = tl.load(tmp_path / "saved")
    shown = Page(chromium, tl.view(loaded, tmp_path / "loaded.html"))
    try:
        shown.page.click("#tl-expand")
        assert sorted(shown.visible_ops()) == list(range(len(trace.ops)))
        shown.click_op(loaded["norm"].index)
        assert shown.stats()["max"] == pytest.approx(float(np.max(reference["norm"])), rel=1e-3)
        shown.clean()
    finally:
        shown.close()
