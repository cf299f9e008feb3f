"""``tl.splice_module`` on Paddle: a layer's call replaced by another callable, for one capture.

Paddle's forward pre-hooks cannot skip a layer's ``forward``, so each layer a
splice names gets an instance-level ``forward`` for the capture, put back (or
removed) when it ends, whatever happened. The layer's hooks still run around
it, so its pass is recorded with the replacement's ops inside and the
replacement's output as what the layer returned; the replacement is given the
arguments the pre-hooks left. Calls from other threads run the layer's own
forward (one Paddle capture runs at a time, so no two captures patch a layer
at once), and so does a replacement that calls the layer itself to wrap it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torchlens_core.capture.builder import TraceBuilder

_MISSING = object()


def _splicing(builder: TraceBuilder, path: str, original: Callable[..., Any]) -> Callable[..., Any]:
    thread = threading.get_ident()
    running: list[bool] = []  # [True] while the replacement runs

    def forward(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != thread or running:
            return original(*args, **kwargs)
        replacement = builder.splice_for(path)
        if replacement is None:  # a call the splice's selector does not name (another pass)
            return original(*args, **kwargs)
        running.append(True)
        try:
            return replacement(*args, **kwargs)
        finally:
            running.pop()

    return forward


@contextlib.contextmanager
def spliced(layers: list[tuple[str, Any]], builder: TraceBuilder) -> Iterator[None]:
    """While the block runs, the layers (``(path, layer)``) a splice names call it instead of their forward."""
    targets = builder.editor.splice_targets() if builder.editor is not None else set()
    saved: list[tuple[Any, Any]] = []
    try:
        for path, layer in layers:
            if path in targets:
                saved.append((layer, vars(layer).get("forward", _MISSING)))
                object.__setattr__(layer, "forward", _splicing(builder, path, layer.forward))
        yield
    finally:
        for layer, forward in reversed(saved):
            if forward is _MISSING:
                object.__delattr__(layer, "forward")
            else:
                object.__setattr__(layer, "forward", forward)
