"""The capture cache (torchlens_jax.capture_cache): repeat captures of a jitted target without make_jaxpr or the
walk, and every way the cache must miss, or never be used."""

from __future__ import annotations

import functools
import gc
import threading
import weakref
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
eqx = pytest.importorskip("equinox")

import attrs  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.records import OpRecord, raw_dtype  # noqa: E402
from torchlens_jax import capture_cache, compiled, walk, zoo  # noqa: E402
from torchlens_jax.arrays import to_numpy  # noqa: E402

CASES = {c.name: c for c in zoo.cases()}
TOL = 1e-5  # the executable's own tolerance against eager binds (XLA fuses around returned values)


@pytest.fixture(autouse=True)
def _fresh_caches(monkeypatch):
    monkeypatch.setattr(compiled, "COMPILE_ON_SIGHTING", 2)
    monkeypatch.setattr(capture_cache, "CAPTURE_CACHE", True)
    capture_cache.CACHE.clear()
    yield
    capture_cache.CACHE.clear()


class Counts:
    """What a capture ran: make_jaxpr calls, walks, XLA compiles (JAX's own monitoring event)."""

    def __init__(self, monkeypatch) -> None:
        self.jaxprs = self.walks = self.compiles = 0
        make_jaxpr, run = jax.make_jaxpr, walk.Walker.run

        def counted_make_jaxpr(*a, **k):
            self.jaxprs += 1
            return make_jaxpr(*a, **k)

        def counted_run(walker, *a, **k):
            self.walks += 1
            return run(walker, *a, **k)

        monkeypatch.setattr(jax, "make_jaxpr", counted_make_jaxpr)
        monkeypatch.setattr(walk.Walker, "run", counted_run)

        def listener(event, duration, **_):
            if event == "/jax/core/compile/backend_compile_duration":
                self.compiles += 1

        jax.monitoring.register_event_duration_secs_listener(listener)
        self.unregister = lambda: jax.monitoring.unregister_event_duration_listener(listener)

    def now(self) -> tuple[int, int, int]:
        return self.jaxprs, self.walks, self.compiles


@pytest.fixture
def counts(monkeypatch):
    c = Counts(monkeypatch)
    yield c
    c.unregister()


# -- the jitted targets ------------------------------------------------------------------------
def _nnx_fn(name):
    model, args, _ = CASES[name].build()
    return nnx.jit(lambda m, x: m(x)), (model, *args), lambda: model(*args)


def _nnx_model(name):
    model, args, _ = CASES[name].build()
    return nnx.jit(model), args, lambda: model(*args)


def _linen(name):
    apply, args, _ = CASES[name].build()
    return jax.jit(apply), args, lambda: apply(*args)


def _eqx_model(name):
    model, args, _ = CASES[name].build()
    return eqx.filter_jit(model), args, lambda: model(*args)


def _eqx_fn(name):
    model, args, _ = CASES[name].build()
    return eqx.filter_jit(lambda m, x: m(x)), (model, *args), lambda: model(*args)


def _plain(name):
    fn, args, _ = CASES[name].build()
    fn = getattr(fn, "__wrapped__", fn)  # jit_mlp is jitted already
    return jax.jit(fn), args, lambda: fn(*args)


TARGETS = {
    "nnx.jit(f)(cnn)": lambda: _nnx_fn("nnx_cnn"),
    "nnx.jit(f)(attention)": lambda: _nnx_fn("nnx_attention"),
    "nnx.jit(model)": lambda: _nnx_model("nnx_mlp"),
    "jax.jit(linen apply)": lambda: _linen("linen_mlp"),
    "filter_jit(eqx cnn)": lambda: _eqx_model("eqx_cnn"),
    "filter_jit(f)(eqx mlp)": lambda: _eqx_fn("eqx_mlp"),
    "jax.jit(jnp mlp)": lambda: _plain("jit_mlp"),
    "jax.jit(jnp cnn)": lambda: _plain("jnp_cnn"),
    "jax.jit(custom derivatives)": lambda: _plain("custom_derivatives"),
}


def _uncached(target, args, monkeypatch, **options):
    """The capture without the cache, on the compiled path (its second capture), as a reference."""
    with monkeypatch.context() as m:
        m.setattr(capture_cache, "CAPTURE_CACHE", False)
        tl.trace(target, *args, backend="jax", **options)
        return tl.trace(target, *args, backend="jax", **options)


def _cached(target, args, **options):
    """A hit: the first capture stores the records, the second compiles the executable, the third reuses it."""
    for _ in range(2):
        tl.trace(target, *args, backend="jax", **options)
    trace = tl.trace(target, *args, backend="jax", **options)
    assert trace.notes["capture"] == capture_cache.CAPTURE_NOTE and trace.notes["compiled"]["cached"]
    return trace


# -- comparing traces ----------------------------------------------------------------------------
_NOT_COMPARED = {"out", "elapsed", "trace_ref", "cost", "pre_edit", "grad", "call", "args", "value", "passes"}


def _plain_value(value):
    """A record field as comparable data: arrays by their bytes, an equation's parameters by their text."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        a = to_numpy(value)
        return ("array", a.shape, str(a.dtype), a.tobytes())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_plain_value(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _plain_value(v)) for k, v in value.items()))
    return value


def _fields(record) -> dict[str, Any]:
    found = {f.name: getattr(record, f.name) for f in attrs.fields(type(record)) if f.name not in _NOT_COMPARED}
    if isinstance(record, OpRecord):
        found["args"] = _plain_value(record.args)
        found["call"] = None if record.call is None else (record.call[0], repr(record.call[1]))
    return found


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    a, b = to_numpy(a), to_numpy(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.allclose(a, b, rtol=TOL, atol=TOL)


def _same_trace(cached, uncached) -> None:
    """Every record field equal, every value within the executable's tolerance."""
    assert len(cached.ops) == len(uncached.ops)
    for a, b in zip(cached.ops, uncached.ops):
        assert _fields(a) == _fields(b), a.label
        assert type(raw_dtype(a)) is type(raw_dtype(b)), a.label  # the slot's plain str, as the walk gives it
        assert _close(a.out, b.out), a.label
    assert list(cached.modules) == list(uncached.modules)
    for m, n in zip(cached.modules.values(), uncached.modules.values()):
        assert _fields(m) == _fields(n)
        assert [_fields(p) for p in m.passes] == [_fields(p) for p in n.passes]
    assert list(cached.params) == list(uncached.params)
    for p, q in zip(cached.params.values(), uncached.params.values()):
        assert _fields(p) == _fields(q) and p.value is q.value  # the model's own arrays, held by reference
    assert cached.output_template == uncached.output_template and cached.halted == uncached.halted
    assert (cached.backend, cached.model_name) == (uncached.backend, uncached.model_name)
    skip = {"capture", "compiled"}
    assert {k: v for k, v in cached.notes.items() if k not in skip} == {
        k: v for k, v in uncached.notes.items() if k not in skip
    }
    if "compiled" in uncached.notes:
        same = ("outputs", "slots", "steps")
        assert [cached.notes["compiled"][k] for k in same] == [uncached.notes["compiled"][k] for k in same]


def _leaves_close(got, expected) -> None:
    got, expected = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)
    assert len(got) == len(expected) and all(_close(g, e) for g, e in zip(got, expected))


# -- equal to an uncached capture ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TARGETS))
def test_a_cached_trace_equals_an_uncached_capture(name, monkeypatch, counts):
    target, args, plain = TARGETS[name]()
    reference = _uncached(target, args, monkeypatch)
    assert "compiled" in reference.notes and reference.notes["capture"] != capture_cache.CAPTURE_NOTE
    for _ in range(2):
        tl.trace(target, *args, backend="jax")
    before = counts.now()
    cached = tl.trace(target, *args, backend="jax")
    assert counts.now() == before  # no make_jaxpr, no walk, no compile
    assert cached.notes["capture"] == capture_cache.CAPTURE_NOTE
    _same_trace(cached, reference)
    # against the model's own untraced call, and its jitted one
    _leaves_close(cached.model_output, plain())
    _leaves_close(cached.output, target(*args))
    report = cached.audit(untraced=True)  # every op replayed eagerly and compared; the model run again
    assert report, report


def test_the_first_capture_runs_eagerly_and_the_first_hit_compiles(counts):
    target, args, plain = _nnx_fn("nnx_cnn")
    compiled.CACHE.clear()
    start = compiled.CACHE.compiles
    first = tl.trace(target, *args)
    assert "compiled" not in first.notes and len(capture_cache.CACHE) == 1
    before = counts.now()
    second = tl.trace(target, *args)  # a hit: the executable is compiled now, from the stored program
    jaxprs, walks, compiles = (n - b for n, b in zip(counts.now(), before))
    assert (jaxprs, walks) == (0, 0) and compiles == 1 and compiled.CACHE.compiles == start + 1
    assert second.notes["capture"] == capture_cache.CAPTURE_NOTE and not second.notes["compiled"]["cached"]
    _leaves_close(second.output, plain())
    for a, b in zip(first.ops, second.ops):  # eager values and compiled ones, op by op
        assert a.label == b.label and _close(a.out, b.out), a.label
        assert b.elapsed is None  # one executable computed them all: ops are not timed
    third = tl.trace(target, *args)
    assert third.notes["compiled"]["cached"] and compiled.CACHE.compiles == start + 1


def test_constants_are_passed_on_the_device_with_their_abstract_values(monkeypatch):
    """A jaxpr's NumPy constants (and JAX's literal arrays) are handed to the executable as device arrays of the
    same shape, dtype and weak type: a host array would be copied to the device at every call."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    target = jax.jit(lambda x: jnp.tanh(x @ table) * 0.5 + jnp.asarray(np.float32(2.0)))
    x = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32).reshape(2, 4)
    given: list[list[Any]] = []
    run = compiled.Compiled.run

    def recording_run(self, args):
        given.append(list(args))
        return run(self, args)

    monkeypatch.setattr(compiled.Compiled, "run", recording_run)
    trace = _cached(target, (x,))
    assert given and all(isinstance(a, jax.Array) for a in given[-1])
    assert any(a.shape == (4, 3) and np.array_equal(np.asarray(a), table) for a in given[-1])
    expected = np.tanh(np.asarray(x) @ table) * 0.5 + 2.0  # by hand, in NumPy
    assert np.allclose(np.asarray(trace.output), expected, rtol=1e-6, atol=1e-6)
    assert trace.output.dtype == jnp.float32 and not trace.output.weak_type


# -- new weights: new values, the same executable ----------------------------------------------------
def test_new_weights_give_new_values_and_compile_nothing(counts):
    model, (x,), _ = CASES["nnx_mlp"].build()
    target = nnx.jit(lambda m, x: m(x))
    _cached(target, (model, x))
    model.fc1.kernel[...] = model.fc1.kernel[...] * 2.0  # in place: same structure, new values
    before = counts.now()
    trace = tl.trace(target, model, x)
    assert counts.now() == before and trace.notes["capture"] == capture_cache.CAPTURE_NOTE
    h1 = x @ model.fc1.kernel[...] + model.fc1.bias[...]  # by hand, from the new weights
    h2 = jax.nn.relu(h1) @ model.fc2.kernel[...] + model.fc2.bias[...]
    assert _close(trace.modules["fc1"].passes[0].out, h1) and _close(trace.modules["fc2"].passes[0].out, h2)
    _leaves_close(trace.output, model(x))
    assert not _close(trace.output, CASES["nnx_mlp"].build()[0](x))  # the old weights' output differs
    # a new input of the same shape: its own values, the input node holding the very array given
    y = x[::-1] * 3.0
    before = counts.now()
    again = tl.trace(target, model, y)
    assert counts.now() == before and again.notes["capture"] == capture_cache.CAPTURE_NOTE
    assert again[again.input_labels[-1]].out is y
    _leaves_close(again.output, model(y))
    assert _close(again.modules["fc1"].passes[0].out, y @ model.fc1.kernel[...] + model.fc1.bias[...])


def test_a_wrapped_model_follows_its_weights(counts):
    model, (x,), _ = CASES["nnx_mlp"].build()
    target = nnx.jit(model)  # the model the wrapper holds: split again at every capture, as nnx.jit does
    _cached(target, (x,))
    model.fc3.bias[...] = model.fc3.bias[...] + 1.0
    before = counts.now()
    trace = tl.trace(target, x)
    assert counts.now() == before and trace.notes["capture"] == capture_cache.CAPTURE_NOTE
    _leaves_close(trace.output, model(x))
    assert trace.params["fc3.bias"].value is model.fc3.bias[...]
    assert _close(trace.params["fc3.bias"].value, CASES["nnx_mlp"].build()[0].fc3.bias[...] + 1.0)


def test_new_linen_variables_and_equinox_weights_give_new_values(counts):
    apply, (variables, x), _ = CASES["linen_mlp"].build()
    target = jax.jit(apply)
    _cached(target, (variables, x))
    doubled = jax.tree_util.tree_map(lambda v: v * 2.0, variables)
    before = counts.now()
    trace = tl.trace(target, doubled, x)
    assert counts.now() == before and trace.notes["capture"] == capture_cache.CAPTURE_NOTE
    _leaves_close(trace.output, apply(doubled, x))
    assert all(
        trace.params[name].value is leaf for name, leaf in zip(trace.params, jax.tree_util.tree_leaves(doubled))
    )  # the parameters given, by reference

    model, (x,), _ = CASES["eqx_mlp"].build()
    step = eqx.filter_jit(lambda m, x: m(x))
    _cached(step, (model, x))
    new = jax.tree_util.tree_map(lambda v: v + 0.5 if eqx.is_inexact_array(v) else v, model)
    before = counts.now()
    trace = tl.trace(step, new, x)
    assert counts.now() == before and trace.notes["capture"] == capture_cache.CAPTURE_NOTE
    _leaves_close(trace.output, new(x))
    first = trace.modules.get("m.layers.0") or trace.modules["layers.0"]
    assert _close(first.passes[0].out, new.layers[0](x))


def test_an_equinox_wrapper_is_keyed_once_and_frees_what_it_keyed(counts, monkeypatch):
    """filter_jit's wrapper is immutable: its model's part of the key is worked out at its first capture only
    (rebuilding the module at each capture cost more than the rest of the key), the same key as worked out anew;
    new weights make a new wrapper, with its own values; a dropped wrapper drops its part."""
    from torchlens_core.capture.policy import CaptureOptions
    from torchlens_jax import cache_keys

    model, (x,), _ = CASES["eqx_cnn"].build()
    target = eqx.filter_jit(model)
    _cached(target, (x,))
    rebuilt = []
    jit_inner = cache_keys.jit_inner
    monkeypatch.setattr(cache_keys, "jit_inner", lambda t: rebuilt.append(type(t)) or jit_inner(t))
    trace = tl.trace(target, x)
    assert not rebuilt and trace.notes["capture"] == capture_cache.CAPTURE_NOTE
    _leaves_close(trace.output, model(x))
    keyed = cache_keys.probe(target, (x,), {}, CaptureOptions())
    monkeypatch.setattr(cache_keys, "is_frozen_wrapper", lambda t: False)
    anew = cache_keys.probe(target, (x,), {}, CaptureOptions())
    assert rebuilt and keyed.key == anew.key and all(a is b for a, b in zip(keyed.params, anew.params))
    monkeypatch.undo()

    new = jax.tree_util.tree_map(lambda v: v * 0.5 if eqx.is_inexact_array(v) else v, model)
    other = eqx.filter_jit(new)
    _cached(other, (x,))
    again = tl.trace(other, x)
    assert again.notes["capture"] == capture_cache.CAPTURE_NOTE
    _leaves_close(again.output, new(x))
    assert not _close(jax.tree_util.tree_leaves(again.output)[0], jax.tree_util.tree_leaves(trace.output)[0])

    at = id(target)
    assert at in cache_keys._FROZEN_PARTS
    gone = weakref.ref(target)
    del target, trace, keyed, anew
    gc.collect()
    assert gone() is None and at not in cache_keys._FROZEN_PARTS


# -- what must miss ----------------------------------------------------------------------------------
def _missed(trace) -> bool:
    return trace.notes["capture"] != capture_cache.CAPTURE_NOTE


def test_a_new_input_shape_or_dtype_misses():
    fn, (params, x), _ = CASES["jnp_mlp"].build()
    target = jax.jit(fn)
    _cached(target, (params, x))
    for new in (jnp.ones((7, 6)), x.astype(jnp.bfloat16), np.asarray(x)):
        trace = tl.trace(target, params, new)
        assert _missed(trace), new.dtype
        _leaves_close(trace.output, fn(params, new))
        assert trace.ops[1].shape == tuple(new.shape) or any(o.shape == tuple(new.shape) for o in trace.ops)
    scaled = jax.jit(lambda x, s: x * s)
    weak = jnp.asarray(2.0)
    assert weak.weak_type
    _cached(scaled, (x.astype(jnp.bfloat16), weak))
    strong = tl.trace(scaled, x.astype(jnp.bfloat16), jnp.asarray(2.0, dtype=jnp.float32))  # weak_type: jit's key
    assert _missed(strong) and strong.output.dtype == jnp.float32  # promoted, where the weak scalar was not


def test_a_changed_static_or_python_argument_misses():
    def f(x, scale, flag):
        return jnp.tanh(x) * scale if flag else jnp.sin(x) * scale

    target = jax.jit(f, static_argnums=(2,))
    x = jnp.arange(6.0).reshape(2, 3)
    _cached(target, (x, 2.0, True))
    for scale, flag in ((3.0, True), (-0.0, True), (0.0, True), (2.0, False), (2, True)):
        trace = tl.trace(target, x, scale, flag)
        _leaves_close(trace.output, f(x, scale, flag))
        assert _missed(trace), (scale, flag)
    for _ in range(2):  # now cached, and the sign of a zero still tells the two apart
        zero = tl.trace(target, x, 0.0, True)
        negative = tl.trace(target, x, -0.0, True)
    assert not _missed(zero) and not _missed(negative)
    assert np.signbit(to_numpy(negative.output)[0, 0]) and not np.signbit(to_numpy(zero.output)[0, 0])


def test_complex_arguments_that_differ_in_the_sign_of_a_zero_miss():
    def f(x, scale):  # a Python number stays as given: a constant of the trace, so part of the key
        return jax.lax.complex(jnp.tanh(x) * scale.real, jnp.tanh(x) * scale.imag)

    target = jax.jit(f)
    x = jnp.arange(1.0, 7.0).reshape(2, 3)
    for _ in range(3):  # cached from the second round on; complex(1, -0.0) == complex(1, 0.0) in Python
        plus = tl.trace(target, x, complex(1.0, 0.0))
        minus = tl.trace(target, x, complex(1.0, -0.0))
    assert not _missed(plus) and not _missed(minus)
    assert np.all(np.signbit(np.imag(to_numpy(minus.output))))
    assert not np.any(np.signbit(np.imag(to_numpy(plus.output))))
    assert np.array_equal(
        np.signbit(np.imag(to_numpy(minus.output))), np.signbit(np.imag(np.asarray(f(x, complex(1.0, -0.0)))))
    )


class Stack(nnx.Module):
    def __init__(self, n: int, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(n)])

    def __call__(self, x):
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return x


def test_a_changed_nnx_module_structure_misses():
    model = Stack(2, nnx.Rngs(0))
    x = jnp.ones((3, 4))
    for target, args in ((nnx.jit(lambda m, x: m(x)), lambda: (model, x)), (nnx.jit(model), lambda: (x,))):
        _cached(target, args())
        model.layers.append(nnx.Linear(4, 4, rngs=nnx.Rngs(1)))  # a layer added
        trace = tl.trace(target, *args())
        assert _missed(trace)
        assert sum(op.func_name == "dot_general" for op in trace.ops) == len(model.layers)
        _leaves_close(trace.output, model(x))
        model.layers.pop()


def test_jax_configuration_is_part_of_the_key():
    fn, (params, x), _ = CASES["jnp_mlp"].build()
    target = jax.jit(fn)
    _cached(target, (params, x))
    with jax.default_matmul_precision("highest"):
        assert _missed(tl.trace(target, params, x))
    assert not _missed(tl.trace(target, params, x))


def test_save_and_halt_are_part_of_the_key_and_give_the_uncached_trace(monkeypatch):
    target, args, _ = _nnx_fn("nnx_cnn")
    for options in (
        {"save": tl.func("conv.*")},
        {"save": tl.module("conv1") | tl.func("max.*")},
        {"halt": tl.module("conv2")},
        {"save": tl.in_module("fc"), "halt": tl.module("fc")},
        {"save": tl.followed_by(tl.func("max.*")), "lookback": 1},
    ):
        reference = _uncached(target, args, monkeypatch, **options)
        cached = _cached(target, args, **options)
        _same_trace(cached, reference)
        assert cached.halted == ("halt" in options)
    full = tl.trace(target, *args)
    assert _missed(full) and all(op.saved for op in full.ops)
    assert tl.pluck(target, *args, "conv1").shape == tl.pluck(target, *args, "conv1").shape


def test_selectors_that_may_read_values_and_editing_options_take_the_ordinary_path():
    target, args, plain = _nnx_fn("nnx_mlp")
    for _ in range(3):
        assert _missed(tl.trace(target, *args, save=tl.where(lambda op: op.num_passes == 1)))
        edited = tl.trace(target, *args, intervene=tl.when(tl.module("fc1"), tl.zero_ablate()))
        assert _missed(edited) and "intervene=" in edited.notes["capture"]
        grads = tl.trace(target, *args, save_grads=True)
        assert _missed(grads)
        recording = tl.record(target, *args)
        assert _missed(recording.to_trace())
    assert len(capture_cache.CACHE) == 0


def test_random_primitives_and_effects_are_never_cached():
    seen = []

    def noisy(key, x):
        y = x + jax.random.normal(key, x.shape)
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), y)
        return y

    def random_only(key, x):
        return x * jax.random.bernoulli(key, 0.5, x.shape)

    x = jnp.ones((2, 3))
    for fn in (noisy, random_only):
        target = jax.jit(fn)
        for i in range(3):
            trace = tl.trace(target, jax.random.key(i), x)
            assert _missed(trace)
            _leaves_close(trace.output, fn(jax.random.key(i), x))
    assert len(capture_cache.CACHE) == 0 and seen


# -- never cached: a plain function ---------------------------------------------------------------------
SCALE = 2.0


def _reads_a_global(x):
    return jnp.sin(x) * SCALE


def test_a_non_jitted_target_is_traced_every_time_and_sees_its_globals(monkeypatch):
    global SCALE
    x = jnp.arange(4.0)
    monkeypatch.setattr(__import__(__name__), "SCALE", 2.0)
    for _ in range(3):
        first = tl.trace(_reads_a_global, x)
    assert len(capture_cache.CACHE) == 0 and _missed(first)
    SCALE = 5.0  # read by the forward: the next capture must see it
    later = tl.trace(_reads_a_global, x)
    _leaves_close(later.output, jnp.sin(x) * 5.0)
    assert not _close(later.output, first.output)
    # a jitted target bakes the global in, as jax.jit itself does: the trace is what the jitted call returns
    jitted = jax.jit(_reads_a_global)
    baked = jitted(x)  # jit traces it now, SCALE = 5
    _cached(jitted, (x,))
    SCALE = 7.0
    stale = tl.trace(jitted, x)
    assert not _missed(stale)
    _leaves_close(jitted(x), baked)  # jit's contract: later changes to globals are not seen
    _leaves_close(stale.output, baked)


# -- records belong to one trace ---------------------------------------------------------------------
def test_two_cached_traces_share_no_mutable_record():
    target, args, _ = _nnx_fn("nnx_attention")
    a = _cached(target, args)
    b = tl.trace(target, *args)
    assert b.notes["capture"] == capture_cache.CAPTURE_NOTE
    for x, y in zip(a.ops, b.ops):
        assert x is not y and x.trace is a and y.trace is b
        for field in ("parents", "children", "module_outputs", "conditions", "kwargs", "meta"):
            assert getattr(x, field) is not getattr(y, field) or not getattr(x, field)
        if x.call is not None:
            assert x.call[1] is not y.call[1]
    for m, n in zip(a.modules.values(), b.modules.values()):
        assert m is not n and m.passes is not n.passes and m.params is not n.params
        for p, q in zip(m.passes, n.passes):
            assert p is not q and p.ops is not q.ops and p.trace is a and q.trace is b
    for p, q in zip(a.params.values(), b.params.values()):
        assert p is not q
    assert a.notes is not b.notes and a.notes["expanded"] is not b.notes["expanded"]
    # mutating one trace changes neither the other nor a later one
    at = next(i for i, o in enumerate(a.ops) if o.call is not None and o.parents)
    op = a.ops[at]
    op.parents.append("nothing_1_1")
    op.meta["mine"] = True
    op.kwargs["mine"] = True
    op.call[1]["mine"] = True
    next(iter(a.modules.values())).passes[0].ops.append("nothing_1_1")
    a.notes["expanded"]["mine"] = 1
    c = tl.trace(target, *args)
    for t in (b, c):
        assert "nothing_1_1" not in t.ops[at].parents and "mine" not in t.ops[at].meta
        assert "mine" not in t.ops[at].kwargs and "mine" not in t.ops[at].call[1]
        assert "nothing_1_1" not in next(iter(t.modules.values())).passes[0].ops
        assert "mine" not in t.notes["expanded"]


def test_mutating_the_first_trace_does_not_change_the_stored_records():
    target, args, _ = _nnx_fn("nnx_mlp")
    first = tl.trace(target, *args)
    labels = [(op.label, list(op.parents)) for op in first.ops]
    for op in first.ops:
        op.parents.clear()
        op.label = "changed"
    second = tl.trace(target, *args)
    assert second.notes["capture"] == capture_cache.CAPTURE_NOTE
    assert [(op.label, op.parents) for op in second.ops] == labels


def test_a_dropped_jitted_function_frees_its_entries():
    x = jnp.arange(3.0)
    target = jax.jit(lambda v: jnp.cos(v) + 1.0)
    for _ in range(3):
        trace = tl.trace(target, x)
    assert trace.notes["capture"] == capture_cache.CAPTURE_NOTE and len(capture_cache.CACHE) == 1
    gone = weakref.ref(target)
    del target
    gc.collect()
    assert gone() is None  # nothing in the cache (nor the trace) holds the function
    assert len(capture_cache.CACHE) == 0 and not capture_cache.CACHE.owners
    _leaves_close(trace.output, jnp.cos(x) + 1.0)  # the trace itself lives on


def test_a_partial_of_a_jitted_function_is_cached_by_its_bound_arguments():
    fn, (params, x), _ = CASES["jnp_mlp"].build()
    bound = functools.partial(jax.jit(fn), params)
    trace = _cached(bound, (x,))
    _leaves_close(trace.output, fn(params, x))
    other = jax.tree_util.tree_map(lambda v: v * 3.0, params)
    rebound = functools.partial(bound.func, other)
    fresh = tl.trace(rebound, x)
    assert _missed(fresh)
    _leaves_close(fresh.output, fn(other, x))


# -- threads ---------------------------------------------------------------------------------------
def test_two_threads_capturing_one_jitted_model_get_whole_traces(monkeypatch):
    from thread_checks import ROUNDS, raised, run_together

    target, args, plain = _nnx_fn("nnx_attention")
    reference = _uncached(target, args, monkeypatch)
    expected = plain()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def task():
        trace = tl.trace(target, *args)
        try:
            _same_trace(trace, reference)
            _leaves_close(trace.output, expected)
        except AssertionError as exc:
            with lock:
                errors.append(exc)
        return trace

    hits = 0
    for _ in range(ROUNDS):
        results = run_together(task, task)
        raised(results)
        hits += sum(t.notes["capture"] == capture_cache.CAPTURE_NOTE for t in results)
        assert results[0] is not results[1] and results[0].ops[3] is not results[1].ops[3]
    assert not errors, errors[0]
    assert hits >= 2 * ROUNDS - 2  # every capture after the first round's came from the cache
