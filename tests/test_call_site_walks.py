"""The call-site walk's shortcut: internal code is skipped by one set lookup, except code that may run a module
call's frame (a PassSites boundary), which a walk must still stop at, even when an earlier walk skipped it."""

from __future__ import annotations

import sys

import pytest

from torchlens_core.capture.sites import CallSites, PassSites

_FRAMEWORK = '''
import sys


def layer(passes, path, body, open_pass):
    """A framework's module call: its frame runs the layer's body (a PassSites boundary when open_pass)."""
    if open_pass:
        passes.enter(path, sys._getframe())
    try:
        return body()
    finally:
        if open_pass:
            passes.exit(path)


def kernel(passes):
    """An op: frames of the framework's own between the layer's body and the call-site lookup."""
    return _dispatch(passes)


def _dispatch(passes):
    return passes.stack()


def builtin_body(passes):
    """A layer whose body is all the framework's (a Linear's matmul): two ops."""
    return lambda: (kernel(passes), kernel(passes))
'''


@pytest.fixture
def framework(tmp_path):
    folder = tmp_path / "fakeframework"
    folder.mkdir()
    (folder / "__init__.py").write_text(_FRAMEWORK)
    sys.path.insert(0, str(tmp_path))
    try:
        import fakeframework
    finally:
        sys.path.remove(str(tmp_path))
    yield fakeframework
    sys.modules.pop("fakeframework", None)


def _names(found):  # (above the test's own frame come pytest's: the user's code too, as far as a walk knows)
    return [c.func_name for c in found]


def test_a_boundary_skipped_by_an_earlier_walk_still_ends_later_walks(framework) -> None:
    passes = PassSites(CallSites(framework.__file__))

    def model(open_pass):
        return framework.layer(passes, "a", framework.builtin_body(passes), open_pass)

    # A walk with no pass open climbs through layer()'s frame and judges its code internal.
    first = model(False)
    assert _names(first[0])[:2] == ["model", sys._getframe().f_code.co_name] and first[0] == first[1]
    assert id(framework.layer.__code__) in passes.sites.skip
    # Now layer()'s frame is a boundary: both ops' walks stop there, and share the call's one tuple of the user
    # frames above it (a walk that climbed past the boundary would make a new tuple for each op).
    again = model(True)
    assert again[0] is again[1]
    assert again[0][0] == first[0][0] and _names(again[0]) == _names(first[0])  # model()'s line, then above
    assert id(framework.layer.__code__) not in passes.sites.skip
    assert passes.open == []


def test_user_frames_below_and_above_a_boundary_are_both_found(framework) -> None:
    passes = PassSites(CallSites(framework.__file__))

    def user_body():
        return framework.kernel(passes)

    def user_model():
        return framework.layer(passes, "a", user_body, open_pass=True)

    # innermost first: the body (below the boundary), then the model and this test (above it)
    here = sys._getframe().f_code.co_name
    for _ in range(2):  # the second time from the verdicts and the skip set the first made
        assert _names(user_model()) == ["user_body", "user_model", here]
    assert _names(framework.layer(passes, "a", framework.builtin_body(passes), True)[0])[0] == here


def test_forgotten_verdicts_give_the_same_sites(framework) -> None:
    passes = PassSites(CallSites(framework.__file__))

    def model():
        return framework.layer(passes, "a", framework.builtin_body(passes), open_pass=True)

    before = model()

    def forget_then_look():  # verdicts dropped while a pass is open (the bound on remembered code reached)
        passes.sites._forget()
        return framework.kernel(passes)

    during = framework.layer(passes, "a", forget_then_look, open_pass=True)
    assert _names(during)[:2] == ["forget_then_look", sys._getframe().f_code.co_name]
    after = model()
    assert after[0][0] == before[0][0] and _names(after[0]) == _names(before[0]) and after[0] is after[1]


def test_a_walk_through_internal_frames_to_the_outermost_ends_there() -> None:
    # threading's folder (the standard library's) internal: a thread's outermost frames are all internal, and
    # the walk climbs past them to the end of the stack
    import threading

    sites = CallSites(threading.__file__)
    found = []

    def in_thread():
        for _ in range(2):  # the second time by the skip set the first walk filled
            found.append(sites.stack(limit=10))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert [_names(f) for f in found] == [["in_thread"], ["in_thread"]]
