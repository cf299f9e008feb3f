"""Per-op gradients on JAX, checked against jax.grad of hand-written copies of the models with a zero added
at the activation in question (the gradient with respect to that zero is the activation's, by JAX alone)."""

from __future__ import annotations

from typing import Any

import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_core.ir.records import GRAD_NO_DEPENDENCE, GRAD_NOT_DIFFERENTIABLE  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


def _ops(trace: Any, func: str) -> list[Any]:
    return [op for op in trace.ops if op.func_name == func]


def _close(got: Any, expected: Any) -> None:
    assert got is not None
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), **TOL)


def _normal(seed: int, *shape: int) -> Any:
    return jax.random.normal(jax.random.key(seed), shape)


# -- plain functions: every op, the inputs, the parameters passed as a pytree ------------------
def _mlp(params: dict[str, Any], x: Any) -> Any:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.sin(h @ params["w2"])


def test_every_op_of_an_mlp_matches_jax_grad_with_a_zero_added_there() -> None:
    params = {"w1": _normal(0, 4, 8), "b1": _normal(1, 8), "w2": _normal(2, 8, 3)}
    x = _normal(3, 5, 4)
    trace = tl.trace(_mlp, params, x, save_grads=True)
    trace.log_backward(lambda out: (out**2).sum())

    def perturbed(params: dict[str, Any], x: Any, d: list[Any]) -> Any:
        pre = x @ params["w1"] + params["b1"] + d[0]
        h = jnp.tanh(pre) + d[1]
        z = h @ params["w2"] + d[2]
        return (jnp.sin(z) ** 2).sum()

    zeros = [jnp.zeros((5, 8)), jnp.zeros((5, 8)), jnp.zeros((5, 3))]
    g_params, g_x, g_d = jax.grad(perturbed, argnums=(0, 1, 2))(params, x, zeros)
    _close(_ops(trace, "add")[0].grad, g_d[0])
    _close(_ops(trace, "tanh")[0].grad, g_d[1])
    _close(_ops(trace, "dot_general")[1].grad, g_d[2])
    _close(_ops(trace, "sin")[0].grad, 2 * jnp.sin(jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]))
    args = trace.call.args
    _close(trace.ops[args[1].index].grad, g_x)
    for name in params:  # a params dict passed as an argument: its arrays are inputs of the trace
        _close(trace.ops[args[0][name].index].grad, g_params[name])
    assert all(op.grad_status == "saved" for op in trace.ops if op.kind != "output")


# -- nnx: parameters, module outputs --------------------------------------------------------
class _Net(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.fc1 = nnx.Linear(4, 8, rngs=rngs)
        self.fc2 = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.fc2(nnx.gelu(self.fc1(x)))


def test_nnx_parameters_and_module_outputs_match_jax_grad() -> None:
    model = _Net(nnx.Rngs(0))
    x = _normal(4, 3, 4)
    trace = tl.trace(model, x, save_grads=True)
    trace.log_backward(lambda out: out.mean())
    graphdef, state = nnx.split(model, nnx.Param)

    def loss(state: Any, d: Any) -> Any:
        m = nnx.merge(graphdef, state)
        return m.fc2(nnx.gelu(m.fc1(x) + d)).mean()

    g_state, g_d = jax.grad(loss, argnums=(0, 1))(state, jnp.zeros((3, 8)))
    _close(trace.modules["fc1"].passes[0].grad, g_d)  # the gradient at what the module call returned
    _close(trace.params["fc1.kernel"].grad, g_state["fc1"]["kernel"][...])
    _close(trace.params["fc2.bias"].grad, g_state["fc2"]["bias"][...])


def test_linen_variables_params_get_gradients_and_batch_statistics_none() -> None:
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.BatchNorm(use_running_average=True, name="bn")(nn.Dense(5, name="fc1")(x))
            return nn.Dense(2, name="fc2")(jnp.tanh(x))

    model = MLP()
    x = _normal(5, 3, 4)
    variables = model.init(jax.random.key(0), x)
    trace = tl.trace(model.apply, variables, x, save_grads=True)
    trace.log_backward(lambda out: (out * out).sum())
    expected = jax.grad(lambda p: (model.apply({**variables, "params": p}, x) ** 2).sum())(variables["params"])
    _close(trace.params["fc1.kernel"].grad, expected["fc1"]["kernel"])
    _close(trace.params["bn.scale"].grad, expected["bn"]["scale"])
    assert trace.params["bn.mean"].grad is None  # a batch statistic, not a trainable parameter


# -- control flow the walk expands -----------------------------------------------------------
def test_each_scan_step_has_its_own_gradient() -> None:
    w_x, w_h, xs = _normal(6, 3, 4), _normal(7, 4, 4) * 0.5, _normal(8, 5, 2, 3)

    def rnn(w_x: Any, w_h: Any, xs: Any) -> Any:
        def step(h: Any, x: Any) -> tuple[Any, Any]:
            h = jnp.tanh(x @ w_x + h @ w_h)
            return h, h

        return jax.lax.scan(step, jnp.zeros((2, 4)), xs)[0]

    trace = tl.trace(rnn, w_x, w_h, xs, save_grads=True)
    trace.log_backward(lambda out: jnp.sum(out**3))

    def unrolled(d: list[Any]) -> Any:  # the same recurrence by hand, a zero after each step's tanh
        h = jnp.zeros((2, 4))
        for t in range(5):
            h = jnp.tanh(xs[t] @ w_x + h @ w_h) + d[t]
        return jnp.sum(h**3)

    expected = jax.grad(unrolled)([jnp.zeros((2, 4))] * 5)
    tanhs = _ops(trace, "tanh")
    assert len(tanhs) == 5
    for op, g in zip(tanhs, expected):
        _close(op.grad, g)
    _close(trace.ops[trace.call.args[0].index].grad, jax.grad(lambda w: jnp.sum(rnn(w, w_h, xs) ** 3))(w_x))


def test_cond_jit_and_while_bodies_have_gradients() -> None:
    x = _normal(9, 6) + 2.0

    @jax.jit
    def inner(v: Any) -> Any:
        return jnp.exp(v * 0.3)

    def f(x: Any) -> Any:
        y = jax.lax.cond(x.sum() > 0, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.cos(v), x)
        y = inner(y)
        return jax.lax.while_loop(lambda s: jnp.sum(s**2) > 1.0, lambda s: s * 0.5, y)

    trace = tl.trace(f, x, save_grads=True)
    trace.log_backward(lambda out: out.sum())
    assert float(x.sum()) > 0
    n = len(_ops(trace, "mul")) - 2  # the while iterations: the other two are the branch's and inner's

    def by_hand(x: Any, d_sin: Any, d_exp: Any) -> Any:  # the branch and iterations taken, written out
        y = jnp.exp((jnp.sin(x) + d_sin) * 2.0 * 0.3) + d_exp
        for _ in range(n):
            y = y * 0.5
        return y.sum()

    g_x, g_sin, g_exp = jax.grad(by_hand, argnums=(0, 1, 2))(x, jnp.zeros(6), jnp.zeros(6))
    _close(_ops(trace, "sin")[0].grad, g_sin)
    _close(_ops(trace, "exp")[0].grad, g_exp)
    _close(trace["input_1"].grad, g_x)
    assert n >= 1 and all(op.grad is not None for op in _ops(trace, "mul"))


# -- custom derivative rules -----------------------------------------------------------------
def test_custom_rules_are_jax_s_not_the_equations() -> None:
    @jax.custom_vjp
    def round_ste(x: Any) -> Any:  # a straight-through estimator: round's own derivative is 0
        return jnp.round(x)

    round_ste.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))

    def f(x: Any) -> Any:
        return (jax.nn.relu(x) * 3.0 + round_ste(x * 2.0)).sum()

    x = jnp.array([-1.0, 0.0, 0.0, 0.7, 2.2])  # relu's rule gives 0 at 0, max(x, 0)'s equations 1/2
    trace = tl.trace(f, x, save_grads=True)
    trace.log_backward(lambda out: out)
    _close(trace["input_1"].grad, jax.grad(f)(x))
    _close(trace["input_1"].grad, jnp.array([2.0, 2.0, 2.0, 5.0, 5.0]))
    _close(_ops(trace, "round")[0].grad, jnp.ones(5))  # the call's output: the gradient JAX passes into the rule


def test_ops_with_several_outputs_get_the_output_s_structure() -> None:
    x, y = _normal(10, 7), _normal(11, 7)

    def f(x: Any, y: Any) -> Any:
        keys, vals = jax.lax.sort((x, y), num_keys=1)
        top, idx = jax.lax.top_k(vals * keys, 3)
        return top.sum() * 2.0 + (vals**2).sum() + idx.sum().astype(jnp.float32)

    trace = tl.trace(f, x, y, save_grads=True)
    trace.log_backward(lambda out: out)

    def by_hand(d_keys: Any, d_vals: Any, d_top: Any) -> Any:
        keys, vals = jax.lax.sort((x, y), num_keys=1)
        keys, vals = keys + d_keys, vals + d_vals
        top, idx = jax.lax.top_k(vals * keys, 3)
        top = top + d_top
        return top.sum() * 2.0 + (vals**2).sum() + idx.sum().astype(jnp.float32)

    g_keys, g_vals, g_top = jax.grad(by_hand, argnums=(0, 1, 2))(jnp.zeros(7), jnp.zeros(7), jnp.zeros(3))
    sort, top_k = _ops(trace, "sort")[0], _ops(trace, "top_k")[0]
    assert isinstance(sort.grad, tuple) and len(sort.grad) == 2
    _close(sort.grad[0], g_keys)
    _close(sort.grad[1], g_vals)
    _close(top_k.grad[0], g_top)
    assert top_k.grad[1] is None  # the indices are integers
    _close(trace["input_1"].grad, jax.grad(f)(x, y))


# -- statuses, selectors, refusals -----------------------------------------------------------
def test_statuses_say_why_an_op_has_no_gradient() -> None:
    def two_heads(x: Any) -> Any:
        a = jnp.sin(x)
        b = jnp.cos(x)
        stopped = jax.lax.stop_gradient(jnp.exp(x))
        return a * stopped, b, jnp.argmax(x)

    x = _normal(12, 5)
    trace = tl.trace(two_heads, x, save_grads=True)
    trace.log_backward(lambda out: out[0].sum())
    _close(_ops(trace, "sin")[0].grad, jnp.exp(x))
    assert _ops(trace, "cos")[0].grad is None and _ops(trace, "cos")[0].grad_status == GRAD_NO_DEPENDENCE
    assert _ops(trace, "exp")[0].grad_status == GRAD_NO_DEPENDENCE  # only through stop_gradient
    assert _ops(trace, "argmax")[0].grad_status == GRAD_NOT_DIFFERENTIABLE
    _close(trace["input_1"].grad, jnp.cos(x) * jnp.exp(x))
    # (ops save_grads= did not select: the conformance suite's, on every backend)


def test_gradients_are_refused_where_they_cannot_be_given() -> None:
    # (save_grads= with halt=, no save_grads=, a loss of several numbers: the conformance suite's, on every backend)
    x = _normal(13, 3, 4)
    model = _Net(nnx.Rngs(1))
    trace = tl.trace(model, x, save_grads=True)
    with pytest.raises(tl.UnsupportedError, match="function of the trace's output"):
        trace.log_backward(trace.output.sum())
    trace.log_backward(lambda out: out.sum())  # a refused call leaves the trace usable
    assert trace.params["fc1.kernel"].grad is not None


def test_the_user_s_model_is_untouched_by_a_training_mode_backward() -> None:
    class Norm(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.fc = nnx.Linear(4, 4, rngs=rngs)
            self.bn = nnx.BatchNorm(4, use_running_average=False, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.bn(self.fc(x))

    model = Norm(nnx.Rngs(2))
    x = _normal(14, 6, 4)
    before = jax.tree.map(np.asarray, nnx.state(model))
    trace = tl.trace(model, x, save_grads=True)
    trace.log_backward(lambda out: (out**2).sum())
    after = jax.tree.map(np.asarray, nnx.state(model))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)
    expected = nnx.grad(lambda m: (m(x) ** 2).sum())(nnx.clone(model))  # nnx's own, on a copy
    _close(trace.params["fc.kernel"].grad, expected["fc"]["kernel"][...])


def test_a_loaded_trace_refuses_a_custom_derivative_it_no_longer_has(tmp_path: Any) -> None:
    # (a loaded trace's gradients, otherwise those of the live one: the conformance suite's, on every backend)
    x = _normal(15, 3, 4)
    relu = tl.trace(lambda v: jax.nn.relu(v) * 2.0, x, save_grads=True)
    again = tl.load(tl.save(relu, tmp_path / "relu"))
    with pytest.raises(tl.UnsupportedError, match="relu"):  # its custom_jvp rule is code, not saved
        again.log_backward(lambda out: out.sum())
