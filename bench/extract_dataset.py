"""tl.extract_dataset at scale: 2,000 samples through ResNet-18, two layers; memory, interrupt and resume.

    python bench/extract_dataset.py                       # 2,000 samples of 3x64x64, layers relu and layer3
    python bench/extract_dataset.py --size 32 --json out.json

Three runs, each into its own store:

1. a full extraction, timed: seconds, samples/s, and the peak RSS it added
   over a warmed-up process, next to the bytes of activations it wrote;
2. the same call interrupted (the dataset raises at sample --interrupt-at),
   then rerun: the batches the rerun computed, counted at the model's forward;
3. checks: the resumed store reads back equal to the uninterrupted one, and
   sampled activations equal ``tl.pluck`` on the same samples (exactly for the
   same batch; within float tolerance alone, as batch size changes kernels).

The dataset is a lazy sequence (sample i is made from seed i when read), so
the process holds no dataset: what RSS gains is what the extraction holds.

    python bench/extract_dataset.py --backend jax --size 32   # the same conv net in torch, jax, tf or paddle

``--backend`` runs one timed extraction of a small conv net (two 3x3 convs of
16 and 32 channels, a pool, a dense head; NHWC in JAX and Keras, NCHW in
torch and Paddle) over NumPy samples, the layers being both convs: throughput
and peak memory per backend, the model identical in size. Run each backend in
its own environment (TensorFlow and Paddle do not share a process).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any


def rss_peak_mib() -> float:
    """Peak resident set size of this process so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def rss_now_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


class RandomImages:
    """A map-style dataset: sample i is a 3xSxS image drawn from seed i, made when read."""

    def __init__(self, n: int, size: int, fail_at: int | None = None) -> None:
        self.n, self.size, self.fail_at = n, size, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        if not 0 <= i < self.n:
            raise IndexError(i)
        if self.fail_at is not None and i >= self.fail_at:
            raise RuntimeError(f"simulated interruption at sample {i}")
        return torch.randn(3, self.size, self.size, generator=torch.Generator().manual_seed(i))


class NumpyImages:
    """A map-style dataset of NumPy images, drawn from seed i when read: channels first or last."""

    def __init__(self, n: int, size: int, channels_last: bool) -> None:
        self.n, self.size, self.channels_last = n, size, channels_last

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import numpy as np

        if not 0 <= i < self.n:
            raise IndexError(i)
        image = np.random.default_rng(i).standard_normal((3, self.size, self.size), dtype=np.float32)
        return image.transpose(1, 2, 0).copy() if self.channels_last else image


def conv_net(backend: str) -> tuple[Any, list[str], bool]:
    """(model, its two conv layers' keys, channels last) of the same small conv net in each framework."""
    if backend == "torch":
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 10),
        ).eval()
        return model, ["0", "2"], False
    if backend == "paddle":
        import paddle

        paddle.seed(0)
        model = paddle.nn.Sequential(
            paddle.nn.Conv2D(3, 16, 3, padding=1),
            paddle.nn.ReLU(),
            paddle.nn.Conv2D(16, 32, 3, padding=1),
            paddle.nn.ReLU(),
            paddle.nn.AdaptiveAvgPool2D(1),
            paddle.nn.Flatten(),
            paddle.nn.Linear(32, 10),
        )
        model.eval()
        return model, ["0", "2"], False
    if backend == "tf":
        import keras

        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((None, None, 3)),
                keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10),
            ]
        )
        return model, ["conv1", "conv2"], True
    if backend == "jax":
        from flax import nnx

        class Net(nnx.Module):
            def __init__(self, rngs: Any) -> None:
                self.conv1 = nnx.Conv(3, 16, (3, 3), rngs=rngs)
                self.conv2 = nnx.Conv(16, 32, (3, 3), rngs=rngs)
                self.head = nnx.Linear(32, 10, rngs=rngs)

            def __call__(self, x: Any) -> Any:
                x = nnx.relu(self.conv2(nnx.relu(self.conv1(x))))
                return self.head(x.mean(axis=(1, 2)))

        return Net(nnx.Rngs(0)), ["conv1", "conv2"], True
    raise SystemExit(f"--backend takes torch, jax, tf or paddle, not {backend!r}")


def per_backend(args: Any) -> dict[str, Any]:
    """One timed extraction of the small conv net on ``args.backend``: throughput and peak memory."""
    import numpy as np

    import torchlens as tl

    model, layers, channels_last = conv_net(args.backend)
    n, size, batch = args.samples, args.size, args.batch_size
    data = NumpyImages(n, size, channels_last)
    root = args.out or tempfile.mkdtemp(prefix="tl-extract-bench-")
    os.makedirs(root, exist_ok=True)
    store = os.path.join(root, f"net-{args.backend}")
    # Warm up (imports, kernels, allocator pools) on a store of two batches, outside the measurement.
    tl.extract_dataset(
        model,
        NumpyImages(2 * batch, size, channels_last),
        layers,
        batch_size=batch,
        output_dir=store,
        progress=False,
        overwrite=True,
    )
    baseline_peak = rss_peak_mib()
    t0 = time.perf_counter()
    handle = tl.extract_dataset(model, data, layers, batch_size=batch, output_dir=store, progress=False, overwrite=True)
    seconds = time.perf_counter() - t0
    peak = rss_peak_mib()
    per_sample = sum(int(np.prod(s)) * np.dtype(handle.dtypes[k]).itemsize for k, s in handle.shapes.items())
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store) for f in fs)
    results = {
        "backend": args.backend,
        "samples": n,
        "input": [size, size, 3] if channels_last else [3, size, size],
        "batch_size": batch,
        "layers": layers,
        "shapes": {k: list(v) for k, v in handle.shapes.items()},
        "seconds": round(seconds, 2),
        "samples_per_s": round(n / seconds, 1),
        "rss_peak_growth_mib": round(peak - baseline_peak, 1),
        "activations_mib": round(per_sample * n / 2**20, 1),
        "on_disk_mib": round(on_disk / 2**20, 1),
    }
    print(
        f"{args.backend}: conv net, {n} samples of {results['input']}, batch {batch}: {seconds:.2f} s, "
        f"{n / seconds:.1f} samples/s, peak RSS +{peak - baseline_peak:.1f} MiB; "
        f"{results['activations_mib']} MiB of activations, {results['on_disk_mib']} MiB on disk"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.out is None:
        shutil.rmtree(root, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="torch, jax, tf or paddle: time the small conv net there")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64, help="input height and width")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--layers", nargs="+", default=["relu", "layer3"])
    parser.add_argument("--interrupt-at", type=int, default=None, help="sample at which run 2 breaks (default n/2)")
    parser.add_argument("--check", type=int, default=8, help="samples compared with tl.pluck")
    parser.add_argument("--no-grad", action="store_true", help="run the timed extraction under torch.no_grad()")
    parser.add_argument("--plain", action="store_true", help="also time a plain forward of the same batches")
    parser.add_argument("--out", default=None, help="folder for the stores (default: a temporary one, removed)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.backend is not None:
        return per_backend(args)

    import numpy as np
    import torch
    import torchvision
    import zarr

    import torchlens as tl

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    n, size, batch = args.samples, args.size, args.batch_size
    interrupt_at = args.interrupt_at if args.interrupt_at is not None else n // 2
    root = args.out or tempfile.mkdtemp(prefix="tl-extract-bench-")
    os.makedirs(root, exist_ok=True)
    full_dir, resumed_dir = os.path.join(root, "full"), os.path.join(root, "resumed")
    for path in (full_dir, resumed_dir):
        shutil.rmtree(path, ignore_errors=True)

    # Warm up: one capture of a batch, so imports and allocator pools are in the baseline.
    warm = torch.stack([RandomImages(n, size)[i] for i in range(batch)])
    tl.trace(model, warm, save=tl.module(args.layers[-1]), halt=tl.module(args.layers[-1]))
    del warm
    baseline_peak, baseline_now = rss_peak_mib(), rss_now_mib()

    # 1. The full extraction.
    t0 = time.perf_counter()
    with torch.no_grad() if args.no_grad else contextlib.nullcontext():
        handle = tl.extract_dataset(
            model, RandomImages(n, size), args.layers, batch_size=batch, output_dir=full_dir, progress=False
        )
    seconds = time.perf_counter() - t0
    peak = rss_peak_mib()
    per_sample = sum(int(np.prod(s)) * np.dtype(handle.dtypes[k]).itemsize for k, s in handle.shapes.items())
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(full_dir) for f in fs)

    plain = None
    if args.plain:  # the whole forward, no capture, no writes: for scale
        data = RandomImages(n, size)
        t2 = time.perf_counter()
        for start in range(0, n, batch):
            model(torch.stack([data[i] for i in range(start, min(n, start + batch))]))
        plain = time.perf_counter() - t2

    # 2. Interrupted, then resumed; batches counted where the forward starts.
    calls = [0]
    hook = model.register_forward_pre_hook(lambda module, inputs: calls.__setitem__(0, calls[0] + 1))
    try:
        try:
            tl.extract_dataset(
                model,
                RandomImages(n, size, fail_at=interrupt_at),
                args.layers,
                batch_size=batch,
                output_dir=resumed_dir,
                progress=False,
            )
            raise AssertionError("the interrupted run did not stop")
        except RuntimeError as exc:
            interrupted = str(exc)
        before = calls[0]
        partial = tl.Activations(resumed_dir)
        written_before = int(np.count_nonzero(zarr.open_group(resumed_dir, mode="r")["_chunks_done"][:]))
        t1 = time.perf_counter()
        resumed = tl.extract_dataset(
            model, RandomImages(n, size), args.layers, batch_size=batch, output_dir=resumed_dir, progress=False
        )
        resume_seconds = time.perf_counter() - t1
        computed_on_resume = calls[0] - before
    finally:
        hook.remove()
    total_batches = -(-n // batch)

    # 3. Checks: resumed == uninterrupted, chunk by chunk; sampled activations == tl.pluck.
    equal = all(
        np.array_equal(handle[k][s : s + batch], resumed[k][s : s + batch], equal_nan=True)
        for k in args.layers
        for s in range(0, n, batch)
    )
    rng = np.random.default_rng(0)
    picks = sorted(rng.choice(n, size=min(args.check, n), replace=False).tolist())
    data = RandomImages(n, size)
    alone, same_batch = 0.0, True
    for i in picks:
        for key in args.layers:
            got = resumed[key][i]
            single = tl.pluck(model, data[i][None], key).detach().numpy()[0]
            alone = max(alone, float(np.abs(got - single).max()))
            start = i - i % batch
            batched = tl.pluck(model, torch.stack([data[j] for j in range(start, min(n, start + batch))]), key)
            same_batch &= bool(np.array_equal(got, batched[i - start].detach().numpy()))

    results = {
        "samples": n,
        "input": [3, size, size],
        "batch_size": batch,
        "layers": args.layers,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "no_grad": args.no_grad,
        "seconds": round(seconds, 2),
        "samples_per_s": round(n / seconds, 1),
        "plain_forward_seconds": None if plain is None else round(plain, 2),
        "rss_baseline_mib": round(baseline_now, 1),
        "rss_peak_mib": round(peak, 1),
        "rss_peak_growth_mib": round(peak - baseline_peak, 1),
        "activation_bytes_per_sample": per_sample,
        "activations_mib": round(per_sample * n / 2**20, 1),
        "on_disk_mib": round(on_disk / 2**20, 1),
        "interrupted": interrupted,
        "batches_written_before_resume": written_before,
        "batches_total": total_batches,
        "batches_computed_on_resume": computed_on_resume,
        "incomplete_handle_len_before_resume": len(partial),
        "resume_seconds": round(resume_seconds, 2),
        "resumed_equals_uninterrupted": equal,
        "checked_samples": picks,
        "equal_to_pluck_on_same_batch": same_batch,
        "max_abs_diff_to_pluck_alone": alone,
    }
    print(
        f"ResNet-18, {n} samples of 3x{size}x{size}, batch {batch}, layers {args.layers}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads{', no_grad' if args.no_grad else ''}"
    )
    print(f"  extraction      {seconds:7.2f} s   {n / seconds:7.1f} samples/s")
    if plain is not None:
        print(f"  plain forward   {plain:7.2f} s   {n / plain:7.1f} samples/s  (whole model, no capture, no writes)")
    print(
        f"  peak RSS        {peak:7.1f} MiB  (+{peak - baseline_peak:.1f} MiB over the warmed-up process; "
        f"the activations written are {per_sample * n / 2**20:.1f} MiB, {on_disk / 2**20:.1f} MiB on disk)"
    )
    print(f"  interrupted     {interrupted!r}: {written_before}/{total_batches} batches were written")
    print(
        f"  resumed         computed {computed_on_resume} batches in {resume_seconds:.2f} s "
        f"(expected {total_batches - written_before})"
    )
    print(
        f"  read back       resumed == uninterrupted: {equal}; samples {picks}: equal to tl.pluck on the same "
        f"batch: {same_batch}, max |diff| to tl.pluck alone: {alone:.2e}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.out is None:
        shutil.rmtree(root, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
