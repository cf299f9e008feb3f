"""tl.save over an existing trace is all or nothing: killed or out of disk, the folder holds the old trace or the new.

Issue 36 item 5: a save killed once writing had begun (kill -9, a full disk)
destroyed the old trace (no manifest left), after which tl.save refused the
folder; a full disk surfaced as a raw OSError. The trace saved here is the
committed fixture (tests/fixtures/torch_mlp_trace), loaded: it needs no
framework, so these checks run in every session.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from saving_checks import views

import torchlens as tl
from torchlens_core.store import atomic

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "torch_mlp_trace"
TRACE_FILES = {"manifest.json", "trace.json", "arrays.bin"}


def named(name: str) -> tl.Trace:
    """The fixture trace under another model name: the old and the new trace of a folder differ by it."""
    trace = tl.load(FIXTURE)
    trace.model_name = name
    return trace


def leftovers(folder: pathlib.Path) -> list[str]:
    """Siblings of ``folder`` a save wrote or left (its temporary folders)."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}"))


# -- killed while saving ---------------------------------------------------------------------------
# The child saves the "new" trace over the folder. Every write, rename, exchange and removal first prints a
# line and sleeps, so that the test kills the child (SIGKILL) at a known step; a write prints after half its
# bytes, so that a kill lands inside a file being written.
CHILD = textwrap.dedent("""
    import builtins, io, os, shutil, sys, time
    import torchlens as tl
    from torchlens_core.store import atomic

    def step(what):
        print(what, flush=True)
        if os.environ.get("KILL_AT") == what.split(" ", 1)[0]:
            time.sleep(60)  # the parent kills us here

    class Slow:
        def __init__(self, f, name):
            self.f, self.name, self.n = f, name, 0
        def write(self, data):
            half = len(data) // 2  # (bytes, memoryview of bytes, or str for a file opened as text)
            self.f.write(data[:half])
            self.n += 1
            step(f"write:{self.name}:{self.n} {len(data)}")
            return self.f.write(data[half:]) + half
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    real_open = io.open
    def slow_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Slow(f, os.path.basename(os.fspath(file))) if any(c in mode for c in "wxa") else f
    builtins.open = io.open = slow_open
    for module, name in ((os, "rename"), (shutil, "rmtree"), (atomic, "_exchange")):
        real = getattr(module, name)
        def wrapped(*args, real=real, name=name, **kwargs):
            step(f"{name}:")
            return real(*args, **kwargs)
        setattr(module, name, wrapped)

    trace = tl.load(sys.argv[2])
    trace.model_name = "new"
    tl.save(trace, sys.argv[1])
    print("done", flush=True)
""")


def run_child(folder: pathlib.Path, kill_at: str | None) -> list[str]:
    """Run the child's save; kill it with SIGKILL at step ``kill_at``. Returns the steps it printed."""
    env = dict(os.environ, KILL_AT=kill_at or "")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder), str(FIXTURE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    steps = []
    assert child.stdout is not None
    for line in child.stdout:
        steps.append(line.strip())
        if kill_at is not None and line.strip().split(" ", 1)[0] == kill_at:
            child.send_signal(signal.SIGKILL)
            break
    child.wait(timeout=120)
    if kill_at is None:
        assert child.returncode == 0 and steps[-1] == "done", child.stderr.read()[-3000:]
    else:
        assert child.returncode == -signal.SIGKILL, (kill_at, steps, child.stderr.read()[-3000:])
    return steps


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="no SIGKILL here")
def test_a_save_killed_at_any_step_leaves_the_old_trace_or_the_new(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "trace"
    old, new = named("old"), named("new")
    expected = {"old": views(old), "new": views(new)}
    tl.save(old, folder)
    steps = [s.split(" ", 1)[0] for s in run_child(folder, None)]  # a save that runs to the end: its steps
    assert tl.load(folder).model_name == "new"
    writes = [s for s in steps if s.startswith("write:")]
    assert {w.split(":")[1] for w in writes} == TRACE_FILES, steps
    # Inside each file's first write, inside the last array chunk, then each step that moves folders.
    points = list(
        dict.fromkeys(
            [
                next(w for w in writes if w.split(":")[1] == name)
                for name in ("trace.json", "arrays.bin", "manifest.json")
            ]
            + [w for w in writes if w.startswith("write:arrays.bin")][-1:]
            + [s for s in steps if not s.startswith("write:") and s != "done"]
        )
    )
    assert len(points) >= 5, steps
    seen = set()
    for point in points:
        tl.save(old, folder)
        run_child(folder, point)
        loaded = tl.load(folder)  # the folder loads, whatever step the save was killed at
        seen.add(loaded.model_name)
        assert views(loaded) == expected[loaded.model_name], point
        # Killed before the folders were swapped, the old trace; after, the new.
        swapped = steps.index(point) > steps.index("_exchange:")
        assert loaded.model_name == ("new" if swapped else "old"), (point, steps)
        # Saving again works, and removes what the killed save left beside the folder.
        tl.save(new, folder)
        assert views(tl.load(folder)) == expected["new"]
        assert leftovers(folder) == [], point
        assert set(os.listdir(folder)) == TRACE_FILES
    assert seen == {"old", "new"}


# -- out of disk -----------------------------------------------------------------------------------
class FullDisk:
    """``open`` for the saving module: files opened for writing take ``room`` bytes in all, then ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.raised = 0

    def __call__(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = open(file, mode, *args, **kwargs)
        return self.Writer(f, self) if any(c in mode for c in "wxa") else f

    class Writer:
        def __init__(self, f: Any, disk: FullDisk) -> None:
            self.f, self.disk = f, disk

        def write(self, data: Any) -> int:
            n = len(memoryview(data).cast("B"))
            if n > self.disk.room:
                self.disk.raised += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.disk.room -= n
            return self.f.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

        def __enter__(self) -> FullDisk.Writer:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.__exit__(*exc)


@pytest.mark.parametrize("full_in", ["trace.json", "arrays.bin", "manifest.json"])
def test_a_full_disk_is_a_trace_file_error_and_the_old_trace_stays(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, full_in: str
) -> None:
    folder = tmp_path / "trace"
    old, new = named("old"), named("new")
    sizes = {p.name: p.stat().st_size for p in tl.save(new, tmp_path / "scratch").iterdir()}
    room = {
        "trace.json": 10,
        "arrays.bin": sizes["trace.json"] + 10,
        "manifest.json": sizes["trace.json"] + sizes["arrays.bin"] + 10,
    }[full_in]
    tl.save(old, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    disk = FullDisk(room)
    monkeypatch.setattr(atomic, "open", disk, raising=False)
    with pytest.raises(
        tl.TraceFileError,
        match=rf"cannot save to .*trace'.*No space left on device.* writing "
        rf"{full_in}.*still holds the trace it held before.*free some "
        rf"space",
    ) as info:
        tl.save(new, folder)
    assert disk.raised == 1 and str(folder) in str(info.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the old trace, byte for byte
    assert leftovers(folder) == []
    assert views(tl.load(folder)) == views(old)
    monkeypatch.undo()
    tl.save(new, folder)
    assert views(tl.load(folder)) == views(new)


def test_a_full_disk_on_a_first_save_leaves_nothing(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "open", FullDisk(100), raising=False)
    with pytest.raises(tl.TraceFileError, match="nothing was saved there"):
        tl.save(named("new"), tmp_path / "trace")
    assert sorted(os.listdir(tmp_path)) == []


def test_no_permission_is_a_trace_file_error(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tmp_path / "locked"
    parent.mkdir()
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        parent.chmod(0o500)
    else:  # root may write anywhere: the refusal the system would give, given for the sibling only
        real_mkdir = os.mkdir

        def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
            if atomic.TEMP in os.fspath(path):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", refuse)
    try:
        with pytest.raises(tl.TraceFileError, match="locked.*write permission"):
            tl.save(named("new"), parent / "trace")
    finally:
        parent.chmod(0o700)
    assert os.listdir(parent) == []


# -- what a save may replace -----------------------------------------------------------------------
def test_other_files_beside_a_trace_are_not_deleted(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "trace"
    tl.save(named("old"), folder)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(tl.TraceFileError, match=r"other files \(notes.txt\)"):
        tl.save(named("new"), folder)
    assert (folder / "notes.txt").read_text() == "mine" and tl.load(folder).model_name == "old"


def test_an_empty_folder_a_linked_folder_and_the_folders_mode(tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty").mkdir()
    tl.save(named("new"), tmp_path / "empty")
    assert tl.load(tmp_path / "empty").model_name == "new"
    # Through a link to a folder: the trace is replaced where the link points, and the link stays.
    tl.save(named("old"), tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "real").chmod(0o750)
    tl.save(named("new"), tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and tl.load(tmp_path / "real").model_name == "new"
    assert (tmp_path / "real").stat().st_mode & 0o777 == 0o750  # the replaced folder's permissions are kept
    assert leftovers(tmp_path / "real") == []


def test_a_stale_sibling_of_a_running_save_is_left_alone(tmp_path: pathlib.Path) -> None:
    # Only siblings whose process is gone are removed: this one's process (ours) is running.
    folder = tmp_path / "trace"
    busy = tmp_path / f".trace{atomic.TEMP}{os.getpid()}-0000"
    busy.mkdir()
    (busy / "trace.json").write_text("{}")
    gone = tmp_path / f".trace{atomic.TEMP}{2**22 + 12345}-0000"  # above Linux's default pid_max: no process
    gone.mkdir()
    (gone / "arrays.bin").write_bytes(b"x")
    theirs = tmp_path / f".trace{atomic.TEMP}{2**22 + 12346}-0000"
    theirs.mkdir()
    (theirs / "mine.txt").write_text("not a trace file")  # not ours to remove, whoever made it
    tl.save(named("new"), folder)
    assert leftovers(folder) == sorted([busy.name, theirs.name])
    assert json.loads((busy / "trace.json").read_text()) == {}


def test_what_cannot_be_swapped_is_refused_by_name(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = named("new")
    (tmp_path / "broken").symlink_to(tmp_path / "nothing")
    with pytest.raises(tl.TraceFileError, match="link to nothing"):
        tl.save(trace, tmp_path / "broken")
    tl.save(named("old"), tmp_path / "here")
    monkeypatch.chdir(tmp_path / "here")  # replacing the working directory would leave this process in none
    with pytest.raises(tl.TraceFileError, match="working directory"):
        tl.save(trace, ".")
    assert tl.load(".").model_name == "old"


def test_without_an_atomic_exchange_two_renames_replace_the_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on Windows or a file system refusing RENAME_EXCHANGE: the old folder is moved aside, the new moved in.
    monkeypatch.setattr(atomic, "_exchange", lambda new, folder: False)
    folder = tmp_path / "trace"
    tl.save(named("old"), folder)
    tl.save(named("new"), folder)
    assert views(tl.load(folder)) == views(named("new")) and leftovers(folder) == []
    monkeypatch.setattr(atomic, "open", FullDisk(10), raising=False)
    with pytest.raises(tl.TraceFileError, match="still holds the trace it held before"):
        tl.save(named("old"), folder)
    assert tl.load(folder).model_name == "new" and leftovers(folder) == []
