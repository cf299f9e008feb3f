"""tl.save / tl.load: the format's guarantees, checked with the third-party numpy backend (no framework)."""

from __future__ import annotations

import json
import pathlib
import random

import pytest

pytest.importorskip("torchlens_numpy")
import numpy as np
from saving_checks import rehash, same_values, views

import torchlens as tl
from torchlens_core.store import saving

W = np.arange(12.0).reshape(3, 4) / 10


def model(x: np.ndarray, *, scale: float = 2.0) -> dict[str, object]:
    h = np.tanh(x @ W) * scale
    h[0, :2] += np.inf  # an in-place write, and inf among the values
    s = np.add.reduce(h[:, 1:], axis=1, keepdims=True)
    noise = np.random.normal(size=h.shape)
    return {"h": h[..., ::2], "stats": (s.mean(), s.astype(np.float32)), "noisy": h + noise}


@pytest.fixture
def saved(tmp_path: pathlib.Path) -> tuple[tl.Trace, pathlib.Path]:
    np.random.seed(0)
    t = tl.trace(model, np.linspace(-1, 1, 6).reshape(2, 3), backend="numpy", scale=3.0)
    return t, tl.save(t, tmp_path / "my_trace")


def test_round_trip_keeps_everything_and_replays(saved) -> None:
    t, path = saved
    loaded = tl.load(path)
    assert views(loaded) == views(t)
    assert sorted(p.name for p in path.iterdir()) == ["arrays.bin", "manifest.json", "trace.json"]
    for a, b in zip(t.ops, loaded.ops):
        assert same_values("numpy", a.out, b.out), a.label
    assert same_values("numpy", loaded.output, t.output) and isinstance(loaded.output, dict)
    assert isinstance(loaded["stats"] if "stats" in loaded else loaded.output["stats"], tuple)
    assert "not_replayable" not in loaded.notes
    assert same_values("numpy", loaded.replay(), t.output)
    assert loaded.audit()


def test_readme_lines_run_as_written(saved, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.chdir(tmp_path)
    log = saved[0]
    tl.save(log, "my_trace")
    loaded = tl.load("my_trace")
    assert views(loaded) == views(log)
    tl.save(loaded, "my_trace")  # saving over a saved trace is allowed, and gives the same trace
    assert views(tl.load("my_trace")) == views(log)


def test_values_the_format_must_keep_exactly(tmp_path: pathlib.Path) -> None:
    weird = (
        None,
        True,
        3,
        -2.5,
        float("nan"),
        float("-inf"),
        1 + 2j,
        "s",
        slice(1, None, 2),
        Ellipsis,
        [1, (2, 3)],
        {"a": 1, 4: "b", (1, 2): None},
        np.float32,
        np.dtype("int16"),
        np.int64(7),
        np.array([True, False]),
        np.array(["x", "yz"]),
        10**30,
    )
    t = tl.trace(lambda x: x + 1, np.ones(2), backend="numpy")
    t.ops[1].meta["weird"] = weird
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    got = loaded.ops[1].meta["weird"]
    assert repr(got[:4]) == repr(weird[:4]) and np.isnan(got[4]) and got[5:12] == weird[5:12]
    assert got[12] is np.dtype(np.float32) or got[12] == np.dtype(np.float32)
    assert got[13] == np.dtype("int16") and type(got[14]) is np.int64 and got[14] == 7
    assert got[15].tolist() == [True, False] and got[16].tolist() == ["x", "yz"] and got[17] == 10**30


def test_unsavable_values_make_ops_unreplayable_not_the_save_fail(tmp_path: pathlib.Path) -> None:
    t = tl.trace(lambda x: x * 2 + 1, np.ones(3), backend="numpy")
    t.ops[1].meta["handle"] = object()  # nothing can encode this
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    label = t.ops[1].label
    assert "could not be saved" in loaded.notes["not_replayable"][label]
    assert views(loaded) == views(t)
    with pytest.raises(tl.UnsupportedError, match=label):
        loaded.replay()


def test_bfloat16_without_the_framework_loads_as_float32() -> None:
    from torchlens_core.store.encoding import Decoder

    bits = np.array([0x3F80, 0xC000, 0x7F80], dtype=np.uint16)  # 1.0, -2.0, inf in bfloat16
    table = [
        {
            "kind": "framework",
            "offset": 0,
            "nbytes": 6,
            "storage": "<u2",
            "shape": [3],
            "dtype": "bfloat16",
            "device": "cpu",
        }
    ]
    value = Decoder("no-such-backend", table, bytearray(bits.tobytes()), framework=False).array(0)
    assert value.dtype == np.float32 and value.tolist() == [1.0, -2.0, float("inf")]


# -- damaged files ------------------------------------------------------------------------------
def edit_records(path: pathlib.Path, change) -> None:
    records = json.loads((path / "trace.json").read_text())
    change(records)
    (path / "trace.json").write_text(json.dumps(records))
    rehash(path)


def test_missing_folder_and_files(saved, tmp_path: pathlib.Path) -> None:
    _, path = saved
    with pytest.raises(tl.TraceFileError, match="does not exist"):
        tl.load(tmp_path / "nothing")
    (path / "arrays.bin").unlink()
    with pytest.raises(tl.TraceFileError, match="arrays.bin.*missing"):
        tl.load(path)
    (path / "manifest.json").unlink()
    with pytest.raises(tl.TraceFileError, match="manifest.json"):
        tl.load(path)


def test_save_refuses_to_clobber_other_things(saved, tmp_path: pathlib.Path) -> None:
    t, _ = saved
    (tmp_path / "file").write_text("x")
    with pytest.raises(tl.TraceFileError, match="is a file"):
        tl.save(t, tmp_path / "file")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "mine.txt").write_text("x")
    with pytest.raises(tl.TraceFileError, match="non-empty folder"):
        tl.save(t, tmp_path / "folder")


@pytest.mark.parametrize("version", [7, 0, "1", None, True])
def test_other_format_versions_are_refused_by_name(saved, version) -> None:
    _, path = saved
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = version
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(tl.TraceFileError, match=f"version {version!r}; this TorchLens .* reads versions 1 to 6"):
        tl.load(path)


@pytest.mark.parametrize("name", ["trace.json", "arrays.bin"])
def test_truncated_and_tampered_files(saved, name) -> None:
    _, path = saved
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[:-10])
    with pytest.raises(tl.TraceFileError, match="truncated"):
        tl.load(path)
    (path / name).write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    with pytest.raises(tl.TraceFileError, match="SHA-256"):
        tl.load(path)


def test_a_call_outside_numpy_is_refused(saved) -> None:
    _, path = saved

    def evil(records):
        op = next(o for o in records["ops"] if o["call"] is not None)
        op["call"] = {"function": "os:system"}
        op["args"], op["parent_indices"] = ["echo owned"], []

    edit_records(path, evil)
    with pytest.raises(tl.TraceFileError, match="os:system"):
        tl.load(path)
    for call in (
        {"function": "numpy:load"},
        {"function": "numpy:save"},
        {"ufunc": "__class__"},
        {"random": "seed"},
        {"operator": "attrgetter"},
        {"method": "__reduce__"},
        ["numpy", "load"],
    ):
        edit_records(path, lambda r, call=call: next(o for o in r["ops"] if o["call"] is not None).update(call=call))
        with pytest.raises(tl.TraceFileError):
            tl.load(path)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r["ops"][1].pop("label"),
        lambda r: r["ops"][1].update(parent_indices=[5]),
        lambda r: r["ops"][1].update(parent_indices="0"),
        lambda r: r["ops"][1].update(module_passes=[["nowhere", 1]]),
        lambda r: r["ops"][1].update(args={"dict": 3}),
        lambda r: r["ops"][1].update(args=[{"ref": [99, []]}]),
        lambda r: r["ops"][1].update(out={"array": 10**6}),
        lambda r: r["ops"][1].update(out={"eval": "__import__('os')"}),
        lambda r: r["arrays"][0].update(nbytes=10**12),
        lambda r: r["arrays"][0].update(storage="O"),
        lambda r: r["arrays"][0].update(storage="|V8"),
        lambda r: r["arrays"][0].update(offset=-8),
        lambda r: r["arrays"][0].update(kind="pickle"),
        lambda r: r.update(ops={}),
        lambda r: r.update(notes=[]),
        lambda r: r.update(output_template={"ref": [10**6, []]}),
        lambda r: r.update(output_template={"list": [{"list": [{"list": []}]}] * 3} if False else [[[[[[]]]]]] * 2),
        lambda r: r.clear(),
    ],
    ids=lambda f: "",
)
def test_malformed_but_valid_json_is_a_trace_file_error(saved, change) -> None:
    t, path = saved
    edit_records(path, change)
    try:
        loaded = tl.load(path)
    except tl.TraceFileError:
        return
    views(loaded)  # a change the format tolerates must still give a usable trace


def test_deep_nesting_is_refused(saved) -> None:
    _, path = saved
    deep: object = []
    for _ in range(500):
        deep = [deep]
    edit_records(path, lambda r: r.update(output_template=deep))
    with pytest.raises(tl.TraceFileError):
        tl.load(path)


def test_random_corruption_never_escapes_as_another_error(saved) -> None:
    t, path = saved
    expected = views(t)
    originals = {p.name: p.read_bytes() for p in path.iterdir()}
    rng = random.Random(1234)
    loaded_ok = 0
    for trial in range(200):
        name = rng.choice(sorted(originals))
        data = bytearray(originals[name])
        how = rng.choice(["flip", "flip", "truncate", "append", "zero"])
        if how == "flip":
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif how == "truncate":
            del data[rng.randrange(len(data)) :]
        elif how == "append":
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            start = rng.randrange(len(data))
            data[start : start + 8] = bytes(len(data[start : start + 8]))
        for other, raw in originals.items():
            (path / other).write_bytes(bytes(data) if other == name else raw)
        try:
            loaded = tl.load(path)
        except tl.TraceFileError:
            continue
        # Only a change no hash covers and the format ignores (whitespace in the manifest...) may load.
        assert views(loaded) == expected, f"trial {trial}: {how} in {name} loaded a different trace"
        loaded_ok += 1
    assert loaded_ok < 40


def test_the_format_version_is_pinned() -> None:
    assert saving.FORMAT_VERSION == 6 and saving.READS_VERSIONS == (1, 2, 3, 4, 5, 6)
