"""Captures and threads: a capture records only the thread that started it.

Frameworks without a thread-local dispatch hook are intercepted by replacing
attributes of classes or modules, which every thread shares. Two rules keep
other threads untouched:

- every replacement first asks whether the calling thread is capturing, and
  if not calls the original at once (one ``threading.get_ident()`` and one
  dict look-up);
- an attribute is replaced once, by the first capture that needs it, and put
  back once, by the last one out (:class:`SharedPatch`, counted under a lock;
  :func:`shared_patch` gives every capture the same one), so overlapping
  captures never restore each other's replacement too early or leave one
  behind. The cyclic GC, which tl.trace switches off while it captures, is
  counted the same way (:func:`pause_gc`, :func:`resume_gc`).

A backend whose interception cannot serve two captures at once refuses the
second with a typed error instead (:class:`OneCaptureAtATime`): never a
silently partial trace.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torchlens_core.ir.errors import CaptureError, UnsupportedError

_MISSING = object()

# make(original, handlers) -> the replacement. ``handlers`` maps a thread id to what that
# thread's capture handles the call with; for any other thread the replacement calls ``original``.
MakeReplacement = Callable[[Any, dict[int, Any]], Any]


class SharedPatch:
    """``owner.<name>`` replaced while at least one thread uses it, each call served by its own thread's handler.

    ``original`` given to ``make`` is what the attribute resolved to before
    the first use (looked up through the class, so an inherited method is
    found); on the way out the attribute is set back, or deleted if the owner
    did not define it itself. ``name`` may be a tuple of names, a family of
    functions such as a module's random draws: each is replaced by
    ``make(its original, handlers)``, all under one lock and one count.
    """

    def __init__(self, owner: Any, name: str | tuple[str, ...], make: MakeReplacement) -> None:
        self.owner, self.name, self.make = owner, name, make
        self.names = (name,) if isinstance(name, str) else tuple(name)
        self.handlers: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._saved: list[Any] = []  # per name, what the owner itself held (_MISSING: nothing, it inherited)
        self._replacements: list[Any] = []  # per name, while installed

    @property
    def installed(self) -> bool:
        return bool(self._replacements)

    @contextlib.contextmanager
    def use(self, handler: Any) -> Iterator[None]:
        """Route this thread's calls to ``handler`` while the block runs."""
        thread = threading.get_ident()
        with self._lock:
            if thread in self.handlers:
                raise CaptureError(f"{self.name} is already intercepted for this thread: captures do not nest")
            if not self.handlers:
                self._install()
            self.handlers[thread] = handler
        try:
            yield
        finally:
            with self._lock:
                del self.handlers[thread]
                if not self.handlers:
                    self._uninstall()

    def _install(self) -> None:
        owner = self.owner
        own = vars(owner) if hasattr(owner, "__dict__") else {}
        saved = [own.get(name, _MISSING) for name in self.names]
        replacements = [self.make(getattr(owner, name), self.handlers) for name in self.names]  # all, or none
        for name, replacement in zip(self.names, replacements):
            setattr(owner, name, replacement)
        self._saved, self._replacements = saved, replacements

    def _uninstall(self) -> None:
        saved, self._saved, self._replacements = self._saved, [], []
        for name, value in zip(self.names, saved):
            if value is _MISSING:
                delattr(self.owner, name)
            else:
                setattr(self.owner, name, value)


_PATCHES: dict[tuple[int, Any], SharedPatch] = {}
_PATCHES_LOCK = threading.Lock()


class SharedPatchUse:
    """The one :class:`SharedPatch` of ``owner.<name>`` in this process, found (or made) as a thread uses it.

    Two objects patching one attribute would put each other's originals back
    out of order, so every capture goes through the process-wide table; the
    table holds a patch only while some thread uses it (a patch of one
    module instance must not keep the module alive after its captures).
    """

    def __init__(self, owner: Any, name: str | tuple[str, ...], make: MakeReplacement) -> None:
        self.owner, self.name, self.make = owner, name, make

    @contextlib.contextmanager
    def use(self, handler: Any) -> Iterator[None]:
        """Route this thread's calls to ``handler`` while the block runs."""
        key = (id(self.owner), self.name)
        with _PATCHES_LOCK:  # found and entered at once: a patch is never dropped between the two
            patch = _PATCHES.get(key)
            if patch is None:
                patch = _PATCHES[key] = SharedPatch(self.owner, self.name, self.make)
            elif patch.make is not self.make:
                raise CaptureError(f"{self.name} of {self.owner!r} is already replaced for captures by {patch.make!r}")
            entered = patch.use(handler)
            entered.__enter__()
        try:
            yield
        finally:
            with _PATCHES_LOCK:
                entered.__exit__(None, None, None)
                if not patch.installed and _PATCHES.get(key) is patch:
                    del _PATCHES[key]


def shared_patch(owner: Any, name: str | tuple[str, ...], make: MakeReplacement) -> SharedPatchUse:
    """``shared_patch(owner, name, make).use(handler)``: this thread's calls of ``owner.<name>`` go to ``handler``.

    Every capture that patches an attribute asks here: the first user
    installs the replacement ``make(original, handlers)`` and the last puts
    the original back, whatever the interleaving.
    """
    return SharedPatchUse(owner, name, make)


class OneCaptureAtATime:
    """For a backend whose interception serves one capture at a time: the second is refused, typed.

    A capture nested in the traced forward and one started by another thread
    get different messages; neither installs anything.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self.thread: int | None = None

    @contextlib.contextmanager
    def claim(self) -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            if self.thread == threading.get_ident():
                raise UnsupportedError(
                    f"a {self.backend} capture is already running in this thread: captures do not nest "
                    f"(call tl.trace outside the traced function)"
                )
            raise UnsupportedError(
                f"a {self.backend} capture is already running in another thread: the {self.backend} backend "
                f"intercepts process-wide and captures one forward at a time. Run the tl.trace calls one after "
                f"another (hold a lock around them); plain forwards in other threads are fine meanwhile"
            )
        self.thread = threading.get_ident()
        try:
            yield
        finally:
            self.thread = None
            self._lock.release()


class _PausedGC:
    """The cyclic GC off while any capture runs (it walks the whole heap as a capture's records pile up).

    Counted under a lock: overlapping captures switch it back on once, when
    the last one ends, and only if it was on when the first one began.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._was_enabled = False

    def pause(self) -> None:
        with self._lock:
            if self._users == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._users += 1

    def resume(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._was_enabled:
                gc.enable()


_PAUSED_GC = _PausedGC()
pause_gc, resume_gc = _PAUSED_GC.pause, _PAUSED_GC.resume
