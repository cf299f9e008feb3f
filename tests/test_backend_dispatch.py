"""Typed dispatch: the core calls the one backend it works with, looked up by name, never every plugin.

A raw-hook third-party plugin (module-level functions taking ``backend=``) is traced, replayed,
saved and loaded through the adapter that calls its own hook functions; a ``Backend`` subclass's
methods are called directly, so asking backend A never touches backend B; unknown names raise.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

import torchlens as tl
from torchlens_core.backend.adapter import HookBackend
from torchlens_core.backend.arrays import is_array_of, max_error, numpy_error
from torchlens_core.backend.base import Backend
from torchlens_core.backend.hookspecs import hookimpl
from torchlens_core.backend.manager import CONTRACT_VERSION, BackendInfo, backend_named, plugin_manager
from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.ir.errors import BackendNotFoundError, TraceFileError
from torchlens_core.ir.records import Ref

# A toy "framework": a chain of named NumPy kernels applied in turn, which the backends below record.
KERNELS = {"tanh": np.tanh, "negative": np.negative, "exp": np.exp}


class Chain:
    def __init__(self, *steps: str) -> None:
        self.steps = steps

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for step in self.steps:
            x = KERNELS[step](x)
        return x


def _record(backend: str, target: Chain, args: tuple[Any, ...], options: Any) -> Any:
    """The chain run once, each kernel call recorded."""
    builder = TraceBuilder(backend, "chain", options)
    value = args[0]
    parent = builder.add_input(value, shape=tuple(value.shape), dtype=value.dtype.name, device="cpu").index
    for step in target.steps:
        out = KERNELS[step](value)
        op = builder.add_op(
            step, KERNELS[step], (Ref(parent),), {}, (parent,), out, shape=tuple(out.shape), dtype=out.dtype.name
        )
        value, parent = out, op.index
    builder.add_outputs(Ref(parent), value)
    return builder.finish()


def _info(name: str, aliases: tuple[str, ...] = ()) -> BackendInfo:
    return BackendInfo(
        name=name,
        framework="numpy",
        install="pip install numpy",
        aliases=aliases,
        capabilities=frozenset({"functions", "save"}),
        contract=CONTRACT_VERSION,
    )


# -- a third party's plugin written as raw pluggy hooks ----------------------------------------------------
RAW = "rawchain"


def _raw_plugin(calls: list[str]) -> types.ModuleType:
    """A plugin module as a third party writes one: plain functions, each answering for RAW only."""
    module = types.ModuleType("rawchain_plugin")

    @hookimpl
    def torchlens_backend_info() -> BackendInfo:
        return _info(RAW, aliases=("rawchain-alias",))

    @hookimpl
    def torchlens_capture(backend: str, target: Any, args: Any, kwargs: Any, options: Any) -> Any:
        if backend != RAW:
            return None
        calls.append("capture")
        return _record(RAW, target, args, options)

    @hookimpl
    def torchlens_replay_op(backend: str, op: Any, args: Any, kwargs: Any) -> Any:
        if backend != RAW:
            return None
        calls.append("replay_op")
        return op.call(*args, **kwargs)

    @hookimpl
    def torchlens_array_info(backend: str, value: Any) -> Any:
        if backend != RAW or not isinstance(value, np.ndarray):
            return None
        return tuple(value.shape), value.dtype.name, "cpu"

    @hookimpl
    def torchlens_to_numpy(backend: str, value: Any) -> Any:
        return np.array(value, copy=True) if backend == RAW else None

    @hookimpl
    def torchlens_array_error(backend: str, actual: Any, expected: Any) -> Any:
        return numpy_error(actual, expected) if backend == RAW else None

    @hookimpl
    def torchlens_encode_call(backend: str, op: Any) -> Any:
        if backend != RAW:
            return None
        calls.append("encode_call")
        return op.func_name if KERNELS.get(op.func_name) is op.call else None

    @hookimpl
    def torchlens_decode_call(backend: str, data: Any) -> Any:
        if backend != RAW:
            return None
        calls.append("decode_call")
        if data not in KERNELS:
            raise TraceFileError(f"{data!r} is no kernel of the chain backend")
        return KERNELS[data]

    @hookimpl
    def torchlens_from_numpy(backend: str, array: Any) -> Any:  # declares fewer arguments than the spec
        if backend != RAW:
            return None
        calls.append("from_numpy")
        return np.array(array, copy=True)

    for function in (
        torchlens_backend_info,
        torchlens_capture,
        torchlens_replay_op,
        torchlens_array_info,
        torchlens_to_numpy,
        torchlens_array_error,
        torchlens_encode_call,
        torchlens_decode_call,
        torchlens_from_numpy,
    ):
        setattr(module, function.__name__, function)
    return module


@pytest.fixture
def raw_calls():
    calls: list[str] = []
    pm = plugin_manager()
    pm.register(_raw_plugin(calls), name="rawchain-distribution")  # the entry point's name need not be the backend's
    try:
        yield calls
    finally:
        pm.unregister(name="rawchain-distribution")


def test_a_raw_hook_plugin_is_traced_replayed_saved_and_loaded_through_the_adapter(raw_calls, tmp_path) -> None:
    backend = backend_named(RAW)
    assert isinstance(backend, HookBackend)
    assert backend_named("rawchain-alias") is backend
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    expected = np.exp(-np.tanh(x))  # the kernels composed by hand
    trace = tl.trace(Chain("tanh", "negative", "exp"), x, backend=RAW)
    assert raw_calls == ["capture"]
    assert trace.backend == RAW
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["tanh", "negative", "exp"]
    np.testing.assert_allclose(trace.output, expected, rtol=1e-12)
    # replay: no replay_graph hook, so op by op through the plugin's replay_op
    np.testing.assert_allclose(trace.replay(), expected, rtol=1e-12)
    assert raw_calls.count("replay_op") == 3
    tl.save(trace, tmp_path / "chain")
    assert raw_calls.count("encode_call") == 3
    loaded = tl.load(tmp_path / "chain")
    assert raw_calls.count("decode_call") == 3
    assert loaded.backend == RAW
    np.testing.assert_allclose(loaded.output, expected, rtol=1e-12)
    before = raw_calls.count("replay_op")
    np.testing.assert_allclose(loaded.replay(), expected, rtol=1e-12)
    assert raw_calls.count("replay_op") == before + 3
    assert max_error(RAW, x, x + 0.5) == pytest.approx(float(np.max(0.5 / (1 + np.abs(x + 0.5)))))


def test_a_hook_the_raw_plugin_leaves_out_answers_none_as_the_pluggy_hook_did(raw_calls) -> None:
    backend = backend_named(RAW)
    assert backend.flop_formulas() is None
    assert backend.op_classes() is None
    assert backend.replay_graph(None, None) is None  # type: ignore[arg-type]
    assert backend.encode_array(np.ones(2)) is None  # the core then uses to_numpy and array_info
    assert backend.array_ops() is None
    assert backend.info() == _info(RAW, aliases=("rawchain-alias",))
    # an implementation declaring fewer arguments than its spec is passed those alone, as pluggy does
    made = backend.from_numpy(np.arange(3), "int64", "cpu")
    np.testing.assert_array_equal(made, np.arange(3))
    assert raw_calls == ["from_numpy"]


def test_registering_or_removing_a_plugin_refreshes_the_lookup(raw_calls) -> None:
    assert isinstance(backend_named(RAW), HookBackend)
    plugin_manager().unregister(name="rawchain-distribution")
    try:
        with pytest.raises(BackendNotFoundError, match="rawchain"):
            backend_named(RAW)
    finally:
        plugin_manager().register(_raw_plugin(raw_calls), name="rawchain-distribution")
    assert backend_named(RAW).to_numpy(np.ones(2)) is not None


# -- Backend subclasses: called directly, by name ----------------------------------------------------------
class ChainBackend(Backend):
    """A Backend subclass of the chain framework, counting the calls of its methods."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []

    def info(self) -> BackendInfo:
        return _info(self.name)

    def capture(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Any:
        self.calls.append("capture")
        return _record(self.name, target, args, options)

    def replay_op(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls.append("replay_op")
        return op.call(*args, **kwargs)

    def array_info(self, value: Any) -> tuple[tuple[int, ...], str, str] | None:
        self.calls.append("array_info")
        return (tuple(value.shape), value.dtype.name, "cpu") if isinstance(value, np.ndarray) else None

    def to_numpy(self, value: Any) -> Any:
        self.calls.append("to_numpy")
        return np.array(value, copy=True)

    def array_error(self, actual: Any, expected: Any) -> float | None:
        self.calls.append("array_error")
        return numpy_error(actual, expected)


class WatchedChainBackend(ChainBackend):
    """Also counts each time pluggy asks its per-backend hooks, whatever name was asked for."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.asked: list[str] = []

    @hookimpl
    def torchlens_capture(self, backend: str, target: Any, args: Any, kwargs: Any, options: Any) -> Any:
        self.asked.append(f"capture:{backend}")
        return super().torchlens_capture(backend, target, args, kwargs, options)

    @hookimpl
    def torchlens_replay_op(self, backend: str, op: Any, args: Any, kwargs: Any) -> Any:
        self.asked.append(f"replay_op:{backend}")
        return super().torchlens_replay_op(backend, op, args, kwargs)

    @hookimpl
    def torchlens_array_info(self, backend: str, value: Any) -> Any:
        self.asked.append(f"array_info:{backend}")
        return super().torchlens_array_info(backend, value)

    @hookimpl
    def torchlens_array_error(self, backend: str, actual: Any, expected: Any) -> Any:
        self.asked.append(f"array_error:{backend}")
        return super().torchlens_array_error(backend, actual, expected)


@pytest.fixture
def two_backends():
    a, b = ChainBackend("chain_a"), WatchedChainBackend("chain_b")
    pm = plugin_manager()
    pm.register(a, name="chain_a")
    pm.register(b, name="chain_b")  # registered last: pluggy would ask it first for every request
    try:
        yield a, b
    finally:
        pm.unregister(name="chain_b")
        pm.unregister(name="chain_a")


def test_asking_backend_a_never_asks_backend_b(two_backends) -> None:
    a, b = two_backends
    assert backend_named("chain_a") is a  # the registered instance itself, no adapter
    x = np.linspace(0.1, 0.9, 4)
    trace = tl.trace(Chain("tanh", "exp"), x, backend="chain_a")
    np.testing.assert_allclose(trace.replay(), np.exp(np.tanh(x)), rtol=1e-12)
    assert is_array_of("chain_a")(x) and not is_array_of("chain_a")([1.0])
    assert max_error("chain_a", x, x) == 0.0
    assert a.calls.count("capture") == 1 and a.calls.count("replay_op") == 2
    assert "array_info" in a.calls and "array_error" in a.calls
    assert b.asked == [] and b.calls == []  # the old dispatch asked chain_b's hooks for every chain_a request


def test_a_subclass_that_overrides_a_hook_keeps_it(two_backends) -> None:
    _, b = two_backends
    x = np.ones(3)
    trace = tl.trace(Chain("negative"), x, backend="chain_b")
    np.testing.assert_array_equal(trace.output, -x)
    assert "capture:chain_b" in b.asked and b.calls.count("capture") == 1
    assert backend_named("chain_b").to_numpy(x) is not x and "to_numpy" in b.calls  # not overridden: the method


def test_a_module_of_an_instances_hooks_keeps_a_hook_function_of_its_own() -> None:
    from torchlens_core.backend.base import hooks_of

    instance = ChainBackend("chain_m")
    module = types.ModuleType("chain_m_plugin")
    vars(module).update(hooks_of(instance))

    @hookimpl
    def torchlens_op_classes(backend: str) -> Any:
        return {"exp": ["exp"]} if backend == "chain_m" else None

    module.torchlens_op_classes = torchlens_op_classes
    plugin_manager().register(module, name="chain_m")
    try:
        backend = backend_named("chain_m")
        assert isinstance(backend, HookBackend)
        assert backend.op_classes() == {"exp": ["exp"]}  # the module's own function, not the base's {}
        assert backend.array_info(np.ones(2)) == ((2,), "float64", "cpu") and instance.calls == ["array_info"]
    finally:
        plugin_manager().unregister(name="chain_m")
    vars(module).pop("torchlens_op_classes")
    plugin_manager().register(module, name="chain_m")
    try:
        assert backend_named("chain_m") is instance  # only the instance's hooks: the instance itself
    finally:
        plugin_manager().unregister(name="chain_m")


@pytest.mark.parametrize("name", ["numpy", "torch", "jax"])
def test_a_built_in_style_plugin_is_its_backend_instance(name: str) -> None:
    """numpy's entry point names a module exporting its instance's hooks (hooks_of); torch's and jax's the instance."""
    instance = pytest.importorskip(f"torchlens_{name}.plugin").backend
    assert backend_named(name) is instance
    assert backend_named(name).op_classes() == instance.op_classes()


def test_unknown_names_raise_backend_not_found() -> None:
    with pytest.raises(BackendNotFoundError, match="no backend named 'no-such-backend'"):
        backend_named("no-such-backend")
    with pytest.raises(tl.BackendNotFoundError):
        tl.trace(Chain("tanh"), np.ones(2), backend="no-such-backend")
    lenient = backend_named("no-such-backend", missing_ok=True)  # a trace loaded where its plugin is missing
    assert lenient.array_info(np.ones(2)) is None and lenient.to_numpy(np.ones(2)) is None
    with pytest.raises(BackendNotFoundError):  # the lenient answer is not remembered as a backend of that name
        backend_named("no-such-backend")
