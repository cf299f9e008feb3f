"""tl.extract_dataset on torch, the inputs users hold and the outputs models give: DataLoaders (refused with the
call to make), NumPy arrays, bfloat16 stored as raw bits, an LSTM's tuple output read by leaf, time-major
outputs with batch_axis. References are the untraced modules themselves."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import torchlens as tl

torch = pytest.importorskip("torch")
zarr = pytest.importorskip("zarr")
np = pytest.importorskip("numpy")

from torchlens_core.store import extract  # noqa: E402 - after the skips


def cnn(dtype: Any = torch.float32) -> Any:
    torch.manual_seed(0)
    return (
        torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 8, 3, padding=1))
        .to(dtype)
        .eval()
    )


def test_a_dataloader_is_refused_with_the_call_to_make(tmp_path: pathlib.Path) -> None:
    model, data = cnn(), torch.randn(6, 3, 8, 8)
    loader = torch.utils.data.DataLoader(list(data), batch_size=4)
    with pytest.raises(tl.UnsupportedError, match=r"torch DataLoader yields batches.*loader.dataset.*batch_size=4"):
        tl.extract_dataset(model, loader, ["0"], output_dir=tmp_path / "loader", progress=False)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(data), 3, False)
    with pytest.raises(tl.UnsupportedError, match="yields batches"):  # batch_size is None, yet it batches
        tl.extract_dataset(
            model,
            torch.utils.data.DataLoader(list(data), batch_sampler=sampler),
            ["0"],
            output_dir=tmp_path / "sampler",
            progress=False,
        )
    unbatched = torch.utils.data.DataLoader(list(data), batch_size=None)  # yields samples: fine
    handle = tl.extract_dataset(model, unbatched, ["0"], batch_size=4, output_dir=tmp_path / "ok", progress=False)
    with torch.no_grad():
        assert np.array_equal(handle["0"][:4], model[0](data[:4]).numpy())


def test_a_numpy_array_is_read_by_index_and_converted(tmp_path: pathlib.Path) -> None:
    model = cnn()
    array = np.random.default_rng(0).standard_normal((6, 3, 8, 8)).astype(np.float32)
    handle = tl.extract_dataset(model, array, ["1"], batch_size=4, output_dir=tmp_path / "np", progress=False)
    with torch.no_grad():
        expected = model[1](model[0](torch.from_numpy(array)))
    np.testing.assert_allclose(handle["1"][:], expected.numpy(), rtol=1e-5, atol=1e-6)


def test_bfloat16_is_stored_losslessly_as_raw_bits(tmp_path: pathlib.Path) -> None:
    model = cnn(torch.bfloat16)
    data = [x.to(torch.bfloat16) for x in torch.randn(5, 3, 8, 8)]
    handle = tl.extract_dataset(model, data, ["0", "2"], batch_size=4, output_dir=tmp_path / "bf16", progress=False)
    with torch.no_grad():
        expected = model[0](torch.stack(data))
    bits = expected.view(torch.int16).numpy().view(np.uint16)
    raw = zarr.open_group(str(tmp_path / "bf16"), mode="r")["0"]
    assert handle.dtypes == {"0": "bfloat16", "2": "bfloat16"} and raw.dtype == np.uint16
    assert np.array_equal(raw[:], bits)  # bit for bit, 2 bytes a value
    wide = tl.Activations(tmp_path / "bf16", as_float32=True)
    assert wide["0"].dtype == np.float32 and np.array_equal(wide["0"][:], expected.float().numpy())
    ml_dtypes = pytest.importorskip("ml_dtypes")
    read = handle["0"][2:4]
    assert read.dtype == ml_dtypes.bfloat16 and np.array_equal(read.view(np.uint16), bits[2:4])
    assert np.array_equal(np.asarray(handle["0"]).view(np.uint16), bits)


def test_float16_is_stored_as_is(tmp_path: pathlib.Path) -> None:
    model = cnn(torch.float16)
    data = [x.half() for x in torch.randn(3, 3, 8, 8)]
    handle = tl.extract_dataset(model, data, ["0"], batch_size=2, output_dir=tmp_path / "f16", progress=False)
    with torch.no_grad():
        expected = model[0](torch.stack(data[:2])).numpy()
    assert handle["0"].dtype == np.float16 and np.array_equal(handle["0"][:2], expected)
    wide = tl.Activations(tmp_path / "f16", as_float32=True)["0"][:2]
    assert wide.dtype == np.float32 and np.array_equal(wide, expected.astype(np.float32))


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(3, 4)  # time-major: (time, batch, features) in and out

    def forward(self, x: Any) -> Any:
        out, (h, c) = self.lstm(x.transpose(0, 1))
        return out.sum(0) + h[0]


def test_lstm_leaves_and_a_time_major_batch_axis(tmp_path: pathlib.Path) -> None:
    model, data = Recurrent().eval(), list(torch.randn(6, 5, 3))  # samples (time, features)
    with torch.no_grad():
        out, (h, c) = model.lstm(torch.stack(data).transpose(0, 1))
    with pytest.raises(tl.UnsupportedError, match=r"gives a tuple of 2, not one array.*'lstm\[0\]'"):
        tl.extract_dataset(model, data, ["lstm"], output_dir=tmp_path / "whole", progress=False)
    with pytest.raises(extract.ExtractError, match="first axis is not the batch"):
        tl.extract_dataset(model, data, [("lstm", 0)], batch_size=4, output_dir=tmp_path / "axis", progress=False)
    handle = tl.extract_dataset(
        model,
        data,
        [("lstm", 0), ("lstm", 1, 0)],
        batch_size=4,
        batch_axis={"lstm[0]": 1, "lstm[1][0]": 1},
        output_dir=tmp_path / "leaves",
        progress=False,
    )
    assert handle.layers == ["lstm[0]", "lstm[1][0]"]
    assert handle.shapes == {"lstm[0]": (5, 4), "lstm[1][0]": (1, 4)}  # batch first, the time axis after it
    assert [entry["batch_axis"] for entry in handle.index["layers"]] == [1, 1]
    np.testing.assert_allclose(handle["lstm[0]"][:], out.transpose(0, 1).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(handle[("lstm", 1, 0)][:], h.transpose(0, 1).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match=r"batch_axis= names \['lstm\[9\]'\]"):
        tl.extract_dataset(model, data, [("lstm", 0)], batch_axis={"lstm[9]": 1}, output_dir=tmp_path / "bad")


def test_the_layout_is_read_from_the_trace(tmp_path: pathlib.Path) -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv1d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6, 2)
    ).eval()
    data = list(torch.randn(3, 3, 8))
    handle = tl.extract_dataset(model, data, ["0", "1", "2", "3"], output_dir=tmp_path / "out", progress=False)
    assert [(e["layout"], e["spatial_axes"]) for e in handle.index["layers"]] == [
        ("NCW", [2]),
        ("NCW", [2]),
        (None, None),
        (None, None),
    ]  # a flatten merges the axes: not known
    assert zarr.open_group(str(tmp_path / "out"))["1"].attrs["torchlens"]["layout"] == "NCW"
    resumed = tl.extract_dataset(model, data, ["0", "1", "2", "3"], output_dir=tmp_path / "out", progress=False)
    assert resumed.index["layers"] == handle.index["layers"]


def test_a_store_from_before_sharding_and_batch_axis_resumes(tmp_path: pathlib.Path) -> None:
    model, data = cnn(), list(torch.randn(6, 3, 8, 8))
    reference = tl.extract_dataset(model, data, ["0"], batch_size=4, output_dir=tmp_path / "ref", progress=False)
    # An earlier version's store: a chunk per batch, no batch_axes / layout in the index, batch 1 unwritten.
    group = zarr.open_group(str(tmp_path / "old"), mode="w")
    old = group.create_array("0", shape=(6, 4, 8, 8), chunks=(4, 4, 8, 8), dtype="float32", fill_value=float("nan"))
    old[:4] = reference["0"][:4]
    markers = group.create_array(extract.MARKERS, shape=(2,), chunks=(1,), dtype="uint32", fill_value=0)
    markers[0] = 4
    index = dict(
        reference.index,
        complete=False,
        layers=[
            {k: v for k, v in e.items() if k in ("key", "array", "shape", "dtype")} for e in reference.index["layers"]
        ],
    )
    del index["batch_axes"]
    group.attrs["torchlens"] = index
    resumed = tl.extract_dataset(model, data, ["0"], batch_size=4, output_dir=tmp_path / "old", progress=False)
    assert resumed.complete and np.array_equal(resumed["0"][:], reference["0"][:])
    assert resumed["0"].chunks == (4, 4, 8, 8)  # read and written as it was made
