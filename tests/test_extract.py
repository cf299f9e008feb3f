"""tl.extract_dataset: batches a dataset, writes chosen activations to Zarr, resumes, runs on a dask cluster."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from extract_checks import CountingSamples

import torchlens as tl

torch = pytest.importorskip("torch")
zarr = pytest.importorskip("zarr")
np = pytest.importorskip("numpy")

from torchlens_core.backend.manager import backend_named  # noqa: E402
from torchlens_core.store import extract  # noqa: E402 - after the skips

LAYERS = ["relu_1", "4"]  # an op label (the first relu) and a module path (the second relu's module)


def small_model() -> Any:
    """Built from torch's own modules only, so that dask workers unpickle it without this file."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 4),
    ).eval()


def samples(n: int, seed: int = 1) -> list[Any]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 8, 8, generator=generator) for _ in range(n)]


def stopping(data: list[Any], at: int) -> Iterator[Any]:
    """An iterator over ``data`` that breaks (like a crash or a ^C) when it reaches sample ``at``."""
    for i, sample in enumerate(data):
        if i == at:
            raise RuntimeError(f"interrupted at sample {i}")
        yield sample


def count_forwards(model: Any) -> list[int]:
    calls = [0]
    model.register_forward_pre_hook(lambda module, inputs: calls.__setitem__(0, calls[0] + 1))
    return calls


def markers(path: Any) -> list[int]:
    return zarr.open_group(str(path), mode="r")[extract.MARKERS][:].tolist()


def assert_same(a: tl.Activations, b: tl.Activations) -> None:
    assert a.layers == b.layers and len(a) == len(b)
    for key in a.layers:
        assert np.array_equal(a[key][:], b[key][:])


# -- the README's call, and equality with tl.pluck ---------------------------------------------------
def test_readme_call_runs_as_written(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    import torchvision.models as models

    model = models.alexnet(weights=None)
    dataset = [torch.randn(3, 224, 224) for _ in range(8)]
    handle = tl.extract_dataset(
        model, dataset, layers=["relu_1_2", "conv2d_3_7"], batch_size=32, output_dir="torchlens-activations/"
    )

    assert isinstance(handle, tl.Activations) and handle.complete
    assert handle.layers == ["relu_1_2", "conv2d_3_7"] and len(handle) == 8
    assert list(handle.sample_ids) == list(range(8))
    assert handle.shapes == {"relu_1_2": (64, 55, 55), "conv2d_3_7": (384, 13, 13)}
    assert (tmp_path / "torchlens-activations" / "zarr.json").is_file()
    batch = torch.stack(dataset)
    for key in handle.layers:
        assert np.array_equal(handle[key][:], tl.pluck(model, batch, key).detach().numpy())


def test_reads_back_equal_to_pluck_on_the_same_samples(tmp_path: pathlib.Path) -> None:
    model, data = small_model(), samples(10)
    handle = tl.extract_dataset(model, data, LAYERS, batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert len(handle) == 10 and handle.shapes == {"relu_1": (8, 8, 8), "4": (16, 4, 4)}
    # one shard (file) per batch, one chunk per sample in it
    assert handle["relu_1"].shards == (4, 8, 8, 8) and handle["relu_1"].chunks == (1, 8, 8, 8)
    for start in range(0, 10, 4):  # exactly what tl.pluck gives on the same batch
        batch = torch.stack(data[start : start + 4])
        for key in LAYERS:
            assert np.array_equal(handle[key][start : start + 4], tl.pluck(model, batch, key).detach().numpy())
    for i in (0, 5, 9):  # and what it gives on each sample alone, up to batch-size-dependent rounding
        for key in LAYERS:
            alone = tl.pluck(model, data[i][None], key).detach().numpy()[0]
            np.testing.assert_allclose(handle[key][i], alone, rtol=1e-5, atol=1e-6)


def test_the_store_is_plain_zarr_that_other_tools_read(tmp_path: pathlib.Path) -> None:
    dask_array = pytest.importorskip("dask.array")
    model, data = small_model(), samples(6)
    ids = [f"img-{i}" for i in range(6)]
    handle = tl.extract_dataset(
        model, data, LAYERS, batch_size=4, output_dir=tmp_path / "out", sample_ids=ids, progress=False
    )
    assert handle.sample_ids == ids
    group = zarr.open_group(str(tmp_path / "out"), mode="r")
    index = group.attrs["torchlens"]
    assert index["complete"] and index["n_samples"] == 6 and index["sample_ids"] == ids
    assert [(entry["key"], entry["shape"], entry["dtype"]) for entry in index["layers"]] == [
        ("relu_1", [8, 8, 8], "float32"),
        ("4", [16, 4, 4], "float32"),
    ]
    assert [(entry["batch_axis"], entry["layout"]) for entry in index["layers"]] == [(0, "NCHW"), (0, "NCHW")]
    assert json.loads((tmp_path / "out" / "zarr.json").read_text())["attributes"]["torchlens"] == index
    stored = dask_array.from_zarr(str(tmp_path / "out"), component=index["layers"][1]["array"])
    assert np.array_equal(stored.compute(), handle["4"][:])
    meta = json.loads((tmp_path / "out" / "4" / "zarr.json").read_text())
    assert [codec["name"] for codec in meta["codecs"]] == ["sharding_indexed"]
    assert [codec["name"] for codec in meta["codecs"][0]["configuration"]["codecs"]] == ["bytes", "zstd"]
    assert meta["attributes"]["torchlens"] == {
        "dtype": "float32",
        "batch_axis": 0,
        "layout": "NCHW",
        "spatial_axes": [2, 3],
    }
    # a batch is one file: 2 batches of 6 samples, 2 shard files per layer
    assert sorted(p.name for p in (tmp_path / "out" / "4" / "c").iterdir()) == ["0", "1"]


def test_activations_handle(tmp_path: pathlib.Path) -> None:
    tl.extract_dataset(small_model(), samples(5), LAYERS, batch_size=2, output_dir=tmp_path / "out", progress=False)
    handle = tl.Activations(tmp_path / "out")  # reopened later
    assert "relu_1" in handle and "relu_2" not in handle and handle.batch_size == 2 and handle.backend == "torch"
    assert isinstance(handle["relu_1"][1:3], np.ndarray) and handle["relu_1"][1:3].shape == (2, 8, 8, 8)
    assert handle.dtypes == {"relu_1": "float32", "4": "float32"}
    assert "Sequential" in repr(handle) and "5 samples" in repr(handle)
    with pytest.raises(KeyError, match="did you mean 'relu_1'"):
        handle["relu_11"]
    with pytest.raises(TypeError, match="layer key"):
        handle[0]
    with pytest.raises(TypeError, match="not iterable"):
        iter(handle)
    with pytest.raises(extract.ExtractError, match="no activation store"):
        tl.Activations(tmp_path / "nothing-here")


def test_several_inputs_as_tuples_or_dicts(tmp_path: pathlib.Path) -> None:
    def scaled(x: Any, scale: Any) -> Any:
        return torch.relu(x) * scale

    xs, scales = samples(5), [torch.full((1, 1, 1), float(i)) for i in range(5)]
    expected = (torch.relu(torch.stack(xs)) * torch.stack(scales)).numpy()
    as_tuples = tl.extract_dataset(
        scaled, list(zip(xs, scales)), ["mul_1"], batch_size=2, output_dir=tmp_path / "tuples", progress=False
    )
    as_dicts = tl.extract_dataset(
        scaled,
        [{"x": x, "scale": s} for x, s in zip(xs, scales)],
        "mul_1",
        batch_size=2,
        output_dir=tmp_path / "dicts",
        progress=False,
    )
    assert np.array_equal(as_tuples["mul_1"][:], expected) and np.array_equal(as_dicts["mul_1"][:], expected)


# -- resuming ---------------------------------------------------------------------------------------
def test_resume_after_an_interruption_computes_only_unfinished_batches(tmp_path: pathlib.Path) -> None:
    model, data = small_model(), samples(22)
    reference = tl.extract_dataset(model, data, LAYERS, batch_size=4, output_dir=tmp_path / "ref", progress=False)
    calls = count_forwards(model)
    with pytest.raises(RuntimeError, match="interrupted at sample 10"):  # an iterator: no length known
        tl.extract_dataset(model, stopping(data, 10), LAYERS, batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert calls[0] == 2 and markers(tmp_path / "out") == [4, 4]  # batch 2 was still being read
    partial = tl.Activations(tmp_path / "out")
    assert not partial.complete and "incomplete" in repr(partial)

    calls[0] = 0
    resumed = tl.extract_dataset(model, iter(data), LAYERS, batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert calls[0] == 4  # batches 2..5 of 6
    assert resumed.complete and markers(tmp_path / "out") == [4, 4, 4, 4, 4, 2]
    assert_same(resumed, reference)

    calls[0] = 0  # a finished store: nothing is computed again
    again = tl.extract_dataset(model, iter(data), LAYERS, batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert calls[0] == 0 and len(again) == 22


Images = CountingSamples  # a map-style dataset that counts its reads and can break at a given sample


def test_a_sequence_resumes_without_reading_finished_samples(tmp_path: pathlib.Path) -> None:
    model, data = small_model(), samples(10)
    with pytest.raises(KeyboardInterrupt):
        tl.extract_dataset(
            model, Images(data, fail_at=5), LAYERS, batch_size=2, output_dir=tmp_path / "out", progress=False
        )
    assert markers(tmp_path / "out") == [2, 2, 0, 0, 0]  # sized up front; batches 0 and 1 done
    rerun = Images(data)
    handle = tl.extract_dataset(model, rerun, LAYERS, batch_size=2, output_dir=tmp_path / "out", progress=False)
    assert rerun.reads == 6  # samples 4..9 only
    assert_same(
        handle, tl.extract_dataset(model, data, LAYERS, batch_size=2, output_dir=tmp_path / "ref", progress=False)
    )


def test_a_batch_without_its_marker_is_redone(tmp_path: pathlib.Path) -> None:
    model, data = small_model(), samples(8)
    handle = tl.extract_dataset(model, data, LAYERS, batch_size=4, output_dir=tmp_path / "out", progress=False)
    expected = handle["4"][:]
    # As if the process died after writing batch 1's chunks but before its marker, the chunks half-new.
    group = zarr.open_group(str(tmp_path / "out"), mode="r+")
    group["4"][4:8] = 0.0
    group[extract.MARKERS][1] = 0
    group.attrs["torchlens"] = {**group.attrs["torchlens"], "complete": False}
    calls = count_forwards(model)
    handle = tl.extract_dataset(model, data, LAYERS, batch_size=4, output_dir=tmp_path / "out", progress=False)
    assert calls[0] == 1 and np.array_equal(handle["4"][:], expected)


def test_a_different_extraction_is_refused_unless_overwritten(tmp_path: pathlib.Path) -> None:
    model, data = small_model(), samples(4)
    tl.extract_dataset(model, data, LAYERS, batch_size=2, output_dir=tmp_path / "out", progress=False)
    with pytest.raises(extract.ExtractError, match=r"batch_size=2 there, 4 here.*overwrite=True"):
        tl.extract_dataset(model, data, LAYERS, batch_size=4, output_dir=tmp_path / "out", progress=False)
    with pytest.raises(extract.ExtractError, match="n_samples=4 there, 3 here"):
        tl.extract_dataset(model, data[:3], LAYERS, batch_size=2, output_dir=tmp_path / "out", progress=False)
    handle = tl.extract_dataset(
        model, data, ["relu_2"], batch_size=4, output_dir=tmp_path / "out", progress=False, overwrite=True
    )
    assert handle.layers == ["relu_2"] and sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_chunks_done",
        "relu_2",
        "zarr.json",
    ]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not yours")
    with pytest.raises(extract.ExtractError, match="not an activation store"):
        tl.extract_dataset(model, data, LAYERS, output_dir=tmp_path / "mine", progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "not yours"


# -- errors -----------------------------------------------------------------------------------------
def test_an_unknown_layer_raises_a_keyerror_with_suggestions(tmp_path: pathlib.Path) -> None:
    model, data = small_model(), samples(4)
    with pytest.raises(tl.LabelNotFoundError, match="relu_9.*closest labels and module paths: .*'relu_2") as caught:
        tl.extract_dataset(model, data, ["relu_1", "relu_9"], batch_size=2, output_dir=tmp_path / "out", progress=False)
    assert isinstance(caught.value, KeyError)
    assert not (tmp_path / "out" / "relu_1").exists()  # nothing written, nothing marked
    handle = tl.extract_dataset(
        model, data, ["relu_1", "relu_2"], batch_size=2, output_dir=tmp_path / "out", progress=False
    )  # the corrected call starts afresh
    assert handle.layers == ["relu_1", "relu_2"] and handle.complete


def test_dataset_errors_are_clear(tmp_path: pathlib.Path) -> None:
    model = small_model()
    with pytest.raises(extract.ExtractError, match="dataset is empty"):
        tl.extract_dataset(model, [], LAYERS, output_dir=tmp_path / "empty", progress=False)
    with pytest.raises(extract.ExtractError, match="dataset is empty"):
        tl.extract_dataset(model, iter([]), LAYERS, output_dir=tmp_path / "empty2", progress=False)

    data = samples(10)
    data[6] = torch.randn(3, 9, 9)
    with pytest.raises(extract.ExtractError, match=r"sample 6 has shape \[3, 9, 9\].*first sample had shape \[3, 8"):
        tl.extract_dataset(model, data, LAYERS, batch_size=4, output_dir=tmp_path / "shapes", progress=False)
    assert markers(tmp_path / "shapes") == [4, 0, 0]  # the batch before is written, the bad one is not

    labelled = [(x, 0) for x in samples(2)]
    with pytest.raises(tl.UnsupportedError, match=r"is of type int, not a torch array.*\(x for x, _ in dataset\)"):
        tl.extract_dataset(model, labelled, LAYERS, output_dir=tmp_path / "labelled", progress=False)

    with pytest.raises(extract.ExtractError, match="first axis is not the batch"):
        tl.extract_dataset(
            lambda x: (x * 2).sum(0),
            samples(4),
            ["sum_1"],
            batch_size=4,
            output_dir=tmp_path / "nobatch",
            progress=False,
        )
    with pytest.raises(extract.ExtractError, match="sample_ids has 3 ids for a dataset of 4"):
        tl.extract_dataset(model, samples(4), LAYERS, sample_ids=["a", "b", "c"], output_dir=tmp_path / "ids")
    with pytest.raises(TypeError, match="batch_size"):
        tl.extract_dataset(model, samples(4), LAYERS, batch_size=0, output_dir=tmp_path / "b")
    with pytest.raises(TypeError, match="layers="):
        tl.extract_dataset(model, samples(4), [], output_dir=tmp_path / "b")
    with pytest.raises(tl.UnsupportedError, match="engine="):
        tl.extract_dataset(model, samples(4), LAYERS, engine="ray", output_dir=tmp_path / "b")


# -- progress ---------------------------------------------------------------------------------------
@pytest.fixture
def shown_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core's progress bar (torchlens_core.ir.progress) shown from the first sample, not after seconds."""
    from torchlens_core.ir import progress

    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setattr(progress, "STRIDE", 1)


def test_progress_without_tqdm_is_a_line_on_stderr(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shown_at_once: None
) -> None:
    from torchlens_core.ir import progress

    monkeypatch.setattr(progress, "_tqdm", lambda: None)
    with tl.options.set_progress("always"):
        tl.extract_dataset(small_model(), samples(6), LAYERS, batch_size=4, output_dir=tmp_path / "a")
        err = capsys.readouterr().err
        assert "tl.extract_dataset: 4/6 samples" in err and "tl.extract_dataset: 6/6 samples" in err
        tl.extract_dataset(small_model(), samples(6), LAYERS, batch_size=4, output_dir=tmp_path / "b", progress=False)
        assert "tl.extract_dataset" not in capsys.readouterr().err  # (the captures' own bars show: "always")
        # Resumed, batches written before count once: known up front for a sequence, passed over for an iterator.
        for name, dataset in (("seq", Images(samples(10), fail_at=5)), ("iter", stopping(samples(10), 5))):
            with pytest.raises((KeyboardInterrupt, RuntimeError)):
                tl.extract_dataset(small_model(), dataset, LAYERS, batch_size=2, output_dir=tmp_path / name)
            capsys.readouterr()
            rerun = samples(10) if name == "seq" else iter(samples(10))
            tl.extract_dataset(small_model(), rerun, LAYERS, batch_size=2, output_dir=tmp_path / name)
            last = capsys.readouterr().err.strip().splitlines()[-1]
            assert last.startswith(
                "tl.extract_dataset: 10/10 samples" if name == "seq" else "tl.extract_dataset: 10 samples"
            )
    # progress=True follows tl.options.set_progress; a mode given to the call overrides it for the call
    with tl.options.set_progress("never"):
        tl.extract_dataset(small_model(), samples(6), LAYERS, batch_size=4, output_dir=tmp_path / "c")
        assert capsys.readouterr().err == ""
        tl.extract_dataset(
            small_model(), samples(6), LAYERS, batch_size=4, output_dir=tmp_path / "d", progress="always"
        )
        assert "tl.extract_dataset: 6/6 samples" in capsys.readouterr().err
    with pytest.raises(TypeError, match="progress="):
        tl.extract_dataset(small_model(), samples(6), LAYERS, output_dir=tmp_path / "e", progress="loud")


def test_progress_bar_with_tqdm(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shown_at_once: None
) -> None:
    pytest.importorskip("tqdm")
    from torchlens_core.ir import progress

    monkeypatch.setattr(progress, "_interactive", lambda stream: True)  # a terminal: tqdm's bar, not lines
    tl.extract_dataset(small_model(), samples(6), LAYERS, batch_size=4, output_dir=tmp_path / "a")
    err = capsys.readouterr().err
    assert "tl.extract_dataset" in err and "4/6" in err and "samples/s" not in err


# -- the hook ---------------------------------------------------------------------------------------
def test_stack_hook() -> None:
    batch = backend_named("torch").stack([torch.ones(2, 3), torch.zeros(2, 3)])
    assert batch.shape == (2, 2, 3) and torch.equal(batch[0], torch.ones(2, 3))

    from torchlens_core.backend.base import Backend

    class Bare(Backend):
        name = "bare"

    with pytest.raises(tl.UnsupportedError, match="bare backend cannot batch"):
        Bare().stack([1, 2])


# -- a dask cluster ---------------------------------------------------------------------------------
def test_dask_local_cluster_workers_write_their_chunks(tmp_path: pathlib.Path) -> None:
    distributed = pytest.importorskip("distributed")
    model, data = small_model(), samples(26)
    reference = tl.extract_dataset(model, data, LAYERS, batch_size=4, output_dir=tmp_path / "ref", progress=False)
    with pytest.raises(RuntimeError, match="interrupted"):  # half done here, finished on the cluster
        tl.extract_dataset(
            model, stopping(data, 9), LAYERS, batch_size=4, output_dir=tmp_path / "resumed", progress=False
        )
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    with cluster, distributed.Client(cluster) as client:
        with distributed.get_task_stream(client) as tasks:
            fresh = tl.extract_dataset(
                model, data, LAYERS, batch_size=4, output_dir=tmp_path / "fresh", engine=client, progress=False
            )
            resumed = tl.extract_dataset(
                model, iter(data), LAYERS, batch_size=4, output_dir=tmp_path / "resumed", engine=client, progress=False
            )
    ran = [task for task in tasks.data if "_on_worker" in str(task["key"])]
    # fresh: batch 0 runs here (it tells the shapes), 1..6 on workers; resumed: batches 2..6 of 7
    assert len(ran) == 6 + 5
    assert len({task["worker"] for task in ran}) == 2
    assert_same(fresh, reference)
    assert_same(resumed, reference)


# -- at scale ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_thousand_resnet18_samples_bounded_memory_and_resume(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torchvision")
    bench = pathlib.Path(__file__).parent.parent / "bench" / "extract_dataset.py"
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(
        [sys.executable, str(bench), "--samples", "2000", "--json", str(out), "--out", str(tmp_path)],
        check=True,
        env=env,
        timeout=1800,
    )
    result = json.loads(out.read_text())
    # Memory: the extraction holds about a batch, not the 500 MiB of activations it writes.
    assert result["rss_peak_growth_mib"] < min(160, result["activations_mib"] / 3), result
    assert result["batches_written_before_resume"] == 1000 // 32
    assert result["batches_computed_on_resume"] == result["batches_total"] - 1000 // 32
    assert result["resumed_equals_uninterrupted"] and result["equal_to_pluck_on_same_batch"]
    assert result["max_abs_diff_to_pluck_alone"] < 1e-4
