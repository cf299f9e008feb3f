"""The activation store of tl.extract_dataset, and Activations, its lazy reader.

The store at ``output_dir`` is a plain Zarr v3 group that other tools open
directly (zarr-python, xarray, tensorstore, zarr.js)::

    output_dir/
        zarr.json        the group; its attribute "torchlens" is the index: layers, shapes,
                         dtypes, sample ids, batch size, whether the extraction is complete
        relu_1_2/        one array per layer, (n_samples, *activation shape), batch first: one
        conv2d_3_7/        shard per batch, one zstd-compressed chunk per sample in it
        _chunks_done/    per batch, how many samples its chunks hold (0: not written yet)

Invariants:

- A batch counts as written only once its marker in ``_chunks_done`` is set,
  and the marker is set only after every layer's chunk of that batch is stored
  (each chunk write is atomic). An interrupted run leaves at most unmarked
  chunks; a rerun redoes the unmarked batches and nothing else.
- Batches never share a shard (a file), so workers write their own chunks without
  locks. Only the calling process writes metadata (array shapes, the index).
- At most a batch of activations per batch in flight is held in memory: one
  batch in this process; with a cluster, a bounded window of batches.
- No framework import: batches are made by the backend's ``torchlens_stack``
  hook, values converted by ``torchlens_to_numpy``, and each batch is captured
  with ``tl.trace(save=..., halt=...)``, so only the requested values are kept
  and the forward stops after the last of them.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
from collections.abc import Iterator
from typing import Any

import attrs

from torchlens_core.ir.errors import ExtractError, LabelNotFoundError, MissingDependencyError, closest

__all__ = ["Activations", "ExtractError"]

FORMAT = "torchlens.activations"
FORMAT_VERSION = 1
INDEX = "torchlens"  # the group attribute that holds the index
MARKERS = "_chunks_done"
INSTALL = 'pip install "torchlens[extract]"'  # zarr; dask.distributed for engine=; tqdm for the progress bar


def import_zarr() -> Any:
    """The zarr module, or a MissingDependencyError naming the extra that installs it.

    zarr is an optional dependency: a plain ``pip install torchlens`` has no
    extraction, and the raw ModuleNotFoundError would not say what to install.
    """
    try:
        import zarr
    except ImportError as error:
        raise MissingDependencyError(
            f"tl.extract_dataset and Activations need zarr 3, which is not installed ({error}): {INSTALL}"
        ) from None
    major = str(getattr(zarr, "__version__", "0")).split(".")[0]
    if not major.isdigit() or int(major) < 3:  # the store is Zarr v3, written with the zarr 3 API
        raise MissingDependencyError(
            f"tl.extract_dataset and Activations need zarr 3, not zarr {zarr.__version__}: {INSTALL}"
        )
    return zarr


@attrs.frozen
class Plan:
    """Everything a batch needs besides the model and its samples; small and picklable (it goes to workers)."""

    store: str
    backend: str
    keys: tuple[str, ...]  # as the store names them ("relu_1_2", "lstm[0]")
    arrays: tuple[str, ...]
    batch_size: int
    paths: tuple[tuple[Any, ...], ...] = ()  # per key: (label or module path, *leaf path of a tuple output)
    batch_axes: tuple[int, ...] = ()  # per key: the batch's axis in the layer's output (stored first)
    inputs: tuple[tuple[Any, tuple[int, ...], str], ...] | None = None  # (slot, shape, dtype) of a sample
    shapes: tuple[tuple[int, ...], ...] | None = None  # per layer, one sample's activation shape
    dtypes: tuple[str, ...] | None = None
    # per layer: (layout name such as "NHWC", the spatial axes as stored), (None, None) where not known
    layouts: tuple[tuple[str | None, tuple[int, ...] | None], ...] | None = None


def key_name(path: tuple[Any, ...]) -> str:
    """A layer key as the store names it: ``"relu_1_2"``, ``"lstm[0]"``, ``"encoder['hidden']"`` (a leaf)."""
    return str(path[0]) + "".join(f"[{step!r}]" for step in path[1:])


# 16-bit floats NumPy itself lacks are stored as their raw bits, the dtype in the array's attributes.
RAW_16BIT = {"bfloat16": "uint16"}
_NAN_BITS = {"bfloat16": 0x7FC0}


def stored_form(array: Any, dtype: str, key: str) -> tuple[Any, str]:
    """``(array as stored, dtype name recorded)`` for one layer's values.

    ``dtype`` is the backend's name for the array's dtype, ``array`` what its
    ``torchlens_to_numpy`` gave: an ``ml_dtypes.bfloat16`` array (JAX, TF), or
    float32 holding each bfloat16 value exactly (torch, Paddle). Both become the
    raw 16 bits, checked to hold the very values the backend gave.
    """
    import numpy as np

    if dtype.rsplit(".", 1)[-1] != "bfloat16":
        if array.dtype.kind not in "biufc":  # float8 and other ml_dtypes types: no Zarr data type holds them
            raise ExtractError(
                f"layer {key!r} is {dtype}, which the activation store cannot hold: extract a "
                f"layer after a cast to float32 (or bfloat16), or cast in the model"
            )
        return array, str(array.dtype)
    if array.dtype.itemsize == 2:  # ml_dtypes.bfloat16
        return array.view(np.uint16), "bfloat16"
    if array.dtype != np.float32:
        raise ExtractError(f"layer {key!r}: a bfloat16 output came back from the backend as {array.dtype}")
    wide = np.ascontiguousarray(array).view(np.uint32)
    bits = (wide >> 16).astype(np.uint16)
    if not np.array_equal(bits.astype(np.uint32) << 16, wide):  # cannot happen for a widened bfloat16
        raise ExtractError(f"layer {key!r}: its bfloat16 values came back as float32 that bfloat16 cannot hold")
    return bits, "bfloat16"


class Activations:
    """The activations ``tl.extract_dataset`` wrote, read lazily.

    ``handle["relu_1_2"]`` is that layer's Zarr array, shape
    ``(n_samples, *activation shape)``: index or slice it for NumPy
    (``handle["relu_1_2"][:8]``), nothing is read before. ``handle.layers``,
    ``handle.sample_ids``, ``handle.shapes``, ``handle.dtypes``, ``len(handle)``
    (samples). ``Activations(output_dir)`` reopens a store later.

    A bfloat16 layer (stored as its raw 16 bits) reads as ``ml_dtypes.bfloat16``
    arrays, or float32 with ``as_float32=True`` (which reads float16 layers as
    float32 too); ``handle[key]`` is then a :class:`Decoded` view of the Zarr
    array, indexed the same way.
    """

    __iter__ = None  # a handle is not a sequence of samples: index a layer, then the samples

    def __init__(self, path: str | os.PathLike, *, as_float32: bool = False) -> None:
        zarr = import_zarr()
        self.as_float32 = bool(as_float32)
        self.path = location_of(path)
        try:
            self._group = zarr.open_group(self.path, mode="r")
        except (FileNotFoundError, zarr.errors.ContainsArrayError):
            raise ExtractError(f"no activation store at {os.fspath(path)!r}") from None
        index = self._group.attrs.asdict().get(INDEX)
        if not isinstance(index, dict) or index.get("format") != FORMAT or not index.get("layers"):
            raise ExtractError(f"{os.fspath(path)!r} holds no activations written by tl.extract_dataset")
        self._index = index
        self._layers = {entry["key"]: entry for entry in index["layers"]}

    @property
    def layers(self) -> list[str]:
        """The layer keys, in the order they were asked for."""
        return list(self._layers)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each layer's activation shape for one sample."""
        return {key: tuple(entry["shape"]) for key, entry in self._layers.items()}

    @property
    def dtypes(self) -> dict[str, str]:
        return {key: entry["dtype"] for key, entry in self._layers.items()}

    @property
    def sample_ids(self) -> list[Any] | range:
        """The id of each sample, in store order: the ids given, or the positions 0..n-1."""
        ids = self._index["sample_ids"]
        return range(len(self)) if ids is None else list(ids)

    @property
    def complete(self) -> bool:
        """False while an extraction is unfinished (unwritten samples read as NaN or 0)."""
        return bool(self._index["complete"])

    @property
    def batch_size(self) -> int:
        return int(self._index["batch_size"])

    @property
    def backend(self) -> str:
        return str(self._index["backend"])

    @property
    def index(self) -> dict[str, Any]:
        """The raw index stored in the group's attributes (JSON)."""
        return dict(self._index)

    def __len__(self) -> int:
        n = self._index["n_samples"]
        return int(n) if self.complete and n is not None else int(self[self.layers[0]].shape[0])

    def __contains__(self, key: object) -> bool:
        return key in self._layers

    def __getitem__(self, key: str | tuple[Any, ...]) -> Any:
        if isinstance(key, tuple) and key and isinstance(key[0], str):  # ("lstm", 0), as layers= took it
            key = key_name(key)
        if not isinstance(key, str):
            raise TypeError(
                f"index a handle by layer key (one of {self.layers}), then the array by sample: "
                f"handle[{self.layers[0]!r}][{key!r}]"
            )
        entry = self._layers.get(key)
        if entry is None:
            near = closest(key, self._layers)
            hint = f"; did you mean {', '.join(map(repr, near))}?" if near else f"; it has {self.layers}"
            raise LabelNotFoundError(f"no layer {key!r} in this activation store{hint}")
        array = self._group[entry["array"]]
        if entry["dtype"] in RAW_16BIT or (self.as_float32 and entry["dtype"] == "float16"):
            return Decoded(array, entry["dtype"], self.as_float32)
        return array

    def __repr__(self) -> str:
        layers = ", ".join(f"{key} {tuple(e['shape'])} {e['dtype']}" for key, e in self._layers.items())
        state = "" if self.complete else ", incomplete"
        return f"<Activations of {self._index['model']} at {self.path!r}: {len(self)} samples{state}; {layers}>"


class Decoded:
    """A layer array stored in another form than it is read: raw bfloat16 bits, or float16 read as float32.

    Indexed like the Zarr array (``decoded[:8]``, ``decoded[3]``), each read decoded;
    ``.raw`` is the Zarr array itself.
    """

    def __init__(self, raw: Any, dtype: str, as_float32: bool) -> None:
        self.raw, self.stored_dtype, self.as_float32 = raw, dtype, as_float32

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.raw.shape)

    @property
    def dtype(self) -> Any:
        import numpy as np

        return np.dtype(np.float32) if self.as_float32 else _numpy_dtype(self.stored_dtype)

    def __len__(self) -> int:
        return int(self.raw.shape[0])

    def __getitem__(self, selection: Any) -> Any:
        import numpy as np

        values = np.asarray(self.raw[selection])
        if self.stored_dtype == "bfloat16":
            if self.as_float32:  # a bfloat16 is the top half of the float32 of the same value
                return (values.astype(np.uint32) << 16).view(np.float32)
            return values.view(_numpy_dtype("bfloat16"))
        return values.astype(np.float32)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        values = self[...]
        return values if dtype is None else values.astype(dtype)

    def __repr__(self) -> str:
        return f"<Decoded {self.stored_dtype} layer {self.raw.path!r}, shape {self.shape}, read as {self.dtype}>"


def _numpy_dtype(name: str) -> Any:
    """NumPy's dtype of that name, from ml_dtypes for those NumPy lacks."""
    import numpy as np

    if name not in RAW_16BIT:
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError:
        raise MissingDependencyError(
            f"reading a {name} layer as {name} needs ml_dtypes (pip install ml_dtypes); "
            f"or open the store with tl.Activations(path, as_float32=True)"
        ) from None
    return np.dtype(getattr(ml_dtypes, name))


# -- the store -------------------------------------------------------------------------------
@contextlib.contextmanager
def store_io(location: str, doing: str) -> Iterator[None]:
    """An OSError of the store's files (a full disk, no permission) as an ExtractError saying what to do.

    Only store operations run inside: an OSError of the model or the dataset stays what it is. Every
    write of the store is atomic (zarr writes a file beside and renames it), so a failed one leaves
    what was there: the rerun resumes as after an interruption.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            todo = "free some space on that disk, then rerun the same call"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            todo = "choose an output_dir you can write, or fix its permissions and rerun the same call"
        else:
            todo = "fix that, then rerun the same call"
        file = f" ({exc.filename})" if exc.filename else ""
        raise ExtractError(
            f"{doing} the activation store at {location} failed: {exc.strerror or exc}{file}; "
            f"{todo}: it resumes, keeping every batch already written"
        ) from None


def location_of(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


_PARTIAL = re.compile(r"zarr\.[0-9a-f]+\.partial")  # zarr writes a file under this name, then renames it


def open_store(location: str, overwrite: bool) -> tuple[Any, dict[str, Any] | None]:
    """The group at ``location`` and its index (None for a fresh store); never clobbers foreign data."""
    zarr = import_zarr()

    if overwrite:
        with store_io(location, "creating"):
            return zarr.open_group(location, mode="w"), None
    local = "://" not in location
    # (a "zarr.<hex>.partial" is zarr's own: the group's metadata, being written when a run was killed)
    names = os.listdir(location) if local and os.path.isdir(location) else []
    if any(not _PARTIAL.fullmatch(name) for name in names) and not os.path.isfile(os.path.join(location, "zarr.json")):
        raise ExtractError(
            f"{location} exists and is not an activation store: pick another output_dir, "
            f"or pass overwrite=True to replace what is there"
        )
    try:
        with store_io(location, "opening"):
            group = zarr.open_group(location, mode="a")
    except zarr.errors.ContainsArrayError:
        raise ExtractError(
            f"{location} holds a Zarr array, not an activation store; pass overwrite=True to replace it"
        ) from None
    for name in names:  # what a killed run left of the group's metadata (zarr warns of it at every listing)
        if _PARTIAL.fullmatch(name):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(location, name))
    index = group.attrs.asdict().get(INDEX)
    if index is None and next(iter(group.keys()), None) is not None:
        raise ExtractError(
            f"{location} holds a Zarr group that tl.extract_dataset did not write; pass overwrite=True to replace it"
        )
    if index is not None and (not isinstance(index, dict) or index.get("format") != FORMAT):
        raise ExtractError(f"{location} holds an index of another format; pass overwrite=True to replace it")
    return group, index


def check_same(index: dict[str, Any], output_dir: Any, **wanted: Any) -> None:
    """A rerun resumes only an extraction of the same layers, batch size, ids and dataset length."""
    differ = []
    for name, value in wanted.items():
        stored = index.get(name)
        if name in ("backend", "n_samples") and (value is None or stored is None):
            continue  # not known on one side: nothing to compare
        if value != stored:
            differ.append(f"{'layers' if name == 'keys' else name}={_short(stored)} there, {_short(value)} here")
    if differ:
        raise ExtractError(
            f"{os.fspath(output_dir)} holds another extraction ({'; '.join(differ)}): pass "
            f"overwrite=True to start again, or choose another output_dir"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def array_names(keys: tuple[str, ...]) -> tuple[str, ...]:
    """Zarr node names for layer keys: unique, no '/' or ':' (kept in the index next to their key)."""
    names: list[str] = []
    for key in keys:
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", key).lstrip("_.") or "layer"
        base, n = name, 2
        while name in names or name == MARKERS:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return tuple(names)


def create_arrays(group: Any, index: dict[str, Any], plan: Plan, values: list[Any], n: int) -> Writer:
    """One array per layer, sized for ``n`` samples, one shard per batch and one chunk per sample in it; then
    the index that lists them.

    Sharding makes a batch one file (one write per batch and layer, as before, so workers never share a
    file) while a chunk holds one sample: reading a sample decompresses that sample, not its whole batch.
    """
    with store_io(plan.store, "creating the arrays of"):
        return _create_arrays(group, index, plan, n)


def _create_arrays(group: Any, index: dict[str, Any], plan: Plan, n: int) -> Writer:
    import numpy as np
    from zarr.codecs import ZstdCodec

    assert plan.shapes is not None and plan.dtypes is not None
    # zarr-python's own default codec (so every reader of Zarr v3 has it), at its fastest level: on
    # activations it compresses better than Blosc-zstd, at about 180 MiB/s a core.
    compressor = ZstdCodec(level=1)
    axes = plan.batch_axes or (0,) * len(plan.keys)
    layouts = plan.layouts or ((None, None),) * len(plan.keys)
    for name, shape, dtype, axis, (layout, spatial) in zip(plan.arrays, plan.shapes, plan.dtypes, axes, layouts):
        stored = RAW_16BIT.get(dtype, dtype)
        # Unwritten samples read as NaN (raw bfloat16: its quiet NaN's bits), integers as 0.
        fill = float("nan") if np.dtype(stored).kind in "fc" else _NAN_BITS.get(dtype, 0)
        # what the values are, for any reader
        attributes = {
            "torchlens": {
                "dtype": dtype,
                "batch_axis": axis,
                "layout": layout,
                "spatial_axes": None if spatial is None else list(spatial),
            }
        }
        if stored != dtype:
            attributes["torchlens"]["encoding"] = f"the raw bits of {dtype}, as {stored}"
        group.create_array(
            name,
            shape=(n, *shape),
            shards=(plan.batch_size, *shape),
            chunks=(1, *shape),
            dtype=stored,
            compressors=compressor,
            fill_value=fill,
            overwrite=True,
            attributes=attributes,
            dimension_names=("sample", *(f"{name}_dim{i}" for i in range(1, len(shape) + 1))),
        )
    group.create_array(
        MARKERS,
        shape=(math.ceil(n / plan.batch_size),),
        chunks=(1,),
        dtype="uint32",
        fill_value=0,
        overwrite=True,
        dimension_names=("batch",),
        attributes={"description": "samples written in each batch's chunks; 0: not yet"},
    )
    index.update(
        backend=plan.backend,
        inputs=[list(entry) for entry in plan.inputs or ()],
        layers=[
            {
                "key": key,
                "array": name,
                "shape": list(shape),
                "dtype": dtype,
                "batch_axis": axis,
                "layout": layout,
                "spatial_axes": None if spatial is None else list(spatial),
            }
            for key, name, shape, dtype, axis, (layout, spatial) in zip(
                plan.keys, plan.arrays, plan.shapes, plan.dtypes, axes, layouts
            )
        ],
    )
    group.attrs[INDEX] = index
    return Writer(plan, group)


class Writer:
    """Writes batches into the layer arrays, then the batch's marker. Any process may write; only the caller
    grows the arrays (``ensure``)."""

    def __init__(self, plan: Plan, group: Any = None) -> None:
        self.store = plan.store
        with store_io(plan.store, "opening"):
            group = group if group is not None else import_zarr().open_group(plan.store, mode="r+")
            self.batch_size = plan.batch_size
            self.arrays = [group[name] for name in plan.arrays]
            self.markers = group[MARKERS]

    def ensure(self, stop: int) -> None:
        """Grow the arrays (and markers) to hold ``stop`` samples: a dataset of unknown length grows as it comes."""
        with store_io(self.store, "growing the arrays of"):
            for array in self.arrays:
                if array.shape[0] < stop:
                    array.resize((stop, *array.shape[1:]))
            chunks = math.ceil(stop / self.batch_size)
            if self.markers.shape[0] < chunks:
                self.markers.resize((chunks,))

    def write(self, k: int, start: int, values: list[Any]) -> None:
        count = len(values[0])
        with store_io(self.store, f"writing batch {k} to"):
            for array, value in zip(self.arrays, values):
                array[start : start + count] = value
            self.markers[k] = count  # last: the batch counts as written only now


def finish_store(group: Any, index: dict[str, Any], plan: Plan, n: int, ids: list[Any] | None) -> None:
    """Trim the arrays to the samples seen, check every batch is marked, and mark the store complete."""
    if n == 0:
        raise ExtractError("the dataset is empty: there are no samples to extract")
    if ids is not None and len(ids) != n:
        raise ExtractError(f"sample_ids has {len(ids)} ids but the dataset gave {n} samples")
    writer = Writer(plan, group)
    with store_io(plan.store, "finishing"):
        for array in writer.arrays:
            if array.shape[0] != n:
                array.resize((n, *array.shape[1:]))
        n_batches = math.ceil(n / plan.batch_size)
        if writer.markers.shape[0] != n_batches:
            writer.markers.resize((n_batches,))
        counts = writer.markers[:].tolist()
    missing = [k for k, count in enumerate(counts) if count != min(plan.batch_size, n - k * plan.batch_size)]
    if missing:
        raise ExtractError(f"batches {missing[:10]} were not written; rerun the same call to complete them")
    index.update(n_samples=n, sample_ids=ids, complete=True)
    with store_io(plan.store, "writing the index of"):
        group.attrs[INDEX] = index
