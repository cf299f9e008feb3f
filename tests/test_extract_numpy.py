"""tl.extract_dataset on the third-party numpy plugin: it gets extraction by implementing the documented
torchlens_stack hook. Checked against tl.pluck on the same batch and against the plain NumPy computation."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

import torchlens as tl

np = pytest.importorskip("numpy")
zarr = pytest.importorskip("zarr")
pytest.importorskip("torchlens_numpy")

from torchlens_core.backend.manager import backend_named  # noqa: E402 - after the skips
from torchlens_core.store import extract  # noqa: E402

WEIGHTS = np.random.default_rng(0).standard_normal((6, 4))
FORWARDS = [0]


def mlp(x: Any) -> Any:
    FORWARDS[0] += 1
    hidden = np.tanh(x @ WEIGHTS)
    return np.maximum(hidden, 0.0).sum(axis=1)


def stopping(data: list[Any], at: int) -> Iterator[Any]:
    for i, sample in enumerate(data):
        if i == at:
            raise RuntimeError(f"interrupted at sample {i}")
        yield sample


def test_stack_hook() -> None:
    batch = backend_named("numpy").stack([np.ones((2, 3)), np.zeros((2, 3))])
    assert batch.shape == (2, 2, 3) and np.array_equal(batch[0], np.ones((2, 3)))


def test_equals_pluck_and_the_plain_computation_and_resumes(tmp_path: pathlib.Path) -> None:
    data = list(np.random.default_rng(1).standard_normal((10, 6)))
    tanh = next(op.label for op in tl.trace(mlp, np.stack(data[:2]), backend="numpy").ops if op.func_name == "tanh")
    handle = tl.extract_dataset(
        mlp, data, [tanh], batch_size=4, output_dir=tmp_path / "ref", backend="numpy", progress=False
    )
    assert handle.backend == "numpy" and handle.shapes == {tanh: (4,)}
    assert np.array_equal(handle[tanh][:], np.tanh(np.stack(data) @ WEIGHTS))
    for start in range(0, 10, 4):
        batch = np.stack(data[start : start + 4])
        assert np.array_equal(handle[tanh][start : start + 4], tl.pluck(mlp, batch, tanh, backend="numpy"))

    FORWARDS[0] = 0
    with pytest.raises(RuntimeError, match="interrupted at sample 9"):
        tl.extract_dataset(
            mlp, stopping(data, 9), [tanh], batch_size=4, output_dir=tmp_path / "out", backend="numpy", progress=False
        )
    per_batch = FORWARDS[0] // 2
    assert per_batch >= 1 and FORWARDS[0] == 2 * per_batch
    assert zarr.open_group(str(tmp_path / "out"))[extract.MARKERS][:].tolist() == [4, 4]
    FORWARDS[0] = 0
    resumed = tl.extract_dataset(
        mlp, iter(data), [tanh], batch_size=4, output_dir=tmp_path / "out", backend="numpy", progress=False
    )
    assert FORWARDS[0] == per_batch and np.array_equal(resumed[tanh][:], handle[tanh][:])


def test_a_dask_cluster_runs_the_numpy_backend(tmp_path: pathlib.Path) -> None:
    distributed = pytest.importorskip("distributed")
    weights = np.random.default_rng(3).standard_normal((6, 4))

    def net(x: Any) -> Any:  # defined here, so that cloudpickle sends it by value to the workers
        return np.tanh(x @ weights).sum(axis=1)

    data = list(np.random.default_rng(4).standard_normal((14, 6)))
    tanh = next(op.label for op in tl.trace(net, np.stack(data[:2]), backend="numpy").ops if op.func_name == "tanh")
    reference = tl.extract_dataset(
        net, data, [tanh], batch_size=4, output_dir=tmp_path / "ref", backend="numpy", progress=False
    )
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    with cluster, distributed.Client(cluster) as client:
        with distributed.get_task_stream(client) as tasks:
            handle = tl.extract_dataset(
                net,
                data,
                [tanh],
                batch_size=4,
                output_dir=tmp_path / "dask",
                backend="numpy",
                engine=client,
                progress=False,
            )
    assert len([task for task in tasks.data if "_on_worker" in str(task["key"])]) == 3  # batch 0 runs here
    assert np.array_equal(handle[tanh][:], reference[tanh][:])
    assert np.array_equal(handle[tanh][:], np.tanh(np.stack(data) @ weights))


def test_a_full_disk_is_an_extract_error_and_the_rerun_resumes_exactly(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 36 item 5: a full disk surfaced as a raw OSError from deep in zarr. Each file zarr writes (index,
    # array metadata, chunks, markers) goes through its LocalStore's _put: the disk fills at the k-th.
    import errno
    import itertools
    import os

    from zarr.storage import _local

    data = list(np.random.default_rng(5).standard_normal((10, 6)))
    tanh = next(op.label for op in tl.trace(mlp, np.stack(data[:2]), backend="numpy").ops if op.func_name == "tanh")
    expected = np.tanh(np.stack(data) @ WEIGHTS)
    real_put, calls = _local._put, []

    def counting(path: Any, value: Any, exclusive: bool = False) -> int:
        calls.append(str(path))
        return real_put(path, value, exclusive=exclusive)

    monkeypatch.setattr(_local, "_put", counting)
    tl.extract_dataset(mlp, data, [tanh], batch_size=4, output_dir=tmp_path / "count", backend="numpy", progress=False)
    total = len(calls)
    monkeypatch.undo()
    for k in sorted({1, 2, 3, total // 2, total - 1, total}):  # the index first ... the index marked complete
        out = tmp_path / f"full{k}"

        seen = itertools.count(1)

        def full(path: Any, value: Any, exclusive: bool = False, seen: Any = seen, k: int = k) -> int:
            if next(seen) >= k:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real_put(path, value, exclusive=exclusive)

        monkeypatch.setattr(_local, "_put", full)
        with pytest.raises(
            extract.ExtractError,
            match=rf"activation store at {out} failed: No space left on device.*"
            rf"free some space.*rerun the same call",
        ):
            tl.extract_dataset(mlp, data, [tanh], batch_size=4, output_dir=out, backend="numpy", progress=False)
        monkeypatch.undo()
        # As a killed zarr write leaves them: a partial file beside the group's and an array's metadata.
        for where in (out, out / extract.MARKERS):
            if where.is_dir():
                (where / f"zarr.{'0123abcd' * 4}.partial").write_bytes(b"{")
        handle = tl.extract_dataset(mlp, data, [tanh], batch_size=4, output_dir=out, backend="numpy", progress=False)
        assert handle.complete and np.array_equal(handle[tanh][:], expected), k
