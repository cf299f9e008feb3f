"""The viewer in a real browser, on torch traces: ResNet-18 live and loaded, a comparison, an intervened trace.

Values are checked against forward hooks on an untraced run, counts against the model's own modules.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from viewer_checks import Page, assert_not_blank, browser

import torchlens as tl

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def chromium() -> Any:
    with browser() as found:
        yield found


@pytest.fixture(scope="module")
def resnet() -> tuple[Any, Any, dict[str, Any]]:
    """(model, input, outputs of some modules from forward hooks on a plain, untraced forward)."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 64, 64)
    seen: dict[str, Any] = {}
    names = ("layer1.0.conv1", "layer2.1.bn2", "fc")
    handles = [
        model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o.detach().clone()))
        for n in names
    ]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return model, x, seen


@pytest.fixture(scope="module")
def resnet_page(resnet: Any, chromium: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    model, x, _ = resnet
    trace = tl.trace(model, x)
    path = tl.view(trace, tmp_path_factory.mktemp("viewer") / "resnet.html")
    page = Page(chromium, path)
    yield trace, page
    page.close()


def check_op(page: Page, trace: Any, module: str, reference: Any) -> None:
    """Clicking the op a module returned shows its label, the hook's shape and module, and the hook's values."""
    op = trace[module]
    page.click_op(op.index)
    shown = page.panel()
    assert shown["label"] == op.label
    assert shown["Shape"] == str(tuple(reference.shape))
    assert shown["Module"] == f"{module}:1"
    stats = page.stats()
    assert stats["min"] == pytest.approx(float(reference.min()), rel=1e-3, abs=1e-6)
    assert stats["max"] == pytest.approx(float(reference.max()), rel=1e-3, abs=1e-6)
    assert stats["mean"] == pytest.approx(float(reference.double().mean()), rel=1e-3, abs=1e-6)
    assert page.page.locator("#tl-panel canvas.tl-histogram").count() == 1
    assert page.page.locator("#tl-panel canvas.tl-heatmap").count() == 1  # 4-D: one channel's heatmap


def test_page_loads_offline_collapsed_and_expands_to_every_op(resnet_page: Any) -> None:
    trace, page = resnet_page
    page.clean()
    start = len(page.visible_ops())
    assert 0 < start < len(trace.ops)  # opens collapsed, as collapse="auto" draws
    page.page.click("#tl-expand")
    assert sorted(page.visible_ops()) == list(range(len(trace.ops)))
    assert_not_blank(page.page.locator("#tl-graph").screenshot())
    page.clean()


def test_clicking_an_op_shows_label_shape_module_and_value(resnet_page: Any, resnet: Any) -> None:
    trace, page = resnet_page
    page.page.click("#tl-expand")
    for module in ("layer1.0.conv1", "layer2.1.bn2", "fc"):
        check_op(page, trace, module, resnet[2][module])
    # a parent is a link to that op
    op = trace["layer2.1.bn2"]
    page.click_op(op.index)
    page.page.locator("#tl-panel tr[data-field=Parents] a").first.click()
    assert page.panel()["label"] == op.parents[0]
    # 4-D value: the heatmap selector switches channels
    assert page.page.locator("#tl-panel select.tl-slice option").count() == 8
    page.clean()


def test_folding_a_module_hides_its_ops_and_shows_one_box(resnet_page: Any) -> None:
    trace, page = resnet_page
    page.page.click("#tl-expand")
    inside = {trace[label].index for label in trace.modules["layer1"].passes[0].ops}
    assert len(inside) > 5 and sorted(page.visible_ops(inside)) == sorted(inside)
    page.page.evaluate("i => window.torchlensViewer.center(i)", min(inside))
    page.page.locator('#tl-graph g.cluster[data-cluster="layer1:1"] > text').click()
    assert page.visible_ops(inside) == []
    assert page.boxes("layer1:1") == 1
    assert len(page.visible_ops()) == len(trace.ops) - len(inside)  # everything else still shown
    page.page.locator('.tl-modbox[data-module="layer1:1"]').click()  # and open again
    assert sorted(page.visible_ops(inside)) == sorted(inside) and page.boxes("layer1:1") == 0
    # fold everything at depth 1: each top-level module of several ops is one box
    page.page.select_option("#tl-depth", "1")
    for path in ("layer1", "layer2", "layer3", "layer4"):
        assert page.boxes(f"{path}:1") == 1
    assert len(page.visible_ops()) == len(trace.ops) - sum(
        len(trace.modules[p].passes[0].ops) for p in ("layer1", "layer2", "layer3", "layer4")
    )
    page.clean()


def test_search_finds_ops_by_function_label_and_module(resnet_page: Any, resnet: Any) -> None:
    trace, page = resnet_page
    page.page.click("#tl-expand")
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in resnet[0].modules())
    assert page.search("conv2d") == f"{convs} ops match"
    assert page.page.locator("#tl-graph .tl-match").count() == convs
    assert page.panel()["func"] == "conv2d"  # Enter jumps to the first match
    assert page.search("layer3.1.bn2") == "1 op matches"
    assert page.panel()["label"] == trace["layer3.1.bn2"].label
    # folded, the match lights up the box it is in
    page.page.select_option("#tl-depth", "1")
    assert page.search("layer3.1.bn2") == "1 op matches"
    assert page.page.locator('.tl-modbox.tl-match[data-module="layer3:1"]').count() == 1
    page.search("")
    page.clean()


def test_hover_lights_the_paths_to_input_and_output(resnet_page: Any) -> None:
    trace, page = resnet_page
    page.page.click("#tl-expand")
    op = trace["layer2.1.bn2"]
    page.page.evaluate("i => window.torchlensViewer.center(i)", op.index)
    page.page.locator(f'#tl-graph g.node[data-op="{op.index}"]').hover()
    lit = set(page.page.eval_on_selector_all("#tl-graph g.node.tl-path", "els => els.map(e => Number(e.dataset.op))"))
    # every ancestor and descendant, from the parent lists alone
    expected: set[int] = set()
    for start, step in (
        (op.index, lambda o: o.parent_indices),
        (op.index, lambda o: [trace[c].index for c in o.children]),
    ):
        todo = list(step(trace.ops[start]))
        while todo:
            i = todo.pop()
            if i not in expected:
                expected.add(i)
                todo += step(trace.ops[i])
    assert lit == expected
    page.page.mouse.move(1, 1)
    assert page.page.locator("#tl-graph .tl-path").count() == 0
    page.clean()


def test_a_loaded_trace_through_the_command_line(resnet: Any, chromium: Any, tmp_path: pathlib.Path) -> None:
    model, x, seen = resnet
    tl.save(tl.trace(model, x), tmp_path / "saved")
    out = tmp_path / "loaded.html"
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", "view", str(tmp_path / "saved"), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    loaded = tl.load(tmp_path / "saved")
    page = Page(chromium, out)
    try:
        page.page.click("#tl-expand")
        assert sorted(page.visible_ops()) == list(range(len(loaded.ops)))
        check_op(page, loaded, "layer2.1.bn2", seen["layer2.1.bn2"])
        assert page.search("relu") == f"{sum(op.func_name == 'relu' for op in loaded.ops)} ops match"
        assert_not_blank(page.page.screenshot())
        page.clean()
    finally:
        page.close()


class Block(torch.nn.Module):
    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 4, eps=eps)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))

    def forward(self, x: Any) -> Any:
        return self.head(self.norm(self.conv(x)).tanh())


def test_a_comparison_colours_ops_by_error_and_opens_on_the_first_divergence(
    chromium: Any, tmp_path: pathlib.Path
) -> None:
    torch.manual_seed(0)
    a, b = Block().eval(), Block(eps=1e-1).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    cmp = tl.compare(tl.trace(a, x), tl.trace(b, x))
    first = cmp.first_divergence
    assert first is not None and first.module == "norm"
    page = Page(chromium, tl.view(cmp, tmp_path / "cmp.html"))
    try:
        shown = page.panel()
        assert shown["label"] == first.a
        assert shown["Compared"].startswith("diverges")
        fill = (
            'i => document.querySelector(`#tl-graph g.node[data-op="${i}"] > :is(path, polygon)`)'
            ".getAttribute('fill')"
        )
        assert page.page.evaluate(fill, cmp.a[first.a].index) in ("#fcbba1", "#fb6a4a", "#cb181d")
        assert page.page.evaluate(fill, cmp.a["conv"].index) == "#c7e9c0"  # before the divergence: agrees
        page.clean()
    finally:
        page.close()


def test_an_intervened_trace_marks_the_edited_ops(chromium: Any, tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 3, 6, 6)
    trace = tl.trace(model, x, intervene=tl.when(tl.func("relu"), tl.zero_ablate()))
    edited = [op for op in trace.ops if op.edits]
    assert len(edited) == 1
    page = Page(chromium, tl.view(trace, tmp_path / "edited.html"))
    try:
        marked = page.page.eval_on_selector_all("#tl-graph g.node.tl-edited", "els => els.map(e => e.dataset.op)")
        assert marked == [str(edited[0].index)]
        shown = page.panel()  # opens on the edited op
        assert shown["label"] == edited[0].label and "zero_ablate" in shown["Edited"]
        stats = page.stats()
        assert stats["min"] == 0 and stats["max"] == 0  # zero-ablated: every value is 0
        page.clean()
    finally:
        page.close()


def test_a_layout_left_out_by_max_nodes_is_refused_in_the_page(
    resnet: Any, chromium: Any, tmp_path: pathlib.Path
) -> None:
    model, x, _ = resnet
    trace = tl.trace(model, x)
    page = Page(chromium, tl.view(trace, tmp_path / "small.html", max_nodes=60))
    try:
        start = page.visible_ops()
        page.page.click("#tl-expand")
        assert "too large to expand" in page.page.inner_text("#tl-status")
        assert len(page.visible_ops()) < len(trace.ops) and len(page.visible_ops()) >= len(start)
        page.clean()
    finally:
        page.close()
    with pytest.raises(tl.TorchLensError, match="raise max_nodes"):
        tl.view(trace, tmp_path / "none.html", max_nodes=3)


class Mixed(torch.nn.Module):
    """Values of every kind a picture takes: large with shrunk heatmaps, NaN, several outputs, integers, one
    value repeated, infinity, and small ones stacked."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: Any) -> Any:
        y = self.conv(x)  # 1 x 4 x 68 x 68: pictured alone, heatmaps averaged down to 23 x 23
        z = torch.log(y)  # NaN where y < 0
        a, b = torch.split(y[0, 0], 34)
        i = y.flatten().argmax()
        s = torch.full((2, 2), 3.0) * y.mean()
        t = torch.tensor([1.0, float("inf")]) * y.mean()
        small = [y.mean(dim=(2, 3)) * k for k in range(20)]  # 1 x 4 each: stacked
        return z.nansum() + a.sum() + b.sum() + i + s.sum() + t.sum() + sum(v.sum() for v in small)


def _first_tensor(index: int, out: Any) -> tuple[str, tuple[int, ...], Any] | None:
    """(key, path, NumPy array) of an op's first tensor, by torch itself (outputs here: a tensor or a tuple)."""
    for path, value in [((), out)] if isinstance(out, torch.Tensor) else [((i,), v) for i, v in enumerate(out)]:
        if isinstance(value, torch.Tensor):
            return str(index), path, value.detach().numpy()
    return None


def test_small_values_are_converted_in_one_call_a_stack_and_pictured_as_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The viewer converts small values of one shape, dtype and device in one ``to_numpy_stacked`` call: the
    pictures are the ones a conversion value by value gives (the backend declining to stack)."""
    from torchlens_core.backend.manager import backend_named
    from torchlens_core.viewer.data import op_pictures
    from torchlens_core.viewer.pictures import _dict

    torch.manual_seed(0)
    trace = tl.trace(Mixed().eval(), torch.randn(1, 3, 70, 70))
    torch_backend = backend_named("torch")
    real = torch_backend.to_numpy_stacked
    stacks: list[int] = []
    monkeypatch.setattr(torch_backend, "to_numpy_stacked", lambda values: stacks.append(len(values)) or real(values))
    stacked = {k: _dict(v) for k, v in op_pictures(trace).items()}
    monkeypatch.setattr(torch_backend, "to_numpy_stacked", lambda values: None)
    one_by_one = {k: _dict(v) for k, v in op_pictures(trace).items()}
    assert stacks and max(stacks) >= 20  # the 20 small values of one shape, at least, in one call
    assert json.dumps(stacked, sort_keys=True) == json.dumps(one_by_one, sort_keys=True)


def test_every_picture_reads_back_from_the_columns_as_pictures_made_it(chromium: Any, tmp_path: pathlib.Path) -> None:
    """The pictures' numbers travel as base64 arrays and the heatmaps' pixels as one run of bytes a block: the
    page's picture() of every op must be what pictures() made of its value (itself checked against picture()
    value by value), whichever path the value took (stacked, alone, NaN, infinite, several outputs)."""
    from torchlens_core.viewer.data import HEATMAP_BUDGET
    from torchlens_core.viewer.pictures import pictures

    torch.manual_seed(0)
    trace = tl.trace(Mixed().eval(), torch.randn(1, 3, 70, 70))
    found = (_first_tensor(op.index, op.out) for op in trace.ops if op.out is not None)
    expected = pictures((f for f in found if f is not None), HEATMAP_BUDGET)
    assert any("path" in e for e in expected.values()) and any(e["nonfinite"] for e in expected.values())
    assert any(h["rows"] < h["of_rows"] for h in (e.get("heatmaps") for e in expected.values()) if h)
    page = Page(chromium, tl.view(trace, tmp_path / "mixed.html"))
    try:
        every = "n => Array.from({length: n}, (_, i) => window.torchlensViewer.picture(i) ?? null)"
        shown = page.page.evaluate(every, len(trace.ops))
        for op, got in zip(trace.ops, shown):
            made = expected.get(str(op.index))
            assert got == (None if made is None else json.loads(json.dumps(made))), op.label
        page.clean()
    finally:
        page.close()
