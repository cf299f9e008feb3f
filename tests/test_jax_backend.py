"""The JAX backend: the zoo traced and audited, module passes, control flow, and no leftovers."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")

import torchlens as tl  # noqa: E402
from torchlens_core.backend.arrays import max_error  # noqa: E402
from torchlens_core.backend.manager import backend_named  # noqa: E402
from torchlens_jax import zoo  # noqa: E402
from torchlens_jax.arrays import array_error  # noqa: E402

CASES = {case.name: case for case in zoo.cases()}


def _run(case: Any, fn: Any) -> Any:
    if case.reset is not None:
        case.reset()
    return fn()


@pytest.fixture(scope="module")
def traced() -> Any:
    """Trace each zoo case once for the whole module: ``traced(name) -> (trace, model, args, kwargs, own)``."""
    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            case = CASES[name]
            model, args, kwargs = case.build()
            own = _run(case, lambda: model(*args, **kwargs))
            trace = _run(case, lambda: tl.trace(model, *args, backend="jax", **kwargs))
            cache[name] = (trace, model, args, kwargs, own)
        return cache[name]

    return get


# -- the zoo -----------------------------------------------------------------------------------
def test_zoo_is_big_enough() -> None:
    assert len(CASES) >= 10
    assert {
        "jnp_mlp",
        "jnp_cnn",
        "nnx_mlp",
        "nnx_cnn",
        "nnx_attention",
        "nnx_residual",
        "eqx_mlp",
        "eqx_cnn",
        "scan_rnn",
        "cond_branch",
        "while_loop",
        "custom_derivatives",
    } <= set(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_zoo_case(name: str, traced: Any) -> None:
    case = CASES[name]
    trace, model, args, kwargs, own = traced(name)
    error = max_error("jax", trace.output, own)
    assert error <= case.rtol, f"trace output differs from the model's own by {error:.3g}"
    report = trace.audit(rtol=case.rtol)
    assert report, str(report)
    assert max_error("jax", trace.replay(), own) <= case.rtol
    if not case.check_modules:
        return
    seen = _run(case, lambda: backend_named("jax").observe_module_outputs(model, args, kwargs))
    recorded = {mp.label: mp for m in trace.modules.values() for mp in m.passes}
    assert seen and set(seen) == set(recorded)
    for label, value in seen.items():
        path, n = label.rsplit(":", 1)
        out = trace.modules[path].passes[int(n) - 1].out
        assert max_error("jax", out, value) <= case.rtol, label


def test_functions_report_no_module_outputs(traced: Any) -> None:
    _, model, args, kwargs, _ = traced("jnp_mlp")
    assert backend_named("jax").observe_module_outputs(model, args, kwargs) == {}


# -- routing and lookup ------------------------------------------------------------------------
def test_auto_routing_for_an_nnx_module() -> None:
    model, args, _ = zoo.nnx_mlp()
    trace = tl.trace(model, *args)
    assert trace.backend == "jax" and "fc1" in trace.modules


def test_auto_routing_for_a_function_of_jax_arrays() -> None:
    trace = tl.trace(lambda a, b: jnp.sin(a) * b, jnp.ones(3), jnp.arange(3.0))
    assert trace.backend == "jax"
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["sin", "mul"]


def test_claim_leaves_other_targets_alone() -> None:
    from torchlens_jax.plugin import backend as plugin

    assert plugin.torchlens_claim(target=lambda x: x, args=(1.0,), kwargs={}) is None
    assert plugin.torchlens_claim(target=lambda x: x, args=(), kwargs={"x": jnp.ones(2)}) == "jax"
    assert plugin.torchlens_claim(target=eqx.nn.Linear(2, 2, key=jax.random.key(0)), args=(), kwargs={}) == "jax"
    assert plugin.torchlens_capture(backend="torch", target=None, args=(), kwargs={}, options=None) is None


def test_named_lookup_and_parameters(traced: Any) -> None:
    trace = traced("nnx_mlp")[0]
    fc1 = trace["fc1"]
    assert fc1.module == "fc1" and fc1.func_name == "add" and fc1.shape == (4, 16)
    assert trace["dot_general_1"].modules == ["fc1:1"]
    assert trace.modules["fc1"].type_name == "Linear"
    assert trace.modules["fc1"].params == ["fc1.bias", "fc1.kernel"]
    kernel = trace.params["fc1.kernel"]
    assert (kernel.shape, kernel.module, kernel.trainable, kernel.is_buffer) == ((6, 16), "fc1", True, False)
    ops = [op for op in trace.ops if any(getattr(a, "name", None) == "fc1.kernel" for a in op.args)]
    assert [op.func_name for op in ops] == ["dot_general"]
    assert "Linear" in trace.summary()


def test_equinox_names_come_from_the_pytree(traced: Any) -> None:
    trace = traced("eqx_mlp")[0]
    assert {"layers.0", "layers.1", "layers.2"} <= set(trace.modules)
    assert "layers.0.weight" in trace.params and trace.params["layers.0.weight"].module == "layers.0"
    assert trace["layers.2"].module == "layers.2"


def test_linen_apply_takes_its_variables_as_parameters(traced: Any) -> None:
    trace = traced("linen_mlp")[0]
    assert list(trace.modules) == ["fc1", "bn", "fc2"]
    assert trace.modules["bn"].type_name == "BatchNorm"
    kernel, mean = trace.params["fc1.kernel"], trace.params["bn.mean"]
    assert (kernel.module, kernel.trainable, kernel.is_buffer) == ("fc1", True, False)
    assert (mean.module, mean.trainable, mean.is_buffer) == ("bn", False, True)
    assert len(trace.input_labels) == 1  # x; the variables are parameters


def test_a_bound_method_of_a_module_is_traced_with_its_modules() -> None:
    class Encoder(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.fc = nnx.Linear(3, 4, rngs=rngs)

        def encode(self, x: Any) -> Any:
            return jnp.tanh(self.fc(x))

    model = Encoder(nnx.Rngs(0))
    trace = tl.trace(model.encode, jnp.ones((2, 3)))
    assert trace.audit() and trace.modules["fc"].num_passes == 1 and "fc.kernel" in trace.params


def test_nnx_buffers_and_rng_state_are_not_trainable(traced: Any) -> None:
    trace = traced("nnx_residual")[0]
    count = trace.params["drop.rngs.count"]
    assert count.is_buffer and not count.trainable and count.module == "drop"
    assert trace.modules["proj"].num_passes == 2  # called twice
    assert trace["proj:2"].modules[-1] == "proj:2"


def test_tracing_leaves_an_nnx_model_unchanged() -> None:
    model, args, kwargs, _ = zoo.nnx_residual()
    before = int(model.drop.rngs.count[...])
    tl.trace(model, *args, **kwargs)
    assert int(model.drop.rngs.count[...]) == before


# -- control flow ------------------------------------------------------------------------------
def test_scan_iterations_are_passes(traced: Any) -> None:
    trace, _, (_, xs), _, _ = traced("scan_rnn")
    tanh = [op for op in trace.ops if op.func_name == "tanh"]
    assert len(tanh) == xs.shape[0] and all(op.num_passes == xs.shape[0] for op in tanh)
    assert [op.pass_num for op in tanh] == list(range(1, xs.shape[0] + 1))
    assert trace.notes["expanded"]["scan"] == 1


def test_scan_module_calls_are_passes(traced: Any) -> None:
    trace, _, (xs,), _, _ = traced("nnx_scan_rnn")
    steps = xs.shape[0]
    assert trace.modules["cell"].num_passes == steps
    assert trace.modules["cell.ih"].num_passes == steps
    assert trace.modules["head"].num_passes == 1
    assert trace["cell:3"].modules == ["cell:3"]


def test_cond_records_only_the_branch_taken() -> None:
    f, (x,), _ = zoo.cond_branch()
    funcs = {}
    for sign in (1.0, -1.0):
        trace = tl.trace(f, sign * jnp.abs(x), backend="jax")
        assert trace.audit()
        funcs[sign] = [op.func_name for op in trace.ops if op.kind == "op"]
    assert "sin" in funcs[1.0] and "cos" not in funcs[1.0]
    assert "cos" in funcs[-1.0] and "sin" not in funcs[-1.0]


def test_while_loop_iterations_are_passes(traced: Any) -> None:
    trace, _, _, _, (n, _) = traced("while_loop")
    n = int(n)
    tests = [op for op in trace.ops if op.func_name == "ge"]  # the loop condition: checked n + 1 times
    assert n > 1 and len(tests) == n + 1 and {op.num_passes for op in tests} == {n + 1}
    mul_layers = {op.layer_label: op.num_passes for op in trace.ops if op.func_name == "mul"}
    assert sorted(mul_layers.values()) == [n, n + 1]  # the halving in the body; the squares in the norm


def test_higher_order_primitives_are_expanded_not_dropped(traced: Any) -> None:
    trace = traced("custom_derivatives")[0]
    assert {"custom_jvp_call", "custom_vjp_call", "remat2", "jit"} <= set(trace.notes["expanded"])
    assert trace.notes["opaque"] == {}
    funcs = {op.func_name for op in trace.ops}
    assert not funcs & {"custom_jvp_call", "custom_vjp_call", "remat2", "jit", "pjit"}
    assert {"tanh", "max", "dot_general"} <= funcs


def test_empty_and_reversed_scans() -> None:
    def f(xs: Any) -> Any:
        c, ys = jax.lax.scan(lambda c, x: (c + x, jnp.sin(x)), 0.0, xs, reverse=True)
        c0, ys0 = jax.lax.scan(lambda c, x: (c * x, jnp.cos(x)), 1.0, xs[:0])
        return c, ys, c0, ys0

    trace = tl.trace(f, jnp.arange(1.0, 4.0), backend="jax")
    assert trace.audit(), str(trace.audit())
    assert max_error("jax", trace.output, f(jnp.arange(1.0, 4.0))) == 0.0


# -- module outputs ----------------------------------------------------------------------------
class _Passthrough(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.drop = nnx.Dropout(0.5, deterministic=True)  # returns its input as it is
        self.lin = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return {"y": self.lin(self.drop(x)), "x": x, "kernel": self.lin.kernel[...]}


def test_a_module_returning_its_input_gets_an_identity_op() -> None:
    trace = tl.trace(_Passthrough(nnx.Rngs(0)), jnp.ones((2, 3)), backend="jax")
    assert trace.audit(), str(trace.audit())
    drop = trace["drop"]
    assert drop.func_name == "identity" and drop.modules == ["drop:1"] and drop.parents == ["input_1"]
    assert list(trace.output) == ["y", "x", "kernel"]


class _Pair(NamedTuple):
    main: Any
    extras: dict[str, Any]


class _Structured(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.lin = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        y = self.lin(x)
        return _Pair(y * 2.0, {"zeros": jnp.zeros(3), "y": y, "one": jnp.float32(1.0)})  # keys not sorted


class _UsesStructured(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.a = _Structured(rngs)
        self.b = _Structured(rngs)

    def __call__(self, x: Any) -> Any:
        p = self.a(x)
        q = self.b(p.main)
        return q.extras["y"] + p.extras["zeros"] + q.extras["one"], p


def test_structured_module_outputs_keep_their_structure_and_order() -> None:
    model, x = _UsesStructured(nnx.Rngs(0)), jnp.ones((2, 3))
    trace = tl.trace(model, x)
    assert trace.audit(), str(trace.audit())
    out = trace.modules["a"].passes[0].out
    assert isinstance(out, _Pair) and list(out.extras) == ["zeros", "y", "one"]
    assert trace["a"].out.extras["one"] == 1.0  # a module with several outputs is found as its pass
    seen = backend_named("jax").observe_module_outputs(model, (x,), {})
    assert set(seen) == {"a:1", "a.lin:1", "b:1", "b.lin:1"}
    for label, value in seen.items():
        path, n = label.rsplit(":", 1)
        assert max_error("jax", trace.modules[path].passes[int(n) - 1].out, value) == 0.0


# -- nothing left behind -----------------------------------------------------------------------
class _Boom(nnx.Module):
    def __init__(self, exc: BaseException, rngs: Any) -> None:
        self.lin = nnx.Linear(3, 3, rngs=rngs)
        self.exc = exc

    def __call__(self, x: Any) -> Any:
        self.lin(x)
        raise self.exc


def test_wrappers_are_removed_after_capture_and_after_errors() -> None:
    original = nnx.Linear.__dict__["__call__"]
    model, args, _ = zoo.nnx_mlp()
    tl.trace(model, *args)
    assert type(model.fc1).__call__ is original
    for exc in (ValueError("inside the model"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            tl.trace(_Boom(exc, nnx.Rngs(0)), jnp.ones((2, 3)), backend="jax")
        assert nnx.Linear.__call__ is original
    eqx_original = eqx.nn.Linear.__dict__["__call__"]
    model, args, _ = zoo.eqx_mlp()
    tl.trace(model, *args)
    assert type(model.layers[0]).__call__ is eqx_original


def test_unsupported_targets_say_why() -> None:
    import flax.linen as nn

    with pytest.raises(tl.UnsupportedError, match="model.apply"):
        tl.trace(nn.Dense(3), jnp.ones((2, 3)), backend="jax")
    with pytest.raises(tl.UnsupportedError, match="lax.cond"):
        tl.trace(lambda v: v * 2 if v.sum() > 0 else v, jnp.ones(3), backend="jax")


def test_importing_torchlens_imports_no_jax() -> None:
    code = (
        "import sys, torchlens as tl, torchlens_jax.plugin\n"
        "tl.backends()\n"
        "print(sorted(m for m in ('jax', 'jaxlib', 'flax', 'equinox') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# -- identity and arrays -----------------------------------------------------------------------
def test_backend_info() -> None:
    listed = {b["name"]: b for b in tl.backends()}["jax"]
    assert listed["available"] and listed["install"] == "pip install 'torchlens[jax]'"
    assert {"modules", "functions", "control_flow"} <= set(listed["capabilities"])
    assert "in_place" not in listed["capabilities"]  # JAX arrays are immutable: nothing to protect


def test_to_numpy_copies() -> None:
    to_numpy = backend_named("jax").to_numpy
    out = to_numpy(jnp.arange(3))
    assert isinstance(out, np.ndarray) and out.tolist() == [0, 1, 2]
    assert to_numpy(jax.random.key(0)).shape == (2,)  # a key's raw data


def test_array_error() -> None:
    a = jnp.array([1.0, 2.0, jnp.nan, jnp.inf])
    assert array_error(a, a) == 0.0
    assert array_error(a, a.at[0].set(1.5)) == pytest.approx(0.5 / 2.5)
    assert array_error(a, a.at[2].set(0.0)) == float("inf")
    assert array_error(a, a.at[3].set(-jnp.inf)) == float("inf")
    assert array_error(a, a[:3]) == float("inf")
    assert array_error(a, a.astype(jnp.float16)) == float("inf")
    assert array_error(jnp.array([0, 1], jnp.uint8), jnp.array([1, 0], jnp.uint8)) == 1.0
    key = jax.random.key(0)
    assert array_error(key, key) == 0.0
    info = backend_named("jax").array_info
    assert info(jnp.ones((2, 3))) == ((2, 3), "float32", "cpu")
    assert info(np.ones(2, np.int8)) == ((2,), "int8", "cpu")
    assert info(3.0) is None
