"""The datasets tl.extract_dataset reads: samples as users hold them, batched by index or in order.

A sample is an array, or a tuple or dict of arrays (a model's positional or
keyword inputs). A dataset is any iterable of them; a sequence (a list, a
NumPy array, a map-style torch or Paddle ``Dataset``) is read by index, so a
resumed run reads only what it still needs. NumPy samples reach another
framework's model through its ``torchlens_from_numpy`` hook. Loaders that
yield batches are refused with the call that works (each backend knows its
framework's loaders).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from torchlens_core.backend.manager import backend_named, hook
from torchlens_core.ir.errors import UnsupportedError


def fields(sample: Any) -> list[tuple[Any, Any]]:
    """A sample's model inputs as (slot, value): slot None for a lone array, a position, or a keyword."""
    if isinstance(sample, Mapping):
        return list(sample.items())
    if isinstance(sample, (tuple, list)):
        return list(enumerate(sample))
    return [(None, sample)]


def to_backend(sample: Any, backend: str) -> Any:
    """The sample with its NumPy arrays made the backend's (torchlens_from_numpy); other values as they are."""

    def convert(value: Any) -> Any:
        if not isinstance(value, np.ndarray) or backend_named(backend, missing_ok=True).array_info(value) is not None:
            return value  # the backend's own array (the numpy backend's are ndarrays), or not an array at all
        converted = backend_named(backend, missing_ok=True).from_numpy(value, str(value.dtype), "cpu")
        return value if converted is None else converted  # no conversion: the signature check names the type

    if isinstance(sample, Mapping):
        return {key: convert(value) for key, value in sample.items()}
    if type(sample) in (tuple, list):  # (a namedtuple or other subclass is passed on as it is)
        return type(sample)(convert(value) for value in sample)
    return convert(sample)


class Source:
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
        # A list, an array (its first axis), or a map-style dataset (len and indexing, no __iter__ of its
        # own): read by index.
        self.random_access = (
            self.n is not None
            and hasattr(dataset, "__getitem__")
            and (
                isinstance(dataset, Sequence)
                or not hasattr(type(dataset), "__iter__")
                or (hasattr(dataset, "shape") and hasattr(dataset, "ndim"))
            )
        )
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

    def batches(
        self, batch_size: int, finished: Callable[[int, int], bool], skipped: Callable[[int], None]
    ) -> Iterator[tuple[int, int, list[Any]]]:
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


def refuse_batched(dataset: Any) -> None:
    """A loader that yields batches is refused with the call that works: extract_dataset batches itself.

    Each backend recognises its own framework's loaders (``torchlens_batched_loader``).
    """
    instead = hook().torchlens_batched_loader(dataset=dataset)
    if instead is not None:
        raise UnsupportedError(instead)
