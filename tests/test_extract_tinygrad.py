"""tl.extract_dataset on tinygrad: a small model checked against tl.pluck on the same batch and against the
plain tinygrad computation; NumPy samples converted through the backend."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import torchlens as tl

tinygrad = pytest.importorskip("tinygrad")
zarr = pytest.importorskip("zarr")
np = pytest.importorskip("numpy")

from tinygrad import Tensor  # noqa: E402 - after the skips
from tinygrad.nn import Linear  # noqa: E402


class MLP:
    def __init__(self) -> None:
        Tensor.manual_seed(0)
        self.fc1, self.fc2 = Linear(6, 8), Linear(8, 3)

    def __call__(self, x: Any) -> Any:
        return self.fc2(self.fc1(x).relu())


def test_equals_pluck_and_the_plain_forward(tmp_path: pathlib.Path) -> None:
    model = MLP()
    array = np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32)
    data = [Tensor(row) for row in array]
    handle = tl.extract_dataset(model, data, ["fc1"], batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert handle.backend == "tinygrad" and handle.shapes == {"fc1": (8,)}
    np.testing.assert_allclose(handle["fc1"][:], model.fc1(Tensor(array)).numpy(), rtol=1e-5, atol=1e-6)
    for start in (0, 4):
        batch = Tensor(array[start : start + 4])
        assert np.array_equal(handle["fc1"][start : start + 4], tl.pluck(model, batch, "fc1").numpy())
    from_numpy = tl.extract_dataset(
        model, array, ["fc1"], batch_size=4, output_dir=tmp_path / "np", backend="tinygrad", progress=False
    )
    assert np.array_equal(from_numpy["fc1"][:], handle["fc1"][:])
