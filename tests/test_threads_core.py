"""torchlens_core.capture.threads: process-wide patches the capturing thread alone sees, restored exactly once."""

from __future__ import annotations

import gc
import threading

import pytest
from thread_checks import raised, run_together

import torchlens as tl
from torchlens_core.capture.threads import OneCaptureAtATime, SharedPatch, pause_gc, resume_gc, shared_patch


class Target:
    def greet(self, name):
        return f"hello {name}"


class Child(Target):  # inherits greet: the patch must add, then delete, an attribute of its own
    pass


def _shouting(original, handlers):
    def greet(self, name):
        handler = handlers.get(threading.get_ident())
        return original(self, name) if handler is None else handler(original(self, name))

    return greet


def test_each_thread_sees_its_own_handler_and_others_the_original() -> None:
    original = vars(Target)["greet"]
    patch = SharedPatch(Target, "greet", _shouting)
    inside, release = threading.Barrier(3), threading.Event()

    def capturing(suffix):
        with patch.use(lambda text: text.upper() + suffix):
            inside.wait(10)
            seen = Target().greet("a")
            assert release.wait(10)
        return seen

    def plain():
        inside.wait(10)
        try:
            return Target().greet("b")
        finally:
            release.set()

    assert run_together(lambda: capturing("!"), lambda: capturing("?"), plain) == ["HELLO A!", "HELLO A?", "hello b"]
    assert vars(Target)["greet"] is original and not patch.installed


@pytest.mark.parametrize("order", ["first out first", "last out first"])
def test_restored_once_by_the_last_one_out(order: str) -> None:
    original = vars(Target)["greet"]
    patch = SharedPatch(Target, "greet", _shouting)
    entered, leave, left = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def second():  # another thread's capture: in, then out when told
        with patch.use(str.title):
            seen["second"] = vars(Target)["greet"]
            entered.set()
            assert leave.wait(10)
        left.set()

    with patch.use(str.upper):
        replacement = vars(Target)["greet"]
        assert replacement is not original
        worker = threading.Thread(target=second)
        worker.start()
        assert entered.wait(10)
        assert seen["second"] is replacement  # one replacement, shared: never a wrapper of a wrapper
        if order == "last out first":
            leave.set()
            assert left.wait(10)
            assert vars(Target)["greet"] is replacement  # this capture still needs it
    if order == "first out first":
        assert vars(Target)["greet"] is replacement  # the other capture still needs it
        leave.set()
    worker.join(10)
    assert vars(Target)["greet"] is original


def test_an_inherited_attribute_is_deleted_again_and_nesting_is_refused() -> None:
    patch = SharedPatch(Child, "greet", _shouting)
    with patch.use(str.upper):
        assert "greet" in vars(Child) and Child().greet("c") == "HELLO C"
        with pytest.raises(tl.CaptureError, match="do not nest"), patch.use(str.lower):
            pass
        assert Child().greet("c") == "HELLO C"  # the refused use took nothing down
    assert "greet" not in vars(Child) and Child().greet("c") == "hello c"


def test_an_exception_in_the_block_still_restores() -> None:
    original = vars(Target)["greet"]
    with pytest.raises(KeyboardInterrupt), shared_patch(Target, "greet", _shouting).use(str.upper):
        raise KeyboardInterrupt
    assert vars(Target)["greet"] is original
    with shared_patch(Target, "greet", _shouting).use(str.upper):  # one maker per attribute while in use
        with (
            pytest.raises(tl.CaptureError, match="already replaced"),
            shared_patch(Target, "greet", lambda original, handlers: original).use(str.lower),
        ):
            pass
    assert vars(Target)["greet"] is original


def test_a_patch_is_forgotten_when_its_last_user_leaves() -> None:
    import gc
    import weakref

    from torchlens_core.capture import threads

    class Module:
        def forward(self, x: str) -> str:
            return x

    def _through(original, handlers):
        return lambda x: handlers[threading.get_ident()](original(x))

    module = Module()
    with shared_patch(module, "forward", _through).use(str.upper):
        assert module.forward("a") == "A"
    assert not [key for key in threads._PATCHES if key[0] == id(module)]
    alive = weakref.ref(module)
    del module
    gc.collect()
    assert alive() is None  # the table kept nothing of it


def test_one_capture_at_a_time_refuses_nested_and_concurrent_claims() -> None:
    slot = OneCaptureAtATime("demo")
    claimed, done = threading.Event(), threading.Event()

    def holder():
        with slot.claim():
            with pytest.raises(tl.UnsupportedError, match="do not nest"), slot.claim():
                pass
            claimed.set()
            assert done.wait(10)

    def other():
        assert claimed.wait(10)
        try:
            with pytest.raises(tl.UnsupportedError, match="another thread"), slot.claim():
                pass
        finally:
            done.set()

    raised(run_together(holder, other))
    with slot.claim():  # free again
        pass


def test_gc_pause_is_counted() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        pause_gc()
        pause_gc()  # an overlapping capture
        resume_gc()  # the first one ends: the other still runs with the GC off
        assert not gc.isenabled()
        resume_gc()
        assert gc.isenabled()
        gc.disable()  # off before the first capture: left off
        pause_gc()
        resume_gc()
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
