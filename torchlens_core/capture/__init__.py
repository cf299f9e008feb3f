"""Capture: running a model once and building its trace.

The entry points users call (:mod:`.api`: ``trace``, ``record``, ``pluck``),
the :class:`TraceBuilder` backends drive as ops arrive (:mod:`.builder`),
what to keep and when to stop (:mod:`.policy`, :mod:`.selectors`), and the
per-op context every backend records the same way: the user's code sites
(:mod:`.sites`) and data-dependent branches (:mod:`.branches`).
"""

from torchlens_core.capture.api import pluck, record, trace
from torchlens_core.capture.builder import Recording, TraceBuilder
from torchlens_core.capture.policy import CaptureOptions, HaltCapture
from torchlens_core.capture.selectors import Selector

__all__ = ["CaptureOptions", "HaltCapture", "Recording", "Selector", "TraceBuilder", "pluck", "record", "trace"]
