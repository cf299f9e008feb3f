"""tl.extract_dataset on TensorFlow/Keras: a functional Keras model checked against tl.pluck on the same batch
and against keras.Model(inputs, layer.output); tf.data datasets (batched ones refused), NumPy arrays, resume,
and a tuple leaf of an LSTM's (output, h, c)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import torchlens as tl

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
zarr = pytest.importorskip("zarr")
np = pytest.importorskip("numpy")

from extract_checks import CountingSamples  # noqa: E402

from torchlens_core.backend.manager import backend_named  # noqa: E402 - after the skips
from torchlens_core.store import extract  # noqa: E402

FORWARDS = [0]


class Counter(keras.layers.Layer):
    """The identity, counting the forwards that reach it."""

    def call(self, x: Any) -> Any:
        FORWARDS[0] += 1
        return x


def cnn() -> Any:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = Counter(name="count")(inputs)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv1")(x)
    x = keras.layers.Conv2D(8, 3, padding="same", name="conv2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(5, name="head")(x))


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8, 8, 3)).astype(np.float32)


def submodel(model: Any, name: str) -> Any:
    """The framework's own view of one layer's output: keras.Model(inputs, layer.output), untraced."""
    return keras.Model(model.inputs[0], model.get_layer(name).output)


def Images(data: Any, fail_at: int | None = None) -> CountingSamples:
    """A map-style dataset of tensors that counts its reads and can break at a given sample."""
    return CountingSamples(data, fail_at, tf.constant)


def test_stack_hook() -> None:
    batch = backend_named("tf").stack([tf.ones((2, 3)), tf.zeros((2, 3))])
    assert tuple(batch.shape) == (2, 2, 3) and np.array_equal(batch[0].numpy(), np.ones((2, 3)))


def test_keras_model_equals_pluck_and_the_keras_submodel(tmp_path: pathlib.Path) -> None:
    model, data = cnn(), images(10)
    samples = [tf.constant(x) for x in data]
    handle = tl.extract_dataset(
        model, samples, ["conv1", "conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False
    )
    assert handle.backend == "tf" and handle.shapes == {"conv1": (8, 8, 4), "conv2": (8, 8, 8)}  # NHWC
    for name in ("conv1", "conv2"):
        np.testing.assert_allclose(handle[name][:], submodel(model, name)(data).numpy(), rtol=1e-5, atol=1e-6)
    for start in range(0, 10, 4):
        batch = tf.constant(data[start : start + 4])
        for name in ("conv1", "conv2"):
            assert np.array_equal(handle[name][start : start + 4], tl.pluck(model, batch, name).numpy())


def test_tf_data_and_numpy_datasets(tmp_path: pathlib.Path) -> None:
    model, data = cnn(), images(6)
    expected = submodel(model, "conv1")(data).numpy()
    elements = tf.data.Dataset.from_tensor_slices(data)  # unbatched: one (8, 8, 3) tensor per element
    from_tf = tl.extract_dataset(
        model, elements, ["conv1"], batch_size=4, output_dir=tmp_path / "tfdata", progress=False
    )
    from_numpy = tl.extract_dataset(model, data, ["conv1"], batch_size=4, output_dir=tmp_path / "numpy", progress=False)
    for handle in (from_tf, from_numpy):
        assert len(handle) == 6
        np.testing.assert_allclose(handle["conv1"][:], expected, rtol=1e-5, atol=1e-6)
    assert np.array_equal(from_tf["conv1"][:], from_numpy["conv1"][:])

    with pytest.raises(tl.UnsupportedError, match=r"tf.data.Dataset is batched.*dataset.unbatch\(\)"):
        tl.extract_dataset(model, elements.batch(4), ["conv1"], output_dir=tmp_path / "batched", progress=False)
    with pytest.raises(tl.UnsupportedError, match="is batched"):  # a map after the batch hides it no better
        tl.extract_dataset(
            model, elements.batch(4).map(lambda x: x * 2), ["conv1"], output_dir=tmp_path / "m", progress=False
        )
    rebatched = tl.extract_dataset(
        model, elements.batch(4).unbatch(), ["conv1"], batch_size=4, output_dir=tmp_path / "unbatched", progress=False
    )
    assert np.array_equal(rebatched["conv1"][:], from_tf["conv1"][:])


def test_an_interrupted_run_resumes_without_recomputing(tmp_path: pathlib.Path) -> None:
    model, data = cnn(), images(10)
    reference = tl.extract_dataset(model, data, ["conv2"], batch_size=4, output_dir=tmp_path / "ref", progress=False)
    FORWARDS[0] = 0
    with pytest.raises(KeyboardInterrupt):
        tl.extract_dataset(
            model, Images(data, fail_at=5), ["conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False
        )
    assert FORWARDS[0] == 1 and zarr.open_group(str(tmp_path / "out"))[extract.MARKERS][:].tolist() == [4, 0, 0]
    FORWARDS[0] = 0
    rerun = Images(data)
    resumed = tl.extract_dataset(model, rerun, ["conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert rerun.reads == 6 and FORWARDS[0] == 2  # samples 4..9, batches 1 and 2
    assert resumed.complete and np.array_equal(resumed["conv2"][:], reference["conv2"][:])


def test_a_leaf_of_an_lstm_state_tuple(tmp_path: pathlib.Path) -> None:
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5, 3))
    outputs = keras.layers.LSTM(4, return_state=True, name="lstm")(inputs)  # (output, h, c)
    model = keras.Model(inputs, outputs)
    data = np.random.default_rng(2).standard_normal((6, 5, 3)).astype(np.float32)
    with pytest.raises(
        tl.UnsupportedError,
        match=r"gives a tuple of 3, not one array: name one of its leaves, "
        r"e.g. 'lstm\[0\]'",
    ):
        tl.extract_dataset(model, data, ["lstm"], output_dir=tmp_path / "whole", progress=False)
    handle = tl.extract_dataset(
        model, data, [("lstm", 1), ("lstm", 2)], batch_size=4, output_dir=tmp_path / "leaf", progress=False
    )
    assert handle.layers == ["lstm[1]", "lstm[2]"] and handle.shapes == {"lstm[1]": (4,), "lstm[2]": (4,)}
    _, h, c = model(data)
    np.testing.assert_allclose(handle[("lstm", 1)][:], h.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(handle["lstm[2]"][:], c.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(tl.LabelNotFoundError, match=r"is a tuple of 3, which has no 5"):
        tl.extract_dataset(model, data, [("lstm", 5)], output_dir=tmp_path / "bad", progress=False)
