"""Replay on new inputs on the JAX backend: ``trace.replay(*inputs)`` and ``trace.fork()...replay()``.

A jaxpr turns no traced value into a Python one (``make_jaxpr`` refuses it);
the capture's eager walk does, for the index of every ``cond`` (``lax.cond``,
``lax.switch``) and the condition of every ``while`` iteration, and reports
each. The references here never go through TorchLens: a plain call of the
model (or function) on the new inputs, or a closed form of the edited forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")
eqx = pytest.importorskip("equinox")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError, TorchLensError  # noqa: E402

lax = jax.lax
TOL = 1e-5


def normal(seed: int, *shape: int) -> Any:
    return jax.random.normal(jax.random.key(seed), shape)


def close(actual: Any, expected: Any) -> None:
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=TOL, atol=TOL)


def replays_like(trace: Any, model: Any, *args: Any, **kwargs: Any) -> None:
    """Replay on new inputs gives the model's own output on them, which differs from the recorded one."""
    own = model(*args, **kwargs)
    moved = [
        float(np.max(np.abs(np.asarray(o, np.float64) - np.asarray(r, np.float64))))
        for o, r in zip(jax.tree_util.tree_leaves(own), jax.tree_util.tree_leaves(trace.output), strict=True)
    ]
    assert max(moved) > 1e-3, "the new inputs do not change the output: the check could not tell"
    close(trace.replay(*args, **kwargs), own)


def ops_named(trace: Any, func_name: str) -> list[Any]:
    return [op for op in trace.ops if op.func_name == func_name]


# -- models without control flow -----------------------------------------------------------------
def mlp(params: dict[str, Any], x: Any) -> Any:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jax.nn.log_softmax(h @ params["w2"])


def test_function_takes_new_params_and_inputs() -> None:
    params = {"w1": normal(0, 6, 8), "b1": normal(1, 8), "w2": normal(2, 8, 3)}
    trace = tl.trace(mlp, params, normal(3, 4, 6))
    new_params = jax.tree.map(lambda a: a * 1.5 + 0.1, params)
    replays_like(trace, mlp, new_params, normal(4, 4, 6))
    jitted = tl.trace(jax.jit(mlp), params, normal(3, 4, 6))
    replays_like(jitted, mlp, params, normal(5, 4, 6))


def test_keyword_arrays_and_numpy_inputs() -> None:
    def affine(x: Any, *, w: Any, b: Any) -> Any:
        return jnp.tanh(x @ w) + b

    x, w, b = np.asarray(normal(6, 3, 4)), normal(7, 4, 2), normal(8, 2)
    trace = tl.trace(affine, x, w=w, b=b, backend="jax")  # a NumPy input: its node takes a jax.Array as well
    replays_like(trace, affine, normal(9, 3, 4), w=w * 2.0, b=b - 1.0)


class Net(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.fc1 = nnx.Linear(6, 16, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.head = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.head(self.norm(nnx.gelu(self.fc1(x))))


def test_nnx_model() -> None:
    model = Net(nnx.Rngs(0))
    trace = tl.trace(model, normal(10, 4, 6))
    replays_like(trace, model, normal(11, 4, 6))


def test_linen_apply_takes_new_variables() -> None:
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.BatchNorm(use_running_average=True)(nn.relu(nn.Dense(8)(x)))
            return nn.Dense(2)(x)

    model, x = MLP(), normal(12, 4, 5)
    variables = model.init(jax.random.key(0), x)
    trace = tl.trace(model.apply, variables, x)
    new_variables = jax.tree.map(lambda a: a * 1.3, variables)  # running variances stay positive
    replays_like(trace, model.apply, new_variables, normal(13, 4, 5))


def test_equinox_model_and_scan() -> None:
    model = eqx.nn.MLP(5, 2, width_size=8, depth=2, key=jax.random.key(1))
    replays_like(tl.trace(model, normal(14, 5)), model, normal(15, 5))

    w_x, w_h = normal(16, 3, 4), normal(17, 4, 4)

    def rnn(xs: Any) -> Any:
        def step(h: Any, x: Any) -> tuple[Any, Any]:
            h = jnp.tanh(x @ w_x + h @ w_h)
            return h, h

        return lax.scan(step, jnp.zeros(4), xs)

    replays_like(tl.trace(rnn, normal(18, 6, 3)), rnn, normal(19, 6, 3))


# -- data-dependent control flow -----------------------------------------------------------------
def branchy(x: Any) -> Any:
    return lax.cond(x.sum() > 0, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.cos(v) - 1.0, x) + 1.0


def positive(seed: int) -> Any:
    return jnp.abs(normal(seed, 4, 3)) + 0.1


def decider_of(trace: Any, func_name: str) -> str:
    """The label of the op whose value picked the branch that ``func_name`` ran in."""
    (label,) = {c for op in ops_named(trace, func_name) for c in op.conditions}
    return label


def test_cond_holds_where_the_branch_is_the_same_and_raises_where_it_flips() -> None:
    trace = tl.trace(branchy, positive(20))
    replays_like(trace, branchy, positive(21))
    with pytest.raises(tl.GraphDoesNotHold, match=decider_of(trace, "sin")):
        trace.replay(-positive(21))  # the sum is negative: the model takes the cos branch
    close(trace.replay(), branchy(positive(20)))  # a refused replay leaves the trace as it was


class Gated(nnx.Module):
    """An nnx model that picks one of two submodules by the sign of its input's mean."""

    def __init__(self, rngs: Any) -> None:
        self.a = nnx.Linear(4, 4, rngs=rngs)
        self.b = nnx.Linear(4, 4, rngs=rngs)
        self.head = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        h = lax.cond(x.mean() > 0, lambda v: nnx.relu(self.a(v)), lambda v: jnp.tanh(self.b(v)), x)
        return self.head(h)


def test_nnx_model_with_a_cond_over_submodules() -> None:
    model = Gated(nnx.Rngs(1))
    trace = tl.trace(model, jnp.abs(normal(38, 3, 4)) + 0.1)
    replays_like(trace, model, jnp.abs(normal(39, 3, 4)) + 0.1)
    with pytest.raises(tl.GraphDoesNotHold, match=decider_of(trace, "max")):  # relu's max ran in the branch
        trace.replay(-jnp.abs(normal(39, 3, 4)) - 0.1)


def test_host_callback_branches_inside_its_op() -> None:
    """A host callback's Python runs inside its op, which replay runs again: nothing of it is baked in."""

    def host(v: np.ndarray) -> np.ndarray:
        return np.sin(v) if v.sum() > 0 else np.cos(v)

    def f(x: Any) -> Any:
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x * 2.0) + 1.0

    trace = tl.trace(f, positive(40))
    replays_like(trace, f, -positive(41))


def test_switch_index() -> None:
    def three_way(x: Any) -> Any:
        index = jnp.clip(jnp.floor(x.mean() * 3.0), 0, 2).astype(jnp.int32)
        return lax.switch(index, [jnp.sin, jnp.cos, jnp.tanh], x * 2.0)

    def with_mean(seed: int, mean: float) -> Any:
        x = normal(seed, 8)
        return x - x.mean() + mean

    trace = tl.trace(three_way, with_mean(22, 0.5))  # index 1: cos
    replays_like(trace, three_way, with_mean(23, 0.4))
    for mean in (0.1, 0.9):  # index 0 and 2
        with pytest.raises(tl.GraphDoesNotHold, match=decider_of(trace, "cos")):
            trace.replay(with_mean(23, mean))


def test_cond_in_scan_checks_every_iteration() -> None:
    def running(xs: Any) -> Any:
        def step(c: Any, x: Any) -> tuple[Any, Any]:
            y = lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x)
            return c + y, y

        return lax.scan(step, jnp.zeros(3), xs)

    signs = jnp.array([1.0, -1.0, 1.0, 1.0, -1.0])[:, None]
    trace = tl.trace(running, (jnp.abs(normal(24, 5, 3)) + 0.1) * signs)
    replays_like(trace, running, (jnp.abs(normal(25, 5, 3)) + 0.1) * signs)
    flipped = (jnp.abs(normal(25, 5, 3)) + 0.1) * signs.at[3].set(-1.0)
    deciders = sorted({c for op in ops_named(trace, "sin") for c in op.conditions})
    assert len(deciders) == 3  # iterations 1, 3 and 4 took the sin branch
    with pytest.raises(tl.GraphDoesNotHold, match=f"{deciders[2]}'s value"):  # the fourth iteration's
        trace.replay(flipped)


def shrink(x: Any) -> Any:
    """Halve a vector until its norm is below 1: the trip count depends on the data."""

    def body(s: tuple[Any, Any]) -> tuple[Any, Any]:
        return s[0] + 1, s[1] * 0.5

    return lax.while_loop(lambda s: jnp.linalg.norm(s[1]) >= 1.0, body, (jnp.int32(0), x))


def with_norm(seed: int, norm: float) -> Any:
    x = normal(seed, 6)
    return x / jnp.linalg.norm(x) * norm


def test_while_loop_count() -> None:
    trace = tl.trace(shrink, with_norm(26, 5.0))  # 5, 2.5, 1.25, then 0.625: three iterations
    assert int(trace.output[0]) == 3
    replays_like(trace, shrink, with_norm(27, 6.0))  # three iterations too
    tests = sorted(ops_named(trace, "ge"), key=lambda op: op.pass_num)
    assert len(tests) == 4
    with pytest.raises(tl.GraphDoesNotHold, match=f"{tests[3].label}'s value converts to True"):
        trace.replay(with_norm(27, 9.0))  # four iterations
    with pytest.raises(tl.GraphDoesNotHold, match=f"{tests[1].label}'s value converts to False"):
        trace.replay(with_norm(27, 1.9))  # one iteration


def test_an_input_or_parameter_that_decides_directly() -> None:
    """A loop condition that is an input itself, or a parameter (which linen's replay can replace)."""

    def doubling(s: tuple[Any, Any]) -> tuple[Any, Any]:
        return s[1].sum() < 10.0, s[1] * 2.0

    def grow(go: Any, x: Any) -> Any:
        return lax.while_loop(lambda s: s[0], doubling, (go, x))[1]

    x = jnp.abs(normal(28, 3)) + 0.5
    trace = tl.trace(grow, jnp.array(True), x)
    replays_like(trace, grow, jnp.array(True), x * 1.05)
    with pytest.raises(tl.GraphDoesNotHold, match="input_1's value converts to False"):
        trace.replay(jnp.array(False), x)

    class Grow(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            go = self.variable("consts", "go", lambda: jnp.array(True))
            return lax.while_loop(lambda s: s[0], doubling, (go.value, x))[1]

    model = Grow()
    variables = model.init(jax.random.key(0), x)
    trace = tl.trace(model.apply, variables, x)
    replays_like(trace, model.apply, variables, x * 1.05)
    with pytest.raises(tl.GraphDoesNotHold, match="identity_1_1's value converts to False"):
        trace.replay({"consts": {"go": jnp.array(False)}}, x)


# -- edits -------------------------------------------------------------------------------------------
def test_fork_edit_that_flips_a_cond() -> None:
    x = positive(31)
    trace = tl.trace(branchy, x)
    (total,) = ops_named(trace, "reduce_sum")
    fork = trace.fork().when(tl.label(total.label), tl.zero_ablate())  # 0 > 0: the cos branch
    with pytest.raises(tl.GraphDoesNotHold, match=decider_of(trace, "sin")):
        fork.replay()
    close(fork.rerun(branchy, x).output, jnp.cos(x))  # cos(x) - 1 + 1

    def halved(value: Any, site: Any) -> Any:
        return value * 0.5  # still positive: the branch holds

    kept = trace.fork().when(tl.label(total.label), halved)
    close(kept.replay(), jnp.sin(x) * 2.0 + 1.0)
    close(kept.replay(positive(32)), jnp.sin(positive(32)) * 2.0 + 1.0)
    with pytest.raises(tl.GraphDoesNotHold):
        kept.replay(-positive(32))


def test_fork_edit_that_changes_a_loop_count() -> None:
    x = with_norm(33, 5.0)
    trace = tl.trace(shrink, x)
    halving = next(op for op in ops_named(trace, "mul") if op.conditions and op.pass_num == 1)  # the body's
    fork = trace.fork().when(tl.label(halving.label), tl.zero_ablate())  # zeros after one halving: the loop stops
    with pytest.raises(tl.GraphDoesNotHold, match="converts to False"):
        fork.replay()
    count, y = fork.rerun(shrink, x).output
    assert int(count) == 1
    close(y, jnp.zeros(6))


def test_edits_captured_live_are_checked_on_new_inputs() -> None:
    """A trace captured with an edit recorded the branch the edited value picked: new inputs keep it."""
    x = positive(34)
    total = ops_named(tl.trace(branchy, x), "reduce_sum")[0].label
    live = tl.trace(branchy, x, intervene=tl.when(tl.label(total), tl.zero_ablate()))
    close(live.output, jnp.cos(x))
    close(live.replay(-positive(35)), jnp.cos(-positive(35)))  # the sum is zeroed whatever the inputs


def test_an_edited_identity_op_is_what_the_model_reads() -> None:
    """A module returning its input gets an identity op; an edit of it is seen by the rest of the forward."""

    class Passthrough(nnx.Module):
        def __call__(self, x: Any) -> Any:
            return x

    class Model(nnx.Module):
        def __init__(self) -> None:
            self.inner = Passthrough()

        def __call__(self, x: Any) -> Any:
            return jnp.sin(self.inner(x)) + 1.0

    model, x = Model(), positive(36)
    trace = tl.trace(model, x)
    (identity,) = ops_named(trace, "identity")
    where = tl.when(tl.label(identity.label), tl.zero_ablate())
    live = tl.trace(model, x, intervene=where)
    close(live.output, jnp.ones_like(x))  # sin(0) + 1
    close(trace.fork().when(tl.label(identity.label), tl.zero_ablate()).replay(), jnp.ones_like(x))


# -- bad inputs --------------------------------------------------------------------------------------
def test_new_inputs_of_another_kind_or_parameters_of_another_shape_are_refused() -> None:
    # (JAX arrays of another shape or dtype, one argument too many: the conformance suite's replay checks)
    trace = tl.trace(branchy, positive(37))
    with pytest.raises(ArgumentTypeError, match="float64"):
        trace.replay(np.ones((4, 3), np.float64))
    with pytest.raises(ArgumentTypeError, match="keyword"):
        trace.replay(positive(37), extra=positive(38))

    class Lin(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(2)(x)

    model, x = Lin(), normal(38, 3, 4)
    variables = model.init(jax.random.key(0), x)
    trace = tl.trace(model.apply, variables, x)
    wrong = jax.tree.map(lambda a: jnp.ones((*a.shape[:-1], 5)), variables)
    with pytest.raises(TorchLensError, match="parameter"):
        trace.replay(wrong, x)
