"""tl.save / tl.load on jax: primitive parameters, unsavable ones, tampered calls (the zoo: conformance/)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from saving_checks import rehash, same_values  # noqa: E402

import torchlens as tl  # noqa: E402


def test_parameters_of_many_primitives_round_trip(tmp_path: pathlib.Path) -> None:
    # gather/scatter dimension numbers and modes, Precision, FftType, dtypes, PRNG impls, device_put's copy semantics
    import jax.numpy as jnp

    def fn(x: jax.Array, key: jax.Array) -> jax.Array:
        a = x[jnp.array([0, 2])].sum() + x.at[1].set(5.0) + jnp.dot(x, x.T, precision=jax.lax.Precision.HIGHEST).sum()
        b = jnp.sort(x, axis=-1) + jnp.cumsum(x, axis=0) + jnp.argmax(x, axis=1)[:, None] + jnp.fft.rfft(x).real.sum()
        c = jax.random.normal(key, x.shape) + jax.random.bernoulli(
            jax.random.wrap_key_data(jax.random.key_data(key), impl="rbg"), 0.3, x.shape
        )
        d = jax.lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10) + jax.lax.top_k(x, 2)[0].sum()
        return a + b + c + d + jax.device_put(x) * jnp.float32(1.5) + jnp.round(x * 3.3) + jnp.exp(x) ** 2.5

    t = tl.trace(fn, jax.random.normal(jax.random.key(1), (3, 4)), jax.random.key(7, impl="rbg"))
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert "not_replayable" not in loaded.notes
    gather = next(op for op in loaded.ops if op.func_name == "gather")
    assert type(gather.config["dimension_numbers"]).__name__ == "GatherDimensionNumbers"
    assert same_values("jax", loaded.replay(), t.model_output)
    assert loaded.audit()


def test_what_has_no_saved_form_loads_as_not_replayable(tmp_path: pathlib.Path) -> None:
    # scatter-add holds its update jaxpr (a program, not data); pure_callback runs Python.
    import jax.numpy as jnp

    def fn(x: jax.Array) -> jax.Array:
        y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return x.at[1].add(2.0) + y

    t = tl.trace(fn, jnp.arange(4.0))
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    missing = loaded.notes["not_replayable"]
    assert [label.split("_1_")[0] for label in sorted(missing)] == ["pure_callback", "scatter-add"], missing
    assert "runs Python" in missing["pure_callback_1_1"]
    assert "update_jaxpr" in next(why for label, why in missing.items() if label.startswith("scatter-add"))
    with pytest.raises(tl.UnsupportedError, match="scatter-add"):
        loaded.replay()


def test_a_tampered_primitive_name_is_refused(tmp_path: pathlib.Path) -> None:
    import jax.numpy as jnp

    t = tl.trace(lambda x: jnp.tanh(x) * 2, jnp.ones(3))
    path = tl.save(t, tmp_path / "t")
    records = json.loads((path / "trace.json").read_text())
    assert records["ops"][1]["call"] == {"primitive": "tanh", "params": {"accuracy": None}}
    evil_calls = [
        {"primitive": "os.system", "params": {}},
        {"primitive": "debug_callback", "params": {}},
        {"primitive": "io_callback", "params": {}},
        {"primitive": "tanh"},
        {"primitive": "tanh", "params": {"accuracy": {"eval": 1}}},
        {"primitive": "tanh", "params": {"x": {"enum": ["os", "system"]}}},
        {"primitive": "tanh", "params": {"x": {"struct": ["Precision", []]}}},
        {"primitive": "tanh", "params": {"x": {"dtype": "O"}}},
    ]
    for evil in evil_calls:
        records["ops"][1]["call"] = evil
        (path / "trace.json").write_text(json.dumps(records))
        rehash(path)
        with pytest.raises(tl.TraceFileError):
            tl.load(path)


def test_bfloat16_constants_round_trip(tmp_path) -> None:
    def f(x):
        return (x.astype(jnp.bfloat16) * 2).astype(jnp.float32)

    trace = tl.trace(f, jnp.ones(3), backend="jax")
    loaded = tl.load(tl.save(trace, tmp_path / "bf16"))
    assert np.array_equal(np.asarray(loaded.replay()), np.full(3, 2.0, np.float32))
    assert loaded.audit()
