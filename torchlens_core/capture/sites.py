"""Where an op was called from: the first frame outside the framework and TorchLens."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import pluggy

import torchlens_core
from torchlens_core.capture import api
from torchlens_core.ir.records import CodeLocation

_API_FILE = api.__file__
# User frames kept per op. Walking them costs more than the rest of a call site's lookup on a large
# model (each frame walked is memory the kernels have pushed out of the cache): PassSites stops each
# op's walk at its module call.
CONTEXT_FRAMES = 3
_MAX_CODES = 1 << 16  # code objects remembered at most


class CallSites:
    """Finds the caller's code site, skipping frames in the given packages and in TorchLens.

    ``CallSites(torch.__file__, __file__)``: files in the directories of those
    modules (and of the core and pluggy) are never a user's code site; nor are
    the ``files`` named one by one (a plugin's capture modules, beside code of
    its own that is a user's, such as its example models). The
    verdict is cached per code object, and so is each CodeLocation per
    instruction offset: a frame's ``f_lineno`` is worked out from the line
    table on every read, which costs more than the dictionary lookup. A
    lookup walks a few frames and costs about a microsecond.
    """

    def __init__(self, *module_files: str, files: tuple[str, ...] = ()) -> None:
        folders = (*module_files, torchlens_core.__file__, pluggy.__file__)  # the core: every layer's folder
        self.internal = tuple(os.path.join(os.path.dirname(os.path.abspath(f)), "") for f in folders)
        self.internal_files = frozenset(os.path.abspath(f) for f in files)
        # Internal functions that call the model: the walk stops there too, rather than climbing through
        # pluggy's frames to the API's (a shallow model's ops walk every frame up to the stop).
        self.stop_codes: frozenset[CodeType] = frozenset()
        # Verdicts by id(code), one lookup a frame: False for internal code (the walk goes on), True where the
        # walk stops, and for the user's code its CodeLocations by instruction offset. `held` keeps each judged
        # code object alive, so that its id cannot be reused by another one.
        self.verdicts: dict[int, bool | dict[int, CodeLocation]] = {}
        self.held: dict[int, CodeType] = {}
        # The ids of internal code a walk climbs past with one set test a frame, once it is past an internal
        # frame (most of a walk: the framework's frames between an op and its module call). Left out: stops,
        # and code that runs a frame a PassSites call may end its walks at (`boundaries`), which the walk must
        # compare with its boundary.
        self.skip: set[int] = set()
        self.boundaries: set[int] = set()

    def stop_at(self, *functions: Callable[..., Any]) -> None:
        """Stop walks at these functions' frames too (a backend's function that calls the model)."""
        self.stop_codes |= {f.__code__ for f in functions}
        self._forget()

    def _forget(self) -> None:
        self.verdicts, self.held, self.skip, self.boundaries = {}, {}, set(), set()

    def may_end_walks(self, code: CodeType) -> None:
        """Frames running ``code`` may be a walk's boundary (:meth:`PassSites.enter`): never skipped unseen."""
        key = id(code)
        if key not in self.boundaries:
            self.held[key] = code  # (its id stays its own while it is listed)
            self.boundaries.add(key)
            self.skip.discard(key)

    def _judge(self, code: CodeType) -> None:
        if len(self.held) >= _MAX_CODES:  # code compiled at run time (exec, generated models): stay bounded
            self._forget()
        filename = code.co_filename
        self.held[id(code)] = code
        if filename.startswith(self.internal) or filename in self.internal_files or filename.startswith("<frozen"):
            stop = self.verdicts[id(code)] = filename == _API_FILE or code in self.stop_codes
            if not stop and id(code) not in self.boundaries:
                self.skip.add(id(code))
        else:
            self.verdicts[id(code)] = {}

    def stack(self, limit: int = CONTEXT_FRAMES, skip: int = 0) -> tuple[CodeLocation, ...]:
        """The user's frames leading to the current call, innermost first, at most ``limit``.

        ``skip``: frames above the caller known to be internal (the recorder's
        own), not looked at. The walk stops at the TorchLens call that started
        the capture: frames above it (the script calling ``tl.trace``) are the
        same for every op.
        """
        if limit <= 0:
            return ()
        return tuple(self.walk(sys._getframe(1 + skip), limit, None)[0])

    def walk(self, frame: FrameType | None, limit: int, boundary: FrameType | None) -> tuple[list[CodeLocation], bool]:
        """The user's frames from ``frame`` up, at most ``limit``, and whether the walk reached ``boundary``.

        The walk ends at ``limit`` user frames, at a stop (False), or at the
        ``boundary`` frame (True), the frames above which the caller knows.
        This runs for every recorded op: it is written for speed.
        """
        verdicts, skip = self.verdicts, self.skip
        found: list[CodeLocation] = []
        while frame is not None:
            if frame is boundary:
                return found, True
            try:
                lines = verdicts[id(frame.f_code)]
            except KeyError:  # not judged yet: judge it, and look at this frame again
                self._judge(frame.f_code)
                verdicts, skip = self.verdicts, self.skip
                continue
            if lines is False:  # internal, as most frames: on up, past the internal frames above by one test each
                frame = frame.f_back
                while frame is not None and id(frame.f_code) in skip:
                    frame = frame.f_back
                continue
            if lines is True:  # a stop
                break
            offset = frame.f_lasti
            location = lines.get(offset)
            if location is None:
                code = frame.f_code
                location = lines[offset] = CodeLocation(code.co_filename, frame.f_lineno, code.co_name)
            found.append(location)
            if len(found) >= limit:
                break
            frame = frame.f_back
        return found, False


class PassSites:
    """Call sites within the module calls open in one capture, each op's walk ending at its module call.

    A deep model's op is called from frames many levels down: its module's
    forward, the framework's module-call machinery, the parent's forward, and
    so on. The frames above a module call do not change while it runs, so a
    backend hands :meth:`enter` a frame the module call runs under (one that
    calls the module's forward: the frame running the module's hooks); an op's
    walk stops there, and what lies above is worked out once per call. A
    frame that is not, after all, above the op's frames is never met: the walk
    then goes on to the end, as :meth:`CallSites.stack` would. Frames are held
    only while their module call is open.
    """

    def __init__(self, sites: CallSites, limit: int = CONTEXT_FRAMES) -> None:
        self.sites = sites
        self.limit = limit
        # per open module call: [its path, the frame it runs under, the user frames above that (None: not yet),
        # the call site of an op with no user frame below the call (None: not yet)]
        self.open: list[list[Any]] = []

    def enter(self, path: str, frame: FrameType) -> None:
        if id(frame.f_code) not in self.sites.boundaries:
            self.sites.may_end_walks(frame.f_code)
        self.open.append([path, frame, None, None])

    def exit(self, path: str) -> None:
        """Close the innermost call of ``path`` (and any call inside it left open by an exception)."""
        open_calls = self.open
        while open_calls:
            if open_calls.pop()[0] == path:
                return

    def stack(self, skip: int = 0) -> tuple[CodeLocation, ...]:
        """:meth:`CallSites.stack` for the caller (``skip`` frames above it left out)."""
        limit = self.limit
        if not self.open:
            return tuple(self.sites.walk(sys._getframe(1 + skip), limit, None)[0]) if limit > 0 else ()
        entry = self.open[-1]
        found, met = self.sites.walk(sys._getframe(1 + skip), limit, entry[1])
        if met and not found:  # every frame below the module call is internal (a framework's layer): one tuple
            if entry[3] is None:  # for every such op of the call, which the schema's check then passes once
                entry[3] = tuple(self._above(len(self.open) - 1)[:limit])
            return entry[3]
        if met and len(found) < limit:
            found += self._above(len(self.open) - 1)[: limit - len(found)]
        return tuple(found)

    def _above(self, i: int) -> list[CodeLocation]:
        """The user frames above open call ``i``'s frame, at most ``limit``."""
        entry = self.open[i]
        if entry[2] is None:
            found, met = self.sites.walk(entry[1], self.limit, self.open[i - 1][1] if i else None)
            if met and len(found) < self.limit:
                found += self._above(i - 1)[: self.limit - len(found)]
            entry[2] = found
        return entry[2]
