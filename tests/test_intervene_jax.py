"""Interventions on the JAX backend (``intervene=``, ``tl.splice_module``), each checked against the edit made by hand.

The references never go through TorchLens: an op site is checked against the
model's own code run with the edit written in (the activation is passed in as
a function, so the edited one is a plain Python function), a module site
against a copy of the model whose submodule is wrapped by a module that edits
what it returns (nnx), flax's own ``nn.intercept_methods`` (linen), or
``eqx.tree_at`` (equinox). Every edited trace must also audit clean: replay
redoes the edits and must land on the recorded values.

What every backend with the ``intervene`` capability must do (each built-in
helper at an op and at a module call, splices, refused and failing edits, the
array operations, gradients through an edit) is checked on each backend's zoo
by the conformance suite (torchlens/conformance/edit_checks.py); these are
JAX's own: nnx, linen and equinox models, jit, scan, cond and while bodies,
pass- through modules.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")
eqx = pytest.importorskip("equinox")

import torchlens as tl  # noqa: E402
from torchlens_core.backend.array_ops import NumpyArrayOps  # noqa: E402
from torchlens_core.backend.manager import backend_named  # noqa: E402
from torchlens_jax.arrays import ARRAY_OPS  # noqa: E402

lax = jax.lax
TOL = 1e-5


def close(actual: Any, expected: Any, tol: float = TOL) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=tol, atol=tol)


def audited(trace: Any) -> Any:
    report = trace.audit()
    assert report, str(report)
    return trace


def normal(seed: int, *shape: int) -> Any:
    return jax.random.normal(jax.random.key(seed), shape)


# -- the model ---------------------------------------------------------------------------------
def forward(model: Any, x: Any, act: Callable[[Any], Any]) -> Any:
    """Net's forward, with its activation given: the hand-made references pass an edited one."""
    h = act(model.fc1(x))
    h = model.norm(h)
    h = act(model.fc2(h)) + h
    return model.head(h)


class Net(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.fc1 = nnx.Linear(6, 16, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.fc2 = nnx.Linear(16, 16, rngs=rngs)
        self.head = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return forward(self, x, jnp.tanh)


class Edited(nnx.Module):
    """A submodule wrapped by hand: what it returns goes through ``edit``."""

    def __init__(self, inner: Any, edit: Callable[[Any], Any]) -> None:
        self.inner = inner
        self.edit = edit

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.edit(self.inner(*args, **kwargs))


@pytest.fixture(scope="module")
def net() -> Any:
    return Net(nnx.Rngs(0))


X = normal(1, 4, 6)
X2 = normal(2, 4, 6)  # the reference run of mean/resample ablation and patching
VECTOR = np.linspace(-1.0, 1.0, 16)


def tanh_values(model: Any, x: Any) -> list[Any]:
    """The two activations' values, by hand."""
    seen: list[Any] = []
    forward(model, x, lambda z: seen.append(jnp.tanh(z)) or seen[-1])
    return seen


def fc2_value(model: Any, x: Any) -> Any:
    seen: list[Any] = []
    copy = nnx.clone(model)
    copy.fc2 = Edited(copy.fc2, lambda v: seen.append(v) or v)
    copy(x)
    return seen[0]


# Every built-in helper's arithmetic, at an op and at a module call of each zoo case, is the conformance suite's
# (torchlens/conformance/edit_checks.py, against NumPy); these, a JAX array as the vector and two helpers in
# turn, are checked here against the edit made by hand.
# name -> (helper given the reference trace, the same edit by hand: (value, the site's value in the reference run))
HELPERS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]] = {
    "steer_jax_vector": (
        lambda ref: tl.steer(jnp.asarray(VECTOR, jnp.float32), -0.5),
        lambda v, r: v - 0.5 * jnp.asarray(VECTOR, jnp.float32),
    ),
    "chained": (lambda ref: (tl.scale(3.0), tl.clamp(min=0.0)), lambda v, r: jnp.maximum(v * 3.0, 0.0)),
}


def _helpers(name: str, ref: Any) -> tuple[Any, ...]:
    made = HELPERS[name][0](ref)
    return made if isinstance(made, tuple) else (made,)


# -- every helper at op sites ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HELPERS))
def test_every_helper_at_op_sites(name: str, net: Any) -> None:
    reference = tl.trace(net, X2)
    trace = audited(tl.trace(net, X, intervene=tl.when(tl.func("tanh"), *_helpers(name, reference))))
    by_hand = HELPERS[name][1]
    others, before = tanh_values(net, X2), []

    def edited_tanh(z: Any) -> Any:
        value = jnp.tanh(z)
        before.append(value)
        return by_hand(value, others[len(before) - 1])

    expected = forward(net, X, edited_tanh)
    close(trace.output, expected)
    close(trace.replay(), expected)
    edited = [op for op in trace.ops if op.edited]
    assert [op.func_name for op in edited] == ["tanh", "tanh"]
    assert [e.site for e in trace.interventions] == [f"{op.layer_label}:1" for op in edited]
    for op, value, other in zip(edited, before, others):
        close(op.pre_edit, value)  # the value before the edit, as the model computed it
        close(op.out, by_hand(value, other))  # the value every later op saw
    assert not any(op.edited for op in reference.ops)


# -- every helper at module sites ----------------------------------------------------------------
@pytest.mark.parametrize("name", list(HELPERS))
def test_every_helper_at_module_sites(name: str, net: Any) -> None:
    reference = tl.trace(net, X2)
    trace = audited(tl.trace(net, X, intervene=tl.when(tl.module("fc2"), *_helpers(name, reference))))
    by_hand = HELPERS[name][1]
    other = fc2_value(net, X2)
    copy = nnx.clone(net)
    copy.fc2 = Edited(copy.fc2, lambda v: by_hand(v, other))
    expected = copy(X)
    close(trace.output, expected)
    close(trace.replay(), expected)
    (edit,) = trace.interventions
    assert (edit.site, edit.kind) == ("fc2:1", "module")
    close(trace.modules["fc2"].passes[0].out, by_hand(fc2_value(net, X), other))
    (op,) = [op for op in trace.ops if op.edited]
    close(op.pre_edit, fc2_value(net, X))


def test_a_module_site_and_an_op_site_together(net: Any) -> None:
    trace = audited(
        tl.trace(
            net, X, intervene=[tl.when(tl.module("fc1"), tl.scale(-1.0)), tl.when(tl.func("tanh"), tl.clamp(max=0.5))]
        )
    )
    copy = nnx.clone(net)
    copy.fc1 = Edited(copy.fc1, lambda v: -v)
    close(trace.output, forward(copy, X, lambda z: jnp.minimum(jnp.tanh(z), 0.5)))
    assert len(trace.interventions) == 3


# -- tl.splice_module (a splice of one call, and its edit: the conformance suite's) -------------------------------
class Shared(nnx.Module):
    """One projection called twice in straight-line code: passes 1 and 2 of ``proj``."""

    def __init__(self, rngs: Any) -> None:
        self.proj = nnx.Linear(8, 8, rngs=rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.head(self.proj(jnp.tanh(self.proj(x))))


def test_splice_one_pass_of_a_module_called_twice() -> None:
    model, x = Shared(nnx.Rngs(3)), normal(4, 2, 8)
    trace = audited(tl.trace(model, x, intervene=tl.when(tl.module("proj:2"), tl.splice_module(jnp.cos))))
    close(trace.output, model.head(jnp.cos(jnp.tanh(model.proj(x)))))
    assert trace.modules["proj"].num_passes == 2
    assert [op.func_name for op in trace.ops if op.modules == ["proj:2"]] == ["cos"]


# -- structured module outputs --------------------------------------------------------------------
class Pair(NamedTuple):
    main: Any
    extras: dict[str, Any]


class Structured(nnx.Module):
    """Returns a NamedTuple holding a dict; ``y`` is both returned and read again inside the module."""

    def __init__(self, rngs: Any) -> None:
        self.lin = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        y = self.lin(x)
        return Pair(y * 2.0, {"y": y, "n": jnp.float32(2.0)})


class UsesStructured(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.block = Structured(rngs)

    def __call__(self, x: Any) -> Any:
        p = self.block(x)
        return p.main + p.extras["y"] * p.extras["n"]


def test_every_leaf_of_a_structured_module_output_is_edited() -> None:
    model, x = UsesStructured(nnx.Rngs(0)), normal(5, 2, 3)
    trace = audited(tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(3.0))))
    copy = nnx.clone(model)
    copy.block = Edited(copy.block, lambda p: jax.tree.map(lambda v: v * 3.0, p))
    close(trace.output, copy(x))
    assert sorted(e.where.path for e in trace.interventions) == [(0,), (1, "n"), (1, "y")]
    # y was read inside the module (y * 2.0) before the edit: that op saw it unedited, as with a hook
    y = model.block.lin(x)
    (mul,) = [op for op in trace.ops if op.func_name == "mul" and op.modules == ["block:1"]]
    close(mul.out, y * 2.0 * 3.0)
    close(mul.pre_edit, y * 2.0)
    out = trace.modules["block"].passes[0].out
    assert isinstance(out, Pair)
    close(out.extras["y"], y * 3.0)


# -- linen and equinox ----------------------------------------------------------------------------
class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        h = nn.tanh(nn.Dense(16, name="fc1")(x))
        return nn.Dense(3, name="fc2")(h)


def _intercepting(path: tuple[str, ...], replace: Callable[..., Any]) -> Any:
    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        if context.method_name == "__call__" and context.module.path == path:
            return replace(next_fun, *args, **kwargs)
        return next_fun(*args, **kwargs)

    return nn.intercept_methods(interceptor)


@pytest.mark.parametrize("name", list(HELPERS))
def test_linen_module_sites_against_intercept_methods(name: str) -> None:
    model = LinenMLP()
    variables = model.init(jax.random.key(0), X)
    trace = audited(tl.trace(model.apply, variables, X, intervene=tl.when(tl.module("fc1"), *_helpers(name, None))))
    with _intercepting(("fc1",), lambda f, *a, **k: HELPERS[name][1](f(*a, **k), None)):
        expected = model.apply(variables, X)
    close(trace.output, expected)


def test_linen_splice_against_intercept_methods() -> None:
    model = LinenMLP()
    variables = model.init(jax.random.key(0), X)

    def replacement(x: Any) -> Any:
        return jnp.concatenate([x, -x, x[..., :4]], axis=-1)

    trace = audited(
        tl.trace(model.apply, variables, X, intervene=tl.when(tl.module("fc1"), tl.splice_module(replacement)))
    )
    with _intercepting(("fc1",), lambda f, *a, **k: replacement(*a, **k)):
        expected = model.apply(variables, X)
    close(trace.output, expected)


class _EqxEdited(eqx.Module):
    inner: Any
    edit: Callable[[Any], Any] = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.edit(self.inner(*args, **kwargs))


@pytest.mark.parametrize("name", list(HELPERS))
def test_equinox_module_sites_against_tree_at(name: str) -> None:
    model = eqx.nn.MLP(6, 16, width_size=16, depth=2, key=jax.random.key(20))
    x = normal(21, 6)
    trace = audited(tl.trace(model, x, intervene=tl.when(tl.module("layers.1"), *_helpers(name, None))))
    by_hand = HELPERS[name][1]
    copy = eqx.tree_at(lambda m: m.layers[1], model, _EqxEdited(model.layers[1], lambda v: by_hand(v, None)))
    close(trace.output, copy(x))


def test_equinox_splice_against_tree_at() -> None:
    model = eqx.nn.MLP(6, 16, width_size=16, depth=2, key=jax.random.key(20))
    other = eqx.nn.Linear(16, 16, key=jax.random.key(22))
    x, original = normal(21, 6), eqx.nn.Linear.__dict__["__call__"]
    trace = audited(tl.trace(model, x, intervene=tl.when(tl.module("layers.1"), tl.splice_module(other))))
    close(trace.output, eqx.tree_at(lambda m: m.layers[1], model, other)(x))
    assert eqx.nn.Linear.__dict__["__call__"] is original


# -- inside the control flow the walk expands ------------------------------------------------------
W1, W2 = normal(10, 6, 6), normal(11, 6, 6)


def _block(w: Any, h: Any, edit: Callable[[Any], Any] = lambda v: v) -> Any:
    return edit(jnp.tanh(h @ w))


_jitted_block = jax.jit(_block)


def jit_model(w1: Any, w2: Any, x: Any) -> Any:
    return jnp.sin(_jitted_block(w2, _jitted_block(w1, x)))


def test_edits_inside_jit() -> None:
    trace = audited(tl.trace(jit_model, W1, W2, X, intervene=tl.when(tl.func("tanh"), tl.scale(-2.0))))
    assert trace.notes["expanded"].get("pjit", 0) + trace.notes["expanded"].get("jit", 0) == 2
    edit = jax.jit(lambda w, h: _block(w, h, lambda v: v * -2.0))
    close(trace.output, jnp.sin(edit(W2, edit(W1, X))))
    # only the second call's tanh, by its label
    second = [op.label for op in tl.trace(jit_model, W1, W2, X).ops if op.func_name == "tanh"][1]
    trace = audited(tl.trace(jit_model, W1, W2, X, intervene=tl.when(tl.label(second), tl.zero_ablate())))
    close(trace.output, jnp.sin(jnp.zeros((4, 6))))


def test_edits_in_a_jitted_target() -> None:
    target = jax.jit(jit_model)
    trace = audited(tl.trace(target, W1, W2, X, intervene=tl.when(tl.func("sin"), tl.clamp(min=0.0))))
    close(trace.output, jnp.maximum(target(W1, W2, X), 0.0))


WX, WH, XS = normal(12, 3, 5), normal(13, 5, 5) * 0.5, normal(14, 6, 2, 3)


def rnn(wx: Any, wh: Any, xs: Any, edit: Callable[[int, Any], Any] | None = None) -> Any:
    """A scan; with ``edit``, the same recurrence unrolled by hand with the edit at each step."""

    def step(h: Any, x: Any) -> tuple[Any, Any]:
        h = jnp.tanh(x @ wx + h @ wh)
        return h, h

    h0 = jnp.zeros((xs.shape[1], 5))
    if edit is None:
        last, hs = lax.scan(step, h0, xs)
        return last, hs.sum(0)
    h, hs = h0, []
    for t in range(xs.shape[0]):
        h = edit(t, step(h, xs[t])[0])
        hs.append(h)
    return h, jnp.stack(hs).sum(0)


def test_edits_in_every_scan_iteration() -> None:
    trace = audited(tl.trace(rnn, WX, WH, XS, intervene=tl.when(tl.func("tanh"), tl.steer(VECTOR[:5], 0.3))))
    expected = rnn(WX, WH, XS, lambda t, h: h + 0.3 * jnp.asarray(VECTOR[:5], jnp.float32))
    close(trace.output[0], expected[0])
    close(trace.output[1], expected[1])
    assert [e.site.split(":")[1] for e in trace.interventions] == [str(i) for i in range(1, 7)]


def test_an_edit_in_one_scan_iteration() -> None:
    layer = next(op.layer_label for op in tl.trace(rnn, WX, WH, XS).ops if op.func_name == "tanh")
    trace = audited(tl.trace(rnn, WX, WH, XS, intervene=tl.when(tl.label(f"{layer}:3"), tl.zero_ablate())))
    expected = rnn(WX, WH, XS, lambda t, h: jnp.zeros_like(h) if t == 2 else h)
    close(trace.output[0], expected[0])
    close(trace.output[1], expected[1])
    (op,) = [op for op in trace.ops if op.edited]
    assert op.pass_num == 3
    before: list[Any] = []
    rnn(WX, WH, XS, lambda t, h: before.append(h) or h if t == 2 else h)
    close(op.pre_edit, before[0])
    assert float(jnp.abs(op.out).max()) == 0


class Cell(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.ih = nnx.Linear(3, 8, rngs=rngs)
        self.hh = nnx.Linear(8, 8, use_bias=False, rngs=rngs)

    def __call__(self, h: Any, x: Any) -> Any:
        return jnp.tanh(self.ih(x) + self.hh(h))


class ScanRNN(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.cell = Cell(rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, xs: Any) -> Any:
        def step(h: Any, x: Any) -> tuple[Any, Any]:
            h = self.cell(h, x)
            return h, h

        last, _ = lax.scan(step, jnp.zeros((xs.shape[1], 8)), xs)
        return self.head(last)


def _unrolled(model: Any, xs: Any, cell: Callable[[int, Any, Any], Any]) -> Any:
    h = jnp.zeros((xs.shape[1], 8))
    for t in range(xs.shape[0]):
        h = cell(t, h, xs[t])
    return model.head(h)


def test_a_module_site_in_one_scan_iteration() -> None:
    model = ScanRNN(nnx.Rngs(5))
    trace = audited(tl.trace(model, XS, intervene=tl.when(tl.module("cell:2"), tl.scale(-1.0))))
    expected = _unrolled(model, XS, lambda t, h, x: model.cell(h, x) * (-1.0 if t == 1 else 1.0))
    close(trace.output, expected)
    assert [e.site for e in trace.interventions] == ["cell:2"]


def test_splicing_a_module_called_in_a_scan() -> None:
    model, other = ScanRNN(nnx.Rngs(5)), Cell(nnx.Rngs(8))
    trace = audited(tl.trace(model, XS, intervene=tl.when(tl.module("cell"), tl.splice_module(other))))
    copy = nnx.clone(model)
    copy.cell = other
    close(trace.output, copy(XS))
    assert trace.modules["cell"].num_passes == XS.shape[0]
    # one pass of a call that runs as every iteration cannot be spliced alone: refused, typed
    with pytest.raises(tl.UnsupportedError, match=r"cell:2.*tl\.module\('cell'\)"):
        tl.trace(model, XS, intervene=tl.when(tl.module("cell:2"), tl.splice_module(other)))


def branchy(w: Any, x: Any, flip: float = 1.0, edit: Callable[[Any], Any] = lambda v: v) -> Any:
    z = x @ w
    s = jnp.sum(z) * flip
    return lax.cond(s > 0, lambda v: edit(jnp.tanh(v)) * 2.0, lambda v: jnp.sin(v) - 1.0, z)


def test_an_edit_that_flips_a_cond_branch() -> None:
    w = W1 if float(jnp.sum(X @ W1)) > 0 else -W1
    plain = tl.trace(branchy, w, X)
    assert "tanh" in [op.func_name for op in plain.ops]
    trace = audited(tl.trace(branchy, w, X, intervene=tl.when(tl.func("reduce_sum"), tl.scale(-1.0))))
    close(trace.output, branchy(w, X, flip=-1.0))
    funcs = [op.func_name for op in trace.ops]
    assert "sin" in funcs and "tanh" not in funcs  # the branch the edited value picks, as it ran
    # and an edit inside the branch taken
    trace = audited(tl.trace(branchy, w, X, intervene=tl.when(tl.func("tanh"), tl.noise(0.2, seed=1))))
    noise = jnp.asarray(0.2 * np.random.default_rng(1).standard_normal((4, 6)), jnp.float32)
    close(trace.output, branchy(w, X, edit=lambda v: v + noise))


def halve_until_small(x: Any, factor: float = 0.5) -> Any:
    def cond(s: tuple[Any, Any]) -> Any:
        return jnp.max(jnp.abs(s[0])) > 0.1

    def body(s: tuple[Any, Any]) -> tuple[Any, Any]:
        return s[0] * factor, s[1] + 1

    return lax.while_loop(cond, body, (x, 0))


def test_an_edit_in_a_while_loop_changes_its_iterations() -> None:
    plain = halve_until_small(X)
    trace = audited(tl.trace(halve_until_small, X, intervene=tl.when(tl.func("mul"), tl.scale(0.5))))
    expected = halve_until_small(X, 0.25)
    close(trace.output[0], expected[0])
    assert int(trace.output[1]) == int(expected[1]) < int(plain[1])


# -- ops with several results --------------------------------------------------------------------
def top2(x: Any) -> Any:
    values, indices = lax.top_k(x, 2)
    return values * 2.0, indices + 1


def test_an_op_with_several_results_has_each_edited() -> None:
    trace = audited(tl.trace(top2, X, intervene=tl.when(tl.func("top_k"), tl.clamp(max=1))))
    values, indices = lax.top_k(X, 2)
    close(trace.output[0], jnp.minimum(values, 1.0) * 2.0)
    assert (np.asarray(trace.output[1]) == np.minimum(np.asarray(indices), 1) + 1).all()
    assert sorted(e.path for e in trace.interventions) == [(0,), (1,)]


# -- what is refused -----------------------------------------------------------------------------
class Boom(Exception):
    pass


def _boom(value: Any, site: Any) -> Any:
    raise Boom(site.key)


class ReturnsItsInput(nnx.Module):
    """Returns the array it was given: its output is an explicit identity op."""

    def __call__(self, x: Any) -> Any:
        return x


class PassesThrough(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.fc = nnx.Linear(4, 4, rngs=rngs)
        self.same = ReturnsItsInput()

    def __call__(self, x: Any) -> Any:
        h = self.fc(x)
        return self.same(h) + h  # h read again by the model, unedited


def test_a_module_site_on_a_pass_through_module_leaves_the_callers_array_unedited() -> None:
    model, x = PassesThrough(nnx.Rngs(9)), jax.random.normal(jax.random.key(9), (3, 4))
    traced = audited(tl.trace(model, x, save=tl.module("same"), intervene=tl.when(tl.module("same"), tl.scale(-2.0))))
    h = np.asarray(model.fc(x))
    close(traced.output, h * -2.0 + h)  # the model's own h, unedited
    close(traced["same"].out, h * -2.0)
    (add,) = [
        op
        for op in traced.ops
        if op.func_name == "add" and len(op.parents) == 2 and traced[op.parents[0]].func_name == "identity"
    ]
    edit, kept = (traced[label] for label in add.parents)
    assert edit.edited and not kept.edited
    # JAX's recorded graph tells the caller's reads from the module's: a fork replays the edit as it ran live
    close(tl.trace(model, x).fork().when(tl.module("same"), tl.scale(-2.0)).replay(), h * -2.0 + h)


class Keeps(nnx.Module):
    """Keeps what it returns where the model reads it again (``self.last = y; return y``)."""

    def __init__(self, rngs: Any, store: Any) -> None:
        self.fc = nnx.Linear(4, 4, rngs=rngs)
        self.store = store

    def __call__(self, x: Any) -> Any:
        y = jax.nn.relu(self.fc(x))
        self.store.last = y
        return y


class KeepsItsOutput(nnx.Module):
    def __init__(self, rngs: Any, reread: bool = True) -> None:
        self.store = types.SimpleNamespace()
        self.block = Keeps(rngs, self.store)
        self.reread = reread

    def __call__(self, x: Any) -> Any:
        out = self.block(x) * 3.0
        return out + self.store.last if self.reread else out + 1.0  # else only what the block returned


def test_an_edited_module_output_read_again_where_the_model_kept_it_is_refused() -> None:
    """A hook hands the caller the edit while the kept array stays unedited: one recorded value cannot be both."""
    model, x = KeepsItsOutput(nnx.Rngs(9)), jax.random.normal(jax.random.key(9), (3, 4))
    with pytest.raises(tl.InterventionError, match=r"block:1 handed .* itself \(tl.label\('max_1_4:1'\)\)"):
        tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))
    y = np.asarray(jax.nn.relu(model.block.fc(x)))
    close(audited(tl.trace(model, x, intervene=tl.when(tl.label("max_1_4:1"), tl.scale(-2.0)))).output, -8.0 * y)
    # the clean trace saw the kept read: a fork refuses to replay the module site, and replays the op itself
    clean = tl.trace(model, x)
    assert clean["max_1_4"].meta.get("read_where_kept")
    fork = clean.fork().when(tl.module("block"), tl.scale(-2.0))
    with pytest.raises(tl.UnsupportedError, match="block:1 returns max_1_4, which the model also read where"):
        fork.replay()
    close(clean.fork().when(tl.label("max_1_4"), tl.scale(-2.0)).replay(), -8.0 * y)
    model.reread = False
    assert not tl.trace(model, x)["max_1_4"].meta.get("read_where_kept")
    close(tl.trace(model, x).fork().when(tl.module("block"), tl.scale(-2.0)).replay(), -6.0 * y + 1.0)
    close(audited(tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))).output, -6.0 * y + 1.0)


def test_nothing_is_left_patched_after_a_helper_or_a_replacement_raises(net: Any) -> None:
    linear_call = nnx.Linear.__dict__["__call__"]
    norm_call = nnx.LayerNorm.__dict__["__call__"]
    with pytest.raises(Boom):
        tl.trace(net, X, intervene=tl.when(tl.func("tanh"), _boom))
    with pytest.raises(Boom):
        tl.trace(net, X, intervene=tl.when(tl.module("fc1"), _boom))

    for exc in (Boom, KeyboardInterrupt):

        def raising(h: Any, exc: type[BaseException] = exc) -> Any:  # raises while the jaxpr is traced
            raise exc("replacement")

        with pytest.raises(exc):
            tl.trace(net, X, intervene=tl.when(tl.module("fc2"), tl.splice_module(raising)))
    assert nnx.Linear.__dict__["__call__"] is linear_call and nnx.LayerNorm.__dict__["__call__"] is norm_call
    close(tl.trace(net, X).output, net(X))  # and the next capture is a plain one
    close(net(X), forward(net, X, jnp.tanh))


# -- the array operations --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16"])  # float32 and the integers: the conformance suite, on the zoo's arrays
def test_array_ops_match_the_numpy_reference(dtype: str) -> None:
    ref = NumpyArrayOps()
    data = (np.arange(24).reshape(2, 3, 4) - 11.0) / 3.0
    a = jnp.asarray(data).astype(dtype)
    n = np.asarray(a)
    pairs = [
        (ARRAY_OPS.zeros_like(a), ref.zeros_like(n)),
        (ARRAY_OPS.mean(a, (0, 2)), ref.mean(n, (0, 2))),
        (ARRAY_OPS.sum(a, 1), ref.sum(n, 1)),
        (ARRAY_OPS.clip(a, -1.5, 2.0), ref.clip(n, -1.5, 2.0)),
        (ARRAY_OPS.clip(a, None, 0.5), ref.clip(n, None, 0.5)),
        (ARRAY_OPS.take(a, [2, 0, 2], 2), ref.take(n, [2, 0, 2], 2)),
        (ARRAY_OPS.from_numpy(data, a), ref.from_numpy(data, n)),
        (ARRAY_OPS.copy(a), n),
    ]
    info = backend_named("jax").array_info
    for got, want in pairs:
        assert isinstance(got, jax.Array)
        assert str(got.dtype) == str(want.dtype) == dtype and got.shape == want.shape
        assert info(got)[2] == info(a)[2]  # same device
        tol = 0.05 if dtype == "bfloat16" else 1e-6
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol)
    assert ARRAY_OPS.write_into(a, a + 1) is not a  # nothing is written in place: the edited array comes back
    host = np.ones((2, 2), np.float32)  # a NumPy array (an input a module returned) stays a NumPy array
    assert isinstance(ARRAY_OPS.zeros_like(host), np.ndarray) and ARRAY_OPS.copy(host) is not host


def test_backend_declares_intervene_and_splice() -> None:
    listed = {b["name"]: b for b in tl.backends()}["jax"]
    assert {"intervene", "splice"} <= set(listed["capabilities"])
    assert backend_named("jax").array_ops() is ARRAY_OPS


class KeepsItsOutputForAJit(nnx.Module):
    """Reads the array it kept inside a jitted function of its own: a read inside a sub-program."""

    def __init__(self, rngs: Any) -> None:
        self.store = types.SimpleNamespace()
        self.block = Keeps(rngs, self.store)

    def __call__(self, x: Any) -> Any:
        out = self.block(x) * 3.0
        return jax.jit(lambda a, kept: a - kept)(out, self.store.last)


def test_a_kept_edited_output_read_inside_a_jitted_function_is_refused() -> None:
    model, x = KeepsItsOutputForAJit(nnx.Rngs(9)), jax.random.normal(jax.random.key(9), (3, 4))
    y = np.asarray(jax.nn.relu(model.block.fc(x)))
    close(np.asarray(model(x)), 2.0 * y)
    with pytest.raises(tl.InterventionError, match=r"block:1 handed .* itself"):
        tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))
    # the edit made on the op itself reaches both reads, inside the jitted function too
    close(audited(tl.trace(model, x, intervene=tl.when(tl.label("max_1_4:1"), tl.scale(-2.0)))).output, -4.0 * y)


class ReturnsTwice(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.fc = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        y = self.fc(x)
        return y, y


class ReadsBoth(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.twice = ReturnsTwice(rngs)

    def __call__(self, x: Any) -> Any:
        a, b = self.twice(x)
        return a * b + a


def test_a_value_a_module_returns_twice_is_edited_once_at_its_module_site() -> None:
    model, x = ReadsBoth(nnx.Rngs(4)), jax.random.normal(jax.random.key(4), (3, 4))
    e = np.asarray(model.twice.fc(x)) + 1.0  # a hook edits the one array once and returns it twice
    calls: list[Any] = []

    def plus_one(value: Any, site: Any) -> Any:
        calls.append(site)
        return value + 1.0

    traced = tl.trace(model, x, intervene=tl.when(tl.module("twice"), plus_one))
    assert len(calls) == 1  # one op's value: one call of the helper
    close(traced.output, e * e + e)
    close(traced.replay(x), e * e + e)  # replay applies the edit once too, as the capture did
    audited(traced)
