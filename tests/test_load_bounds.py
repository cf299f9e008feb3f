"""tl.load costs memory in proportion to the folder, and refuses early what would cost more (issue 36 item 13).

Before: the 1 GiB cap on trace.json still admitted JSON that parses to some
25 times its size; arrays.bin was read in full before its hash was checked,
and bytes no array used were read and kept; a declared terabyte made
``MemoryError`` escape. Each folder here is the committed fixture
(tests/fixtures/torch_mlp_trace, which loads without any framework) damaged
one way, with hashes recomputed where the check is not the hash; the peak
memory of loading it is measured in a fresh process (bounds are generous,
each far below what the old code spent; nothing is timed).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
from typing import Any

import pytest

import torchlens as tl
from torchlens_core.store import folder as files

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "torch_mlp_trace"
linux = pytest.mark.skipif(not pathlib.Path("/proc/self/clear_refs").exists(), reason="measures Linux's VmHWM")


@pytest.fixture
def path(tmp_path: pathlib.Path) -> pathlib.Path:
    shutil.copytree(FIXTURE, tmp_path / "trace")
    return tmp_path / "trace"


def load_cost(path: pathlib.Path) -> tuple[float, str]:
    """Peak RSS growth (MB) of tl.load(path) in a fresh process that loaded the fixture first; what it said."""
    # The peak is the kernel's high-water mark VmHWM, reset first (a process starts with its parent's peak).
    code = textwrap.dedent(f"""
        import torchlens as tl

        def peak_kb():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

        tl.load({str(FIXTURE)!r})  # imports and warms everything a load needs
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to what the process holds now
        before = peak_kb()
        try:
            tl.load({str(path)!r})
            said = "loaded"
        except tl.TraceFileError as exc:
            said = "TraceFileError: " + str(exc)
        except BaseException as exc:
            said = type(exc).__name__ + ": " + str(exc)
        print((peak_kb() - before) / 1024, said.replace(chr(10), " "))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=path.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    growth, _, said = result.stdout.strip().splitlines()[-1].partition(" ")
    return float(growth), said


def rehash(path: pathlib.Path) -> None:
    """The manifest made to agree with the files again, hashing them a chunk at a time (some are 512 MiB)."""
    manifest = json.loads((path / "manifest.json").read_text())
    for name in ("trace.json", "arrays.bin"):
        digest = hashlib.sha256()
        with open(path / name, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        manifest["files"][name] = {"size": (path / name).stat().st_size, "sha256": digest.hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))


def with_notes(path: pathlib.Path, notes: Any) -> None:
    records = json.loads((path / "trace.json").read_text())
    records["notes"] = notes
    (path / "trace.json").write_text(json.dumps(records, separators=(",", ":")))
    rehash(path)


# -- trace.json: JSON that parses to far more than its size ----------------------------------------
@linux
@pytest.mark.parametrize("shape", ["nested lists", "empty dicts"])
def test_json_that_parses_to_many_times_its_size_is_refused_before_it_is_parsed(path, shape) -> None:
    # 30 MB of "[[]]," (or '{"list":[]},' decoded as lists): the old code parsed it into some 700 MB of lists
    # and decoded them again into as many more, then loaded.
    n = 6_000_000 if shape == "nested lists" else 2_500_000
    inner = [[[]]] * n if shape == "nested lists" else [{"list": []}] * n
    with_notes(path, {"dict": [["bomb", {"list": inner}]]})
    growth, said = load_cost(path)
    assert said.startswith("TraceFileError") and "bytes per byte" in said and "not a file tl.save wrote" in said, said
    assert growth < 80, f"refusing {shape} cost {growth:.0f} MB"


def test_json_cost_is_an_upper_bound_of_what_json_loads_takes(path) -> None:
    # The reference: what tracemalloc sees json.loads allocate (its peak), for real and crafted documents.
    n = 20_000
    documents = {
        "a saved trace": (path / "trace.json").read_bytes(),
        "empty dicts": b"[" + b",".join([b"{}"] * n) + b"]",
        "one-key dicts": b"[" + b",".join([b'{"a":1.5}'] * n) + b"]",
        "nested dicts": b"[" + b",".join([b'{"a":{"a":{}}}'] * n) + b"]",
        "nested lists": b"[" + b",".join([b"[[[]]]"] * n) + b"]",
        "floats": b"[" + b",".join([b"1.5"] * n) + b"]",
        "big ints": b"[" + b",".join([b"123456789012345"] * n) + b"]",
        "short strings": b"[" + b",".join([b'"ab"'] * n) + b"]",
        "unique keys": b"{" + b",".join(f'"k{i}":{i * 1000}'.encode() for i in range(n)) + b"}",
        "wide text": ("[" + ",".join(['"\U0001f600ab"'] * n) + "]").encode(),
    }
    for name, raw in documents.items():
        cost = files.JsonCost()
        for start in range(0, len(raw), 4096):
            cost.feed(raw[start : start + 4096])
        text = raw.decode()
        tracemalloc.start()
        parsed = json.loads(text)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del parsed
        assert cost.cost(len(raw)) >= peak, name
        if name == "a saved trace":  # well inside what a saved trace may take per byte
            assert cost.cost(len(raw)) <= files.JSON_COST_PER_BYTE / 1.5 * len(raw)


# -- arrays.bin: read only what the arrays use, hash before holding --------------------------------
@linux
def test_bytes_no_array_uses_are_refused_before_arrays_bin_is_read(path) -> None:
    # 512 MiB of zeros after the arrays (sparse: nothing on disk), the manifest's size and hash to match.
    with open(path / "arrays.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) + (512 << 20))
    rehash(path)
    growth, said = load_cost(path)
    assert said.startswith("TraceFileError") and "arrays end at byte" in said, said
    assert growth < 64, f"refusing 512 MiB that no array uses cost {growth:.0f} MB"


@linux
def test_an_arrays_bin_that_fails_its_hash_is_refused_without_being_held(path) -> None:
    # A 512 MiB array declared in the table, its bytes sparse zeros, a hash that does not match: the old code
    # read all of it into memory first.
    records = json.loads((path / "trace.json").read_text())
    size = (path / "arrays.bin").stat().st_size
    offset = size + (-size % 64)
    records["arrays"].append(
        {
            "kind": "numpy",
            "offset": offset,
            "nbytes": 512 << 20,
            "storage": "|u1",
            "shape": [512 << 20],
            "dtype": "uint8",
            "device": "cpu",
        }
    )
    records["notes"] = {"dict": [["big", {"array": len(records["arrays"]) - 1}]]}
    (path / "trace.json").write_text(json.dumps(records))
    with open(path / "arrays.bin", "r+b") as f:
        f.truncate(offset + (512 << 20))
    rehash(path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["arrays.bin"]["sha256"] = hashlib.sha256(b"something else").hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest))
    growth, said = load_cost(path)
    assert said.startswith("TraceFileError") and "SHA-256" in said, said
    assert growth < 64, f"refusing a 512 MiB arrays.bin that fails its hash cost {growth:.0f} MB"


@linux
@pytest.mark.parametrize("size", [1 << 40, 1 << 43])
def test_a_declared_size_beyond_this_machines_memory_is_refused_unread(path, size) -> None:
    # Sparse, with the manifest's size to match: the old code let MemoryError escape (bytearray of a TiB).
    with open(path / "arrays.bin", "r+b") as f:
        f.truncate(size)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["arrays.bin"]["size"] = size
    (path / "manifest.json").write_text(json.dumps(manifest))
    growth, said = load_cost(path)
    assert said.startswith("TraceFileError") and "more than this machine's memory" in said, said
    assert growth < 64


def test_what_is_in_proportion_still_loads(path) -> None:
    # A real trace carrying 2 MB of ordinary values in its notes: well within the bounds, it loads.
    with_notes(path, {"dict": [["values", {"list": [i * 0.5 for i in range(200_000)]}]]})
    loaded = tl.load(path)
    assert loaded.notes["values"][-1] == 199_999 * 0.5
