"""Where an op was called from: the first frame outside the framework and TorchLens."""

from __future__ import annotations

import os
import sys

import pluggy


class CallSites:
    """Finds the caller's code site, skipping frames in the given packages and in TorchLens.

    ``CallSites(torch.__file__, __file__)``: files in the directories of those
    modules (and of the core and pluggy) are never a user's code site. The
    verdict per file is cached: a lookup walks a few frames and costs about a
    microsecond.
    """

    def __init__(self, *module_files: str) -> None:
        files = (*module_files, __file__, pluggy.__file__)
        self.internal = tuple(os.path.join(os.path.dirname(os.path.abspath(f)), "") for f in files)
        self.verdicts: dict[str, bool] = {}

    def first_outside(self) -> tuple[str, int, str] | None:
        """File, line and function of the nearest calling frame outside the skipped packages."""
        frame = sys._getframe(1)
        verdicts, internal = self.verdicts, self.internal
        while frame is not None:
            filename = frame.f_code.co_filename
            inside = verdicts.get(filename)
            if inside is None:
                inside = verdicts[filename] = filename.startswith(internal) or filename.startswith("<frozen")
            if not inside:
                return filename, frame.f_lineno, frame.f_code.co_name
            frame = frame.f_back
        return None
