"""tl.extract_dataset on Paddle: a model checked against tl.pluck on the same batch and against a forward hook
on the untraced model; paddle.io.Dataset of NumPy samples, DataLoader refused with the call to make, resume."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import torchlens as tl

paddle = pytest.importorskip("paddle")
zarr = pytest.importorskip("zarr")
np = pytest.importorskip("numpy")

from extract_checks import CountingSamples  # noqa: E402

from torchlens_core.backend.manager import backend_named  # noqa: E402 - after the skips
from torchlens_core.store import extract  # noqa: E402

FORWARDS = [0]


class CNN(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = paddle.nn.Conv2D(3, 4, 3, padding=1)
        self.act = paddle.nn.ReLU()
        self.conv2 = paddle.nn.Conv2D(4, 8, 3, padding=1)
        self.head = paddle.nn.Linear(8, 5)

    def forward(self, x: Any) -> Any:
        FORWARDS[0] += 1
        x = self.conv2(self.act(self.conv1(x)))
        return self.head(x.mean(axis=[2, 3]))


def model() -> Any:
    paddle.seed(0)
    return CNN().eval()


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)


def hooked(net: Any, name: str, batch: np.ndarray) -> np.ndarray:
    """The layer's output from a forward hook on a plain, untraced forward."""
    seen = []
    handle = getattr(net, name).register_forward_post_hook(lambda layer, inputs, out: seen.append(out.numpy()))
    try:
        with paddle.no_grad():
            net(paddle.to_tensor(batch))
    finally:
        handle.remove()
    return seen[0]


class Images(CountingSamples, paddle.io.Dataset):
    """A map-style paddle.io.Dataset of NumPy samples that counts reads and can break at a given sample."""


def test_stack_hook() -> None:
    batch = backend_named("paddle").stack([paddle.ones([2, 3]), paddle.zeros([2, 3])])
    assert batch.shape == [2, 2, 3] and np.array_equal(batch[0].numpy(), np.ones((2, 3)))


def test_equals_pluck_and_a_forward_hook(tmp_path: pathlib.Path) -> None:
    net, data = model(), images(10)
    tensors = [paddle.to_tensor(x) for x in data]
    handle = tl.extract_dataset(
        net, tensors, ["conv1", "conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False
    )
    assert handle.backend == "paddle" and handle.shapes == {"conv1": (4, 8, 8), "conv2": (8, 8, 8)}
    for start in range(0, 10, 4):
        batch = data[start : start + 4]
        for name in ("conv1", "conv2"):
            np.testing.assert_allclose(handle[name][start : start + 4], hooked(net, name, batch), rtol=1e-5, atol=1e-6)
            assert np.array_equal(handle[name][start : start + 4], tl.pluck(net, paddle.to_tensor(batch), name).numpy())


def test_a_paddle_dataset_of_numpy_samples_resumes(tmp_path: pathlib.Path) -> None:
    net, data = model(), images(10)
    reference = tl.extract_dataset(net, data, ["conv2"], batch_size=4, output_dir=tmp_path / "ref", progress=False)
    np.testing.assert_allclose(reference["conv2"][:], hooked(net, "conv2", data), rtol=1e-5, atol=1e-6)
    FORWARDS[0] = 0
    with pytest.raises(KeyboardInterrupt):
        tl.extract_dataset(
            net, Images(data, fail_at=5), ["conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False
        )
    assert FORWARDS[0] == 1 and zarr.open_group(str(tmp_path / "out"))[extract.MARKERS][:].tolist() == [4, 0, 0]
    FORWARDS[0] = 0
    rerun = Images(data)
    resumed = tl.extract_dataset(net, rerun, ["conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert rerun.reads == 6 and FORWARDS[0] == 2
    assert resumed.complete and np.array_equal(resumed["conv2"][:], reference["conv2"][:])


def test_a_dataloader_is_refused_with_the_call_to_make(tmp_path: pathlib.Path) -> None:
    net, dataset = model(), Images(images(6))
    loader = paddle.io.DataLoader(dataset, batch_size=3)
    with pytest.raises(tl.UnsupportedError, match=r"Paddle DataLoader yields batches.*loader.dataset.*batch_size=3"):
        tl.extract_dataset(net, loader, ["conv1"], output_dir=tmp_path / "loader", progress=False)
    handle = tl.extract_dataset(
        net, loader.dataset, ["conv1"], batch_size=3, output_dir=tmp_path / "fixed", progress=False
    )
    np.testing.assert_allclose(handle["conv1"][:], hooked(net, "conv1", dataset.data), rtol=1e-5, atol=1e-6)
