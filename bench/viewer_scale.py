"""The viewer at scale: file size, export time and time to first render in headless Chromium.

    python bench/viewer_scale.py [--out DIR]

GPT-2 small (transformers' GPT2Model from a config, random weights, 64 tokens) and a synthetic 5,000-op
trace (50 stages x 4 blocks x 25 ops, every block a module). Time to first render is ``performance.now()``
(from navigation start) once the first layout's SVG is in the DOM, median of 5 loads; needs Chromium and
Playwright (see docs/viewer.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import statistics
import tempfile
import time

import torch

import torchlens as tl


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        for _ in range(8):
            h = torch.tanh(h) * 0.5 + x
        return h


class Synthetic(torch.nn.Module):
    def __init__(self, stages: int = 50, blocks: int = 4) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList(torch.nn.Sequential(*[Block() for _ in range(blocks)])
                                          for _ in range(stages))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


def gpt2() -> tl.Trace:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config()).eval()
    return tl.trace(model, torch.randint(0, 50257, (1, 64)))


def synthetic() -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(Synthetic().eval(), torch.randn(2, 16))


# Expanding everything: one layout swap (parse the largest SVG, index it), then a forced style and layout pass.
EXPAND_ALL = """() => { const t = performance.now(); document.getElementById('tl-expand').click();
  document.getElementById('tl-graph').getBoundingClientRect(); return performance.now() - t; }"""


def first_render(path: pathlib.Path, loads: int = 5) -> tuple[float, float]:
    """Median ms to the first layout in the DOM (from navigation start), and to expand every module."""
    from playwright.sync_api import sync_playwright

    times, expands = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        for _ in range(loads):
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(path.resolve().as_uri())
            page.wait_for_function("window.torchlensViewer !== undefined", timeout=120_000)
            times.append(page.evaluate("window.torchlensViewer.renderedAt"))
            expands.append(page.evaluate(EXPAND_ALL))
            page.close()
        browser.close()
    return statistics.median(times), statistics.median(expands)


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
    print("| trace | ops | layouts (nodes) | export | file size | first render | expand all |")
    print("|---|---|---|---|---|---|---|")
    for name, make in (("GPT-2 small, 64 tokens", gpt2), ("synthetic 5,000-op", synthetic)):
        trace = make()
        path = out / f"{name.split(',')[0].replace(' ', '_')}.html"
        start = time.perf_counter()
        tl.view(trace, path)
        export = time.perf_counter() - start
        text = path.read_text()
        data = json.loads(re.search(r'<script id="tl-data" type="application/json">(.*?)</script>', text, re.S)[1])
        nodes = ", ".join(str(layout["nodes"]) for layout in data["layouts"])
        render, expand = first_render(path)
        print(f"| {name} | {len(trace.ops)} | {nodes} | {export:.1f} s | {path.stat().st_size / 2**20:.1f} MB "
              f"| {render:.0f} ms | {expand:.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
