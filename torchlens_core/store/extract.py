"""tl.extract_dataset: chosen activations of a whole dataset, written to a Zarr v3 store.

The store's layout and its invariants are described in
:mod:`torchlens_core.store.activations`, the datasets it reads in
:mod:`torchlens_core.store.datasets`; this module batches the dataset, captures
each batch with ``tl.trace(save=..., halt=...)`` and hands the values to the
store, here or on a Dask cluster's workers.
"""

from __future__ import annotations

import functools
import operator
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from torchlens_core.backend.manager import backend_named, claim_backend, resolve_backend
from torchlens_core.capture.api import trace
from torchlens_core.capture.selectors import key_selector
from torchlens_core.ir.errors import LabelNotFoundError, UnsupportedError
from torchlens_core.ir.progress import MODES, Progress
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
    key_name,
    location_of,
    open_store,
    store_io,
    stored_form,
)
from torchlens_core.store.datasets import Source, fields, refuse_batched, to_backend
from torchlens_core.store.layouts import layout_name, output_op, spatial_axes

__all__ = ["Activations", "ExtractError", "extract_dataset"]

LayerKey = str | tuple[str | int, ...]  # "relu_1_2", "layer3", or ("lstm", 0): one leaf of a layer's tuple output


# A capture installs process-wide interception (torch: global module hooks), so
# two captures must not overlap in one process, whatever a worker's threads do.
_CAPTURE_LOCK = threading.Lock()


# -- the public face -------------------------------------------------------------------------
def extract_dataset(
    model: Any,
    dataset: Iterable[Any],
    layers: LayerKey | Sequence[LayerKey],
    *,
    output_dir: str | os.PathLike,
    batch_size: int = 32,
    sample_ids: Iterable[Any] | None = None,
    backend: str | None = None,
    engine: Any = None,
    progress: bool | str = True,
    overwrite: bool = False,
    batch_axis: int | Mapping[str, int] = 0,
) -> Activations:
    """Write the activations of ``layers`` for every sample of ``dataset`` to a Zarr store; return a lazy handle.

    ``dataset``: any iterable of unbatched samples (an array each; a tuple or
    dict of arrays for a model of several inputs), all of one shape. A sequence
    (``len`` and indexing, like a list, a NumPy array or a map-style torch or
    Paddle ``Dataset``) is read by index, so a resumed run loads only the
    samples it still needs. NumPy samples are converted to the backend's arrays
    (``torchlens_from_numpy``). A loader that yields batches (a torch or Paddle
    ``DataLoader``, a batched ``tf.data.Dataset``) is refused with the call to
    make instead. ``layers``: op labels or module paths, as ``tl.pluck`` takes
    them; ``(key, leaf, ...)`` names one array of a layer that returns a tuple
    or dict (``("lstm", 0)``; stored as ``"lstm[0]"``). Samples are stacked
    ``batch_size`` at a time; each batch is captured once, keeping only those
    values and stopping the forward after the last of them.

    ``batch_axis``: where the batch is in a layer's output, 0 unless given, for
    every layer (an int) or per layer key (``{"rnn": 1}`` for a time-major
    RNN); the store holds every layer batch-first, and its index records the
    axis it came from.

    ``output_dir``: a directory (or an fsspec URL zarr can open). Rerunning the
    same call resumes: batches already written are skipped. A store written
    with other layers, batch size or sample ids is refused unless
    ``overwrite=True``.

    ``engine``: None runs the batches one after another in this process; a
    ``dask.distributed.Client`` has its workers capture and write batches
    (the model and samples must pickle, and ``output_dir`` must be reachable
    from every worker). ``sample_ids``: one JSON-able id per sample (strings or
    integers), positions 0..n-1 if left out. ``progress``: False shows no bar;
    True shows the core's (a tqdm bar if tqdm is installed, else a line on
    stderr every 10 s) where ``tl.options.set_progress`` or
    ``TORCHLENS_PROGRESS`` say, on a terminal or in Jupyter unless set; a mode
    (``"always"``, ``"auto"``, ``"never"``) sets it for this call.
    """
    import_zarr()  # first: without the "extract" extra nothing else here can work, so say that before anything
    keys = _layer_keys(layers)
    axes = _batch_axes(batch_axis, keys)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise TypeError(f"batch_size= takes a whole number >= 1, not {batch_size!r}")
    if not callable(model):
        raise UnsupportedError(f"tl.extract_dataset needs a model or function to call, got {type(model).__name__}")
    kind = _engine_kind(engine)
    mode = _progress_mode(progress)
    refuse_batched(dataset)
    source = Source(dataset)
    ids = _sample_ids(sample_ids, source.n)
    if backend is not None:
        backend = resolve_backend(backend).name
    location = location_of(output_dir)

    group, index = open_store(location, overwrite)
    if index is not None and index["layers"] is None:  # set up, nothing written (a wrong layer key, say)
        group, index = open_store(location, overwrite=True)
    if index is None:
        index = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "backend": backend,
            "model": _model_name(model),
            "keys": [key_name(path) for path in keys],
            "batch_axes": list(axes),
            "batch_size": batch_size,
            "layers": None,
            "inputs": None,
            "n_samples": source.n,
            "sample_ids": ids,
            "complete": False,
            "markers": MARKERS,
        }
        with store_io(location, "writing the index of"):
            group.attrs[INDEX] = index
    else:
        index.setdefault("batch_axes", [0] * len(index["keys"]))  # a store from before batch_axis=: all first
        check_same(
            index,
            output_dir,
            keys=[key_name(path) for path in keys],
            batch_axes=list(axes),
            batch_size=batch_size,
            backend=backend,
            sample_ids=ids,
            n_samples=source.n,
        )
        if index["complete"]:
            return Activations(location)
    backend = backend or index["backend"]

    plan = Plan(
        store=location,
        backend=backend or "",
        keys=tuple(key_name(path) for path in keys),
        paths=keys,
        arrays=array_names(tuple(map(key_name, keys))),
        batch_size=batch_size,
        batch_axes=axes,
    )
    if index["layers"] is not None:
        plan = attrs.evolve(
            plan,
            inputs=_tuples(index["inputs"]),
            shapes=tuple(tuple(entry["shape"]) for entry in index["layers"]),
            dtypes=tuple(entry["dtype"] for entry in index["layers"]),
            layouts=tuple(
                (entry.get("layout"), None if entry.get("spatial_axes") is None else tuple(entry["spatial_axes"]))
                for entry in index["layers"]
            ),
        )
        with store_io(location, "reading the batch markers of"):
            counts = group[MARKERS][:].tolist()
    else:
        counts = []

    def finished(k: int, count: int) -> bool:
        return k < len(counts) and counts[k] == count

    bar = Progress("tl.extract_dataset", source.n, unit="sample", mode=mode)
    bar.update(source.finished_samples(batch_size, finished))  # written by an earlier run
    try:
        batches = source.batches(batch_size, finished, bar.update)
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
def _signature(sample: Any, position: int, backend: str) -> tuple[tuple[Any, tuple[int, ...], str], ...]:
    info = backend_named(backend, missing_ok=True).array_info
    signature = []
    for slot, value in fields(sample):
        described = info(value)
        if described is None:
            where = "" if slot is None else f" (its input {slot!r})"
            raise UnsupportedError(
                f"sample {position}{where} is of type {type(value).__name__}, not a {backend} array: samples are "
                f"arrays, or tuples or dicts of arrays for a model of several inputs; map a labelled dataset to "
                f"inputs first, e.g. (x for x, _ in dataset)"
            )
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
                f"extract_dataset batches samples, so they must all have one shape and dtype (resize or pad first)"
            )
    return attrs.evolve(plan, inputs=expected)


def _describe(signature: tuple[tuple[Any, tuple[int, ...], str], ...]) -> str:
    parts = [f"{'' if slot is None else f'{slot}: '}shape {list(shape)} {dtype}" for slot, shape, dtype in signature]
    return ", ".join(parts)


def _collate(samples: list[Any], backend: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The model's batched inputs: each input slot stacked by the backend's torchlens_stack hook."""
    stack = backend_named(backend, missing_ok=True).stack

    def batch(slot: Any) -> Any:
        stacked = stack([s if slot is None else s[slot] for s in samples])
        if stacked is None:
            raise UnsupportedError(
                f"the {backend} backend implements no torchlens_stack hook, "
                f"so tl.extract_dataset cannot batch its samples"
            )
        return stacked

    first = samples[0]
    if isinstance(first, Mapping):
        return (), {key: batch(key) for key in first}
    if isinstance(first, (tuple, list)):
        return tuple(batch(i) for i in range(len(first))), {}
    return (batch(None),), {}


def _capture(model: Any, samples: list[Any], start: int, plan: Plan) -> tuple[Plan, list[Any]]:
    """Capture one batch: the plan (inputs, shapes and dtypes filled in) and each layer's values as NumPy."""
    samples = [to_backend(sample, plan.backend) for sample in samples]
    plan = _check_samples(samples, start, plan)
    args, kwargs = _collate(samples, plan.backend)
    bases = tuple(dict.fromkeys(str(path[0]) for path in plan.paths))
    selector = functools.reduce(operator.or_, map(key_selector, bases))
    with _CAPTURE_LOCK:
        try:
            captured = trace(model, *args, backend=plan.backend, save=selector, halt=selector, **kwargs)
        except LabelNotFoundError as exc:  # a layer that never ran: halt= says so once the forward has ended
            raise LabelNotFoundError(f"layers= names what this model does not have: {exc}") from None
    del args, kwargs
    unknown = []
    for key in bases:
        try:
            captured[key]
        except LabelNotFoundError as exc:
            unknown.append(f"{key!r} ({exc})")
    if unknown:
        raise LabelNotFoundError(f"layers= names what this model does not have: {'; '.join(unknown)}")
    impl = backend_named(plan.backend, missing_ok=True)
    info, to_numpy = impl.array_info, impl.to_numpy
    values, shapes, dtypes, layouts = [], [], [], []
    for i, (key, path, axis) in enumerate(zip(plan.keys, plan.paths, plan.batch_axes)):
        value = _leaf(captured[path[0]].out, path, info, plan.backend)
        described = info(value)
        assert described is not None  # _leaf returns an array or raises
        shape = tuple(described[0])
        if not -len(shape) <= axis < len(shape) or shape[axis] != len(samples):
            where = "first axis" if axis == 0 else f"axis {axis} (batch_axis=)"
            raise ExtractError(
                f"layer {key!r} has shape {list(shape)} for a batch of {len(samples)} samples: its "
                f"{where} is not the batch, so it cannot be stored per sample; pass batch_axis= "
                f"(e.g. {{{key!r}: 1}} for a time-major output) naming the axis that is"
            )
        array, dtype = stored_form(to_numpy(value), described[1], key)
        if axis != 0:  # stored batch-first; the index records the axis it came from
            array = np.ascontiguousarray(np.moveaxis(array, axis, 0))
        if (
            plan.shapes is not None
            and plan.dtypes is not None  # set with the shapes
            and (array.shape[1:] != plan.shapes[i] or dtype != plan.dtypes[i])
        ):
            raise ExtractError(
                f"layer {key!r} gave {list(array.shape[1:])} {dtype} per sample in the batch from "
                f"sample {start}, but {list(plan.shapes[i])} {plan.dtypes[i]} before"
            )
        if plan.layouts is None:  # the first batch: which axes are spatial, read from the trace
            layouts.append(_layout(captured, path, plan.backend, len(shape), axis))
        values.append(array)
        shapes.append(array.shape[1:])
        dtypes.append(dtype)
    # A trace is cyclic (modules point back at it): it would wait for the cyclic GC, and with it the
    # values it holds and, under autograd, their graphs. Let them go now.
    for op in captured.ops:
        op.out = None
    captured.model_output = None
    return attrs.evolve(
        plan,
        shapes=tuple(shapes),
        dtypes=tuple(dtypes),
        layouts=plan.layouts if plan.layouts is not None else tuple(layouts),
    ), values


def _layout(
    captured: Any, path: tuple[Any, ...], backend: str, ndim: int, axis: int
) -> tuple[str | None, tuple[int, ...] | None]:
    """(layout name, spatial axes) of a layer as stored (batch first); (None, None) where not known."""
    op = output_op(captured, captured[path[0]], path)
    spatial = None if op is None else spatial_axes(captured, op, backend, ndim)
    if spatial is None:
        return None, None
    axis %= ndim
    stored = tuple(sorted(0 if d == axis else d + 1 if d < axis else d for d in spatial))  # after the moveaxis
    return layout_name(ndim, stored), stored


def _leaf(value: Any, path: tuple[Any, ...], info: Any, backend: str) -> Any:
    """The array ``path`` names: a layer's output, or one leaf of the tuple or dict it returned."""
    for depth, step in enumerate(path[1:], start=1):
        if isinstance(value, Mapping) and step in value:
            value = value[step]
        elif isinstance(step, int) and isinstance(value, (tuple, list)) and -len(value) <= step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, tuple) and step in getattr(value, "_fields", ()):
            value = getattr(value, step)  # a namedtuple's field
        else:
            raise LabelNotFoundError(
                f"layer {key_name(path[: depth + 1])!r}: the output of {key_name(path[:depth])!r} "
                f"is {_structure(value)}, which has no {step!r}"
            )
    if info(value) is None:
        hint = (
            f"name one of its leaves, e.g. {key_name((*path, _first_step(value)))!r}"
            if _first_step(value) is not None
            else "name one op inside it instead (its op labels are in tl.trace(model, x).summary())"
        )
        raise UnsupportedError(f"layer {key_name(path)!r} gives {_structure(value)}, not one array: {hint}")
    return value


def _first_step(value: Any) -> Any:
    if isinstance(value, Mapping):
        return next(iter(value), None)
    return 0 if isinstance(value, (tuple, list)) and value else None


def _structure(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {list(value)[:8]}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _claim(model: Any, sample: Any) -> str:
    inputs = tuple(value for _, value in fields(sample))
    name = claim_backend(model, inputs, {})
    if name is None:
        raise UnsupportedError(f"no installed backend recognises {type(model).__name__} or its samples; pass backend=")
    return name


# -- engines ---------------------------------------------------------------------------------
def _progress_mode(progress: Any) -> str | None:
    """``progress=`` as the core's progress mode: True, the mode in force; False, none; or a mode."""
    if progress is True:
        return None  # tl.options.set_progress's, else TORCHLENS_PROGRESS's, else "auto"
    if progress is False or progress in MODES:
        return "never" if progress is False else progress
    raise TypeError(f"progress= takes True, False or a progress mode ({', '.join(map(repr, MODES))}), not {progress!r}")


def _engine_kind(engine: Any) -> str:
    if engine is None:
        return "local"
    if (
        type(engine).__module__.split(".")[0] == "distributed"
        and hasattr(engine, "submit")
        and hasattr(engine, "scatter")
    ):
        return "dask"
    raise UnsupportedError(
        f"engine= takes None (batches run in this process) or a dask.distributed.Client, not {type(engine).__name__}"
    )


def _run_here(model: Any, batches: Iterator[Any], plan: Plan, store: Writer, bar: Progress) -> None:
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


def _run_on_dask(client: Any, model: Any, batches: Iterator[Any], plan: Plan, store: Writer, bar: Progress) -> None:
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


# -- argument checks -------------------------------------------------------------------------
def _layer_keys(layers: Any) -> tuple[tuple[Any, ...], ...]:
    """Each layer as (label or module path, *leaf path): a plain key has no leaf path."""
    single = isinstance(layers, str) or (
        isinstance(layers, tuple)
        and bool(layers)
        and isinstance(layers[0], str)
        and any(not isinstance(step, str) for step in layers[1:])
    )
    keys = (layers,) if single else tuple(layers) if isinstance(layers, Iterable) else None
    paths = [(key,) if isinstance(key, str) else key for key in keys or ()]
    if not paths or not all(_valid_path(path) for path in paths):
        raise TypeError(
            f"layers= takes op labels or module paths, e.g. ['relu_1_2', 'features.6'], or (key, leaf) "
            f"for one array of a layer that returns a tuple or dict, e.g. [('lstm', 0)]; not {layers!r}"
        )
    return tuple(dict.fromkeys(paths))


def _valid_path(path: Any) -> bool:
    return (
        isinstance(path, tuple)
        and bool(path)
        and isinstance(path[0], str)
        and bool(path[0])
        and all(isinstance(step, str) or (isinstance(step, int) and not isinstance(step, bool)) for step in path[1:])
    )


def _batch_axes(batch_axis: Any, keys: tuple[tuple[Any, ...], ...]) -> tuple[int, ...]:
    """Each layer's batch axis, from one int for all or a {layer key: axis} mapping (others 0)."""
    names = [key_name(path) for path in keys]
    if isinstance(batch_axis, Mapping):
        unknown = [key for key in batch_axis if key not in names and not (isinstance(key, tuple) and key in keys)]
        if unknown:
            raise TypeError(f"batch_axis= names {unknown}, which are not in layers= ({names})")
        given = {(key_name(key) if isinstance(key, tuple) else key): axis for key, axis in batch_axis.items()}
        axes = [given.get(name, 0) for name in names]
    else:
        axes = [batch_axis] * len(keys)
    if not all(isinstance(axis, int) and not isinstance(axis, bool) for axis in axes):
        raise TypeError(f"batch_axis= takes an int, or a dict of layer key to int, not {batch_axis!r}")
    return tuple(axes)


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
