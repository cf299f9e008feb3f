"""tl.trace(..., save_to=path) when the disk fills up mid-capture.

The child process caps the size of any file it writes (RLIMIT_FSIZE: the kernel
answers a write past it with EFBIG, as it answers ENOSPC on a full disk), with
the signal a write past the cap raises ignored. What must hold: a typed error
saying nothing was saved, no half-written folder under the name, and a trace
saved there before still whole and loadable (the old folder or the new one).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")

_CHILD = textwrap.dedent("""
    import os, resource, signal, sys
    import torch, torchvision
    import torchlens as tl

    target = sys.argv[1]
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(weights=None).eval(), torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    small = tl.trace(model, torch.randn(1, 3, 16, 16), save=tl.func("linear"), save_to=target)  # the old trace
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.RLIM_INFINITY))
    try:
        tl.trace(model, x, save_to=target)  # about 30 MB of values: fails part way
    except tl.TraceFileError as exc:
        print("ERROR", exc)
    else:
        print("NO ERROR")
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("ENTRIES", sorted(os.listdir(os.path.dirname(target))))
    old = tl.load(target)
    print("OLD", len(old.ops) == len(small.ops), [op.label for op in old.ops if op.saved] ==
          [op.label for op in small.ops if op.saved])
    again = tl.trace(model, x, save_to=target)  # with room again, the same call succeeds
    print("AGAIN", bool(torch.equal(tl.load(target).output, expected)), bool(torch.equal(again.output, expected)))
""")


def test_a_disk_filling_up_mid_capture_leaves_the_old_trace_and_says_so(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    target = tmp_path / "out" / "trace"
    target.parent.mkdir()
    done = subprocess.run([sys.executable, str(script), str(target)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert "File too large" in lines["ERROR"] and "still holds the trace it held before" in lines["ERROR"], done.stdout
    assert lines["ENTRIES"] == "['trace']", done.stdout  # no temporary folder left beside it
    assert lines["OLD"] == "True True", done.stdout
    assert lines["AGAIN"] == "True True", done.stdout
