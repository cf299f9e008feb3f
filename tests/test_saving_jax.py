"""tl.save / tl.load on the jax backend: every zoo model round-trips, replays and audits; tampered calls are refused."""

from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import torchlens as tl  # noqa: E402
from torchlens_core.plugins import hook  # noqa: E402

CASES = [c for c in hook().torchlens_conformance_cases(backend="jax") or [] if not c.slow]


def views(t: tl.Trace) -> list[object]:
    rows = [(o.label, o.func_name, o.shape, o.dtype, o.parents, o.children, o.module_passes, o.module_outputs,
             o.params, o.code_context, o.flops, o.macs, repr(o.config)) for o in t.ops]
    return [rows, t.summary(), t.to_dot(), tl.hash(t), [m.path for m in t.modules.values()], list(t.params)]


def same(a: object, b: object) -> bool:
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(leaves_a) == len(leaves_b) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                                  for x, y in zip(leaves_a, leaves_b))


def rehash(path: pathlib.Path) -> None:
    """Make the manifest agree with the files again, as a deliberate tamperer would."""
    manifest = json.loads((path / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (path / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_zoo_round_trip_replays_and_audits(case, tmp_path: pathlib.Path) -> None:
    if case.reset:
        case.reset()
    model, args, kwargs = case.build()
    t = tl.trace(model, *args, backend="jax", **kwargs)
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert views(loaded) == views(t)
    assert "not_replayable" not in loaded.notes
    assert same(loaded.replay(), t.model_output)
    report = loaded.audit(rtol=case.rtol)
    assert report, str(report)


def test_parameters_of_many_primitives_round_trip(tmp_path: pathlib.Path) -> None:
    # gather/scatter dimension numbers and modes, Precision, FftType, dtypes, PRNG impls, device_put's copy semantics
    import jax.numpy as jnp

    def fn(x: jax.Array, key: jax.Array) -> jax.Array:
        a = x[jnp.array([0, 2])].sum() + x.at[1].set(5.0) + jnp.dot(x, x.T, precision=jax.lax.Precision.HIGHEST).sum()
        b = jnp.sort(x, axis=-1) + jnp.cumsum(x, axis=0) + jnp.argmax(x, axis=1)[:, None] + jnp.fft.rfft(x).real.sum()
        c = jax.random.normal(key, x.shape) + jax.random.bernoulli(
            jax.random.wrap_key_data(jax.random.key_data(key), impl="rbg"), 0.3, x.shape)
        d = jax.lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10) + jax.lax.top_k(x, 2)[0].sum()
        return a + b + c + d + jax.device_put(x) * jnp.float32(1.5) + jnp.round(x * 3.3) + jnp.exp(x) ** 2.5

    t = tl.trace(fn, jax.random.normal(jax.random.key(1), (3, 4)), jax.random.key(7, impl="rbg"))
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert "not_replayable" not in loaded.notes
    gather = next(op for op in loaded.ops if op.func_name == "gather")
    assert type(gather.config["dimension_numbers"]).__name__ == "GatherDimensionNumbers"
    assert same(loaded.replay(), t.model_output)
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
    evil_calls = [{"primitive": "os.system", "params": {}}, {"primitive": "debug_callback", "params": {}},
                  {"primitive": "io_callback", "params": {}}, {"primitive": "tanh"},
                  {"primitive": "tanh", "params": {"accuracy": {"eval": 1}}},
                  {"primitive": "tanh", "params": {"x": {"enum": ["os", "system"]}}},
                  {"primitive": "tanh", "params": {"x": {"struct": ["Precision", []]}}},
                  {"primitive": "tanh", "params": {"x": {"dtype": "O"}}}]
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
