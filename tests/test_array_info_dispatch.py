"""array_info_of: one backend's array_info as a direct call, answering as its own hook does."""

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
    """A third party's raw hook implementation, answering for the name ``rawdemo``."""

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


def test_only_the_plugin_serving_the_name_is_asked():
    """The plugin registered under a backend's name answers for it; other plugins are not asked."""
    pm = plugin_manager()
    mine, other, partial = _RawPlugin(((1,), "a", "cpu")), _RawPlugin(((2,), "b", "cpu")), _ValueOnly()
    pm.register(mine, name="rawdemo")
    pm.register(other, name="raw-other")  # answers for rawdemo's name too, through pluggy only
    pm.register(partial, name="raw-value-only")
    try:
        info = array_info_of("rawdemo")
        assert info(b"xy") == ((1,), "a", "cpu")  # pluggy would have asked raw-other first: ((2,), "b", "cpu")
        assert hook().torchlens_array_info(backend="rawdemo", value=b"xy") == ((2,), "b", "cpu")
        assert info(bytearray(b"abc")) is None and info(np.zeros(2)) is None
        assert array_info_of("raw-value-only")(bytearray(b"abc")) == ((3,), "uint8", "cpu")  # its one argument
        # a built-in backend answers alone: a raw plugin answering every name is not asked for it
        for backend in [i.name for i in backend_infos() if i.available]:
            assert array_info_of(backend)(bytearray(b"ab")) is None
    finally:
        for name in ("rawdemo", "raw-other", "raw-value-only"):
            pm.unregister(name=name)
    assert array_info_of("rawdemo")(b"xy") is None
