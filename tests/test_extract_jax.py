"""tl.extract_dataset on JAX: flax.nnx, linen through apply, equinox and plain functions, checked against
tl.pluck on the same batch and against the model's own untraced computation; resume; NumPy and dict datasets;
bfloat16 stored as raw bits; batch_axis."""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

import torchlens as tl

jax = pytest.importorskip("jax")
zarr = pytest.importorskip("zarr")
nnx = pytest.importorskip("flax.nnx")
np = pytest.importorskip("numpy")

import jax.numpy as jnp  # noqa: E402 - after the skips

from torchlens_core.backend.manager import backend_named  # noqa: E402
from torchlens_core.store import extract  # noqa: E402

FORWARDS = [0]


class CNN(nnx.Module):
    """Channels-last convolutions, as flax has them."""

    def __init__(self, rngs: Any, dtype: Any = jnp.float32) -> None:
        self.conv1 = nnx.Conv(3, 4, (3, 3), rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.conv2 = nnx.Conv(4, 8, (3, 3), rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.head = nnx.Linear(8, 5, rngs=rngs, dtype=dtype, param_dtype=dtype)

    def __call__(self, x: Any) -> Any:
        FORWARDS[0] += 1  # a module-level count: nnx would not keep a change to the module's own attributes
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        return self.head(x.mean(axis=(1, 2)))


def images(n: int, seed: int = 0, dtype: Any = jnp.float32) -> list[Any]:
    keys = jax.random.split(jax.random.key(seed), n)
    return [jax.random.normal(k, (8, 8, 3), dtype=dtype) for k in keys]


def stopping(data: list[Any], at: int) -> Iterator[Any]:
    for i, sample in enumerate(data):
        if i == at:
            raise RuntimeError(f"interrupted at sample {i}")
        yield sample


def markers(path: Any) -> list[int]:
    return zarr.open_group(str(path), mode="r")[extract.MARKERS][:].tolist()


def test_stack_hook() -> None:
    batch = backend_named("jax").stack([jnp.ones((2, 3)), jnp.zeros((2, 3))])
    assert isinstance(batch, jax.Array) and batch.shape == (2, 2, 3)
    assert np.array_equal(np.asarray(batch[0]), np.ones((2, 3))) and not np.asarray(batch[1]).any()


def test_nnx_model_equals_pluck_and_the_untraced_layers(tmp_path: pathlib.Path) -> None:
    model, data = CNN(nnx.Rngs(0)), images(10)
    layers = ["conv1", "max_2_8"]  # a module path (NHWC conv output) and an op label (the second relu)
    handle = tl.extract_dataset(model, data, layers, batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert handle.complete and handle.backend == "jax" and len(handle) == 10
    assert handle.shapes == {"conv1": (8, 8, 4), "max_2_8": (8, 8, 8)}  # channels-last, as flax computes it
    assert [(e["layout"], e["spatial_axes"]) for e in handle.index["layers"]] == [("NHWC", [1, 2])] * 2
    assert zarr.open_group(str(tmp_path / "out"))["conv1"].attrs["torchlens"]["layout"] == "NHWC"
    for start in range(0, 10, 4):
        batch = jnp.stack(data[start : start + 4])
        conv1 = model.conv1(batch)  # untraced: the submodule called directly
        relu2 = nnx.relu(model.conv2(nnx.relu(conv1)))
        assert np.array_equal(handle["conv1"][start : start + 4], np.asarray(conv1))
        assert np.array_equal(handle["max_2_8"][start : start + 4], np.asarray(relu2))
        for key in layers:
            assert np.array_equal(handle[key][start : start + 4], np.asarray(tl.pluck(model, batch, key)))


def test_linen_through_apply_and_plain_functions(tmp_path: pathlib.Path) -> None:
    linen = pytest.importorskip("flax.linen")

    class MLP(linen.Module):
        @linen.compact
        def __call__(self, x: Any) -> Any:
            return linen.Dense(2, name="fc2")(linen.relu(linen.Dense(6, name="fc1")(x)))

    module = MLP()
    variables = module.init(jax.random.key(0), jnp.ones((1, 4)))
    data = [jax.random.normal(k, (4,)) for k in jax.random.split(jax.random.key(1), 6)]
    handle = tl.extract_dataset(
        functools.partial(module.apply, variables),
        data,
        ["max_1_4"],
        batch_size=4,
        output_dir=tmp_path / "linen",
        backend="jax",
        progress=False,
    )
    batch = jnp.stack(data)
    hidden = module.apply(variables, batch, capture_intermediates=True)[1]["intermediates"]["fc1"]["__call__"][0]
    # batches of 4 and 2 against one of 6: XLA's CPU matmul may round the last bit differently per batch shape
    np.testing.assert_allclose(handle["max_1_4"][:], np.asarray(jax.nn.relu(hidden)), rtol=1e-6, atol=1e-7)

    def gelu_net(x: Any, scale: Any) -> Any:
        return jnp.tanh(jax.nn.gelu(x) * scale)

    scales = [jnp.full((4,), float(i)) for i in range(6)]
    label = [op.label for op in tl.trace(gelu_net, batch, jnp.stack(scales)).ops if op.func_name == "mul"][-1]
    as_dicts = tl.extract_dataset(
        gelu_net,
        iter([{"x": x, "scale": s} for x, s in zip(data, scales)]),
        [label],
        batch_size=4,
        output_dir=tmp_path / "dicts",
        backend="jax",
        progress=False,
    )
    expected = np.asarray(jax.nn.gelu(batch) * jnp.stack(scales))  # keyword inputs, untraced
    np.testing.assert_allclose(as_dicts[label][:], expected, rtol=1e-6, atol=1e-7)


def test_equinox_model(tmp_path: pathlib.Path) -> None:
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(4, 3, 8, depth=2, key=jax.random.key(2))
    batched = jax.vmap(mlp)  # equinox layers take one example; the batch is a vmap
    data = [jax.random.normal(k, (4,)) for k in jax.random.split(jax.random.key(3), 5)]
    trace = tl.trace(batched, jnp.stack(data[:2]), backend="jax")
    last = [op.label for op in trace.ops if op.kind == "op"][-1]
    handle = tl.extract_dataset(
        batched, data, [last], batch_size=2, output_dir=tmp_path / "eqx", backend="jax", progress=False
    )
    np.testing.assert_allclose(handle[last][:], np.asarray(batched(jnp.stack(data))), rtol=1e-6, atol=1e-6)
    for start in (0, 2, 4):
        batch = jnp.stack(data[start : start + 2])
        assert np.array_equal(
            handle[last][start : start + 2], np.asarray(tl.pluck(batched, batch, last, backend="jax"))
        )


def test_an_interrupted_run_resumes_without_recomputing(tmp_path: pathlib.Path) -> None:
    model, data = CNN(nnx.Rngs(0)), images(10)
    reference = tl.extract_dataset(model, data, ["conv2"], batch_size=4, output_dir=tmp_path / "ref", progress=False)
    FORWARDS[0] = 0
    with pytest.raises(RuntimeError, match="interrupted at sample 9"):
        tl.extract_dataset(
            model, stopping(data, 9), ["conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False
        )
    per_batch = FORWARDS[0] // 2
    assert per_batch >= 1 and FORWARDS[0] == 2 * per_batch and markers(tmp_path / "out") == [4, 4]
    FORWARDS[0] = 0
    resumed = tl.extract_dataset(
        model, iter(data), ["conv2"], batch_size=4, output_dir=tmp_path / "out", progress=False
    )
    assert FORWARDS[0] == per_batch  # only the last batch (2 samples) was computed
    assert resumed.complete and np.array_equal(resumed["conv2"][:], reference["conv2"][:])


def test_a_numpy_array_dataset_is_converted_and_read_by_index(tmp_path: pathlib.Path) -> None:
    model = CNN(nnx.Rngs(0))
    array = np.stack([np.asarray(x) for x in images(6)])  # (6, 8, 8, 3): a dataset as many hold it
    handle = tl.extract_dataset(model, array, ["conv1"], batch_size=4, output_dir=tmp_path / "np", progress=False)
    assert np.array_equal(handle["conv1"][:], np.asarray(model.conv1(jnp.asarray(array))))
    assert handle.index["inputs"] == [[None, [8, 8, 3], "float32"]]


def test_bfloat16_is_stored_as_raw_bits_and_read_back_exactly(tmp_path: pathlib.Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    model, data = CNN(nnx.Rngs(0), dtype=jnp.bfloat16), images(5, dtype=jnp.bfloat16)
    handle = tl.extract_dataset(
        model, data, ["conv1", "head"], batch_size=4, output_dir=tmp_path / "bf16", progress=False
    )
    expected = np.asarray(model.conv1(jnp.stack(data)))
    assert expected.dtype == ml_dtypes.bfloat16 and handle.dtypes == {"conv1": "bfloat16", "head": "bfloat16"}
    read = handle["conv1"][:]
    assert read.dtype == ml_dtypes.bfloat16 and np.array_equal(read.view(np.uint16), expected.view(np.uint16))
    raw = zarr.open_group(str(tmp_path / "bf16"), mode="r")["conv1"]
    assert raw.dtype == np.uint16 and raw.attrs["torchlens"]["dtype"] == "bfloat16"  # 2 bytes a value on disk
    wide = tl.Activations(tmp_path / "bf16", as_float32=True)["conv1"][1:3]
    assert wide.dtype == np.float32 and np.array_equal(wide, expected[1:3].astype(np.float32))


def test_batch_axis_for_a_time_major_output(tmp_path: pathlib.Path) -> None:
    def time_major(xs: Any) -> Any:  # (batch, time, 3) in, (time, batch, 3) and a pair out
        steps = jnp.swapaxes(xs, 0, 1)
        hidden = jnp.cumsum(jnp.tanh(steps), axis=0)
        return hidden, (hidden[-1] * 2.0, hidden.sum(0))

    data = [jax.random.normal(k, (5, 3)) for k in jax.random.split(jax.random.key(4), 6)]
    batch = jnp.stack(data)
    trace = tl.trace(time_major, batch)
    cumsum = next(op.label for op in trace.ops if op.func_name == "cumsum")
    with pytest.raises(extract.ExtractError, match=r"first axis is not the batch.*batch_axis="):
        tl.extract_dataset(time_major, data, [cumsum], batch_size=4, output_dir=tmp_path / "no", progress=False)
    handle = tl.extract_dataset(
        time_major, data, [cumsum], batch_size=4, output_dir=tmp_path / "tm", batch_axis={cumsum: 1}, progress=False
    )
    assert handle.shapes == {cumsum: (5, 3)} and handle.index["layers"][0]["batch_axis"] == 1
    expected = np.cumsum(np.tanh(np.asarray(batch).swapaxes(0, 1)), axis=0).swapaxes(0, 1)
    np.testing.assert_allclose(handle[cumsum][:], expected, rtol=1e-6, atol=1e-6)
    assert np.array_equal(handle[cumsum][:4], np.moveaxis(np.asarray(tl.pluck(time_major, batch[:4], cumsum)), 1, 0))


def test_a_dtype_the_store_cannot_hold_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    def to_float8(x: Any) -> Any:
        return (x * 2.0).astype(jnp.float8_e4m3fn).astype(jnp.float32)

    data = [jnp.ones((3,)) * i for i in range(4)]
    label = next(
        op.label for op in tl.trace(to_float8, jnp.stack(data)).ops if op.kind == "op" and "float8" in str(op.dtype)
    )
    with pytest.raises(extract.ExtractError, match="float8_e4m3fn, which the activation store cannot hold"):
        tl.extract_dataset(to_float8, data, [label], output_dir=tmp_path / "f8", progress=False)
