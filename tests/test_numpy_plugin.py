"""The third-party numpy backend (plugins/torchlens-numpy): capture, lookup, faithfulness, replay, cleanup."""

from __future__ import annotations

import importlib.metadata
import math
import subprocess
import sys

import pytest

pytest.importorskip("torchlens_numpy")
import numpy as np

import torchlens as tl
from torchlens_core.backend.manager import backend_named, claim_backend
from torchlens_numpy import zoo
from torchlens_numpy.arrays import array_error, array_info

W = np.arange(12.0).reshape(3, 4) / 10  # a constant of the traced functions below


def trace(fn, *args, **kwargs) -> tl.Trace:
    return tl.trace(fn, *args, backend="numpy", **kwargs)


def same(a, b) -> bool:
    return array_error(a, b) == 0.0


# -- registration -------------------------------------------------------------------------------
def test_registered_through_the_entry_point_like_any_third_party_backend() -> None:
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="torchlens.backends")}
    assert eps["numpy"].value == "torchlens_numpy.plugin"
    assert eps["numpy"].dist.name == "torchlens-numpy"
    listed = {b["name"]: b for b in tl.backends()}
    assert listed["numpy"]["available"] and listed["numpy"]["framework"] == "numpy"
    assert set(listed["numpy"]["capabilities"]) == {
        "functions",
        "in_place",
        "random",
        "control_flow",
        "save",
        "halt",
        "timing",
        "intervene",
        "new_inputs",
    }


def test_never_claims_a_call_on_its_own() -> None:
    from torchlens_numpy import plugin

    x = np.ones(3)
    assert plugin.torchlens_claim(target=np.tanh, args=(x,), kwargs={}) is None
    assert claim_backend(np.tanh, (x,), {}) != "numpy"


def test_plugin_module_loads_none_of_its_framework_code() -> None:
    """tl.backends() loads every plugin module: this one adds only itself to what `import torchlens` loads.

    NumPy is TorchLens's own dependency, so the framework's import is no measure here; the plugin's NumPy code
    (capture, replay, arrays, saving) loads when a method first needs it (``lazy``)."""
    code = (
        "import sys, torchlens\n"
        "before = set(sys.modules)\n"
        "import torchlens_numpy.plugin\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    added = set(eval(result.stdout))
    assert {"torchlens_numpy", "torchlens_numpy.plugin"} <= added
    assert added <= {"torchlens_numpy", "torchlens_numpy.plugin", "torchlens.backend"}, sorted(added)


# -- the zoo ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", zoo.cases(), ids=lambda c: c.name)
def test_zoo_traces_audit_clean_and_replay(case) -> None:
    fn, args, kwargs = case.build()
    if case.reset:
        case.reset()
    own = fn(*args, **kwargs)
    if case.reset:
        case.reset()
    t = trace(fn, *args, **kwargs)
    report = t.audit()
    assert report, str(report)
    assert t.modules == {} and t.num_ops > 0
    replayed = t.replay()
    assert all(array_error(a, b) == 0.0 for a, b in zip(_leaves(replayed), _leaves(own), strict=True))
    assert all(array_error(a, b) == 0.0 for a, b in zip(_leaves(t.output), _leaves(own), strict=True))


def _leaves(x):
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in _leaves(x[k])]
    if isinstance(x, (tuple, list)):
        return [v for item in x for v in _leaves(item)]
    return [x]


# -- lookup and naming --------------------------------------------------------------------------
def test_labels_short_labels_and_positions() -> None:
    def fn(x):
        return np.maximum(x @ W + 1, 0)

    t = trace(fn, np.ones((2, 3)))
    assert [op.label for op in t.ops] == ["input_1", "matmul_1_1", "add_1_2", "maximum_1_3", "output_1"]
    assert t["matmul_1"] is t["matmul_1_1"] is t["matmul_1:1"] is t[1] is t[-4]
    assert t["add_1"].parents == ["matmul_1_1"] and t["add_1"].children == ["maximum_1_3"]
    assert t["add_1"].args[1] == 1 and t["matmul_1"].call is np.matmul
    assert t["matmul_1"].shape == (2, 4) and t["matmul_1"].dtype == "float64" and t["matmul_1"].device == "cpu"
    assert same(t["matmul_1"].out, np.ones((2, 3)) @ W)
    with pytest.raises(KeyError, match="did you mean 'matmul_1"):
        t["matmul_11"]


def test_operators_functions_methods_and_indexing_are_ops() -> None:
    def fn(x, i):
        a = -x.T  # a property and an operator
        b = np.concatenate([a, a], axis=1).sum(axis=0)  # a function, then a method
        c = np.add.reduce(x, axis=1)  # a ufunc method
        return b[i] * c[0], x[x > 0]  # indexing, fancy and boolean

    t = trace(fn, np.arange(6.0).reshape(2, 3) - 2, np.array([0, 1]))
    assert [op.func_name for op in t.ops if op.kind == "op"] == [
        "transpose",
        "negative",
        "concatenate",
        "sum",
        "add.reduce",
        "getitem",
        "getitem",
        "multiply",
        "greater",
        "getitem",
    ]
    assert t["getitem_3"].parents == ["input_1", "greater_1_10"]
    assert t.audit()


def test_loops_give_one_op_per_step_and_branches_what_ran() -> None:
    def fn(x):
        while x.sum() < 10:  # data-dependent loop
            x = x * 2
        return np.tanh(x) if x.max() > 3 else np.exp(x)

    t = trace(fn, np.ones(3))
    assert [op.func_name for op in t.ops if op.kind == "op"] == [
        "sum",
        "less",
        "multiply",
        "sum",
        "less",
        "multiply",
        "sum",
        "less",
        "max",
        "greater",
        "tanh",
    ]
    assert t.audit()


def test_numpy_scalars_are_tracked_and_returned_as_scalars() -> None:
    def fn(x):
        s = x.sum()  # NumPy gives a scalar: tracked as a 0-d array
        s += 1  # rebinds s, as for a scalar
        return s * 2, float(s)

    x = np.arange(4.0)
    t = trace(fn, x)
    out, as_float = t.output
    assert type(out) is np.float64 and out == 14.0 and as_float == 7.0
    assert t["add_1"].parents == ["sum_1_1"] and not t["add_1"].in_place
    assert type(t.replay()[0]) is np.float64
    assert t.audit()


# -- faithfulness -------------------------------------------------------------------------------
def test_saved_values_survive_later_in_place_writes() -> None:
    def fn(x):
        h = x @ W
        h += 1  # np.add(h, 1, out=(h,))
        v = h.reshape(-1)  # a view of h ...
        v[:2] = 0  # ... written through
        np.multiply(h, 2, out=h)
        h.sort(axis=1)
        return h

    x = np.ones((2, 3))
    t = trace(fn, x)
    base = x @ W
    assert same(t["matmul_1"].out, base)
    assert same(t["add_1"].out, base + 1)
    assert same(t["reshape_1"].out, (base + 1).reshape(-1))
    expected = (base + 1).reshape(-1)
    expected[:2] = 0
    assert same(t["setitem_1"].out, expected)  # the view, as it was after the write
    assert same(t["multiply_1"].out, expected.reshape(2, 4) * 2)
    assert t["add_1"].in_place and t["multiply_1"].in_place and t["sort_1"].in_place
    assert same(t.output, fn(x))
    assert t.audit()


def test_inputs_are_saved_before_the_function_writes_into_them() -> None:
    def fn(x):
        x += 1  # writes into the caller's array, as NumPy does
        return x * 2

    x = np.zeros(3)
    t = trace(fn, x)
    assert same(x, np.ones(3))  # the caller sees the write...
    assert same(t["input_1"].out, np.zeros(3))  # ...the trace keeps the input as it came in
    assert same(t.replay(), np.full(3, 2.0)) and same(x, np.ones(3))  # replay writes into copies only
    assert t.audit()


def test_constants_are_copied_once_and_returned_constants_are_sources() -> None:
    w = np.eye(3)

    def fn(x):
        for _ in range(3):
            x = x @ w  # a closure constant, read three times
        return x, np.zeros(2)  # a returned array no op computed

    t = trace(fn, np.ones(3))
    copies = {id(op.args[1]) for op in t.ops if op.func_name == "matmul"}
    assert len(copies) == 1 and t["matmul_1"].args[1] is not w
    w[0, 0] = 5.0  # changing the constant afterwards does not change the trace
    assert same(t["matmul_1"].args[1], np.eye(3))
    assert t["constant_1"].source == "constant" and t.output_labels == ["output_1", "output_2"]
    assert t.audit()


def test_calls_outside_numpys_dispatch_enter_as_constants() -> None:
    def fn(x):
        y = np.asarray(x) * 2  # np.asarray drops the tracking: y is a constant of the trace
        return x + y

    t = trace(fn, np.ones(3))
    assert [op.func_name for op in t.ops if op.kind == "op"] == ["add"]
    assert t["add_1"].parents == ["input_1"] and same(t["add_1"].args[1], np.full(3, 2.0))
    assert t.audit()


# -- random draws -------------------------------------------------------------------------------
def test_global_rng_draws_are_random_sources_that_replay_exactly() -> None:
    def fn(x):
        return x + np.random.rand(*x.shape) + np.random.normal(loc=x)

    np.random.seed(3)
    t = trace(fn, np.ones(4))
    rand, normal = t["rand_1"], t["normal_1"]
    assert rand.source == "random" and not rand.parents and "rng_state" in rand.meta
    assert normal.parents == ["input_1"]
    state = np.random.get_state()
    assert same(t.replay(), t.output)
    assert np.array_equal(np.random.get_state()[1], state[1])  # replay leaves the caller's RNG alone
    assert t.audit()


# -- cleanup ------------------------------------------------------------------------------------
def _random_functions() -> dict[str, object]:
    return {name: getattr(np.random, name) for name in dir(np.random) if not name.startswith("_")}


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_nothing_stays_patched_after_an_exception(error) -> None:
    before = _random_functions()
    escaped = []

    def fn(x):
        y = x * 2
        escaped.append(y)
        np.random.rand(2)
        raise error("inside the function")

    with pytest.raises(error, match="inside the function"):
        trace(fn, np.ones(3))
    assert _random_functions() == before
    assert type(escaped[0] + 1) is np.ndarray  # an escaped array no longer records
    assert same(escaped[0] + 1, np.full(3, 3.0))


def test_arrays_that_escape_a_finished_capture_behave_as_numpy() -> None:
    before = _random_functions()
    escaped = []
    t = trace(lambda x: escaped.append(x * 2) or escaped[0], np.ones(2))
    n = len(t.ops)
    assert type(np.tanh(escaped[0])) is np.ndarray and type(escaped[0][0]) is np.float64
    assert len(t.ops) == n and _random_functions() == before


# -- refusals -----------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself warns
def test_refuses_what_it_cannot_record() -> None:
    with pytest.raises(tl.UnsupportedError, match="matrix"):
        trace(lambda m: m * 2, np.matrix([[1.0, 2.0]]))

    def reshape_in_place(x):
        x = x * 1
        x.shape = (3, 1)
        return x

    with pytest.raises(tl.UnsupportedError, match="reshape"):
        trace(reshape_in_place, np.ones(3))


# -- array hooks --------------------------------------------------------------------------------
def test_array_info_and_error() -> None:
    assert array_info(np.zeros((2, 3), np.float32)) == ((2, 3), "float32", "cpu")
    assert array_info(np.float64(1.0)) == ((), "float64", "cpu")
    assert array_info([1.0]) is None
    a = np.array([1.0, np.nan, np.inf])
    assert array_error(a, a.copy()) == 0.0
    assert array_error(np.array([1.0, 3.0]), np.array([1.0, 1.0])) == 1.0
    assert array_error(np.zeros(2), np.zeros(3)) == math.inf
    assert array_error(np.zeros(2, np.float32), np.zeros(2)) == math.inf
    assert array_error(np.array([np.nan, 1.0]), np.array([1.0, np.nan])) == math.inf
    assert array_error(np.array([1, 2]), np.array([1, 3])) == math.inf
    assert backend_named("numpy").to_numpy(a) is not a


def test_save_and_halt() -> None:
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 3)), rng.normal(size=(3, 3))

    def mlp(x, w):
        h = np.maximum(x @ w, 0)
        h += 1  # an in-place write into a value save= may have dropped
        return np.tanh(h @ w) + h

    full = tl.trace(mlp, x, w, backend="numpy")
    part = tl.trace(mlp, x, w, backend="numpy", save=tl.func("tanh"))
    assert [op.label for op in part.ops] == [op.label for op in full.ops]
    kept = [op.func_name for op in part.ops if op.kind == "op" and op.out is not None]
    assert kept == ["tanh"]
    np.testing.assert_array_equal(part["tanh_1"].out, full["tanh_1"].out)
    assert part.audit()
    halted = tl.trace(mlp, x, w, backend="numpy", halt=tl.func("maximum"))
    assert halted.halted and halted.ops[-1].func_name == "maximum" and halted.audit()


def test_third_party_flop_formulas() -> None:
    import numpy as np

    import torchlens as tl

    def f(x, w):
        return np.cumsum(np.tanh(x @ w) + 1)

    trace = tl.trace(f, np.ones((3, 4)), np.ones((4, 5)), backend="numpy")
    assert trace["matmul_1"].macs == 3 * 4 * 5 and trace["matmul_1"].flops == 2 * 60
    assert trace["tanh_1"].flops == 15 and trace["add_1"].flops == 15
    assert trace["cumsum_1"].flops is None  # no formula: unknown, not zero
    assert trace.flops == 150 and [op.label for op in trace.unknown_flops] == [trace["cumsum_1"].label]
