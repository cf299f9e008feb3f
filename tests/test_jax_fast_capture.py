"""The compiled capture path (torchlens_jax.compiled) against the per-equation walk, its cache and its fallbacks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_jax import compiled, zoo  # noqa: E402
from torchlens_jax.arrays import to_numpy  # noqa: E402

CASES = {c.name: c for c in zoo.cases()}
STRAIGHT = [
    "jnp_mlp",
    "jit_mlp",
    "jnp_cnn",
    "custom_derivatives",
    "linen_mlp",
    "nnx_mlp",
    "nnx_cnn",
    "nnx_attention",
    "nnx_residual",
    "eqx_mlp",
    "eqx_cnn",
]
LOOPS = ["scan_rnn", "cond_branch", "while_loop", "nnx_scan_rnn"]
# XLA fuses the executable's ops: a value it returns may differ from an eager bind in the last bits (float32).
TOL = 1e-5


@pytest.fixture(autouse=True)
def _compiled_on_second_capture(monkeypatch):
    monkeypatch.setattr(compiled, "COMPILE_ON_SIGHTING", 2)  # the default, whatever a run set it to


def _capture(name: str, fast: bool, **options):
    case = CASES[name]
    model, args, kwargs = case.build()
    if case.reset is not None:
        case.reset()
    previous = compiled.COMPILED_CAPTURE
    compiled.COMPILED_CAPTURE = fast
    try:
        if fast:  # the first capture of a program runs it eagerly; the second compiles it
            tl.trace(model, *args, backend="jax", **options, **kwargs)
            if case.reset is not None:
                case.reset()
        return tl.trace(model, *args, backend="jax", **options, **kwargs), (model, args, kwargs)
    finally:
        compiled.COMPILED_CAPTURE = previous


def _records(t):
    return [
        (
            o.label,
            o.kind,
            o.func_name,
            o.parents,
            o.module_passes,
            o.module_outputs,
            o.shape,
            o.dtype,
            o.device,
            o.params,
            o.source,
            o.code_context,
            o.layer_key,
            repr(o.config),
            o.saved,
        )
        for o in t.ops
    ]


def _close(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_close(x, y) for x, y in zip(a, b, strict=True))
    a, b = to_numpy(a), to_numpy(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.allclose(a, b, rtol=TOL, atol=TOL)


def _took_fast(t) -> bool:
    return "compiled" in t.notes


@pytest.mark.parametrize("name", STRAIGHT)
def test_fast_path_gives_the_per_equation_records_and_values(name):
    fast, (model, args, kwargs) = _capture(name, True)
    slow, _ = _capture(name, False)
    assert _took_fast(fast) and not _took_fast(slow)
    assert _records(fast) == _records(slow)
    assert [m.passes and [(p.label, p.ops) for p in m.passes] for m in fast.modules.values()] == [
        m.passes and [(p.label, p.ops) for p in m.passes] for m in slow.modules.values()
    ]
    for f, s in zip(fast.ops, slow.ops):
        assert _close(f.out, s.out), f.label
        assert f.meta.get("custom_rule") == s.meta.get("custom_rule")
    # the output is the model's, within tolerance of a plain untraced call (an independent reference)
    plain = jax.tree_util.tree_leaves(model(*args, **kwargs))
    got = jax.tree_util.tree_leaves(fast.model_output)
    assert len(plain) == len(got) and all(_close(g, p) for g, p in zip(got, plain))
    from torchlens_core.capture.rerun import RecordedCall

    report = fast.audit(untraced=isinstance(fast.call, RecordedCall))  # eager replay, op by op, and a plain rerun
    assert report, report


def test_repeat_capture_reuses_the_executable_and_recompiles_only_on_structure():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(4, 8, rngs=rngs)
            self.b = nnx.Linear(8, 3, rngs=rngs)

        def __call__(self, x):
            return self.b(jax.nn.relu(self.a(x)))

    model = Net(nnx.Rngs(0))
    x = jnp.arange(8.0).reshape(2, 4)
    compiled.CACHE.clear()
    start = compiled.CACHE.compiles
    eager = tl.trace(model, x)  # a program met for the first time runs eagerly, each op timed: no compile
    assert "compiled" not in eager.notes and compiled.CACHE.compiles == start
    assert all(o.elapsed is not None and o.elapsed >= 0 for o in eager.ops if o.kind == "op")
    first = tl.trace(model, x)
    second = tl.trace(model, x)
    assert compiled.CACHE.compiles == start + 1
    assert not first.notes["compiled"]["cached"] and second.notes["compiled"]["cached"]
    assert _records(eager) == _records(first) == _records(second)
    assert all(_close(a.out, b.out) for a, b in zip(eager.ops, second.ops))

    # new weights: the same executable, and the new values (weights are arguments, not baked-in constants)
    model.a.kernel[...] = model.a.kernel[...] * 2.0
    third = tl.trace(model, x)
    assert compiled.CACHE.compiles == start + 1 and third.notes["compiled"]["cached"]
    expected = model(x)
    assert _close(third.model_output, expected)
    assert not _close(third.model_output, first.model_output)
    h = jax.nn.relu(x @ model.a.kernel[...] + model.a.bias[...])
    assert _close(third.modules["a"].passes[0].out, x @ model.a.kernel[...] + model.a.bias[...])
    assert _close(third.model_output, h @ model.b.kernel[...] + model.b.bias[...])

    # another input shape, and another structure: new programs, compiled again when captured twice
    for _ in range(2):
        tl.trace(model, jnp.ones((5, 4)))
    assert compiled.CACHE.compiles == start + 2
    model.b = nnx.Linear(8, 6, rngs=nnx.Rngs(1))
    changed = tl.trace(model, x)
    assert _close(changed.model_output, model(x))
    changed = tl.trace(model, x)
    assert compiled.CACHE.compiles == start + 3 and "compiled" in changed.notes
    assert changed.model_output.shape == (2, 6) and _close(changed.model_output, model(x))


def test_programs_whose_literals_differ_only_in_the_sign_of_zero_are_not_one_executable():
    # -0.0 == 0.0 in Python, so a key holding the literals as they are took one program for the other
    from jax import lax

    def times_zero(x):
        return 1.0 / lax.mul(x, 0.0)

    def times_minus_zero(x):
        return 1.0 / lax.mul(x, -0.0)

    x = jnp.ones(3)
    compiled.CACHE.clear()
    for _ in range(3):  # compiled at the second, answered from the cache at the third
        plus = tl.trace(times_zero, x, backend="jax")
    assert plus.notes["compiled"]["cached"]
    minus = [tl.trace(times_minus_zero, x, backend="jax") for _ in range(3)]
    assert np.all(np.asarray(plus.output) == np.inf)
    for trace in minus:  # 1 / (1 * -0.0), and what JAX computes untraced
        assert np.all(np.asarray(trace.output) == -np.inf), np.asarray(trace.output)
        assert np.all(np.asarray(trace.output) == np.asarray(times_minus_zero(x)))


def test_save_shrinks_the_outputs_of_the_executable():
    full, _ = _capture("nnx_cnn", True)
    some, _ = _capture("nnx_cnn", True, save=tl.func("conv.*"))
    convs = [o for o in full.ops if o.kind == "op" and o.func_name.startswith("conv")]
    assert convs and some.notes["compiled"]["outputs"] < full.notes["compiled"]["outputs"]
    # the conv values and the model's output, nothing else
    assert some.notes["compiled"]["outputs"] == len(convs) + len(full.output_labels)
    for o in some.ops:
        if o.kind == "op":
            assert (o.out is not None) == o.func_name.startswith("conv"), o.label
            if o.out is not None:
                assert _close(o.out, full[o.label].out)


def test_halt_cuts_the_program_before_compiling():
    full, _ = _capture("nnx_cnn", True)
    halted, _ = _capture("nnx_cnn", True, halt=tl.module("conv1"))
    assert halted.halted
    assert halted.notes["compiled"]["steps"] < full.notes["compiled"]["steps"]
    out = halted.modules["conv1"].passes[0].out
    assert _close(out, full.modules["conv1"].passes[0].out)


@pytest.mark.parametrize("name", LOOPS)
def test_loops_and_conds_take_the_per_equation_path(name):
    t, (model, args, kwargs) = _capture(name, True)
    assert not _took_fast(t) and "eager walk" in t.notes["capture"]
    plain = jax.tree_util.tree_leaves(model(*args, **kwargs))
    assert all(_close(g, p) for g, p in zip(jax.tree_util.tree_leaves(t.model_output), plain))
    assert t.audit()


def test_intervene_and_save_grads_take_the_per_equation_path():
    model, args, kwargs = CASES["nnx_mlp"].build()
    edited = tl.trace(model, *args, intervene=tl.when(tl.module("fc1"), tl.zero_ablate()), **kwargs)
    assert "compiled" not in edited.notes and "intervene=" in edited.notes["capture"]
    (x,) = args
    zeroed = model.fc3(nnx.relu(model.fc2(nnx.relu(jnp.zeros((x.shape[0], 16))))))  # fc1's output zeroed by hand
    assert _close(edited.model_output, zeroed)
    grads = tl.trace(model, *args, save_grads=True, **kwargs)
    assert "compiled" not in grads.notes and "save_grads=" in grads.notes["capture"]
    assert grads.audit()


def test_a_jaxpr_with_effects_takes_the_per_equation_path():
    seen = []

    def f(x):
        y = jnp.sin(x)
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), y)  # an ordered effect: runs as the walk goes
        return y * 2.0

    x = jnp.arange(3.0)
    for _ in range(2):  # a second capture too: a program would have compiled by now
        t = tl.trace(f, x)
        assert "compiled" not in t.notes and "effects" in t.notes["capture"]
    assert seen and np.allclose(seen[-1], np.sin(np.arange(3.0)))
    assert _close(t.model_output, jnp.sin(x) * 2.0)


def test_code_context_is_the_user_frames_jax_reports() -> None:
    """Each op's code context against JAX's own reading of its equation's traceback (source_info_util.user_frames),
    twice: the second capture's comes from the location cache."""
    from jax._src import source_info_util

    from torchlens_core.capture import api
    from torchlens_jax import walk

    class Wide(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.a = nnx.Linear(4, 8, rngs=rngs)
            self.b = nnx.Linear(8, 3, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.a(x))
            return jnp.tanh(self.b(h)) + jnp.sum(h)

    model, x = Wide(nnx.Rngs(0)), jnp.ones((2, 4))
    seen: list[tuple[Any, ...]] = []
    real = walk._code_context

    def checked(eqn: Any, limit: int = walk.CONTEXT_FRAMES) -> tuple[Any, ...]:
        mine = real(eqn, limit)
        expected = []
        for frame in source_info_util.user_frames(eqn.source_info.traceback):
            if frame.file_name == api.__file__ or len(expected) == limit:
                break
            if not frame.file_name.startswith(walk._OWN_DIRS):
                expected.append((frame.file_name, frame.start_line, frame.function_name))
        assert [tuple(c) for c in mine] == expected
        seen.append(mine)
        return mine

    walk._code_context = checked
    try:
        first = tl.trace(model, x)
        again = tl.trace(model, x)
    finally:
        walk._code_context = real
    assert len(seen) >= 2 * 6 and any(seen)
    assert [op.code_context for op in first.ops] == [op.code_context for op in again.ops]
    assert any(c.func_name.endswith("Wide.__call__") for op in first.ops for c in op.code_context)


def test_code_context_stays_right_when_its_caches_start_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdicts on code objects and their line numbers are cleared when they grow past a bound (code made
    anew at every call): every op's context is then worked out again, the same."""
    from torchlens_jax import walk

    model, args, kwargs = CASES["nnx_attention"].build()
    reference = [op.code_context for op in tl.trace(model, *args, **kwargs).ops]
    grown = len(walk._JUDGED)
    monkeypatch.setattr(walk, "_MAX_CODES", 8)  # cleared at almost every equation
    walk._JUDGED.clear()
    walk._READ.clear()
    walk._ENDS.clear()
    walk._LOCATIONS.clear()
    assert [op.code_context for op in tl.trace(model, *args, **kwargs).ops] == reference
    assert any(reference) and len(walk._JUDGED) < grown
    assert all(id(code) == key for key, code in walk._JUDGED.items())  # each judged code object held


def test_scope_names_of_other_captures_are_not_this_captures_calls() -> None:
    """Call scopes are read by one pattern for every capture: only this capture's id counts, not one it is a
    prefix or suffix of (a scope left in a jit cache by another capture, a capture inside a traced forward)."""
    from torchlens_jax.scopes import CallScopes

    scopes = CallScopes()
    mine, other = scopes.capture_id, scopes.capture_id * 10 + 1
    stack = f"torchlens#{other}.7/torchlens#{mine}.2/jvp(torchlens#{mine}.5)/torchlens#1{mine}.3/dot"
    assert scopes.calls_in(stack) == (2, 5)
    assert scopes.calls_in("dot_general") == ()
