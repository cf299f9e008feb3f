"""Interventions on the tinygrad backend (``intervene=``, ``tl.splice_module``), checked against edits by hand.

tinygrad has no hooks, so the references never go through TorchLens in
another way: an op site is checked against the model's own code run with the
edit written in (the activation is passed in, so the hand-made run gives an
edited one; in-place sites get the edit assigned by hand), a module site
against the model with the layer wrapped by hand in an object that edits what
it returns, a splice against the model with the layer swapped by hand. The
edits by hand are computed in NumPy. Every edited trace must also audit
clean: replay redoes the edits and must land on the recorded values.

What every backend with the ``intervene`` capability must do (each built-in
helper at an op and at a module call, splices, refused and failing edits, the
array operations, gradients through an edit) is checked on each backend's zoo
by the conformance suite (torchlens/conformance/edit_checks.py); these are
tinygrad's own: lazy in-place writes and views, layers without hooks, pass-
through layers.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
if shutil.which("clang") is None and not os.environ.get("DEV"):
    pytest.fail(
        "tinygrad's CPU device compiles its kernels with clang, which is not installed: "
        "apt-get install -y clang (or set DEV=PYTHON, 40-50x slower)",
        pytrace=False,
    )
from tinygrad import Tensor, nn  # noqa: E402
from tinygrad.engine.jit import _TinyJit  # noqa: E402

import torchlens as tl  # noqa: E402

TOL = 1e-5


def np_(t: Any) -> np.ndarray:
    return np.array(t.numpy()) if isinstance(t, Tensor) else np.asarray(t)


def close(actual: Any, expected: Any, tol: float = TOL) -> None:
    np.testing.assert_allclose(np_(actual), np_(expected), rtol=tol, atol=tol)


def audited(trace: Any) -> Any:
    report = trace.audit()
    assert report, str(report)
    return trace


def tensor(a: Any) -> Tensor:
    return Tensor(np.asarray(a, dtype=np.float32))


# -- the model: a small residual CNN of tinygrad.nn layers -----------------------------------------
def relu(t: Tensor) -> Tensor:
    return t.relu()


class ConvBN:
    def __init__(self, cin: int, cout: int) -> None:
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm(cout)

    def __call__(self, x: Tensor) -> Tensor:
        return self.bn(self.conv(x))


class Residual:
    def __init__(self, channels: int) -> None:
        self.a = ConvBN(channels, channels)
        self.b = ConvBN(channels, channels)

    def __call__(self, x: Tensor, act: Callable[[Tensor], Tensor] = relu) -> Tensor:
        return act(self.b(act(self.a(x))) + x)


class Net:
    def __init__(self) -> None:
        self.stem = ConvBN(3, 8)
        self.blocks = [Residual(8), Residual(8)]
        self.head = nn.Linear(8, 5)

    def __call__(self, x: Tensor, act: Callable[[Tensor], Tensor] = relu) -> Tensor:
        h = act(self.stem(x))
        for block in self.blocks:
            h = block(h, act)
        return self.head(h.mean(axis=(2, 3)))


class Edited:
    """A layer wrapped by hand: what it returns goes through ``edit`` (and is kept in ``seen``, unedited)."""

    def __init__(self, inner: Any, edit: Callable[[Any], Any] = lambda v: v) -> None:
        self.inner, self.edit, self.seen = inner, edit, []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        self.seen.append(out)
        return self.edit(out)

    def __getattr__(self, name: str) -> Any:  # what the model reads of the layer itself
        return getattr(self.__dict__["inner"], name)


def run_with(model: Any, x: Tensor, owner: Any, key: Any, wrapper: Any) -> Tensor:
    """``model(x)`` with ``owner[key]`` (or ``owner.key``) replaced by ``wrapper``, put back after."""
    get = (lambda: owner[key]) if isinstance(owner, list) else (lambda: getattr(owner, key))
    original = get()
    if isinstance(owner, list):
        owner[key] = wrapper
    else:
        setattr(owner, key, wrapper)
    try:
        return model(x).realize()
    finally:
        if isinstance(owner, list):
            owner[key] = original
        else:
            setattr(owner, key, original)


@pytest.fixture(scope="module")
def net() -> Net:
    Tensor.manual_seed(0)
    return Net()


@pytest.fixture(scope="module")
def inputs() -> tuple[Tensor, Tensor]:
    Tensor.manual_seed(1)
    return Tensor.randn(2, 3, 8, 8).realize(), Tensor.randn(2, 3, 8, 8).realize()  # the run, the reference run


def relu_values(model: Net, x: Tensor) -> list[np.ndarray]:
    """Every activation's value, by hand."""
    seen: list[np.ndarray] = []

    def act(t: Tensor) -> Tensor:
        out = t.relu()
        seen.append(np_(out))
        return out

    model(x, act)
    return seen


# -- the edits by hand, in NumPy -------------------------------------------------------------
def _vector() -> np.ndarray:
    return np.linspace(-1.0, 1.0, 8).reshape(8, 1, 1)


# Every built-in helper's arithmetic, at an op and at a module call of each zoo case, is the conformance suite's
# (torchlens/conformance/edit_checks.py, against NumPy); these, a tinygrad array as the vector and two helpers in
# turn, are checked here against the edit made by hand.
# name -> (helpers given the reference trace, the same edit by hand: (value, the site's value in the reference run))
HELPERS: dict[str, tuple[Callable[[Any], tuple], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "steer_tinygrad_vector": (lambda ref: (tl.steer(tensor(_vector()), -0.5),), lambda v, r: v - 0.5 * _vector()),
    "chained": (lambda ref: (tl.scale(-3.0), tl.clamp(min=0.0)), lambda v, r: np.maximum(v * -3.0, 0.0)),
}


# -- every helper at op sites ------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HELPERS))
def test_every_helper_at_op_sites_equals_the_model_with_the_edit_written_in(net: Net, inputs: Any, name: str) -> None:
    x, x2 = inputs
    make, by_hand = HELPERS[name]
    reference = tl.trace(net, x2)
    trace = audited(tl.trace(net, x, intervene=tl.when(tl.func("relu"), *make(reference))))
    others, before = relu_values(net, x2), []

    def edited_relu(t: Tensor) -> Tensor:
        before.append(np_(t.relu()))
        return tensor(by_hand(before[-1], others[len(before) - 1]))

    expected = net(x, edited_relu)
    close(trace.output, expected)
    close(trace.replay(), expected)
    edited = [op for op in trace.ops if op.edited]
    assert [op.func_name for op in edited] == ["relu"] * 5
    assert [e.site for e in trace.interventions] == [
        f"{op.label}:1" if ":" not in op.label else op.label for op in edited
    ]
    for op, value, other in zip(edited, before, others):
        close(op.pre_edit, value)  # the value before the edit, as the model computed it
        close(op.out, by_hand(value, other))  # the value every later op saw
    # every later op reads the edited value as the op's output: the graph is the unedited one
    plain = tl.trace(net, x)
    assert [(op.label, op.parents) for op in trace.ops] == [(op.label, op.parents) for op in plain.ops]


# -- every helper at module sites ----------------------------------------------------------------
@pytest.mark.parametrize("name", list(HELPERS))
def test_every_helper_at_a_module_site_equals_the_layer_wrapped_by_hand(net: Net, inputs: Any, name: str) -> None:
    x, x2 = inputs
    make, by_hand = HELPERS[name]
    reference = tl.trace(net, x2)
    trace = audited(tl.trace(net, x, intervene=tl.when(tl.module("blocks.0"), *make(reference))))
    watch = Edited(net.blocks[0])
    run_with(net, x2, net.blocks, 0, watch)
    other = np_(watch.seen[0])
    edit = Edited(net.blocks[0], lambda v: tensor(by_hand(np_(v), other)))
    expected = run_with(net, x, net.blocks, 0, edit)
    value = np_(edit.seen[0])
    close(trace.output, expected)
    close(trace.replay(), expected)
    (record,) = trace.interventions
    assert (record.site, record.kind) == ("blocks.0:1", "module")
    close(trace.modules["blocks.0"].passes[0].out, by_hand(value, other))
    (op,) = [op for op in trace.ops if op.edited]
    close(op.pre_edit, value)
    assert trace[trace.modules["blocks.1"].passes[0].ops[0]].parents == [op.label]  # blocks.1 reads the edit


def test_a_module_site_and_an_op_site_together(net: Net, inputs: Any) -> None:
    x, _ = inputs
    trace = audited(
        tl.trace(
            net, x, intervene=[tl.when(tl.module("stem"), tl.scale(-1.0)), tl.when(tl.func("relu"), tl.clamp(max=0.5))]
        )
    )
    original = net.stem
    net.stem = Edited(original, lambda v: -v)
    try:
        expected = net(x, lambda t: t.relu().minimum(0.5))
    finally:
        net.stem = original
    close(trace.output, expected)
    assert len(trace.interventions) == 1 + 5


# -- a Python branch (one call of a layer called several times, splices: the conformance suite's) ----------------
def branching(x: Tensor, tap: Callable[[Tensor], Tensor] = lambda v: v) -> Tensor:
    """A Python branch on the value of an op the interventions edit."""
    h = tap(x.relu())
    if h.mean().item() > 0.3:
        out = h.tanh() * 2.0
    else:
        out = h - 1.0
    return out


def test_an_edit_that_flips_a_python_branch_is_recorded_as_the_branch_taken() -> None:
    x = Tensor(np.linspace(-1.0, 2.0, 12, dtype=np.float32).reshape(3, 4)).realize()
    plain = tl.trace(branching, x)
    assert "tanh" in {op.func_name for op in plain.ops}  # unedited: mean 0.54, the first branch
    trace = audited(tl.trace(branching, x, intervene=tl.when(tl.func("relu"), tl.scale(0.25))))
    close(trace.output, branching(x, lambda v: v * 0.25))  # mean 0.14: the other branch
    assert "tanh" not in {op.func_name for op in trace.ops}
    (relu,) = [op for op in trace.ops if op.func_name == "relu"]
    (mean,) = [op for op in trace.ops if op.func_name == "mean"]
    (sub,) = [op for op in trace.ops if op.func_name == "sub"]
    assert relu.edited and mean.parents == [relu.label]  # the test read the edited value
    assert sub.conditions == [mean.label]  # the branch taken, on the test of the edited value


# -- in-place ops --------------------------------------------------------------------------------
class InPlace:
    """``+=`` and ``__setitem__`` on a layer's output, which ops read before the writes."""

    def __init__(self) -> None:
        self.fc1 = nn.Linear(6, 6)
        self.fc2 = nn.Linear(6, 6)

    def __call__(self, x: Tensor, y: Tensor, tap: Callable[[str, Tensor], None] = lambda name, h: None) -> Tensor:
        h = self.fc1(x)
        col = h.T.sum(axis=1)  # reads h before the writes
        h += y
        tap("add_", h)  # the hand-made edits are assigned into h, as the capture must write them
        h[:, 0] = 0.0
        tap("setitem", h)
        return self.fc2(h) + col


@pytest.mark.parametrize("site", ["add_", "setitem"])
def test_an_in_place_edit_is_written_into_the_array_and_leaves_other_recorded_values_intact(site: str) -> None:
    Tensor.manual_seed(5)
    model, x, y = InPlace(), Tensor.randn(4, 6).realize(), Tensor.randn(4, 6).realize()
    h0 = np_(model.fc1(x))  # by hand, step by step
    trace = audited(tl.trace(model, x, y, intervene=tl.when(tl.func(site), tl.scale(-2.0))))
    expected = model(x, y, lambda name, h: h.assign(h * -2.0) if name == site else None)
    close(trace.output, expected)
    (op,) = [op for op in trace.ops if op.edited]
    assert op.func_name == site and op.in_place
    value = h0 + np_(y)
    for name in ("add_", "setitem"):
        if name == "setitem":
            value = value.copy()
            value[:, 0] = 0.0
        if name == site:
            close(op.pre_edit, value)
            close(op.out, value * -2.0)
            value = value * -2.0
    # the values recorded before the writes are those that ran, untouched by the writes or the edit
    linear, transpose, total = [op for op in trace.ops if op.kind == "op"][1:4]  # after fc1's weight.T
    assert (linear.func_name, transpose.func_name, total.func_name) == ("linear", "transpose", "sum")
    close(linear.out, h0)
    close(transpose.out, h0.T)
    close(total.out, h0.sum(axis=0))


def test_the_value_before_an_edit_of_a_view_survives_a_later_write_into_its_base() -> None:
    def view_then_write(x: Tensor, tap: Callable[[Tensor], Tensor] = lambda v: v) -> Tensor:
        flat = tap(x.reshape(-1))  # the edited op: a view of the input's buffer
        x += 1.0  # writes the buffer the unedited view reads
        return x.sum() + flat.sum() * 2.0

    data = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    trace = audited(
        tl.trace(
            view_then_write, Tensor(data).realize(), intervene=tl.when(tl.func("reshape"), tl.steer(np.ones(12), 5.0))
        )
    )
    # (realized by hand: tinygrad cannot schedule the lazy edit beside the later write, "cycle detected")
    close(trace.output, view_then_write(Tensor(data).realize(), lambda v: (v + 5.0).realize()))
    (op,) = [op for op in trace.ops if op.edited]
    close(op.pre_edit, data.reshape(-1))  # as computed, not as the input became after +=
    close(op.out, data.reshape(-1) + 5.0)


def test_a_view_of_an_edited_value_keeps_its_value_across_a_write_as_in_a_lazy_run() -> None:
    # in a plain run the edited value is lazy, and a write into it leaves a view taken before unchanged;
    # the capture realizes it, so it must treat its buffer as its own and give the view a copy first
    def view_then_write(x: Tensor, tap: Callable[[Tensor], Tensor] = lambda v: v) -> Tensor:
        edited = tap((x * 2).relu())
        flat = edited.reshape(-1)
        edited += 1.0
        return edited.sum() + flat.sum() * 2.0

    data = np.arange(-6.0, 6.0, dtype=np.float32).reshape(3, 4)
    trace = audited(
        tl.trace(view_then_write, Tensor(data).realize(), intervene=tl.when(tl.func("relu"), tl.scale(3.0)))
    )
    expected = view_then_write(Tensor(data).realize(), lambda v: v * 3.0)
    value = np.maximum(data * 2, 0) * 3.0
    close(expected, (value + 1).sum() + value.sum() * 2.0)  # tinygrad's own semantics, as this test assumes
    close(trace.output, expected)


# -- layer outputs read inside the layer, and structured outputs ------------------------------
class ReadsItsOutput:
    """Returns ``h`` after an op inside it has read ``h``: that op must see the unedited value."""

    def __init__(self) -> None:
        self.fc = nn.Linear(5, 5)
        self.last_mean: Any = None

    def __call__(self, x: Tensor) -> Tensor:
        h = self.fc(x).relu()
        self.last_mean = h.mean()
        return h


class Pair:
    """Returns a dict holding a tuple."""

    def __init__(self) -> None:
        self.fc = nn.Linear(5, 4)

    def __call__(self, x: Tensor) -> dict[str, Any]:
        h = self.fc(x)
        return {"pair": (h.tanh(), h.sigmoid()), "raw": h}


class Outer:
    def __init__(self) -> None:
        self.inner = ReadsItsOutput()
        self.pair = Pair()
        self.head = nn.Linear(4, 2)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.inner(x)
        out = self.pair(h)
        a, b = out["pair"]
        return self.head(a + b * out["raw"]) + self.inner.last_mean


def test_a_layer_output_its_own_ops_read_is_edited_only_for_what_follows() -> None:
    Tensor.manual_seed(6)
    model, x = Outer(), Tensor.randn(3, 5).realize()
    trace = audited(tl.trace(model, x, intervene=tl.when(tl.module("inner"), tl.scale(3.0))))
    wrapped = Edited(model.inner, lambda v: v * 3.0)
    expected = run_with(model, x, model, "inner", wrapped)
    before = np_(wrapped.seen[0])
    close(trace.output, expected)
    (mean,) = [op for op in trace.ops if op.func_name == "mean"]
    close(mean.out, before.mean())  # read inside the layer: unedited, as with the layer wrapped by hand
    close(trace.modules["inner"].passes[0].out, before * 3.0)
    assert [op.func_name for op in trace.ops if op.edited] == ["identity"]  # the edit sits at the layer's exit


def test_every_leaf_of_a_structured_layer_output_is_edited() -> None:
    Tensor.manual_seed(7)
    model, x = Outer(), Tensor.randn(3, 5).realize()
    trace = audited(tl.trace(model, x, intervene=tl.when(tl.module("pair"), tl.scale(-0.5))))

    def halve(out: dict[str, Any]) -> dict[str, Any]:
        a, b = out["pair"]
        return {"pair": (a * -0.5, b * -0.5), "raw": out["raw"] * -0.5}

    wrapped = Edited(model.pair, halve)
    close(trace.output, run_with(model, x, model, "pair", wrapped))
    assert [e.site for e in trace.interventions] == ["pair:1"] * 3
    recorded = trace.modules["pair"].passes[0].out
    close(recorded["pair"][1], np_(wrapped.seen[0]["pair"][1]) * -0.5)
    close(recorded["raw"], np_(wrapped.seen[0]["raw"]) * -0.5)


class ReturnsItsInput:
    """Returns the tensor it was given: its output is an explicit identity op."""

    def __call__(self, x: Tensor) -> Tensor:
        return x


class PassesThrough:
    def __init__(self) -> None:
        self.fc = nn.Linear(4, 4)
        self.same = ReturnsItsInput()

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.fc(x)
        return self.same(h) + h, self.fc.bias  # h read again by the model, unedited; a parameter returned


def test_identity_ops_of_returned_tensors_are_edited_for_what_follows() -> None:
    Tensor.manual_seed(9)
    model, x = PassesThrough(), Tensor.randn(3, 4).realize()
    bias = np_(model.fc.bias)
    trace = audited(tl.trace(model, x, intervene=tl.when(tl.func("identity"), tl.steer(np.ones(4), 10.0))))
    original = model.same
    model.same = Edited(original, lambda v: v + 10.0)
    try:
        summed, _ = model(x)
    finally:
        model.same = original
    close(trace.output[0], summed)
    close(trace.output[1], bias + 10.0)  # returned by the model, not computed: an identity op, edited too
    close(model.fc.bias, bias)  # and the parameter itself is left as it was
    assert [op.func_name for op in trace.ops if op.edited] == ["identity", "identity"]
    assert {op.func_name for op in trace.ops} <= {"input", "transpose", "linear", "identity", "add", "output"}
    (add,) = [op for op in trace.ops if op.func_name == "add"]
    (linear,) = [op for op in trace.ops if op.func_name == "linear"]
    assert add.parents == [trace.ops[linear.index + 1].label, linear.label]  # the edit, and h as the model kept it


def test_a_module_site_on_a_pass_through_layer_leaves_the_callers_tensor_unedited() -> None:
    Tensor.manual_seed(9)
    model, x = PassesThrough(), Tensor.randn(3, 4).realize()
    trace = audited(tl.trace(model, x, save=tl.module("same"), intervene=tl.when(tl.module("same"), tl.scale(-2.0))))
    original = model.same
    model.same = Edited(original, lambda v: v * -2.0)
    try:
        summed, _ = model(x)
    finally:
        model.same = original
    close(trace.output[0], summed)  # -2h + h: the model's own h is read on unedited
    close(trace["same"].out, np_(model.fc(x)) * -2.0)
    (add,) = [op for op in trace.ops if op.func_name == "add"]
    edit, passed = (trace[label] for label in add.parents)
    assert [op.label for op in trace.ops] == [op.label for op in tl.trace(model, x).ops]  # no op added
    assert edit.func_name == "identity" and edit.edited and not passed.edited  # h: its own op, unedited
    clean = tl.trace(model, x)
    fork = clean.fork().when(tl.module("same"), tl.scale(-2.0))
    with pytest.raises(tl.UnsupportedError, match="pass-through"):
        fork.replay()  # the caller's reads and the module's are one in this graph: only a rerun tells them apart
    close(fork.rerun(model, x).output[0], summed)


class Keeps:
    """Keeps what it returns where the model reads it again (``self.last = y; return y``)."""

    def __init__(self) -> None:
        self.fc = nn.Linear(4, 4)

    def __call__(self, x: Tensor) -> Tensor:
        y = self.fc(x).relu()
        self.last = y
        return y


class KeepsItsOutput:
    def __init__(self) -> None:
        self.block = Keeps()
        self.reread = True
        self.catch = False

    def __call__(self, x: Tensor) -> Tensor:
        out = self.block(x) * 3.0
        if self.catch:  # a model that swallows errors: the capture must fail all the same
            try:
                return out + self.block.last
            except Exception:  # noqa: BLE001 - the model under test swallows every error
                return out
        return out + self.block.last if self.reread else out + 1.0  # else only what the block returned


def test_an_edited_module_output_read_again_where_the_model_kept_it_is_refused() -> None:
    """A hook hands the caller the edit while the kept tensor stays unedited: one recorded value cannot be both."""
    Tensor.manual_seed(9)
    model, x = KeepsItsOutput(), Tensor.randn(3, 4).realize()
    for catch in (False, True):
        model.catch = catch
        with pytest.raises(tl.InterventionError, match=r"block:1 handed .* itself \(tl.label\('\w+:1'\)\)") as raised:
            tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))
    model.catch = False
    (label,) = re.search(r"tl.label\('(\w+:1)'\)", str(raised.value)).groups()
    y = np_(model.block.fc(x).relu())
    close(audited(tl.trace(model, x, intervene=tl.when(tl.label(label), tl.scale(-2.0)))).output, -8.0 * y)
    model.reread = False
    close(audited(tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))).output, -6.0 * y + 1.0)


def test_edits_apply_to_ops_that_save_leaves_out(net: Net, inputs: Any) -> None:
    x, _ = inputs
    trace = audited(
        tl.trace(net, x, save=tl.func("conv2d"), intervene=tl.when(tl.module("blocks.0"), tl.zero_ablate()))
    )
    expected = run_with(net, x, net.blocks, 0, lambda h, act: h.zeros_like())
    close(trace.output, expected)
    (op,) = [op for op in trace.ops if op.edited]
    assert op.out is None and op.pre_edit is None  # not saved: neither value kept


# -- refusals and cleanup --------------------------------------------------------------------------
def _patchable_state() -> tuple:
    """Everything capture patches, by identity: Tensor's attributes and the functions tinygrad's own
    metadata wrappers call, layer classes' __call__, TinyJit's."""
    from torchlens_tinygrad.capture import metadata_cell

    attributes = {f"{klass.__name__}.{name}": raw for klass in Tensor.__mro__[:-1] for name, raw in vars(klass).items()}
    cells = {name: cell.cell_contents for name, raw in vars(Tensor).items() if (cell := metadata_cell(raw))}
    attributes.update({f"cell {name}": fn for name, fn in cells.items()})
    classes = (nn.Conv2d, nn.BatchNorm, nn.Linear, ConvBN, Residual, Net)
    return attributes, [vars(c)["__call__"] for c in classes], vars(_TinyJit)["__call__"]


def _same(a: tuple, b: tuple) -> bool:
    return (
        a[0].keys() == b[0].keys()
        and all(a[0][k] is b[0][k] for k in a[0])
        and all(x is y for x, y in zip(a[1], b[1]))
        and a[2] is b[2]
    )


def _raises(value: Any, site: Any) -> Any:
    raise RuntimeError("helper failed")


def _interrupts(value: Any, site: Any) -> Any:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "intervention",
    [
        tl.when(tl.func("relu"), _raises),
        tl.when(tl.module("blocks.0"), _raises),
        tl.when(tl.module("blocks.0"), tl.splice_module(lambda h, act: _raises(h, None))),
        tl.when(tl.func("add"), _interrupts),
    ],
    ids=["op_site", "module_site", "splice", "interrupt"],
)
def test_an_error_in_a_helper_leaves_nothing_installed(net: Net, inputs: Any, intervention: Any) -> None:
    x, _ = inputs
    plain = np_(net(x))
    before = _patchable_state()
    with pytest.raises((RuntimeError, KeyboardInterrupt)):
        tl.trace(net, x, intervene=intervention)
    assert _same(_patchable_state(), before)
    close(net(x), plain)  # the model runs as before
    assert tl.trace(net, x).audit()  # and the next capture works


def test_backend_declares_intervene_and_splice() -> None:
    (listed,) = [b for b in tl.backends() if b["name"] == "tinygrad"]
    assert {"intervene", "splice"} <= set(listed["capabilities"])
