"""The viewer on a large trace (5,000 ops), in a real browser: the page lays out only what it shows.

Over ``PAGE_LAYOUT_OPS`` ops the page lays the graph out itself, one frame per open module, and reads each
op's panel details and value picture from a block it parses only when that op is first shown. Counts are
checked against the model's own structure, values against forward hooks on an untraced run. Timings are in
bench/viewer_scale.py, not here.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from viewer_checks import Page, assert_not_blank, browser

import torchlens as tl
from torchlens_core.viewer.layouts import PAGE_LAYOUT_OPS

torch = pytest.importorskip("torch")

GROUPS, STAGES, BLOCKS = 5, 10, 4  # 200 blocks of 25 ops: 5,000 ops and the input and output


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        for _ in range(8):
            h = torch.tanh(h) * 0.5 + x
        return h


class Group(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = torch.nn.Sequential(
            *[torch.nn.Sequential(*[Block() for _ in range(BLOCKS)]) for _ in range(STAGES)]
        )

    def forward(self, x: Any) -> Any:
        return self.stages(x)


class Big(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.groups = torch.nn.ModuleList(Group() for _ in range(GROUPS))

    def forward(self, x: Any) -> Any:
        for group in self.groups:
            x = group(x)
        return x


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, dict[str, Any], pathlib.Path]:
    """(model, trace, a forward hook's output of one Linear on an untraced run, the viewer file)."""
    torch.manual_seed(0)
    model, x = Big().eval(), torch.randn(2, 8)
    seen: dict[str, Any] = {}
    name = "groups.3.stages.7.2.fc"
    handle = model.get_submodule(name).register_forward_hook(lambda m, i, o: seen.__setitem__(name, o.clone()))
    with torch.no_grad():
        model(x)
    handle.remove()
    trace = tl.trace(model, x)
    assert len(trace.ops) == GROUPS * STAGES * BLOCKS * 25 + 2 > PAGE_LAYOUT_OPS
    return model, trace, seen, tl.view(trace, tmp_path_factory.mktemp("viewer") / "big.html")


@pytest.fixture(scope="module")
def chromium() -> Any:
    with browser() as found:
        yield found


@pytest.fixture()
def page(big: Any, chromium: Any) -> Any:
    shown = Page(chromium, big[3])
    yield shown
    shown.close()


def indices(trace: Any, module: str) -> set[int]:
    return {trace[label].index for label in trace.modules[module].passes[0].ops}


def click_box(page: Page, trace: Any, key: str) -> None:
    """Bring the module pass's box into view (as search does, through one of its ops) and click it."""
    page.page.evaluate("i => window.torchlensViewer.center(i)", min(indices(trace, key.rsplit(":", 1)[0])))
    page.page.locator(f'.tl-modbox[data-module="{key}"]').click()


def nodes(page: Page) -> int:
    return page.page.locator("#tl-graph g.node").count()


def test_it_opens_with_only_the_top_of_the_graph_laid_out(big: Any, page: Page) -> None:
    _, trace, _, _ = big
    page.clean()
    assert page.page.evaluate("window.torchlensViewer.inPage")
    # collapse="auto" opens at depth 3 (group, its Sequential, stage): every stage one box (within the 60-node
    # budget; depth 4 is 202 nodes), and the input and output ops; nothing else is in the DOM.
    assert nodes(page) == GROUPS * STAGES + 2
    assert page.visible_ops() == [0, len(trace.ops) - 1]
    assert page.boxes("groups.3.stages.7:1") == 1
    assert page.page.locator("#tl-graph g.cluster").count() == 2 * GROUPS  # the groups and their Sequentials, open
    assert page.page.evaluate("window.torchlensViewer.parsed()") == []  # no op's details or values read yet
    assert_not_blank(page.page.locator("#tl-graph").screenshot())
    page.clean()


def test_opening_and_folding_modules_lays_out_what_is_shown(big: Any, page: Page) -> None:
    _, trace, _, _ = big
    click_box(page, trace, "groups.3.stages.7:1")
    assert page.boxes("groups.3.stages.7:1") == 0
    assert all(page.boxes(f"groups.3.stages.7.{b}:1") == 1 for b in range(BLOCKS))
    assert nodes(page) == GROUPS * STAGES + 2 - 1 + BLOCKS
    click_box(page, trace, "groups.3.stages.7.2:1")
    inside = indices(trace, "groups.3.stages.7.2")
    assert len(inside) == 25 and sorted(page.visible_ops(inside)) == sorted(inside)
    assert nodes(page) == GROUPS * STAGES + 2 - 1 + BLOCKS - 1 + 25
    # the linear is a module of one op: drawn as that op, named after its module
    fc = trace["groups.3.stages.7.2.fc"].index
    name = page.page.locator(f'#tl-graph g.node[data-op="{fc}"] text').first.text_content()
    assert name == "groups.3.stages.7.2.fc (Linear)"
    # an edge into the block's first op comes from the block before it, shown as a box
    edges = page.page.eval_on_selector_all("#tl-graph g.edge title", "els => els.map(e => e.textContent)")
    assert f"module groups.3.stages.7.1:1->op {fc}" in edges
    # hovering an op lights its ancestors and descendants among the ops shown (the stages are a chain, so
    # going through the boxes adds none)
    op = trace.ops[sorted(inside)[12]]
    page.page.evaluate("i => window.torchlensViewer.center(i)", op.index)
    page.page.locator(f'#tl-graph g.node[data-op="{op.index}"]').hover()
    lit = set(
        page.page.eval_on_selector_all("#tl-graph g.node.tl-path[data-op]", "els => els.map(e => Number(e.dataset.op))")
    )
    related: set[int] = set()
    for step in (lambda o: o.parent_indices, lambda o: [trace[c].index for c in o.children]):
        todo = list(step(op))
        while todo:
            i = todo.pop()
            if i not in related:
                related.add(i)
                todo += step(trace.ops[i])
    assert lit == related & set(page.visible_ops())
    page.page.mouse.move(1, 1)
    page.page.evaluate("i => window.torchlensViewer.center(i)", min(indices(trace, "groups.3.stages.7")))
    page.page.locator('#tl-graph g.cluster[data-cluster="groups.3.stages.7:1"] > text').click()  # fold the stage
    assert page.visible_ops(inside) == [] and page.boxes("groups.3.stages.7:1") == 1
    assert nodes(page) == GROUPS * STAGES + 2
    click_box(page, trace, "groups.3.stages.7:1")  # open again: the block too
    assert sorted(page.visible_ops(inside)) == sorted(inside)
    page.clean()


def test_search_finds_labels_and_functions_inside_folded_modules(big: Any, page: Page) -> None:
    model, trace, _, _ = big
    op = trace.ops[max(indices(trace, "groups.3.stages.7.2"))]
    assert page.search(op.label) == "1 op matches"
    assert page.panel()["label"] == op.label  # Enter shows it
    assert page.page.locator('.tl-modbox.tl-match[data-module="groups.3.stages.7:1"]').count() == 1
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert page.search("linear") == f"{linears} ops match"
    assert page.page.locator("#tl-graph .tl-match").count() == GROUPS * STAGES  # every stage box holds some
    page.clean()


def test_the_panel_reads_an_ops_value_only_when_it_is_shown(big: Any, page: Page) -> None:
    _, trace, seen, _ = big
    op = trace["groups.3.stages.7.2.fc"]
    assert page.page.evaluate("window.torchlensViewer.parsed()") == []
    click_box(page, trace, "groups.3.stages.7:1")
    click_box(page, trace, "groups.3.stages.7.2:1")
    page.click_op(op.index)
    shown = page.panel()
    reference = seen["groups.3.stages.7.2.fc"].double()
    assert shown["label"] == op.label and shown["Shape"] == str(tuple(reference.shape))
    assert shown["Module"] == "groups.3.stages.7.2.fc:1"
    where = op.code_context[0]  # file names are stored once per block: read back as the trace has them
    assert shown["Code"] == f"{where.file}:{where.line_number} in {where.func_name}"
    assert shown["Parents"] == trace.ops[op.parent_indices[0]].label
    stats = page.stats()
    for key, value in (("min", reference.min()), ("max", reference.max()), ("mean", reference.mean())):
        assert stats[key] == pytest.approx(float(value), rel=1e-3, abs=1e-6)
    block = op.index // 1000
    assert page.page.evaluate("window.torchlensViewer.parsed()") == [f"tl-ops-{block}", f"tl-pictures-{block}"]
    page.clean()


def test_every_ops_details_and_picture_read_back_from_the_columns_as_the_trace_has_them(big: Any, page: Page) -> None:
    """The blocks are columns (repeated strings and ops by position, the pictures' numbers as base64 arrays):
    the page's record() and picture() of every op must give back what the trace and picture() say of it."""
    from torchlens_core.viewer.pictures import picture

    _, trace, _, _ = big
    every = "(n, what) => Array.from({length: n}, (_, i) => window.torchlensViewer[what](i) ?? null)"
    records = page.page.evaluate(every, [len(trace.ops), "record"])
    shown = page.page.evaluate(every, [len(trace.ops), "picture"])
    distances = trace.distances()
    short = lambda v: repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
    for op, got, pic in zip(trace.ops, records, shown):
        d = distances[op.index]
        expected = {
            "index": op.index,
            "label": op.label,
            "kind": op.kind,
            "shape": list(op.shape),
            "dtype": str(op.dtype),
            "device": op.device,
            "bytes": op.num_bytes,
            "module_outputs": op.module_outputs,
            "parents": op.parents,
            "children": op.children,
            "saved": op.saved,
            "code": [[c.file, c.line_number, c.func_name] for c in op.code_context[:3]],
            "distance": [d.min_from_input, d.max_from_input, d.min_to_output, d.max_to_output],
            "params": [
                {"name": p.name, "shape": list(p.shape), "numel": p.numel, "buffer": p.is_buffer}
                | {"trainable": p.trainable}
                for p in map(trace.params.get, op.params)
            ],
        }
        if op.kind == "op":
            expected |= {"func": op.func_name, "flops": op.flops, "macs": op.macs, "elapsed": op.elapsed}
            expected |= {"source": op.source, "in_place": op.in_place, "conditions": op.conditions}
            expected["config"] = {str(k): short(v) for k, v in op.config.items()}
        assert {key: got[key] for key in expected} == expected, op.label
        array = op.out.detach().numpy()  # every op of this model returns one tensor
        assert pic == json.loads(json.dumps(picture(array))), op.label
    assert sum(bool(op.params) for op in trace.ops) == GROUPS * STAGES * BLOCKS  # the fields checked are not all empty
    assert all(pic is not None and "heatmaps" in pic for pic in shown)
    page.clean()


def test_the_file_holds_under_450_bytes_an_op(big: Any) -> None:
    """The blocks' columns (375 bytes an op here) are near half of what a JSON row per op and a JSON object per
    picture took (694 bytes an op; 725 on a 50,000-op trace): the browser reads the whole file before it shows
    anything, and JSON's floats and dicts were most of the export's writing."""
    _, trace, _, path = big
    assert pathlib.Path(path).stat().st_size < 450 * len(trace.ops)


def test_expand_all_and_a_layout_over_max_nodes(big: Any, chromium: Any, tmp_path: pathlib.Path) -> None:
    _, trace, _, _ = big
    page = Page(chromium, big[3])
    try:
        page.page.click("#tl-expand")
        assert sorted(page.visible_ops()) == list(range(len(trace.ops)))
        page.clean()
    finally:
        page.close()
    page = Page(chromium, tl.view(trace, tmp_path / "bounded.html", values=False, max_nodes=100))
    try:
        page.page.click("#tl-expand")  # 5,002 nodes: only as deep as 100 allows, and said so
        assert "too large to expand" in page.page.inner_text("#tl-status")
        assert nodes(page) == GROUPS * STAGES + 2  # depth 4 would be 202
        click_box(page, trace, "groups.0.stages.0:1")  # 55 nodes: fine
        assert page.boxes("groups.0.stages.0:1") == 0
        page.clean()
    finally:
        page.close()
    with pytest.raises(tl.TorchLensError, match="raise max_nodes"):
        tl.view(trace, tmp_path / "none.html", values=False, max_nodes=3)


def test_exporting_does_work_per_stack_of_values_not_per_op(
    big: Any, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linear export, checked by counting, not timing: the 5,002 values (all 2 x 8) are pictured stacked (one
    NumPy call per step for all of them), none by the per-value histogram, whose NumPy calls were most of a
    large export; and the cycle collector, which walks every object of the trace at each collection, does not
    run while the page is built. A value with a NaN takes the per-value path, and the stacked pictures are the
    per-value function's."""
    import gc

    import numpy as np

    from torchlens_core.viewer import pictures, render_html

    _, trace, _, _ = big
    calls = {"histogram": 0, "collections": 0}
    generations: list[int] = []
    histogram = pictures.histogram

    def counted(*args: Any) -> Any:
        calls["histogram"] += 1
        return histogram(*args)

    def collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            calls["collections"] += 1
            generations.append(info["generation"])

    monkeypatch.setattr(pictures, "histogram", counted)
    gc.collect()  # the allocation counts at zero: none sets a collection off before the export pauses it
    gc.callbacks.append(collected)
    try:
        text = render_html(trace)
    finally:
        gc.callbacks.remove(collected)
    # at most one, of the youngest objects, set off as the collector is switched back on at the end
    assert calls["histogram"] == 0 and calls["collections"] <= 1 and set(generations) <= {0}
    assert gc.isenabled()  # on again
    op = trace["groups.3.stages.7.2.fc"]
    assert f'<script id="tl-pictures-{op.index // 1000}" type="application/json">' in text
    expected = pictures.picture(op.out.detach().numpy())
    assert page.page.evaluate("i => window.torchlensViewer.picture(i)", op.index) == json.loads(json.dumps(expected))
    calls["histogram"] = 0
    values = [np.array([[1.0, np.nan], [2.0, 5.0]]), *(np.full((2, 2), float(i)) for i in range(3))]
    found = pictures.pictures(((str(i), None, v) for i, v in enumerate(values)), 1 << 20)
    assert calls["histogram"] == 1 and found["0"]["nonfinite"] == 1
    assert [found[str(i)] for i in range(4)] == [pictures.picture(v) for v in values]


class Small(torch.nn.Module):
    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 4, eps=eps)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))

    def forward(self, x: Any) -> Any:
        return self.head(self.norm(self.conv(x)).tanh())


def test_laid_out_in_the_page_a_comparison_and_an_edit_are_marked(
    chromium: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("torchlens_core.viewer.PAGE_LAYOUT_OPS", 0)  # every trace laid out in the page
    torch.manual_seed(0)
    a, b = Small().eval(), Small(eps=1e-1).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    cmp = tl.compare(tl.trace(a, x), tl.trace(b, x))
    first = cmp.first_divergence
    assert first is not None and first.module == "norm"
    page = Page(chromium, tl.view(cmp, tmp_path / "cmp.html"))
    try:
        assert page.page.evaluate("window.torchlensViewer.inPage")
        shown = page.panel()  # opens on the first divergence
        assert shown["label"] == first.a and shown["Compared"].startswith("diverges")
        fill = (
            'i => document.querySelector(`#tl-graph g.node[data-op="${i}"] > :is(path, polygon)`)'
            ".getAttribute('fill')"
        )
        assert page.page.evaluate(fill, cmp.a[first.a].index) in ("#fcbba1", "#fb6a4a", "#cb181d")
        assert page.page.evaluate(fill, cmp.a["conv"].index) == "#c7e9c0"  # before the divergence: agrees
        page.page.click("#tl-expand")
        assert sorted(page.visible_ops()) == list(range(len(cmp.a.ops)))
        page.clean()
    finally:
        page.close()
    trace = tl.trace(a, x, intervene=tl.when(tl.func("relu"), tl.zero_ablate()))
    [edited] = [op for op in trace.ops if op.edits]
    page = Page(chromium, tl.view(trace, tmp_path / "edited.html"))
    try:
        page.page.click("#tl-expand")
        marked = page.page.eval_on_selector_all("#tl-graph g.node.tl-edited", "els => els.map(e => e.dataset.op)")
        assert marked == [str(edited.index)]
        assert page.panel()["label"] == edited.label and "zero_ablate" in page.panel()["Edited"]
        assert page.stats()["max"] == 0  # zero-ablated
        page.clean()
    finally:
        page.close()
