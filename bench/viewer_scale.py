"""The viewer at scale: export time, file size and time to first render in headless Chromium.

    python bench/viewer_scale.py [--ops 1000 10000 50000] [--gpt2] [--loads 3] [--out DIR]

A synthetic model of about ``--ops`` ops, nested as a large model is (groups of 10 stages of 4 blocks of 25
ops, every group, stage and block a module: 50,000 ops are 50 groups, as a 50-layer decoder has 50 layers),
and with ``--gpt2`` GPT-2 small (transformers' GPT2Model from a config, random weights, 64 tokens). First
render is ``performance.now()`` (from navigation start) once the first layout's SVG is in the DOM, median of
``--loads`` loads; "open" is export plus first render (what a user of ``tl.view`` waits for); export CPU is
this process's CPU time for the export (on shared cores the wall clock measures the neighbours too); "nodes
shown" counts the graph's nodes in the DOM then; expand all is the click on **Expand all** until the next
layout pass; open + search is opening one module and searching a label. Needs Chromium and Playwright (see
docs/viewer.md).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import tempfile
import time

import torch

import torchlens as tl

BLOCK_OPS = 25  # a linear, then 8 x (tanh, mul, add)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        for _ in range(8):
            h = torch.tanh(h) * 0.5 + x
        return h


class Group(torch.nn.Module):
    def __init__(self, stages: int, blocks: int) -> None:
        super().__init__()
        self.stages = torch.nn.Sequential(
            *[torch.nn.Sequential(*[Block() for _ in range(blocks)]) for _ in range(stages)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x)


class Synthetic(torch.nn.Module):
    """``groups`` x ``stages`` x ``blocks`` blocks of 25 ops each."""

    def __init__(self, groups: int, stages: int = 10, blocks: int = 4) -> None:
        super().__init__()
        self.groups = torch.nn.ModuleList(Group(stages, blocks) for _ in range(groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for group in self.groups:
            x = group(x)
        return x


def synthetic(ops: int) -> tl.Trace:
    torch.manual_seed(0)
    groups = max(1, round(ops / (BLOCK_OPS * 40)))
    return tl.trace(Synthetic(groups).eval(), torch.randn(2, 16))


def gpt2() -> tl.Trace:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config()).eval()
    return tl.trace(model, torch.randint(0, 50257, (1, 64)))


# Expanding everything: one layout pass, then a forced style and layout pass.
EXPAND_ALL = """() => { const t = performance.now(); document.getElementById('tl-expand').click();
  document.getElementById('tl-graph').getBoundingClientRect(); return performance.now() - t; }"""
# Opening the first folded module box, then searching the label of the last op: the two interactions a user
# makes first on a big trace.
OPEN_AND_SEARCH = """(label) => { const t = performance.now();
  const box = document.querySelector('#tl-graph .tl-modbox');
  if (box) box.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  const search = document.getElementById('tl-search'); search.value = label;
  search.dispatchEvent(new Event('input')); document.getElementById('tl-graph').getBoundingClientRect();
  return performance.now() - t; }"""
NODES = "document.querySelectorAll('#tl-graph g.node').length"


def in_browser(path: pathlib.Path, last_label: str, loads: int) -> dict[str, float]:
    """Medians over ``loads`` fresh pages: first render (ms), nodes shown then, open + search, expand all."""
    from playwright.sync_api import sync_playwright

    found: dict[str, list[float]] = {"render": [], "nodes": [], "open": [], "expand": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        for _ in range(loads):
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(path.resolve().as_uri(), timeout=300_000)
            page.wait_for_function("window.torchlensViewer !== undefined", timeout=300_000)
            found["render"].append(page.evaluate("window.torchlensViewer.renderedAt"))
            found["nodes"].append(page.evaluate(NODES))
            found["open"].append(page.evaluate(OPEN_AND_SEARCH, last_label))
            found["expand"].append(page.evaluate(EXPAND_ALL))
            page.close()
        browser.close()
    return {k: statistics.median(v) for k, v in found.items()}


def screenshot(trace: tl.Trace, html: pathlib.Path, png: pathlib.Path, op: str, depth: str | None = None) -> None:
    """docs/viewer.md's pictures: the page with ``op`` clicked (and modules folded at ``depth``)."""
    from playwright.sync_api import sync_playwright

    for each in trace.ops:
        each.code_context = ()  # no path of this machine in a committed picture
    tl.view(trace, html)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 860})
        page.goto(html.resolve().as_uri())
        page.wait_for_function("window.torchlensViewer !== undefined")
        if depth is not None:
            page.select_option("#tl-depth", depth)
        page.evaluate("i => window.torchlensViewer.center(i)", trace[op].index)
        page.locator(f'#tl-graph g.node[data-op="{trace[op].index}"]').click()
        page.screenshot(path=str(png))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--ops",
        type=int,
        nargs="*",
        default=[1_000, 10_000, 50_000],
        help="sizes of the synthetic trace, in ops (default: 1000 10000 50000)",
    )
    parser.add_argument("--gpt2", action="store_true", help="also GPT-2 small (needs transformers)")
    parser.add_argument("--loads", type=int, default=3, help="page loads per file (the median is shown)")
    parser.add_argument("--out", default=None, help="where to keep the HTML files (default: a temporary folder)")
    parser.add_argument("--shots", default=None, help="write docs/viewer.md's screenshots to this folder")
    args = parser.parse_args()
    if args.shots:
        import torchvision

        torch.manual_seed(0)
        resnet = tl.trace(torchvision.models.resnet18(weights=None).eval(), torch.rand(1, 3, 224, 224))
        shots, scratch = pathlib.Path(args.shots), pathlib.Path(tempfile.mkdtemp())
        screenshot(resnet, scratch / "resnet18.html", shots / "viewer_resnet18.png", "layer2.0.conv1", depth="3")
        trace = gpt2()
        screenshot(trace, scratch / "gpt2.html", shots / "viewer_gpt2.png", "h.0.attn.c_attn", depth="4")
        return
    out = pathlib.Path(args.out or tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    cases = [(f"synthetic {n}", lambda n=n: synthetic(n)) for n in args.ops]
    if args.gpt2:
        cases.insert(0, ("GPT-2 small, 64 tokens", gpt2))
    print(
        "| trace | ops | trace | export | export CPU | file size | first render | open | nodes shown | open + search "
        "| expand all |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, make in cases:
        start = time.perf_counter()
        trace = make()
        traced = time.perf_counter() - start
        path = out / f"{name.split(',')[0].replace(' ', '_')}.html"
        start, cpu = time.perf_counter(), time.process_time()
        tl.view(trace, path)
        export, cpu = time.perf_counter() - start, time.process_time() - cpu
        got = in_browser(path, trace.ops[-1].label, args.loads)
        print(
            f"| {name} | {len(trace.ops):,} | {traced:.1f} s | {export:.1f} s | {cpu:.1f} s | "
            f"{path.stat().st_size / 2**20:.1f} MB | {got['render']:.0f} ms | {export + got['render'] / 1e3:.1f} s | "
            f"{got['nodes']:.0f} | "
            f"{got['open']:.0f} ms | {got['expand']:.0f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
