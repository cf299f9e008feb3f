"""jax: modules called inside a traced function get their paths and passes (torchlens_jax.function_modules).

Every module output is checked against the framework's own computation of that
submodule: linen's ``capture_intermediates``, or the nnx / equinox submodule
called directly on its input, computed by hand outside TorchLens.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")

import torchlens as tl  # noqa: E402
from torchlens_jax import compiled  # noqa: E402

TOL = 1e-5


def close(actual: Any, expected: Any, tol: float = TOL) -> None:
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, (a.shape, e.shape)
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol)


def traced(fn: Any, *args: Any, **options: Any) -> Any:
    """``tl.trace`` on the JAX backend, audited against an untraced run while ``fn`` is alive (a trace holds
    its function weakly)."""
    trace = tl.trace(fn, *args, backend="jax", **options)
    report = trace.audit(untraced=True)
    assert report, str(report)
    return trace


def out(trace: Any, path: str, n: int = 1) -> Any:
    return trace.modules[path].passes[n - 1].out


def structure(trace: Any) -> list[tuple[Any, ...]]:
    """What each op is and which module calls it ran in and returned from."""
    return [(op.func_name, op.module_passes, op.module_outputs) for op in trace.ops if op.kind == "op"]


# -- flax.linen ---------------------------------------------------------------------------------
class CNN(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


class Head(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        return nn.Dense(2)(jnp.tanh(nn.Dense(5)(x)))


X_IMG = jax.random.normal(jax.random.key(0), (2, 6, 6, 1))
CNN_M, HEAD_M = CNN(), Head()
CNN_V = CNN_M.init(jax.random.key(1), X_IMG)
HEAD_V = HEAD_M.init(jax.random.key(2), jnp.ones((2, 3)))


def intermediates(module: Any, variables: Any, x: Any) -> dict[str, Any]:
    """linen's own record of each submodule's output for one apply: {"Conv_0": out, ...}."""
    _, state = module.apply(variables, x, capture_intermediates=True, mutable=["intermediates"])
    return {k: v["__call__"][0] for k, v in state["intermediates"].items() if k != "__call__"}


def test_linen_apply_inside_a_function_has_the_paths_of_apply() -> None:
    direct = tl.trace(CNN_M.apply, CNN_V, X_IMG)
    trace = traced(lambda x: CNN_M.apply(CNN_V, x), X_IMG)
    assert list(trace.modules) == list(direct.modules) == ["Conv_0", "Dense_0"]
    assert [trace.modules[p].type_name for p in trace.modules] == ["Conv", "Dense"]
    assert structure(trace) == structure(direct)  # the same ops, in the same module passes
    for path, value in intermediates(CNN_M, CNN_V, X_IMG).items():
        close(out(trace, path), value)


def test_a_linen_module_applied_twice_is_two_passes() -> None:
    trace = traced(lambda x: CNN_M.apply(CNN_V, x) + CNN_M.apply(CNN_V, x * 2.0), X_IMG)
    assert list(trace.modules) == ["Conv_0", "Dense_0"]
    assert [trace.modules[p].num_passes for p in trace.modules] == [2, 2]
    for n, x in ((1, X_IMG), (2, X_IMG * 2.0)):
        for path, value in intermediates(CNN_M, CNN_V, x).items():
            close(out(trace, path, n), value)
    assert trace["Dense_0:2"].module_passes[-1] == ("Dense_0", 2)


def test_two_linen_modules_in_one_function_are_named_by_their_variables() -> None:
    cnn, head = CNN_M, HEAD_M

    def fn(x: Any) -> Any:
        return head.apply(HEAD_V, cnn.apply(CNN_V, x))

    trace = traced(fn, X_IMG)
    assert set(trace.modules) == {"cnn", "cnn.Conv_0", "cnn.Dense_0", "head", "head.Dense_0", "head.Dense_1"}
    assert (trace.modules["cnn"].type_name, trace.modules["head"].type_name) == ("CNN", "Head")
    features = CNN_M.apply(CNN_V, X_IMG)
    close(out(trace, "cnn"), features)  # each top-level module's own call is a pass, returning what apply does
    close(out(trace, "head"), HEAD_M.apply(HEAD_V, features))
    for prefix, module, variables, x in (("cnn", CNN_M, CNN_V, X_IMG), ("head", HEAD_M, HEAD_V, features)):
        for path, value in intermediates(module, variables, x).items():
            close(out(trace, f"{prefix}.{path}"), value)
    # no collision: the two Dense_0 are two modules, each called once, each in its own module's pass
    assert trace.modules["cnn.Dense_0"].num_passes == trace.modules["head.Dense_0"].num_passes == 1
    dense = trace.modules["head.Dense_0"].passes[0]
    assert all(("head", 1) in trace[label].module_passes for label in dense.ops)


def test_linen_bound_modules_and_variables_passed_as_arguments() -> None:
    bound = CNN_M.bind(CNN_V)
    reference = intermediates(CNN_M, CNN_V, X_IMG)
    for trace in (traced(lambda x: bound(x), X_IMG), traced(lambda v, x: CNN_M.apply(v, x), CNN_V, X_IMG)):
        assert list(trace.modules) == ["Conv_0", "Dense_0"]
        for path, value in reference.items():
            close(out(trace, path), value)


class Encoder(nn.Module):
    def setup(self) -> None:
        self.inner = nn.Dense(4)
        self.out = nn.Dense(2)

    def __call__(self, x: Any) -> Any:
        return self.out(nn.relu(self.inner(x)))


def test_a_submodule_called_by_the_function_keeps_its_path_in_its_module() -> None:
    encoder, x = Encoder(), jnp.arange(6.0).reshape(2, 3)
    variables = encoder.init(jax.random.key(6), x)
    bound = encoder.bind(variables)
    trace = traced(lambda x: bound.out(bound.inner(x)), x)
    assert [(p, m.num_passes) for p, m in trace.modules.items()] == [("inner", 1), ("out", 1)]
    h = x @ variables["params"]["inner"]["kernel"] + variables["params"]["inner"]["bias"]
    close(out(trace, "inner"), h)
    close(out(trace, "out"), h @ variables["params"]["out"]["kernel"] + variables["params"]["out"]["bias"])


# -- flax.nnx -----------------------------------------------------------------------------------
class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.fc1 = nnx.Linear(3, 6, rngs=rngs)
        self.fc2 = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.fc2(nnx.relu(self.fc1(x)))

    def encode(self, x: Any) -> Any:
        return self.fc1(x)


MODEL = MLP(nnx.Rngs(0))
OTHER = MLP(nnx.Rngs(1))
X = jax.random.normal(jax.random.key(3), (4, 3))


def by_hand(model: MLP, x: Any) -> dict[str, Any]:
    """Each submodule called directly on what it receives."""
    h = model.fc1(x)
    return {"fc1": h, "fc2": model.fc2(nnx.relu(h))}


def closure_fn(x: Any) -> Any:
    return MODEL(x)


@pytest.mark.parametrize("how", ["lambda", "global", "argument", "method"])
def test_an_nnx_model_inside_a_function_has_the_paths_of_the_model(how: str) -> None:
    direct = tl.trace(MODEL, X)
    model = MODEL
    trace = {
        "lambda": lambda: traced(lambda x: model(x), X),
        "global": lambda: traced(closure_fn, X),
        "argument": lambda: traced(lambda m, x: m(x), MODEL, X),
        "method": lambda: traced(lambda x: model.encode(x), X),
    }[how]()
    assert list(trace.modules) == list(direct.modules) == ["fc1", "fc2"]
    expected = by_hand(MODEL, X)
    close(out(trace, "fc1"), expected["fc1"])
    if how == "method":  # fc2 is a module of the model, never called by encode
        assert trace.modules["fc2"].num_passes == 0
        return
    assert structure(trace) == structure(direct)
    close(out(trace, "fc2"), expected["fc2"])


def test_an_nnx_model_called_twice_is_two_passes() -> None:
    model = MODEL
    trace = traced(lambda x: model(model(x)), X)
    assert [trace.modules[p].num_passes for p in ("fc1", "fc2")] == [2, 2]
    first = by_hand(MODEL, X)
    second = by_hand(MODEL, first["fc2"])
    for path in ("fc1", "fc2"):
        close(out(trace, path, 1), first[path])
        close(out(trace, path, 2), second[path])


def test_two_nnx_models_of_one_class_are_named_by_their_variables() -> None:
    enc, dec = MODEL, OTHER
    trace = traced(lambda x: dec(enc(x)), X)
    assert list(trace.modules) == ["enc", "enc.fc1", "enc.fc2", "dec", "dec.fc1", "dec.fc2"]
    first = by_hand(MODEL, X)
    second = by_hand(OTHER, first["fc2"])
    close(out(trace, "enc"), first["fc2"])
    close(out(trace, "dec"), second["fc2"])
    for path in ("fc1", "fc2"):
        close(out(trace, f"enc.{path}"), first[path])
        close(out(trace, f"dec.{path}"), second[path])
    assert trace["dec.fc1"].module_passes == (("dec", 1), ("dec.fc1", 1))


def test_modules_no_variable_names_are_named_by_type_and_order() -> None:
    holder = types.SimpleNamespace(inner=types.SimpleNamespace(a=MODEL, b=OTHER))  # deeper than a name reaches
    trace = traced(lambda x: holder.inner.b(holder.inner.a(x)), X)
    assert list(trace.modules) == ["MLP_0", "MLP_0.fc1", "MLP_0.fc2", "MLP_1", "MLP_1.fc1", "MLP_1.fc2"]
    close(out(trace, "MLP_0.fc1"), by_hand(MODEL, X)["fc1"])
    close(out(trace, "MLP_1.fc2"), by_hand(OTHER, MODEL(X))["fc2"])


def test_a_list_of_models_is_named_by_position() -> None:
    models = [MODEL, OTHER]
    trace = traced(lambda x: models[1](models[0](x)), X)
    assert {"models.0.fc1", "models.1.fc2"} <= set(trace.modules)
    close(out(trace, "models.1.fc2"), OTHER(MODEL(X)))


# -- equinox ------------------------------------------------------------------------------------
EQX = eqx.nn.MLP(3, 2, 5, 2, key=jax.random.key(4))
V = jax.random.normal(jax.random.key(5), (3,))


@pytest.mark.parametrize("how", ["closure", "argument"])
def test_an_equinox_model_inside_a_function_has_the_paths_of_the_model(how: str) -> None:
    model = EQX
    direct = tl.trace(EQX, V)
    trace = traced(lambda v: model(v), V) if how == "closure" else traced(lambda m, v: m(v), EQX, V)
    assert list(trace.modules) == list(direct.modules) == ["layers.0", "layers.1", "layers.2"]
    assert structure(trace) == structure(direct)
    h = V
    for i, layer in enumerate(EQX.layers):  # each layer by hand, on what the previous one gave
        h = layer(h)
        close(out(trace, f"layers.{i}"), h)
        h = EQX.activation(h) if i < len(EQX.layers) - 1 else h


# -- jit, the compiled capture path -------------------------------------------------------------
def test_a_jitted_function_called_before_keeps_its_module_paths() -> None:
    # JAX keeps the trace of a jitted function: one made by a plain call would hide the module calls
    fn = jax.jit(lambda x: CNN_M.apply(CNN_V, x))
    fn(X_IMG)
    for _ in range(2):
        trace = traced(fn, X_IMG)
        assert [(p, m.num_passes) for p, m in trace.modules.items()] == [("Conv_0", 1), ("Dense_0", 1)]
        close(out(trace, "Conv_0"), intermediates(CNN_M, CNN_V, X_IMG)["Conv_0"])


def test_repeat_captures_of_a_function_hit_the_cached_executable(monkeypatch: Any) -> None:
    monkeypatch.setattr(compiled, "COMPILE_ON_SIGHTING", 2)
    compiled.CACHE.clear()
    enc, dec = MLP(nnx.Rngs(7)), MLP(nnx.Rngs(8))
    x = jax.random.normal(jax.random.key(9), (5, 3))

    def fn(x: Any) -> Any:
        return dec(enc(x)) + CNN_M.apply(CNN_V, X_IMG).sum()

    start = compiled.CACHE.compiles
    traces = [tl.trace(fn, x, backend="jax") for _ in range(3)]
    assert compiled.CACHE.compiles == start + 1  # compiled on the second capture, reused by the third
    assert "compiled" not in traces[0].notes
    assert not traces[1].notes["compiled"]["cached"] and traces[2].notes["compiled"]["cached"]
    monkeypatch.setattr(compiled, "COMPILED_CAPTURE", False)
    slow = tl.trace(fn, x, backend="jax")
    assert "compiled" not in slow.notes
    for t in traces:
        assert list(t.modules) == list(slow.modules)
        assert structure(t) == structure(slow)
        assert [[(p.label, p.ops) for p in m.passes] for m in t.modules.values()] == [
            [(p.label, p.ops) for p in m.passes] for m in slow.modules.values()
        ]
    assert [p for p in slow.modules if "." not in p] == ["enc", "dec", "CNN_M"]  # closure, then global names
    expected = {
        "enc.fc1": by_hand(enc, x)["fc1"],
        "dec.fc2": by_hand(dec, enc(x))["fc2"],
        "CNN_M.Conv_0": intermediates(CNN_M, CNN_V, X_IMG)["Conv_0"],
    }
    for t in (*traces, slow):
        assert t.audit(untraced=True)
        for path, value in expected.items():
            close(out(t, path), value)
    # new weights: the same executable (weights are its arguments), the new values
    monkeypatch.setattr(compiled, "COMPILED_CAPTURE", True)
    enc.fc1.kernel[...] = enc.fc1.kernel[...] * 2.0
    again = tl.trace(fn, x, backend="jax")
    assert again.notes["compiled"]["cached"] and compiled.CACHE.compiles == start + 1
    close(out(again, "enc.fc1"), by_hand(enc, x)["fc1"])
    close(again.output, fn(x))


# -- interventions ------------------------------------------------------------------------------
def test_splices_and_edits_name_modules_by_their_paths_in_the_function() -> None:
    enc, dec = MODEL, OTHER

    def replacement(h: Any) -> Any:  # instead of enc.fc2 (6 -> 3 features)
        return jnp.sin(h[:, :3])

    spliced = traced(lambda x: dec(enc(x)), X, intervene=tl.when(tl.module("enc.fc2"), tl.splice_module(replacement)))
    h = replacement(nnx.relu(MODEL.fc1(X)))
    close(out(spliced, "enc.fc2"), h)
    close(spliced.output, OTHER(h))
    model = MODEL
    edited = tl.trace(lambda x: model(x), X, backend="jax", intervene=tl.when(tl.module("fc1"), tl.zero_ablate()))
    close(edited.output, MODEL.fc2(jnp.zeros((4, 6))))
    lone = tl.trace(
        lambda x: model(x), X, backend="jax", intervene=tl.when(tl.module("fc2"), tl.splice_module(jnp.cos))
    )
    close(lone.output, jnp.cos(nnx.relu(MODEL.fc1(X))))
    assert list(lone.modules) == ["fc1", "fc2"]


def test_a_splice_that_would_rename_the_functions_modules_is_refused() -> None:
    model, other = MODEL, OTHER

    def fn(x: Any) -> Any:  # names `other` but calls only `model`: its modules are fc1, fc2
        return model(x) if other is not None else x

    def replacement(h: Any) -> Any:  # calls `other`: a second top-level module, which would prefix every path
        return other(h[:, :3])

    with pytest.raises(tl.UnsupportedError, match="replacement calls other"):
        tl.trace(fn, X, backend="jax", intervene=tl.when(tl.module("fc2"), tl.splice_module(replacement)))
    assert nnx.Linear.__dict__["__call__"].__name__ == "__call__"  # put back


# -- leftovers and threads ----------------------------------------------------------------------
def test_nothing_stays_wrapped_after_a_capture_or_an_error() -> None:
    originals = (nnx.Linear.__dict__["__call__"], eqx.nn.Linear.__dict__["__call__"], nn.Module.__dict__["apply"])
    model = MODEL

    def current() -> tuple[Any, ...]:
        return (nnx.Linear.__dict__["__call__"], eqx.nn.Linear.__dict__["__call__"], nn.Module.__dict__["apply"])

    tl.trace(lambda x: model(x) + CNN_M.apply(CNN_V, X_IMG).sum(), X, backend="jax")
    assert current() == originals
    for exc in (ValueError("inside the function"), KeyboardInterrupt()):

        def boom(x: Any, exc: BaseException = exc) -> Any:
            model(x)
            raise exc

        with pytest.raises(type(exc)):
            tl.trace(boom, X, backend="jax")
        assert current() == originals


def test_another_threads_calls_pass_through_unrecorded() -> None:
    model = MODEL
    seen: dict[str, Any] = {}

    def plain() -> None:  # another model: counted as the function's, it would rename every path
        seen["out"] = np.asarray(OTHER(X))

    def fn(x: Any) -> Any:
        worker = threading.Thread(target=plain)  # calls the wrapped classes while the capture traces
        worker.start()
        worker.join()
        return model(x)

    trace = traced(fn, X)
    assert list(trace.modules) == ["fc1", "fc2"]
    assert [trace.modules[p].num_passes for p in ("fc1", "fc2")] == [1, 1]
    close(seen["out"], OTHER(X))


def test_the_observer_counts_module_calls_under_vmap_as_seen_but_uncompared() -> None:
    # equinox layers take one example, so models call them under jax.vmap, where even with jit off the
    # outputs are abstract: the observer must list those calls (None), as the trace records them
    from torchlens_jax.modules import observe_module_outputs

    class Block(eqx.Module):
        norm: eqx.nn.LayerNorm
        fc: eqx.nn.Linear

        def __init__(self, key: Any) -> None:
            self.norm, self.fc = eqx.nn.LayerNorm(4), eqx.nn.Linear(4, 4, key=key)

        def __call__(self, x: Any) -> Any:
            return self.fc(jax.vmap(self.norm)(x).sum(axis=0))

    model, x = Block(jax.random.key(0)), jax.random.normal(jax.random.key(1), (3, 4))
    seen = observe_module_outputs(model, (x,), {})
    assert set(seen) == {"norm:1", "fc:1"}
    assert seen["norm:1"] is None  # under vmap: seen, not compared
    np.testing.assert_allclose(seen["fc:1"], np.asarray(model.fc(jax.vmap(model.norm)(x).sum(axis=0))), rtol=1e-6)
    trace = tl.trace(model, x)
    assert {mp.label for m in trace.modules.values() for mp in m.passes} == set(seen)


def test_linen_module_calls_inside_a_lifted_scan_are_observed_and_match() -> None:
    # capture_intermediates does not see nn.RNN's cell (inside nn.scan); linen's interceptor does, per step
    from torchlens.conformance import checks
    from torchlens_core.backend.cases import Case
    from torchlens_jax.modules import observe_module_outputs

    class Recurrent(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(3)(nn.RNN(nn.OptimizedLSTMCell(6))(x)[:, -1])

    model, x = Recurrent(), jax.random.normal(jax.random.key(0), (2, 4, 3))
    variables = model.init(jax.random.key(1), x)
    seen = observe_module_outputs(model.apply, (variables, x), {})
    cell = sorted(k for k in seen if k.startswith("OptimizedLSTMCell_0:"))
    assert len(cell) == 5  # linen's pass over the scan body for its broadcast variables, then one per step
    assert seen["OptimizedLSTMCell_0:1"] is None and all(seen[k] is not None for k in cell[1:])
    trace = tl.trace(model.apply, variables, x, backend="jax")
    case = Case("linen_rnn", lambda: (model.apply, (variables, x), {}), rtol=1e-5)
    checks.test_module_outputs(
        checks.Traced("jax", case, model.apply, (variables, x), {}, trace, model.apply(variables, x))
    )
