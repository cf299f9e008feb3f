"""``escape_detector="shadow"``: kernels that ran without any recorded call around them.

The recorder sees torch's Python-level calls. Compute can bypass that layer:
a C++ extension calling ATen directly, code running under
``torch._C.DisableTorchFunction()``, a kernel reached from C without a Python
call. Such compute changes values the trace does not explain, and replay
would not redo it. The shadow detector runs a ``TorchDispatchMode`` beside
the capture (both thread-local): every kernel reaches it, and a kernel
reached while no recorded call is running (the recorder's own bookkeeping is
counted as running) is an escape. Each is reported with where it happened:
the module pass it ran in and the last op recorded before it, in
``trace.notes["escapes"]``, and a warning is shown. It costs a Python call
per kernel, so it is a diagnostic, off by default.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

ESCAPES = "escapes"  # trace.notes key: [{"kernel", "count", "module", "after"}]


class ShadowMode(TorchDispatchMode):
    """Counts the kernels reached while the recorder is not inside a recorded call."""

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        self.recorder = recorder
        # (kernel, module pass or None, index of the last op recorded before it or None) -> count
        self.found: dict[tuple[str, str | None, int | None], int] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if not self.recorder.depth:
            builder = self.recorder.builder
            inner = builder.module_stack[-1] if builder.module_stack else None
            last = len(builder.ops) - 1 if builder.ops else None
            key = (str(func), f"{inner[0]}:{inner[1]}" if inner else None, last)
            self.found[key] = self.found.get(key, 0) + 1
        return func(*args, **(kwargs or {}))

    def report(self, trace: Any) -> None:
        """Write what was found into ``trace.notes``, and warn if anything escaped."""
        escapes = [
            {
                "kernel": kernel,
                "count": count,
                "module": module,
                "after": trace.ops[after].label if after is not None else None,
            }
            for (kernel, module, after), count in self.found.items()
        ]
        trace.notes[ESCAPES] = escapes
        if escapes:
            first = escapes[0]
            where = f" in {first['module']}" if first["module"] else ""
            warnings.warn(
                f"escape_detector: {sum(self.found.values())} kernel call(s) ran outside every "
                f"recorded op, first {first['kernel']}{where} after {first['after']}; the trace does not "
                f"explain their effect (trace.notes['escapes'] lists them)",
                RuntimeWarning,
                stacklevel=2,
            )
