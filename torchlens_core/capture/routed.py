"""Functions replaced while captures run, each call routed to the capture recording the calling thread.

Some calls a backend must record reach none of its hooks: a module's
functions that take no recorded array (NumPy's legacy ``np.random.rand(3)``
draws from a global state), or that a model calls before any array is
recorded. A backend replaces them for as long as any capture runs
(:func:`~torchlens_core.capture.threads.shared_patch`: installed by the
first capture, put back by the last, whatever the threads) and routes each
call to the recorder of the capture recording the calling thread, the
innermost one when captures nest (a capture nested in a traced function
uses the replacements its outer capture installed). Any other call (another
thread's, one made inside a recorded call, one after the capture) goes to
``plain``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torchlens_core.capture.threads import shared_patch

# record(recorder, original, args, kwargs) -> what the model gets; plain(original, args, kwargs) -> the same
Record = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]
Plain = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]


def _call(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return original(*args, **kwargs)


class Routed:
    """``owner.<names>`` replaced while captures run: a call the capture of its thread records goes to ``record``.

    Args:
        owner: the module (or class) whose attributes are replaced.
        names: the attributes, replaced and put back as one family.
        record: ``record(recorder, original, args, kwargs)``, for a call a capture records now
            (``recorder.recording()``); returns what the model gets.
        plain: ``plain(original, args, kwargs)`` for every other call (default: the original).

    Make one per family, at import (it is the process's one replacement of those attributes), and run each
    capture's forward inside :meth:`recording`.
    """

    def __init__(self, owner: Any, names: tuple[str, ...], record: Record, plain: Plain = _call) -> None:
        self.owner, self.names, self.record, self.plain = owner, tuple(names), record, plain
        self.current = threading.local()  # .recorder: the capture recording this thread (the innermost)
        self.make = self._replacement  # one object: shared_patch refuses another make for the same attributes

    def _replacement(self, original: Any, handlers: dict[int, Any]) -> Any:
        current, record, plain = self.current, self.record, self.plain

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            recorder = getattr(current, "recorder", None)
            if recorder is None or not recorder.recording():
                return plain(original, args, kwargs)
            return record(recorder, original, args, kwargs)

        return call

    @contextlib.contextmanager
    def recording(self, recorder: Any) -> Iterator[None]:
        """Calls this thread makes inside go to ``recorder``; a capture nested in it uses its replacements.

        A call finds its capture through a thread-local that a nested capture
        changes, not through the patch's per-thread handlers (one per thread:
        they cannot nest)."""
        previous = getattr(self.current, "recorder", None)
        self.current.recorder = recorder
        patched = shared_patch(self.owner, self.names, self.make).use(None) if previous is None else None
        try:
            with patched or contextlib.nullcontext():
                yield
        finally:
            self.current.recorder = previous
