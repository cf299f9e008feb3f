"""tl.save / tl.load on the jax backend: every zoo model round-trips (lookup, summary, tables, drawing, hash)."""

from __future__ import annotations

import pathlib

import pytest

jax = pytest.importorskip("jax")

import torchlens as tl  # noqa: E402
from torchlens_core.plugins import hook  # noqa: E402

CASES = [c for c in hook().torchlens_conformance_cases(backend="jax") or [] if not c.slow]


def views(t: tl.Trace) -> list[object]:
    rows = [(o.label, o.func_name, o.shape, o.dtype, o.parents, o.children, o.module_passes, o.module_outputs,
             o.params, o.code_context, o.flops, o.macs, sorted(o.config)) for o in t.ops]
    # (config values keep their data but not their classes: JAX's dimension-number namedtuples load as tuples)
    return [rows, t.summary(), t.to_dot(), tl.hash(t), [m.path for m in t.modules.values()], list(t.params)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_zoo_round_trip(case, tmp_path: pathlib.Path) -> None:
    if case.reset:
        case.reset()
    model, args, kwargs = case.build()
    t = tl.trace(model, *args, backend="jax", **kwargs)
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert views(loaded) == views(t)
    with pytest.raises(tl.UnsupportedError):
        loaded.replay()

def test_replay_after_load_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    import jax.numpy as jnp

    t = tl.trace(lambda x: jnp.tanh(x) * 2, jnp.ones(3))
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert isinstance(loaded.ops[1].out, jax.Array)
    with pytest.raises(tl.UnsupportedError, match="tanh.*without its parameters"):
        loaded.replay()

