"""A loaded trace whose call arguments were changed is refused before the kernel runs, never a crash.

torch.lstm with batch_first flipped in the saved arguments read and wrote out of bounds and killed the
process on replay (free(): invalid next size, SIGABRT, SIGSEGV). Each tampered file is replayed and
audited in a child process: it must exit normally, having printed a ReplayError.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402


class LSTMThenConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
        self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.conv(y.transpose(1, 2))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    torch.manual_seed(0)
    model = LSTMThenConv().eval()
    x = torch.randn(2, 5, 8)
    folder = tl.save(tl.trace(model, x), tmp_path_factory.mktemp("lstm") / "trace")
    with torch.no_grad():
        torch.save(model(x), folder.parent / "expected.pt")
    return folder


def tampered(saved: pathlib.Path, into: pathlib.Path, func_name: str, position: int, value) -> pathlib.Path:
    """A copy of the saved trace with one argument of the ``func_name`` op changed, hashes made to match."""
    records = json.loads((saved / "trace.json").read_text())
    op = next(o for o in records["ops"] if o["func_name"] == func_name)
    assert op["args"][position] != value
    op["args"][position] = value
    into.mkdir()
    text = json.dumps(records, separators=(",", ":")).encode()
    (into / "trace.json").write_bytes(text)
    (into / "arrays.bin").write_bytes((saved / "arrays.bin").read_bytes())
    manifest = json.loads((saved / "manifest.json").read_text())
    manifest["files"]["trace.json"] = {"size": len(text), "sha256": hashlib.sha256(text).hexdigest()}
    (into / "manifest.json").write_text(json.dumps(manifest))
    return into


CHILD = textwrap.dedent("""
    import sys
    import torchlens as tl
    tl.load(sys.argv[2]).replay()  # the untampered file first: what passed then must not let the tampered call by
    trace = tl.load(sys.argv[1])  # the file passes every check of the loader: its hashes match
    try:
        trace.replay()
        print("replay: ran")
    except tl.TorchLensError as exc:
        print(f"replay: {type(exc).__name__}: {exc}")
    report = trace.audit()
    print("audit:", [f"{f.check}: {f.ok}: {f.detail}" for f in report.findings if not f.ok])
""")

# (op, argument position, new value, what the refusal says): torch.lstm's arguments are (input, hx, params,
# has_biases, num_layers, dropout, train, bidirectional, batch_first); conv1d's (input, weight, bias, stride,
# padding, dilation, groups).
TAMPERINGS = {
    "lstm batch_first flipped": ("lstm", 8, False, "do not fit together"),
    "lstm made bidirectional": ("lstm", 7, True, "do not fit together"),
    "lstm given two layers": ("lstm", 4, 2, "do not fit together"),
    "conv1d stride 2": ("conv1d", 3, [2], "gives shape (2, 16, 3), its record says (2, 16, 5)"),
    "conv1d groups 2": ("conv1d", 6, 2, "do not fit together"),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_a_tampered_call_is_refused_in_a_process_that_survives(saved, tmp_path, name) -> None:
    func_name, position, value, says = TAMPERINGS[name]
    folder = tampered(saved, tmp_path / "t", func_name, position, value)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(saved)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    replay = next(line for line in done.stdout.splitlines() if line.startswith("replay:"))
    assert replay.startswith("replay: ReplayError") and "of this loaded trace is refused" in replay, done.stdout
    assert says in replay, replay
    audit = next(line for line in done.stdout.splitlines() if line.startswith("audit:"))
    assert "of this loaded trace is refused" in audit, audit


def test_the_untampered_file_replays_to_the_models_output(saved) -> None:
    loaded = tl.load(saved)
    assert torch.equal(loaded.replay(), torch.load(saved.parent / "expected.pt"))
    report = loaded.audit()
    assert report, report


def test_a_live_trace_is_not_checked_again(monkeypatch) -> None:
    """A live trace's ops ran with these arguments in the forward: replay makes no meta call for them."""
    from torchlens_torch import meta_check

    calls = []
    monkeypatch.setattr(meta_check, "check", lambda *a: calls.append(a))
    model = LSTMThenConv().eval()
    x = torch.randn(2, 5, 8)
    trace = tl.trace(model, x)
    with torch.no_grad():
        assert torch.allclose(trace.replay(), model(x))
    assert calls == []
