"""``tl.splice_module`` on torch: a module's call replaced by another callable, for one capture.

Module hooks cannot skip a module's forward, so each module a splice names
gets an instance-level ``forward`` for the capture (a :class:`SharedPatch`:
other threads and other captures call the module's own). The module's pre-
and post-hooks still run, so its pass is recorded with the replacement's ops
inside and the replacement's output as what the module returned.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.capture.threads import shared_patch


def _make(original: Callable[..., Any], handlers: dict[int, Any]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        handler = handlers.get(threading.get_ident())
        replacement = handler[0].splice_for(handler[1]) if handler is not None else None
        return original(*args, **kwargs) if replacement is None else replacement(*args, **kwargs)

    return forward


@contextlib.contextmanager
def spliced(model: Any, builder: TraceBuilder) -> Iterator[None]:
    """While the block runs, the modules of ``model`` that a splice names call it instead of their forward."""
    targets = builder.editor.splice_targets() if builder.editor is not None else set()
    with contextlib.ExitStack() as stack:
        if targets and hasattr(model, "named_modules"):
            for path, module in model.named_modules():
                if path in targets:
                    stack.enter_context(shared_patch(module, "forward", _make).use((builder, path)))
        yield
