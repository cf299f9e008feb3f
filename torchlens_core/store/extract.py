"""tl.extract_dataset: chosen activations of a whole dataset, written to a Zarr v3 store.

The store's layout and its invariants are described in
:mod:`torchlens_core.store.activations`; this module batches the dataset, captures
each batch with ``tl.trace(save=..., halt=...)`` and hands the values to the
store, here or on a Dask cluster's workers.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from torchlens_core.backend.manager import claim_backend, hook, resolve_backend
from torchlens_core.capture.api import trace
from torchlens_core.capture.selectors import key_selector
from torchlens_core.ir.errors import LabelNotFoundError, UnsupportedError
from torchlens_core.store.activations import (
    FORMAT,
    FORMAT_VERSION,
    INDEX,
    MARKERS,
    Activations,
    ExtractError,
    Plan,
    Writer,
    array_names,
    check_same,
    create_arrays,
    finish_store,
    import_zarr,
    location_of,
    open_store,
)

__all__ = ["Activations", "ExtractError", "extract_dataset"]


# A capture installs process-wide interception (torch: global module hooks), so
# two captures must not overlap in one process, whatever a worker's threads do.
_CAPTURE_LOCK = threading.Lock()



# -- the public face -------------------------------------------------------------------------
def extract_dataset(model: Any, dataset: Iterable[Any], layers: str | Sequence[str], *, output_dir: str | os.PathLike,
                    batch_size: int = 32, sample_ids: Iterable[Any] | None = None, backend: str | None = None,
                    engine: Any = None, progress: bool = True, overwrite: bool = False) -> Activations:
    """Write the activations of ``layers`` for every sample of ``dataset`` to a Zarr store; return a lazy handle.

    ``dataset``: any iterable of unbatched samples (an array each; a tuple or
    dict of arrays for a model of several inputs), all of one shape. A sequence
    (``len`` and indexing, like a list or a map-style torch ``Dataset``) is
    read by index, so a resumed run loads only the samples it still needs.
    ``layers``: op labels or module paths, as ``tl.pluck`` takes them. Samples
    are stacked ``batch_size`` at a time; each batch is captured once, keeping
    only those values and stopping the forward after the last of them.

    ``output_dir``: a directory (or an fsspec URL zarr can open). Rerunning the
    same call resumes: batches already written are skipped. A store written
    with other layers, batch size or sample ids is refused unless
    ``overwrite=True``.

    ``engine``: None runs the batches one after another in this process; a
    ``dask.distributed.Client`` has its workers capture and write batches
    (the model and samples must pickle, and ``output_dir`` must be reachable
    from every worker). ``sample_ids``: one JSON-able id per sample (strings or
    integers), positions 0..n-1 if left out. ``progress``: a tqdm bar if tqdm
    is installed, else a line on stderr every 10 s.
    """
    import_zarr()  # first: without the "extract" extra nothing else here can work, so say that before anything
    keys = _layer_keys(layers)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise TypeError(f"batch_size= takes a whole number >= 1, not {batch_size!r}")
    if not callable(model):
        raise UnsupportedError(f"tl.extract_dataset needs a model or function to call, got {type(model).__name__}")
    kind = _engine_kind(engine)
    source = _Source(dataset)
    ids = _sample_ids(sample_ids, source.n)
    if backend is not None:
        backend = resolve_backend(backend).name
    location = location_of(output_dir)

    group, index = open_store(location, overwrite)
    if index is not None and index["layers"] is None:  # set up, nothing written (a wrong layer key, say)
        group, index = open_store(location, overwrite=True)
    if index is None:
        index = {"format": FORMAT, "version": FORMAT_VERSION, "backend": backend, "model": _model_name(model),
                 "keys": list(keys), "batch_size": batch_size, "layers": None, "inputs": None,
                 "n_samples": source.n, "sample_ids": ids, "complete": False, "markers": MARKERS}
        group.attrs[INDEX] = index
    else:
        check_same(index, output_dir, keys=list(keys), batch_size=batch_size, backend=backend, sample_ids=ids,
                    n_samples=source.n)
        if index["complete"]:
            _Progress(index["n_samples"], index["n_samples"], progress).close()
            return Activations(location)
    backend = backend or index["backend"]

    plan = Plan(store=location, backend=backend or "", keys=keys, arrays=array_names(keys),
                 batch_size=batch_size)
    if index["layers"] is not None:
        plan = attrs.evolve(plan, inputs=_tuples(index["inputs"]),
                            shapes=tuple(tuple(entry["shape"]) for entry in index["layers"]),
                            dtypes=tuple(entry["dtype"] for entry in index["layers"]))
        counts = group[MARKERS][:].tolist()
    else:
        counts = []

    def finished(k: int, count: int) -> bool:
        return k < len(counts) and counts[k] == count

    bar = _Progress(source.n, source.finished_samples(batch_size, finished), progress)
    try:
        batches = source.batches(batch_size, finished, bar.skip)
        if plan.shapes is None:  # a fresh store: the first batch, here, tells the layers' shapes
            first = next(batches, None)
            if first is None:
                raise ExtractError("the dataset is empty: there are no samples to extract")
            k, start, samples = first
            if not plan.backend:
                plan = attrs.evolve(plan, backend=_claim(model, samples[0]))
            plan, values = _capture(model, samples, start, plan)
            store = create_arrays(group, index, plan, values, source.n or len(samples))
            del samples
            store.write(k, start, values)
            bar.update(len(values[0]))
            del values
        else:
            store = Writer(plan, group)
        if kind == "dask":
            _run_on_dask(engine, model, batches, plan, store, bar)
        else:
            _run_here(model, batches, plan, store, bar)
    finally:
        bar.close()
    finish_store(group, index, plan, source.seen, ids)
    return Activations(location)


# -- what a batch needs ----------------------------------------------------------------------
def _fields(sample: Any) -> list[tuple[Any, Any]]:
    """A sample's model inputs as (slot, value): slot None for a lone array, a position, or a keyword."""
    if isinstance(sample, Mapping):
        return list(sample.items())
    if isinstance(sample, (tuple, list)):
        return list(enumerate(sample))
    return [(None, sample)]


def _signature(sample: Any, position: int, backend: str) -> tuple[tuple[Any, tuple[int, ...], str], ...]:
    info = hook().torchlens_array_info
    signature = []
    for slot, value in _fields(sample):
        described = info(backend=backend, value=value)
        if described is None:
            where = "" if slot is None else f" (its input {slot!r})"
            raise UnsupportedError(
                f"sample {position}{where} is of type {type(value).__name__}, not a {backend} array: samples are "
                f"arrays, or tuples or dicts of arrays for a model of several inputs; map a labelled dataset to "
                f"inputs first, e.g. (x for x, _ in dataset)")
        shape, dtype, _device = described
        signature.append((slot, tuple(shape), dtype))
    return tuple(signature)


def _check_samples(samples: list[Any], start: int, plan: Plan) -> Plan:
    """Every sample must look like the first one of the dataset; returns the plan with that look recorded."""
    expected = plan.inputs
    for offset, sample in enumerate(samples):
        got = _signature(sample, start + offset, plan.backend)
        if expected is None:
            expected = got
        elif got != expected:
            raise ExtractError(
                f"sample {start + offset} has {_describe(got)}, but the first sample had {_describe(expected)}: "
                f"extract_dataset batches samples, so they must all have one shape and dtype (resize or pad first)")
    return attrs.evolve(plan, inputs=expected)


def _describe(signature: tuple[tuple[Any, tuple[int, ...], str], ...]) -> str:
    parts = [f"{'' if slot is None else f'{slot}: '}shape {list(shape)} {dtype}" for slot, shape, dtype in signature]
    return ", ".join(parts)


def _collate(samples: list[Any], backend: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's batched inputs: each input slot stacked by the backend's torchlens_stack hook."""
    stack = hook().torchlens_stack

    def batch(slot: Any) -> Any:
        stacked = stack(backend=backend, samples=[s if slot is None else s[slot] for s in samples])
        if stacked is None:
            raise UnsupportedError(f"the {backend} backend implements no torchlens_stack hook, "
                                   f"so tl.extract_dataset cannot batch its samples")
        return stacked

    first = samples[0]
    if isinstance(first, Mapping):
        return (), {key: batch(key) for key in first}
    if isinstance(first, (tuple, list)):
        return tuple(batch(i) for i in range(len(first))), {}
    return (batch(None),), {}


def _capture(model: Any, samples: list[Any], start: int, plan: Plan) -> tuple[Plan, list[Any]]:
    """Capture one batch: the plan (inputs, shapes and dtypes filled in) and each layer's values as NumPy."""
    plan = _check_samples(samples, start, plan)
    args, kwargs = _collate(samples, plan.backend)
    selector = functools.reduce(operator.or_, map(key_selector, plan.keys))
    with _CAPTURE_LOCK:
        try:
            captured = trace(model, *args, backend=plan.backend, save=selector, halt=selector, **kwargs)
        except LabelNotFoundError as exc:  # a layer that never ran: halt= says so once the forward has ended
            raise LabelNotFoundError(f"layers= names what this model does not have: {exc}") from None
    del args, kwargs
    unknown = []
    for key in plan.keys:
        try:
            captured[key]
        except LabelNotFoundError as exc:
            unknown.append(f"{key!r} ({exc})")
    if unknown:
        raise LabelNotFoundError(f"layers= names what this model does not have: {'; '.join(unknown)}")
    info, to_numpy = hook().torchlens_array_info, hook().torchlens_to_numpy
    values, shapes, dtypes = [], [], []
    for i, key in enumerate(plan.keys):
        value = captured[key].out
        described = info(backend=plan.backend, value=value)
        if described is None:
            raise UnsupportedError(f"layer {key!r} gives a {type(value).__name__}, not one array: name one op "
                                   f"inside it instead (its op labels are in tl.trace(model, x).summary())")
        shape = tuple(described[0])
        if not shape or shape[0] != len(samples):
            raise ExtractError(f"layer {key!r} has shape {list(shape)} for a batch of {len(samples)} samples: its "
                               f"first axis is not the batch, so it cannot be stored per sample")
        array = to_numpy(backend=plan.backend, value=value)
        if plan.shapes is not None and (shape[1:] != plan.shapes[i] or str(array.dtype) != plan.dtypes[i]):
            raise ExtractError(f"layer {key!r} gave {list(shape[1:])} {array.dtype} per sample in the batch from "
                               f"sample {start}, but {list(plan.shapes[i])} {plan.dtypes[i]} before")
        values.append(array)
        shapes.append(shape[1:])
        dtypes.append(str(array.dtype))
    # A trace is cyclic (modules point back at it): it would wait for the cyclic GC, and with it the
    # values it holds and, under autograd, their graphs. Let them go now.
    for op in captured.ops:
        op.out = None
    captured.model_output = None
    return attrs.evolve(plan, shapes=tuple(shapes), dtypes=tuple(dtypes)), values


def _claim(model: Any, sample: Any) -> str:
    inputs = tuple(value for _, value in _fields(sample))
    name = claim_backend(model, inputs, {})
    if name is None:
        raise UnsupportedError(f"no installed backend recognises {type(model).__name__} or its samples; pass backend=")
    return name


# -- the dataset -----------------------------------------------------------------------------
class _Source:
    """The dataset as batches; a sequence is read by index, anything else iterated once."""

    def __init__(self, dataset: Any) -> None:
        indexable = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        if isinstance(dataset, (str, bytes, Mapping)) or not (isinstance(dataset, Iterable) or indexable):
            raise TypeError(f"dataset= takes an iterable of samples, not {type(dataset).__name__}")
        self.dataset = dataset
        try:
            self.n: int | None = len(dataset)
        except TypeError:
            self.n = None
        # A list, or a map-style dataset (len and indexing, no __iter__ of its own): read by index.
        self.random_access = self.n is not None and hasattr(dataset, "__getitem__") and (
            isinstance(dataset, Sequence) or not hasattr(type(dataset), "__iter__"))
        self.seen = 0

    def finished_samples(self, batch_size: int, finished: Callable[[int, int], bool]) -> int:
        """Samples already written, known before reading anything (sequences only; 0 for iterators)."""
        if not self.random_access:
            return 0
        return sum(count for k, _, count in self._layout(batch_size) if finished(k, count))

    def _layout(self, batch_size: int) -> Iterator[tuple[int, int, int]]:
        """(batch number, first sample, sample count) of each batch of a sequence."""
        assert self.n is not None
        for start in range(0, self.n, batch_size):
            yield start // batch_size, start, min(batch_size, self.n - start)

    def batches(self, batch_size: int, finished: Callable[[int, int], bool],
                skipped: Callable[[int], None]) -> Iterator[tuple[int, int, list[Any]]]:
        """(batch number, first sample, samples) of each batch still to compute.

        A sequence reads only those samples. An iterator is read through, and
        ``skipped(count)`` is called for each batch an earlier run finished.
        """
        if self.random_access:
            for k, start, count in self._layout(batch_size):
                self.seen = start + count
                if not finished(k, count):
                    yield k, start, [self.dataset[i] for i in range(start, start + count)]
            return
        samples = iter(self.dataset)
        for k in itertools.count():
            start = k * batch_size
            chunk = list(itertools.islice(samples, batch_size))
            if not chunk:
                return
            self.seen = start + len(chunk)
            if finished(k, len(chunk)):
                skipped(len(chunk))
            else:
                yield k, start, chunk
            if len(chunk) < batch_size:
                return


# -- engines ---------------------------------------------------------------------------------
def _engine_kind(engine: Any) -> str:
    if engine is None:
        return "local"
    if type(engine).__module__.split(".")[0] == "distributed" and hasattr(engine, "submit") and hasattr(
            engine, "scatter"):
        return "dask"
    raise UnsupportedError(f"engine= takes None (batches run in this process) or a dask.distributed.Client, "
                           f"not {type(engine).__name__}")


def _run_here(model: Any, batches: Iterator[Any], plan: Plan, store: Writer, bar: _Progress) -> None:
    """One batch after another in this process: one batch of activations held at a time."""
    for k, start, samples in batches:
        plan, values = _capture(model, samples, start, plan)
        del samples
        count = len(values[0])
        store.ensure(start + count)
        store.write(k, start, values)
        del values
        bar.update(count)


def _on_worker(model: Any, samples: list[Any], k: int, start: int, plan: Plan) -> int:
    """A cluster task: capture one batch and write its chunks and marker; returns the sample count."""
    _, values = _capture(model, samples, start, plan)
    del samples
    Writer(plan).write(k, start, values)
    return len(values[0])


def _run_on_dask(client: Any, model: Any, batches: Iterator[Any], plan: Plan, store: Writer,
                 bar: _Progress) -> None:
    """Workers capture and write batches; at most two batches per worker thread are in flight."""
    from distributed import as_completed

    model_future = client.scatter(model, broadcast=True, hash=False)
    window = 2 * max(1, sum(client.nthreads().values()))
    running = as_completed()
    in_flight: set[Any] = set()

    def settle(future: Any) -> None:
        bar.update(future.result())  # a worker's exception is raised here
        in_flight.discard(future)
        future.release()

    try:
        for k, start, samples in batches:
            store.ensure(start + len(samples))  # before the task: a worker opens the arrays at their new size
            future = client.submit(_on_worker, model_future, samples, k, start, plan, pure=False)
            del samples
            in_flight.add(future)
            running.add(future)
            while len(in_flight) >= window:
                settle(next(running))
        for future in running:
            settle(future)
    except BaseException:
        client.cancel(list(in_flight))
        raise
    finally:
        client.cancel(model_future)


# -- progress --------------------------------------------------------------------------------
class _Progress:
    """A tqdm bar when tqdm is installed, else a line on stderr every ``every`` seconds; nothing if disabled."""

    every = 10.0

    def __init__(self, total: int | None, initial: int, enabled: bool) -> None:
        self.total, self.done, self.computed, self.enabled = total, initial, 0, bool(enabled)
        self.started = self.last = time.monotonic()
        self.bar = None
        tqdm = _tqdm() if self.enabled else None
        if tqdm is not None:
            self.bar = tqdm(total=total, initial=initial, unit="sample", desc="extract_dataset", file=sys.stderr)

    def update(self, count: int) -> None:
        self.done += count
        self.computed += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.enabled and time.monotonic() - self.last >= self.every:
            self._line()

    def skip(self, count: int) -> None:
        """Samples of a batch written by an earlier run (iterated past, not computed)."""
        self.done += count
        if self.bar is not None:
            self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._line()

    def _line(self) -> None:
        self.last = time.monotonic()
        rate = self.computed / max(self.last - self.started, 1e-9)
        total = "" if self.total is None else f"/{self.total}"
        print(f"extract_dataset: {self.done}{total} samples, {rate:.1f} samples/s", file=sys.stderr, flush=True)


def _tqdm() -> Any:
    """tqdm's bar class, or None where tqdm is not installed."""
    if importlib.util.find_spec("tqdm") is None:
        return None
    from tqdm.auto import tqdm

    return tqdm


# -- argument checks -------------------------------------------------------------------------
def _layer_keys(layers: Any) -> tuple[str, ...]:
    keys = (layers,) if isinstance(layers, str) else tuple(layers) if isinstance(layers, Iterable) else None
    if not keys or not all(isinstance(key, str) and key for key in keys):
        raise TypeError(f"layers= takes op labels or module paths, e.g. ['relu_1_2', 'features.6'], not {layers!r}")
    return tuple(dict.fromkeys(keys))


def _sample_ids(sample_ids: Iterable[Any] | None, n: int | None) -> list[Any] | None:
    if sample_ids is None:
        return None
    ids = []
    for value in sample_ids:
        if not isinstance(value, str):
            try:
                value = operator.index(value)
            except TypeError:
                raise TypeError(f"sample_ids are strings or integers, not {type(value).__name__}") from None
        ids.append(value)
    if n is not None and len(ids) != n:
        raise ExtractError(f"sample_ids has {len(ids)} ids for a dataset of {n} samples")
    return ids


def _model_name(model: Any) -> str:
    return type(model).__name__ if not hasattr(model, "__name__") else str(model.__name__)


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples they were (the input signature)."""
    if value is None:
        return None
    return tuple((slot, tuple(shape), dtype) for slot, shape, dtype in value)
