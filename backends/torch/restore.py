"""Restores that complete even when memory runs out.

A capture changes process-wide state (torch's global module hooks, the
compiler stance, the thread's function-mode stack) and puts it back in a
``finally``. With memory short, the putting back may itself raise
``MemoryError`` (a frame, an iterator, an import inside torch): the state
would then stay changed for the rest of the process, the global hook
recording into a dead capture on every module call. Each restore here is
idempotent and run by :func:`until_done`, which retries it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Tries of one restore before its MemoryError is let through, each after a garbage collection (a full
# collection of a large process takes a good part of a second: more tries would look like a hang).
RETRIES = 8


def until_done(restore: Callable[[], Any]) -> None:
    """Run ``restore``, which must be idempotent, until it completes without ``MemoryError``.

    The loop allocates nothing of its own: ``restore`` is made before the
    ``finally`` that calls this, and the counter stays a cached small int.
    """
    tries = 0
    while True:
        try:
            restore()
            return
        except MemoryError:
            tries += 1
            if tries >= RETRIES:
                raise
            with contextlib.suppress(MemoryError):
                gc.collect()  # the failed forward's garbage may be what frees enough


@contextlib.contextmanager
def function_mode(mode: Any) -> Iterator[None]:
    """``mode`` (a TorchFunctionMode) active on this thread while the block runs, and surely popped after.

    ``TorchFunctionMode.__exit__`` pops once; retried after a ``MemoryError`` it
    could pop twice. Here the stack is popped back to its depth from before.
    """
    depth = torch._C._len_torch_function_stack()
    length, pop = torch._C._len_torch_function_stack, torch._C._pop_torch_function_stack

    def pop_back() -> None:
        while length() > depth:
            pop()

    mode.__enter__()
    try:
        yield
    finally:
        until_done(pop_back)
