"""torchlens_core.capture.routed: a module's functions replaced while captures run, each call routed to the
capture recording the calling thread (the innermost when they nest), every other call plain, and the module
left as it was after the last capture, however it ended."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest
from thread_checks import run_together

from torchlens_core.capture.routed import Routed


class FakeRecorder:
    """What Routed asks of a recorder: does it record a call made now?"""

    def __init__(self, name: str) -> None:
        self.name, self.on = name, True

    def recording(self) -> bool:
        return self.on


def _record(recorder: FakeRecorder, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return recorder.name, original(*args, **kwargs)


def _plain(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return "plain", original(*args, **kwargs)


def _source() -> types.ModuleType:
    module = types.ModuleType("source")
    module.double = lambda n: 2 * n
    module.triple = lambda n: 3 * n
    return module


def test_calls_go_to_the_innermost_capture_of_their_thread_and_the_module_is_put_back() -> None:
    module = _source()
    originals = (module.double, module.triple)
    routed = Routed(module, ("double", "triple"), _record, _plain)
    outer, inner = FakeRecorder("outer"), FakeRecorder("inner")
    assert module.double(1) == 2  # nothing replaced before a capture
    with routed.recording(outer):
        assert module.double(1) == ("outer", 2) and module.triple(1) == ("outer", 3)
        with routed.recording(inner):  # a capture nested in the traced function
            assert module.double(2) == ("inner", 4)
            inner.on = False  # a call made inside a recorded call, or after the capture: plain
            assert module.double(3) == ("plain", 6)
        assert module.double(4) == ("outer", 8)
        assert run_together(lambda: module.double(5)) == [("plain", 10)]  # another thread: plain
    assert (module.double, module.triple) == originals
    with pytest.raises(KeyboardInterrupt), routed.recording(outer):
        raise KeyboardInterrupt
    assert (module.double, module.triple) == originals


def test_two_threads_capturing_at_once_each_record_their_own_calls() -> None:
    module = _source()
    original = module.double
    routed = Routed(module, ("double",), _record)  # plain: the original itself
    both_in, first_out = threading.Barrier(2), threading.Event()

    def capture(name: str, n: int, leave_first: bool) -> Any:
        with routed.recording(FakeRecorder(name)):
            both_in.wait(10)
            seen = module.double(n)
            if leave_first:
                first_out.set()
            else:  # the other capture has ended: the replacement stays while this one runs
                assert first_out.wait(10)
                seen = (seen, module.double(n))
        return seen

    got = run_together(lambda: capture("a", 1, True), lambda: capture("b", 2, False))
    assert got == [("a", 2), (("b", 4), ("b", 4))], got
    assert module.double is original and module.double(3) == 6
