"""Progress for long work (torchlens_core/ir/progress.py): silent for short work, in logs or when told not to."""

from __future__ import annotations

import io

import pytest

from torchlens_core.ir import progress as progress_module
from torchlens_core.ir.progress import Progress, current_mode, progress, set_progress


class _Clock:
    """time.monotonic for the module under test: moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", fake)
    monkeypatch.delenv("TORCHLENS_PROGRESS", raising=False)
    return fake


def _work(bar: Progress, clock: _Clock, units: int, seconds_each: float) -> None:
    for _ in range(units):
        clock.now += seconds_each
        bar.update()


def test_short_work_prints_nothing_even_when_always(clock: _Clock) -> None:
    out = io.StringIO()
    bar = Progress("tl.save", total=500, unit="value", mode="always", stream=out)
    _work(bar, clock, 500, 0.001)  # half a second in all: under the delay
    bar.close()
    assert out.getvalue() == "" and not bar.shown


def test_long_work_into_a_log_prints_lines_only_when_always(clock: _Clock) -> None:
    for mode in ("auto", "never"):
        out = io.StringIO()
        bar = Progress("tl.trace", unit="op", mode=mode, stream=out)
        _work(bar, clock, 20_000, 0.002)  # 40 s
        bar.close()
        assert not bar.shown and out.getvalue() == "", mode
    out = io.StringIO()
    bar = Progress("tl.trace", unit="op", mode="always", stream=out)
    _work(bar, clock, 20_000, 0.002)
    bar.close()
    printed = out.getvalue().splitlines()
    # the first line once the delay passed, one every EVERY seconds after, and the last at close
    assert 4 <= len(printed) <= 7, printed
    assert printed[-1].startswith("tl.trace: 20,000 ops"), printed[-1]


def test_a_terminal_gets_tqdms_bar_closed_at_the_end(clock: _Clock) -> None:
    pytest.importorskip("tqdm")
    out = _Terminal()
    with progress_module.progress("tl.load", total=3000, unit="value", mode="auto") as bar:
        bar._stream = out  # the context manager writes to stderr; aimed at the fake terminal here
        bar._show, bar.due = True, progress_module.STRIDE
        _work(bar, clock, 3000, 0.01)  # 30 s
        assert bar.shown
    text = out.getvalue()
    assert "tl.load:" in text and "/3000" in text, text[-300:]  # tqdm redraws on its own clock: the count varies
    assert not bar.shown  # closed by the with block


def test_set_progress_for_a_block_and_for_good(clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "_mode", [None])
    assert current_mode() == "auto"
    monkeypatch.setenv("TORCHLENS_PROGRESS", "never")
    assert current_mode() == "never"
    with set_progress("always"):
        assert current_mode() == "always"
        with set_progress(False):
            assert current_mode() == "never"
        assert current_mode() == "always"
    monkeypatch.delenv("TORCHLENS_PROGRESS")
    assert current_mode() == "auto"
    set_progress(True)
    assert current_mode() == "always"


def test_bad_modes_are_refused_saying_which_there_are(clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "_mode", [None])
    with pytest.raises(ValueError, match="'auto', 'always', 'never'"):
        set_progress("loud")
    monkeypatch.setenv("TORCHLENS_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match="TORCHLENS_PROGRESS"):
        current_mode()


def test_the_bar_is_closed_when_the_work_raises(clock: _Clock) -> None:
    with pytest.raises(KeyError):
        with progress("tl.audit", total=10, mode="never") as bar:
            bar.update(3)
            raise KeyError("inside")
    assert bar.done == 3 and bar.due > 10**15


def test_long_captures_saves_loads_audits_and_compares_show_progress(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    """Each long step prints its progress where it was told to (here every unit counts as long), and the
    same steps print nothing in a log (stderr is not a terminal) under the default mode."""
    pytest.importorskip("torchlens_numpy")
    import numpy as np

    import torchlens as tl

    def model(x):
        for _ in range(40):
            x = np.tanh(x) * 0.5 + x
        return x

    x = np.linspace(-1.0, 1.0, 8)
    monkeypatch.setattr(progress_module, "DELAY", 0.0)  # no work here lasts two seconds: all of it counts as long
    monkeypatch.setattr(progress_module, "STRIDE", 1)
    monkeypatch.delenv("TORCHLENS_PROGRESS", raising=False)

    def every_step() -> None:
        a = tl.trace(model, x, backend="numpy")
        tl.save(a, tmp_path / "t")
        b = tl.load(tmp_path / "t")
        assert b.audit()
        tl.compare(a, b)

    every_step()  # "auto", and stderr is pytest's capture, not a terminal
    assert capsys.readouterr().err == ""
    with set_progress("always"):
        every_step()
    err = capsys.readouterr().err
    for what in (
        "tl.trace:",
        "tl.save:",
        "tl.load:",
        "replaying the trace:",
        "tl.compare: reading values:",
        "tl.compare: pairing values:",
    ):
        assert what in err, f"{what} missing from {err[-2000:]}"
    assert "tl.trace: 1" in err  # the capture's count: its ops (three per step of the loop, and the input)
