"""The JAX module observer for plain functions: the module calls inside ``fn`` as linen and equinox show them.

``tl.trace(fn, x)`` records the modules ``fn`` calls; the conformance suite's
module check compares them with this observer, which must see the calls the
framework's own way (linen's interceptor and scope paths, equinox's calls) and
agree with linen's ``capture_intermediates``, an independent reference.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nn = pytest.importorskip("flax.linen")
eqx = pytest.importorskip("equinox")

import jax.numpy as jnp  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.conformance import checks  # noqa: E402
from torchlens.conformance.checks import Traced  # noqa: E402
from torchlens_core.backend.cases import Case  # noqa: E402
from torchlens_jax.observe import observe_function_modules  # noqa: E402


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.relu(nn.Dense(6)(x))


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        block = Block()
        x = block(block(nn.Dense(6)(x)))  # one block called twice: two passes
        return nn.Dense(3)(x)


NET = Net()
X = jax.random.normal(jax.random.key(0), (2, 4))
VARIABLES = NET.init(jax.random.key(1), X)


def forward(x):
    return NET.apply(VARIABLES, x) * 2


def _traced(fn, x):
    trace = tl.trace(fn, x, backend="jax")
    return Traced("jax", Case("fn", lambda: (fn, (x,), {})), fn, (x,), {}, trace, fn(x))


def test_linen_calls_in_a_function_equal_capture_intermediates():
    seen = observe_function_modules(forward, (X,), {})
    _, state = NET.apply(VARIABLES, X, capture_intermediates=True, mutable=["intermediates"])
    reference = {}
    for path, value in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]:
        keys = [p.key for p in path if hasattr(p, "key")]
        if keys[-1] == "__call__" and len(keys) > 1:
            reference[f"{'.'.join(keys[:-1])}:{path[-1].idx + 1}"] = np.asarray(value)
    assert set(seen) == set(reference) and "Block_0:2" in seen
    for key, value in reference.items():
        np.testing.assert_array_equal(seen[key], value)


def test_the_suite_checks_a_function_s_module_outputs_and_catches_a_wrong_one():
    traced = _traced(forward, X)
    assert "Block_0" in traced.trace.modules
    checks.test_module_outputs(traced)  # the trace's module outputs are what linen saw
    second = traced.trace.modules["Block_0"].passes[1]
    first = traced.trace.modules["Block_0"].passes[0]
    second.out_template = first.out_template  # the second pass now claims the first one's output
    with pytest.raises(AssertionError, match="Block_0"):
        checks.test_module_outputs(traced)


def test_equinox_calls_in_a_function():
    mlp = eqx.nn.MLP(4, 3, 5, depth=2, key=jax.random.key(2))

    def fn(x):
        return jax.vmap(mlp)(x).sum()

    seen = observe_function_modules(fn, (X,), {})
    assert {"layers.0:1", "layers.1:1", "layers.2:1"} <= set(seen)  # under vmap: seen, values abstract
    single = observe_function_modules(lambda x: mlp(x[0]), (X,), {})
    np.testing.assert_allclose(single["layers.0:1"], np.asarray(mlp.layers[0](X[0])), rtol=1e-6)


def test_without_modules_nothing_is_seen_and_several_top_level_modules_are_not_guessed():
    assert observe_function_modules(lambda x: jnp.tanh(x), (X,), {}) == {}
    other = Net()

    def two(x):
        return NET.apply(VARIABLES, x) + other.apply(VARIABLES, x)

    assert observe_function_modules(two, (X,), {}) is None
