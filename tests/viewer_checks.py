"""Drive a viewer page in headless Chromium (Debian's, through Playwright) and check what a user sees.

Shared by tests/test_viewer_*.py. ``browser()`` skips the test, saying why,
where Chromium or Playwright is missing (the core session without them still
passes); CI installs both (.ci/run, the ``test`` extra).
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium): the viewer's browser tests need it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright): the viewer's browser tests need it")
    with sync_playwright() as p:
        found = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield found
        finally:
            found.close()


class Page:
    """One viewer file open in a fresh page, recording console errors and every request that is not the file."""

    def __init__(self, chromium: Any, path: str | pathlib.Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = chromium.new_page(viewport={"width": 1400, "height": 900})
        self.page.on(
            "console",
            lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        url = pathlib.Path(path).resolve().as_uri()

        def route(r: Any) -> None:
            if r.request.url == url or r.request.url.startswith("data:"):
                r.continue_()
            else:  # anything else is the network (or another file): refused and reported
                self.requests.append(r.request.url)
                r.abort()

        self.page.route("**/*", route)
        self.page.goto(url)
        self.page.wait_for_function("window.torchlensViewer !== undefined", timeout=30_000)

    def close(self) -> None:
        self.page.close()

    def clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.requests == [], f"the page asked for {self.requests}"

    def visible_ops(self, indices: Any = None) -> list[int]:
        """Op indices drawn as their own node and shown now."""
        found = self.page.eval_on_selector_all(
            "#tl-graph g.node[data-op]",
            "els => els.filter(e => e.getClientRects().length > 0 && "
            "getComputedStyle(e).display !== 'none').map(e => Number(e.dataset.op))",
        )
        return [i for i in found if indices is None or i in indices]

    def boxes(self, key: str) -> int:
        """How many module boxes (laid out or folded in place) stand for the module pass ``key`` now."""
        return self.page.eval_on_selector_all(
            ".tl-modbox",
            "(els, key) => els.filter(e => e.dataset.module === key && getComputedStyle(e).display !== 'none').length",
            key,
        )

    def search(self, text: str) -> str:
        self.page.fill("#tl-search", text)
        self.page.press("#tl-search", "Enter")
        return self.page.inner_text("#tl-status")

    def panel(self) -> dict[str, str]:
        """The op panel: its title, function, and each row by name."""
        rows = self.page.eval_on_selector_all(
            "#tl-panel tr", "rows => rows.map(r => [r.dataset.field, r.querySelector('td').innerText])"
        )
        found = {"label": self.page.inner_text("#tl-panel h2"), "func": self.page.inner_text(".tl-op-func")}
        for name, value in rows:
            found.setdefault(name, value)
        stats = self.page.query_selector(".tl-stats")
        if stats is not None:
            found["stats"] = stats.inner_text()
        return found

    def click_op(self, index: int) -> None:
        """Bring the op into view (as the page's search does) and click its node with the mouse."""
        self.page.evaluate("i => window.torchlensViewer.center(i)", index)
        self.page.locator(f'#tl-graph g.node[data-op="{index}"]').click()

    def stats(self) -> dict[str, float]:
        text = self.panel()["stats"]
        return {part.split()[0]: float(part.split()[1]) for part in text.split(", ") if "non-finite" not in part}


def pixels(png: bytes) -> list[tuple[int, ...]]:
    """The RGB(A) pixels of a PNG (8-bit, non-interlaced, as Chromium writes screenshots): no imaging library."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, header = 8, b"", None
    while at < len(png):
        length, kind = struct.unpack(">I4s", png[at : at + 8])
        body = png[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    width, height, depth, color, _, _, interlace = header  # type: ignore[misc]
    assert depth == 8 and interlace == 0 and color in (2, 6), header
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(line)
        previous = line
    return [tuple(row[x : x + 3]) for row in rows for x in range(0, stride, channels)]


def assert_not_blank(png: bytes) -> None:
    """The picture shows a graph: many pixels neither white nor one flat colour, in several colours."""
    found = pixels(png)
    inked = [p for p in found if p != (255, 255, 255)]
    assert len(inked) > 0.005 * len(found), f"only {len(inked)} of {len(found)} pixels are not white"
    assert len(set(found)) > 8, f"the screenshot has only {len(set(found))} colours"
