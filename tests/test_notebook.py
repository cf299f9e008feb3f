"""In a notebook: ops, module passes, summaries, audits and bundles show as tables, and trace["<TAB> completes.

The reference for each table is what ``print`` shows of the same object (the
two must say the same), and for completion IPython's own completer, run on a
real ResNet-18 capture; the module paths it must offer are torch's
``named_modules()``.
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import torchlens as tl  # noqa: E402


class _Cells(HTMLParser):
    """The rows of every table in a piece of HTML, each a list of cell texts; and the captions."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.captions: list[str] = []
        self._cell: list[str] | None = None
        self._caption: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "caption":
            self._caption = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "caption" and self._caption is not None:
            self.captions.append("".join(self._caption))
            self._caption = None

    def handle_data(self, data: str) -> None:
        for part in (self._cell, self._caption):
            if part is not None:
                part.append(data)


def cells(markup: str) -> _Cells:
    parsed = _Cells()
    parsed.feed(markup)
    return parsed


@pytest.fixture(scope="module")
def resnet() -> tuple[Any, Any, tl.Trace]:
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), torch.randn(1, 3, 32, 32)
    return model, x, tl.trace(model, x)


def _shown(value: Any) -> dict[str, str]:
    """What IPython's display machinery makes of ``value`` (its own formatter), else the repr methods."""
    try:
        from IPython.core.formatters import DisplayFormatter
    except ImportError:
        html = getattr(value, "_repr_html_", lambda: None)()
        return {"text/plain": repr(value), **({"text/html": html} if html else {})}
    shown, _ = DisplayFormatter().format(value)
    return shown


def test_an_op_shows_as_the_table_of_what_print_shows(resnet: tuple[Any, Any, tl.Trace]) -> None:
    _, x, trace = resnet
    op = trace["conv2d_1_1"]
    parsed = cells(_shown(op)["text/html"])
    printed = str(op).splitlines()
    assert parsed.captions == [printed[0]]
    rows = {row[0]: row[1] for row in parsed.rows}
    keyed = [
        line.strip().partition(": ")
        for line in printed[1:]
        if line.startswith("    ") and not line.startswith("     ") and ": " in line
    ]
    assert {k: v for k, _, v in keyed} == {k: rows[k].splitlines()[0] for k, _, _ in keyed}
    assert rows["Output"].startswith(
        f"shape={tuple(torch.nn.functional.conv2d(x, trace.params['conv1.weight'].value, stride=2, padding=3).shape)}"
    )
    assert "parent layers: input_1" in rows["Related layers"]


def test_a_summary_shows_as_a_table_and_echoes_as_text(resnet: tuple[Any, Any, tl.Trace]) -> None:
    model, _, trace = resnet
    summary = trace.summary()
    assert isinstance(summary, str) and repr(summary) == str(summary)  # echoed in a terminal: the table itself
    parsed = cells(_shown(summary)["text/html"])
    header, *body = parsed.rows
    assert header == ["Layer", "Output Shape", "Params", "Train"]
    text_rows = [line for line in str(summary).splitlines() if line.startswith("| ")][1:]
    table_body = body[: len(text_rows)]
    assert [row[0].strip() for row in table_body] == [line.split("|")[1].strip() for line in text_rows]
    assert table_body == [[cell.rstrip() for cell in line[2:-2].split(" | ")] for line in text_rows]
    # the parameter counts are torch's own ("148.0 k")
    layer1 = next(row for row in table_body if row[0].startswith("layer1 "))
    number, _, unit = layer1[2].partition(" ")
    shown_count = float(number) * {"": 1, "k": 1e3, "M": 1e6}[unit]
    assert shown_count == pytest.approx(sum(p.numel() for p in model.layer1.parameters()), rel=1e-3)


def test_a_module_pass_of_several_outputs_and_an_audit_show_as_tables(resnet: tuple[Any, Any, tl.Trace]) -> None:
    _, x, trace = resnet

    class TwoOut(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, v: Any) -> Any:
            y = self.fc(v)
            return y, y.relu()

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.two = TwoOut()

        def forward(self, v: Any) -> Any:
            a, b = self.two(v)
            return a + b

    seen: list[Any] = []
    model = Outer()
    handle = model.two.register_forward_hook(lambda m, a, out: seen.append(out))
    small = tl.trace(model, torch.randn(2, 4))
    handle.remove()
    module_pass = small["two:1"]
    printed = str(module_pass)
    assert printed.splitlines()[0] == "Module pass two:1 (TwoOut), call 1 of 1:"
    assert f"shape {tuple(seen[0][0].shape)}, {tuple(seen[0][1].shape)}" in printed
    assert "Params: 2 tensors, 15 params" in printed  # 4*3 weights + 3 biases
    parsed = cells(_shown(module_pass)["text/html"])
    assert parsed.captions == [printed.splitlines()[0]]
    assert [row[0] for row in parsed.rows] == [line.strip().split(":")[0] for line in printed.splitlines()[1:]]
    report = trace.audit()
    parsed = cells(_shown(report)["text/html"])
    assert parsed.captions[0].startswith("Audit: PASS")
    assert len(parsed.rows) == 1 + len(report.findings)  # the header, then one row per check


def test_a_bundle_and_its_site_comparison_show_as_tables(resnet: tuple[Any, Any, tl.Trace]) -> None:
    model, x, trace = resnet
    patched = tl.trace(model, x, intervene=tl.when(tl.module("layer1"), tl.zero_ablate()))
    runs = tl.bundle({"clean": trace, "ablated": patched}, baseline="clean")
    assert [row[0] for row in cells(_shown(runs)["text/html"]).rows[1:]] == ["clean", "ablated"]
    site = runs.compare_at("layer1")
    parsed = cells(_shown(site)["text/html"])
    assert parsed.rows[0][:3] == ["run", "max |diff|", "rel L2"]
    ablated = dict((row[0], row) for row in parsed.rows[1:])["ablated"]
    assert float(ablated[1]) == pytest.approx(float(trace["layer1"].out.detach().abs().max()), rel=1e-3)


def test_tab_completes_labels_and_module_paths(resnet: tuple[Any, Any, tl.Trace]) -> None:
    model, _, trace = resnet
    offered = trace._ipython_key_completions_()
    assert {path for path, _ in model.named_modules() if path} <= set(offered)
    assert {"conv2d_1_1", "conv2d_1", "layer1.0.relu:2"} <= set(offered)
    for key in offered:
        trace[key]  # every key offered finds something
    interactive = pytest.importorskip("IPython.core.interactiveshell")
    from IPython.core.completer import provisionalcompleter

    shell = interactive.InteractiveShell.instance()
    shell.user_ns["trace"] = trace
    line = 'trace["layer1.0.c'
    with provisionalcompleter():
        matches = sorted({c.text.rstrip('"]') for c in shell.Completer.completions(line, len(line))})
    assert matches == ["layer1.0.conv1", "layer1.0.conv1:1", "layer1.0.conv2", "layer1.0.conv2:1"]


def test_a_comparison_shows_the_table_print_shows_with_the_divergence_marked(resnet: tuple[Any, Any, tl.Trace]) -> None:
    model, x, trace = resnet
    other = tl.trace(model, x, intervene=tl.when(tl.module("layer2"), tl.scale(1.5)))
    comparison = tl.compare(trace, other)
    markup = _shown(comparison)["text/html"]
    parsed = cells(markup)
    assert parsed.captions == [str(comparison).splitlines()[0]]
    printed = [line.split() for line in str(comparison).splitlines()[1:] if not line.startswith("  ...")]
    header, *body = parsed.rows
    assert [c.split() for c in header] == [
        ["a"],
        ["b"],
        ["layout"],
        ["max", "|diff|"],
        ["max", "rel"],
        ["cosine"],
        ["verdict"],
    ]
    shown_rows = [row for row in body if row[0] != "..."]
    assert [row[0] for row in shown_rows] == [line[0] for line in printed[1:]]
    first = comparison.first_divergence
    assert first is not None and first.module.startswith("layer2")
    marked = markup.count('style="background:#fdd"')
    assert marked == sum(1 for row in shown_rows if "diverges" in row[-1]) >= 1
