"""tl.save / tl.load on tinygrad: device-less tensors (Tensor.arange) load as tinygrad tensors; hostile devices."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
from saving_checks import rehash  # noqa: E402
from tinygrad import Tensor  # noqa: E402

import torchlens as tl  # noqa: E402


def _positions(ids: Tensor) -> Tensor:
    return ids.float() + Tensor.arange(ids.shape[1]).reshape(1, -1) + Tensor.zeros(1, ids.shape[1])


def test_a_tensor_tinygrad_never_placed_round_trips_and_replays(tmp_path: pathlib.Path) -> None:
    ids = Tensor([[1, 5, 7, 2]])
    trace = tl.trace(_positions, ids, backend="tinygrad")
    assert trace["arange_1_2"].device == "cpu"  # tinygrad leaves arange's device unset; it runs on the default
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert not loaded.notes.get("not_replayable"), loaded.notes
    for original, again in zip(trace.ops, loaded.ops):
        assert isinstance(again.out, Tensor), again.label
        np.testing.assert_array_equal(again.out.numpy(), original.out.numpy())
    np.testing.assert_array_equal(loaded.replay().numpy(), np.array([[1, 6, 9, 5]], np.float32))


@pytest.mark.parametrize("device", ["disk:/etc/hostname", "none", "npy", "cpu:x"])
def test_a_device_tinygrad_must_not_open_is_refused(tmp_path: pathlib.Path, device: str) -> None:
    folder = tl.save(tl.trace(_positions, Tensor([[1, 2]]), backend="tinygrad"), tmp_path / "t")
    records = json.loads((folder / "trace.json").read_text())
    assert records["arrays"][0]["device"] == "cpu"
    records["arrays"][0]["device"] = device  # where the first array's value is to be placed
    (folder / "trace.json").write_text(json.dumps(records))
    rehash(folder)
    with pytest.raises(tl.TraceFileError):
        tl.load(folder)
