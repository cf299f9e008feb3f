"""tl.load on hostile folders, for every backend installed: links and special files, memory bombs, bad structure.

Each test saves a small zoo model of the backend (the fuzz suite's seeds) and
damages the folder the way a finding of issue 13 did. The zoo-wide fuzzing is
in tests/test_load_fuzz.py; calls outside each backend's allow-list are in
tests/test_load_calls.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from fuzz_saving import SEEDS
from saving_checks import rehash, views

import torchlens as tl
from torchlens_core.backend.manager import backend_infos, backend_named

BACKENDS = [i.name for i in backend_infos() if i.available and i.name in SEEDS]
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no backend with a zoo is installed")


def _saved(backend: str, folder: pathlib.Path) -> tuple[tl.Trace, pathlib.Path]:
    case = next(c for c in backend_named(backend).conformance_cases() if c.name == SEEDS[backend][0])
    model, args, kwargs = case.build()
    trace = tl.trace(model, *args, backend=backend, **kwargs)
    return trace, tl.save(trace, folder)


@pytest.fixture(params=BACKENDS)
def saved(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> tuple[str, tl.Trace, pathlib.Path]:
    trace, path = _saved(request.param, tmp_path / "trace")
    return request.param, trace, path


def edit(path: pathlib.Path, change: Any) -> None:
    records = json.loads((path / "trace.json").read_text())
    change(records)
    (path / "trace.json").write_text(json.dumps(records))
    rehash(path)


# -- links and special files ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["arrays.bin", "trace.json", "manifest.json"])
def test_a_link_to_the_very_same_bytes_outside_the_folder_is_refused(saved, tmp_path, name) -> None:
    _, _, path = saved
    outside = tmp_path / f"elsewhere-{name}"
    outside.write_bytes((path / name).read_bytes())
    (path / name).unlink()
    (path / name).symlink_to(outside)
    with pytest.raises(tl.TraceFileError, match="symbolic link"):
        tl.load(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifos_directories_and_devices_are_refused_without_blocking(saved) -> None:
    _, _, path = saved
    (path / "arrays.bin").unlink()
    os.mkfifo(path / "arrays.bin")  # opening it for reading would block forever
    with pytest.raises(tl.TraceFileError, match="FIFO"):
        tl.load(path)
    (path / "arrays.bin").unlink()
    (path / "arrays.bin").mkdir()
    with pytest.raises(tl.TraceFileError, match="directory"):
        tl.load(path)
    (path / "arrays.bin").rmdir()
    (path / "arrays.bin").symlink_to("/dev/zero")
    with pytest.raises(tl.TraceFileError, match="symbolic link"):
        tl.load(path)


def test_a_folder_that_is_a_link_still_loads(saved, tmp_path) -> None:
    # Only what is inside the folder must be plain: the folder itself may be reached through a link.
    _, trace, path = saved
    (tmp_path / "link").symlink_to(path, target_is_directory=True)
    assert views(tl.load(tmp_path / "link")) == views(trace)


# -- memory ----------------------------------------------------------------------------------------
def peak_growth_mb(backend: str, path: pathlib.Path) -> tuple[float, str]:
    """Peak RSS growth (MB) of loading ``path`` in a fresh process, after the backend was warmed up; and the error."""
    code = textwrap.dedent(f"""
        import resource, sys
        import torchlens as tl
        from torchlens_core.backend.manager import backend_named
        cases = backend_named({backend!r}).conformance_cases()
        case = next(c for c in cases if c.name == {SEEDS[backend][0]!r})
        model, args, kwargs = case.build()
        tl.trace(model, *args, backend={backend!r}, **kwargs)  # import and warm the framework first
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            tl.load({str(path)!r})
            error = "loaded"
        except tl.TraceFileError as exc:
            error = str(exc)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) / 1024, error.replace(chr(10), " "))  # ru_maxrss is in KB on Linux
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    growth, _, error = result.stdout.strip().splitlines()[-1].partition(" ")
    return float(growth), error


@pytest.mark.skipif(sys.platform != "linux", reason="peak RSS in kilobytes is Linux's")
@pytest.mark.parametrize("name", ["arrays.bin", "trace.json", "manifest.json"])
def test_an_oversized_file_is_refused_before_it_is_read(saved, name) -> None:
    backend, _, path = saved
    with open(path / name, "r+b") as f:
        f.truncate(1 << 30)  # 1 GiB on paper (sparse: nothing on disk); the manifest still says tiny
    growth, error = peak_growth_mb(backend, path)
    assert "bytes" in error and ("manifest says" in error or "at most" in error), error
    assert growth < 64, f"refusing a 1 GiB {name} cost {growth:.0f} MB"


@pytest.mark.skipif(sys.platform != "linux", reason="peak RSS in kilobytes is Linux's")
def test_overlapping_array_rows_cannot_multiply_memory(saved) -> None:
    # 64 rows over the same 16 MiB, each asking for a conversion: before, each made its own copy (a GiB).
    backend, _, path = saved
    data = (path / "arrays.bin").read_bytes()
    offset = len(data) + (-len(data) % 64)
    (path / "arrays.bin").write_bytes(data + bytes(offset - len(data)) + bytes(16 << 20))

    def bomb(records: dict[str, Any]) -> None:
        first = len(records["arrays"])
        records["arrays"] += [
            {
                "kind": "framework",
                "offset": offset,
                "nbytes": 16 << 20,
                "storage": "<f4",
                "shape": [4 << 20],
                "dtype": "float64" if i % 2 else "float32",
                "device": "cpu",
            }
            for i in range(64)
        ]
        records["notes"] = {"dict": [["bomb", {"list": [{"array": first + i} for i in range(64)]}]]}

    edit(path, bomb)
    growth, error = peak_growth_mb(backend, path)
    assert "share bytes" in error or "widened" in error, error
    assert growth < 128, f"loading 16 MiB of arrays cost {growth:.0f} MB"


def test_two_rows_over_the_same_bytes_are_refused(saved) -> None:
    _, _, path = saved

    def overlap(records: dict[str, Any]) -> None:
        a, b = [row for row in records["arrays"] if row["nbytes"]][:2]
        b["offset"] = a["offset"]

    edit(path, overlap)
    with pytest.raises(tl.TraceFileError, match="share bytes"):
        tl.load(path)


def test_a_widening_conversion_is_refused(saved) -> None:
    _, _, path = saved
    records = json.loads((path / "trace.json").read_text())
    if not any(a["kind"] == "framework" for a in records["arrays"]):
        pytest.skip("this backend's arrays load as NumPy's: nothing is converted")
    # float32 bytes decoded as float64 would double them (uint8 as float64: eight times).
    edit(path, lambda r: next(a for a in r["arrays"] if a["kind"] == "framework").update(dtype="float64"))
    with pytest.raises(tl.TraceFileError, match="widened"):
        tl.load(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(offset=a["offset"] + 4), "aligned"),
        (lambda a: a.update(nbytes=a["nbytes"] + 4), "bytes"),
        (lambda a: a.update(shape=[*a["shape"], 2]), "bytes"),
        (lambda a: a.update(offset=10**12), "aligned"),
        (lambda a: a.update(storage="|O"), "plain data"),
        (lambda a: a.update(extra=1), "fields"),
    ],
)
def test_each_array_row_must_agree_with_its_bytes(saved, change, message) -> None:
    _, _, path = saved
    edit(path, lambda r: change(r["arrays"][0]))
    with pytest.raises(tl.TraceFileError, match=message):
        tl.load(path)


# -- structure -------------------------------------------------------------------------------------
STRUCTURE = {
    # the four: each loaded, then raised a raw error on use
    "argument names a missing parameter (KeyError in audit/replay)": lambda r: r["ops"][1].update(
        args=[*r["ops"][1]["args"], {"param": "gone.weight"}]
    ),
    "text shape (RecursionError in to_pandas)": lambda r: r["ops"][1].update(shape="abc"),
    "huge elapsed (OverflowError)": lambda r: r["ops"][1].update(elapsed=10**400),
    "NaN in a shape (TypeError)": lambda r: r["ops"][1].update(shape=[{"float": "nan"}]),
    # more of the same kind
    "negative FLOPs": lambda r: r["ops"][1].update(cost=[-1.0, 0.0]),
    "op params name nothing": lambda r: r["ops"][1].update(params=["no.such.param"]),
    "module lists a parameter that is not there": lambda r: (r["modules"][0] if r["modules"] else r["ops"][1]).update(
        params=["nope"]
    ),
    "module output names no pass": lambda r: r["ops"][1].update(module_outputs=["nowhere:3"]),
    "two ops share a label": lambda r: r["ops"][2].update(label=r["ops"][1]["label"]),
    "pass number past the number of passes": lambda r: r["ops"][1].update(pass_num=2, num_passes=1),
    "count out of int64 range": lambda r: r["ops"][1].update(func_ordinal=2**63),
    "meta key that is not a string": lambda r: r["ops"][1].update(meta={"dict": [[1, 2]]}),
    "reference into the middle of an array": lambda r: r.update(output_template={"ref": [1, [0, 0, 0]]}),
    "value stored for an op marked unsaved": lambda r: r["ops"][1].update(saved=False),
    "unknown field": lambda r: r["ops"][1].update(evil="x"),
    "value shape disagrees with the record": lambda r: r["ops"][1].update(
        shape=[d + 1 for d in r["ops"][1]["shape"]] if all(type(d) is int for d in r["ops"][1]["shape"]) else [7]
    ),
}


@pytest.mark.parametrize("what", list(STRUCTURE))
def test_malformed_structure_is_refused_at_load(saved, what) -> None:
    _, _, path = saved
    edit(path, STRUCTURE[what])
    with pytest.raises(tl.TraceFileError):
        tl.load(path)
