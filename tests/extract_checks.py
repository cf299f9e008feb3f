"""What the extraction tests of every backend share: a map-style dataset that counts its reads and can break."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class CountingSamples:
    """Sample i is ``convert(data[i])``; reads are counted, and reading sample ``fail_at`` or later interrupts."""

    def __init__(
        self, data: Sequence[Any], fail_at: int | None = None, convert: Callable[[Any], Any] = lambda sample: sample
    ) -> None:
        self.data, self.fail_at, self.convert, self.reads = data, fail_at, convert, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        if self.fail_at is not None and i >= self.fail_at:
            raise KeyboardInterrupt
        self.reads += 1
        return self.convert(self.data[i])
