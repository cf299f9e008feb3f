"""Where an op was called from: the first frame outside the framework and TorchLens."""

from __future__ import annotations

import os
import sys
from types import CodeType

import pluggy

import torchlens_core
from torchlens_core.capture import api
from torchlens_core.ir.records import CodeLocation

_API_FILE = api.__file__
# User frames kept per op. Each costs about 1.5 us (Python builds a frame object for every
# frame walked), about 5% of capture at three frames on GPT-2 or a Keras model.
CONTEXT_FRAMES = 3
_MAX_CODES = 1 << 16  # code objects remembered at most


class CallSites:
    """Finds the caller's code site, skipping frames in the given packages and in TorchLens.

    ``CallSites(torch.__file__, __file__)``: files in the directories of those
    modules (and of the core and pluggy) are never a user's code site. The
    verdict is cached per code object, and so is each CodeLocation per
    instruction offset: a frame's ``f_lineno`` is worked out from the line
    table on every read, which costs more than the dictionary lookup. A
    lookup walks a few frames and costs about a microsecond.
    """

    def __init__(self, *module_files: str) -> None:
        files = (*module_files, torchlens_core.__file__, pluggy.__file__)  # the core: every layer's folder
        self.internal = tuple(os.path.join(os.path.dirname(os.path.abspath(f)), "") for f in files)
        # id(code) -> (code, internal?, stops the walk?, instruction offset -> CodeLocation). The
        # entry holds the code object, so that its id cannot be reused by another one.
        self.codes: dict[int, tuple[CodeType, bool, bool, dict[int, CodeLocation]]] = {}

    def _judge(self, code: CodeType) -> tuple[CodeType, bool, bool, dict[int, CodeLocation]]:
        if len(self.codes) >= _MAX_CODES:  # code compiled at run time (exec, generated models): stay bounded
            self.codes.clear()
        filename = code.co_filename
        inside = filename.startswith(self.internal) or filename.startswith("<frozen")
        entry = self.codes[id(code)] = (code, inside, inside and filename == _API_FILE, {})
        return entry

    def stack(self, limit: int = CONTEXT_FRAMES) -> tuple[CodeLocation, ...]:
        """The user's frames leading to the current call, innermost first, at most ``limit``.

        The walk stops at the TorchLens call that started the capture: frames
        above it (the script calling ``tl.trace``) are the same for every op.
        """
        frame = sys._getframe(1)
        codes = self.codes
        found: list[CodeLocation] = []
        while frame is not None and len(found) < limit:
            code = frame.f_code
            entry = codes.get(id(code))
            if entry is None or entry[0] is not code:
                entry = self._judge(code)
            if not entry[1]:
                lines, offset = entry[3], frame.f_lasti
                location = lines.get(offset)
                if location is None:
                    location = lines[offset] = CodeLocation(code.co_filename, frame.f_lineno, code.co_name)
                found.append(location)
            elif entry[2]:
                break
            frame = frame.f_back
        return tuple(found)
