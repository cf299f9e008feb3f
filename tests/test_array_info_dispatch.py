"""array_info_of: the array hook for one backend as a direct call, answering exactly as the pluggy hook does."""

from __future__ import annotations

import numpy as np
import pytest

from torchlens_core.backend.arrays import array_info_of, is_array_of
from torchlens_core.backend.hookspecs import hookimpl
from torchlens_core.backend.manager import backend_infos, hook, plugin_manager


def _values() -> list[object]:
    values: list[object] = [np.zeros((2, 3), np.float32), np.float32(1.5), 3, "x", None, [np.ones(2)]]
    for module, make in (("torch", "zeros"), ("jax.numpy", "zeros")):
        try:
            framework = __import__(module, fromlist=[make])
        except ImportError:
            continue
        values.append(getattr(framework, make)((2, 2)))
    return values


@pytest.mark.parametrize("value", _values(), ids=lambda v: type(v).__name__)
def test_every_backend_answers_as_the_hook_does(value):
    for info in backend_infos():
        if not info.available:
            continue
        expected = hook().torchlens_array_info(backend=info.name, value=value)
        assert array_info_of(info.name)(value) == expected, info.name
        assert is_array_of(info.name)(value) is (expected is not None)


class _RawPlugin:
    """A third party's raw hook implementation, answering for a backend no Backend subclass serves."""

    def __init__(self, answer):
        self.answer = answer

    @hookimpl
    def torchlens_array_info(self, backend, value):
        return self.answer if backend == "rawdemo" and isinstance(value, bytes) else None


class _ValueOnly:
    """A raw implementation declaring only some of the hook's arguments: pluggy passes it those alone."""

    @hookimpl
    def torchlens_array_info(self, value):
        return ((len(value),), "uint8", "cpu") if isinstance(value, bytearray) else None


def test_raw_hook_plugins_are_asked_in_the_hooks_order():
    pm = plugin_manager()
    first, second, partial = _RawPlugin(((1,), "a", "cpu")), _RawPlugin(((2,), "b", "cpu")), _ValueOnly()
    pm.register(first, name="raw-first")
    pm.register(second, name="raw-second")  # registered last: pluggy asks it first, and its answer wins
    pm.register(partial, name="raw-value-only")
    try:
        info = array_info_of("rawdemo")
        for value in (b"xy", bytearray(b"abc"), np.zeros(2), 7):
            assert info(value) == hook().torchlens_array_info(backend="rawdemo", value=value)
        assert info(b"xy") == ((2,), "b", "cpu")
        assert info(bytearray(b"abc")) == ((3,), "uint8", "cpu")
        # a raw plugin can answer for a built-in backend's name too, and is asked in its turn
        for backend in [i.name for i in backend_infos() if i.available]:
            assert array_info_of(backend)(bytearray(b"ab")) == ((2,), "uint8", "cpu")
    finally:
        for name in ("raw-first", "raw-second", "raw-value-only"):
            pm.unregister(name=name)
    assert array_info_of("rawdemo")(b"xy") is None
