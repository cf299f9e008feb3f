"""Where an op was called from: the first frame outside the framework and TorchLens."""

from __future__ import annotations

import os
import sys

import pluggy

import torchlens_core
from torchlens_core.capture import api
from torchlens_core.ir.records import CodeLocation

_API_FILE = api.__file__
# User frames kept per op. Each costs about 1.5 us (Python builds a frame object for every
# frame walked), about 5% of capture at three frames on GPT-2 or a Keras model.
CONTEXT_FRAMES = 3


class CallSites:
    """Finds the caller's code site, skipping frames in the given packages and in TorchLens.

    ``CallSites(torch.__file__, __file__)``: files in the directories of those
    modules (and of the core and pluggy) are never a user's code site. The
    verdict per file is cached: a lookup walks a few frames and costs about a
    microsecond.
    """

    def __init__(self, *module_files: str) -> None:
        files = (*module_files, torchlens_core.__file__, pluggy.__file__)  # the core: every layer's folder
        self.internal = tuple(os.path.join(os.path.dirname(os.path.abspath(f)), "") for f in files)
        self.verdicts: dict[str, bool] = {}

    def stack(self, limit: int = CONTEXT_FRAMES) -> tuple[CodeLocation, ...]:
        """The user's frames leading to the current call, innermost first, at most ``limit``.

        The walk stops at the TorchLens call that started the capture: frames
        above it (the script calling ``tl.trace``) are the same for every op.
        """
        frame = sys._getframe(1)
        verdicts, internal = self.verdicts, self.internal
        found: list[CodeLocation] = []
        while frame is not None and len(found) < limit:
            code = frame.f_code
            filename = code.co_filename
            inside = verdicts.get(filename)
            if inside is None:
                inside = verdicts[filename] = filename.startswith(internal) or filename.startswith("<frozen")
            if not inside:
                found.append(CodeLocation(filename, frame.f_lineno, code.co_name))
            elif filename == _API_FILE:
                break
            frame = frame.f_back
        return tuple(found)
