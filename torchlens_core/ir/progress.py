"""Progress for long work: captures, saves, loads, audits and comparisons of big traces.

A bar appears only when the work has run for ``DELAY`` seconds, so the calls a
user makes on ordinary models print nothing. Where it goes is set once with
``tl.options.set_progress(mode)`` (or for a block: ``with
tl.options.set_progress("never"): ...``), or by the ``TORCHLENS_PROGRESS``
environment variable when nothing was set:

- ``"auto"`` (the default): on a terminal or in a Jupyter kernel, after ``DELAY``
  seconds; never into a log file or a pipe;
- ``"always"``: wherever stderr goes, after ``DELAY`` seconds (a line every
  ``EVERY`` seconds where tqdm is not installed or stderr is not a terminal);
- ``"never"``: nothing.

The bar is tqdm's where tqdm is installed (the ``extract`` extra), else a line
on stderr. Counting is the hot path of a capture, so :meth:`Progress.update`
costs an integer add and a comparison; the clock is read every ``STRIDE`` units.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO, TypeVar

MODES = ("auto", "always", "never")
DELAY = 2.0  # seconds of work before a bar is shown: short calls stay silent
EVERY = 10.0  # seconds between two plain lines where there is no tqdm bar
STRIDE = 64  # units counted between two reads of the clock

T = TypeVar("T")

_mode: list[str | None] = [None]  # set_progress's choice; None: the environment's, else "auto"


def _checked(mode: Any, where: str) -> str:
    if isinstance(mode, bool):  # progress=True / False, as extract_dataset takes it
        return "always" if mode else "never"
    if mode not in MODES:
        raise ValueError(
            f"{where}: progress mode {mode!r} is not one of {', '.join(map(repr, MODES))} (or True / False)"
        )
    return mode


class _Restore:
    """What ``set_progress`` returns: nothing to do when called plainly, the old mode back after a ``with`` block."""

    def __init__(self, previous: str | None) -> None:
        self.previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        _mode[0] = self.previous


def set_progress(mode: str | bool) -> _Restore:
    """Where progress bars go from now on: ``"auto"``, ``"always"`` or ``"never"`` (``True`` / ``False`` too).

    Used in a ``with`` statement, the mode holds for the block and the previous one comes back after it.
    """
    previous = _mode[0]
    _mode[0] = _checked(mode, "tl.options.set_progress")
    return _Restore(previous)


def current_mode() -> str:
    """The mode in force: set_progress's, else ``TORCHLENS_PROGRESS``'s, else ``"auto"``."""
    if _mode[0] is not None:
        return _mode[0]
    return _checked(os.environ.get("TORCHLENS_PROGRESS", "auto").strip().lower() or "auto", "TORCHLENS_PROGRESS")


def _interactive(stream: TextIO) -> bool:
    """A terminal, or a Jupyter kernel (whose stderr is not a terminal, and shows tqdm's widget)."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False
    return "ipykernel" in sys.modules


class Progress:
    """One piece of long work, counted in ``unit``s out of ``total`` (None where it is not known in advance).

    Args:
        what: the name shown in front of the bar (``"tl.save"``).
        total: how many units the work has, or None (a capture does not know its op count).
        unit: what is counted (``"op"``, ``"value"``, ``"MB"``).
        mode: ``"auto"``, ``"always"``, ``"never"``, a bool, or None for the mode in force (:func:`current_mode`).
    """

    __slots__ = ("what", "total", "unit", "done", "due", "_started", "_last", "_bar", "_show", "_lines", "_stream")

    def __init__(
        self,
        what: str,
        total: int | None = None,
        unit: str = "op",
        mode: str | bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.what, self.total, self.unit, self.done = what, total, unit, 0
        self._stream = stream if stream is not None else sys.stderr
        resolved = current_mode() if mode is None else _checked(mode, what)
        self._show = resolved == "always" or (resolved == "auto" and _interactive(self._stream))
        # the count at which the clock is looked at next (never when nothing is shown): a caller counting its units
        # itself calls reached() once its count is there, and nothing before
        self.due = STRIDE if self._show else sys.maxsize
        self._started = self._last = time.monotonic()
        self._bar: Any = None
        self._lines = False

    def update(self, count: int = 1) -> None:
        """``count`` more units done."""
        self.done += count
        if self.done >= self.due:
            self._tick()

    def reached(self, done: int) -> None:
        """``done`` units done in all."""
        self.done = done
        if done >= self.due:
            self._tick()

    def each(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, one unit counted as each is taken."""
        for item in items:
            yield item
            self.update()

    def _tick(self) -> None:
        self.due = self.done + STRIDE
        now = time.monotonic()
        if self._bar is None and not self._lines:
            if now - self._started < DELAY:
                return
            self._open()
        if self._bar is not None:
            self._bar.update(self.done - self._bar.n)
        elif now - self._last >= EVERY:
            self._line(now)

    def _open(self) -> None:
        tqdm = _tqdm() if _interactive(self._stream) else None
        if tqdm is None:
            self._lines = True
            self._line(time.monotonic())
            return
        self._bar = tqdm(
            total=self.total,
            initial=self.done,
            unit=self.unit,
            desc=self.what,
            file=self._stream,
            leave=False,
            dynamic_ncols=True,
        )

    def _line(self, now: float) -> None:
        self._last = now
        rate = self.done / max(now - self._started, 1e-9)
        total = "" if self.total is None else f"/{self.total:,}"
        print(
            f"{self.what}: {self.done:,}{total} {self.unit}s, {rate:,.0f} {self.unit}s/s, {now - self._started:.0f} s",
            file=self._stream,
            flush=True,
        )

    @property
    def shown(self) -> bool:
        """Whether anything was printed (a bar or a line)."""
        return self._bar is not None or self._lines

    def close(self) -> None:
        """The work is over (or failed): the bar goes away; a plain line says where it ended."""
        if self._bar is not None:
            self._bar.update(self.done - self._bar.n)
            self._bar.close()
            self._bar = None
        elif self._lines:
            self._line(time.monotonic())
            self._lines = False
        self.due = sys.maxsize


@contextmanager
def progress(
    what: str, total: int | None = None, unit: str = "op", mode: str | bool | None = None
) -> Iterator[Progress]:
    """``with progress("tl.save", total=n, unit="value") as bar: ... bar.update()``: closed however the block ends."""
    bar = Progress(what, total, unit, mode)
    try:
        yield bar
    finally:
        bar.close()


def _tqdm() -> Any:
    """tqdm's bar class (its notebook widget in Jupyter), or None where tqdm is not installed."""
    if importlib.util.find_spec("tqdm") is None:
        return None
    from tqdm.auto import tqdm

    return tqdm
