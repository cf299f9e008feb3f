"""Live interventions on the numpy plugin: every edit checked against the same edit made by hand.

Each reference is the traced function's code rewritten by hand with the edit
written in (plain NumPy, no TorchLens), run on the same arrays. The traced
functions are the plugin's conformance zoo; every edited trace must also
audit clean, which replays it with its edits.

What every backend with the ``intervene`` capability must do (each built-in
helper at an op and at a module call, splices, refused and failing edits, the
array operations, gradients through an edit) is checked on each backend's zoo
by the conformance suite (torchlens/conformance/edit_checks.py); these are the
reference plugin's own: its functions, loops, in-place ops, threads, and the
core's refusals.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchlens_numpy")
import numpy as np
from thread_checks import ROUNDS, raised, run_together

import torchlens as tl
from torchlens_numpy import zoo
from torchlens_numpy.arrays import ARRAY_OPS
from torchlens_numpy.capture import Tracked


def trace(fn, *args, **kwargs) -> tl.Trace:
    return tl.trace(fn, *args, backend="numpy", **kwargs)


def close(actual, expected, rtol: float = 1e-6) -> bool:
    a, e = np.asarray(actual), np.asarray(expected)
    return a.shape == e.shape and a.dtype == e.dtype and np.allclose(a, e, rtol=rtol, atol=rtol)


def clean(t: tl.Trace) -> None:
    report = t.audit()
    assert report, str(report)


def only(t: tl.Trace, func_name: str) -> tl.OpRecord:
    ops = [op for op in t.ops if op.func_name == func_name]
    assert len(ops) == 1, [op.label for op in ops]
    return ops[0]


def _random_functions() -> dict[str, object]:
    return {name: getattr(np.random, name) for name in dir(np.random) if not name.startswith("_")}


# -- the MLP of the zoo, its tanh edited by every built-in helper -------------------------------
def mlp_by_hand(x, w1, b1, w2, b2, w3, edit):
    """zoo.mlp with ``edit`` applied to the tanh's output."""
    h = edit(np.tanh(x @ w1 + b1))
    h = np.maximum(h @ w2 + b2, 0)
    return h @ w3


def _mlp():
    _, args, _ = zoo._build_mlp()
    other = np.random.default_rng(7).standard_normal(args[0].shape).astype(np.float32)
    return args, other


VECTOR = np.random.default_rng(1).standard_normal(16).astype(np.float32)

# (name, helper given the reference trace, the same edit by hand given the reference's tanh value). Every built-in
# helper's arithmetic, at an op and at a module call of each zoo case, is the conformance suite's
# (torchlens/conformance/edit_checks.py); these are the argument forms it does not pass.
HELPERS = [
    ("mean_ablate_dims", lambda ref: tl.mean_ablate(dims=(0, 1)), lambda h, other: np.full_like(h, h.mean())),
    ("steer_list", lambda ref: tl.steer(VECTOR.tolist(), scale=-1.0), lambda h, other: h - VECTOR),
    ("clamp_max", lambda ref: tl.clamp(max=0.1), lambda h, other: np.minimum(h, np.float32(0.1))),
]


@pytest.mark.parametrize(("helper", "by_hand"), [h[1:] for h in HELPERS], ids=[h[0] for h in HELPERS])
def test_every_helper_at_an_op_site_equals_the_edit_by_hand(helper, by_hand) -> None:
    args, other_x = _mlp()
    reference = trace(zoo.mlp, other_x, *args[1:])  # what swap_with, resample_ablate... read
    other_tanh = np.tanh(other_x @ args[1] + args[2])  # ... and the same value by hand
    helpers = helper(reference)
    helpers = helpers if isinstance(helpers, tuple) else (helpers,)

    t = trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), *helpers))

    expected = mlp_by_hand(*args, edit=lambda h: by_hand(h, other_tanh))
    assert close(t.output, expected)
    assert not close(t.output, zoo.mlp(*args))  # the edit changed something
    site = only(t, "tanh")
    assert site.edited and [e.site for e in t.interventions] == [f"{site.layer_label}:1"]
    assert t.interventions[0].helpers == helpers
    assert close(site.pre_edit, np.tanh(args[0] @ args[1] + args[2]))  # the value before the edit
    assert close(site.out, by_hand(site.pre_edit, other_tanh))  # the value later ops saw
    assert not any(op.edited for op in t.ops if op is not site)
    clean(t)


def test_a_reference_trace_is_left_as_it_was() -> None:
    args, other_x = _mlp()
    reference = trace(zoo.mlp, other_x, *args[1:])
    kept = [None if op.out is None else np.copy(op.out) for op in reference.ops]
    t = trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), tl.swap_with(reference)))
    clean(t)
    assert all(close(op.out, v) for op, v in zip(reference.ops, kept, strict=True))


def test_a_reference_trace_is_left_as_it_was_when_the_function_writes_the_swapped_value() -> None:
    w = np.random.default_rng(4).standard_normal((4, 8))

    def fn(x):
        h = np.tanh(x @ w)
        h += 1.0  # writes the value the edit handed over
        return h * 2.0

    x, other_x = np.random.default_rng(5).standard_normal((2, 3, 4))
    reference = trace(fn, other_x)
    t = trace(fn, x, intervene=tl.when(tl.func("tanh"), tl.swap_with(reference)))
    assert close(t.output, (np.tanh(other_x @ w) + 1.0) * 2.0)  # by hand: the other input's tanh
    assert close(only(reference, "tanh").out, np.tanh(other_x @ w))


# -- sites chosen by label, by pass, by predicate; loops and branches ---------------------------
def rnn_by_hand(xs, wx, wh, b, edit_step):
    h = np.zeros(wh.shape[0], dtype=xs.dtype)
    states = []
    for t_step, x_t in enumerate(xs):
        h = edit_step(t_step, np.tanh(x_t @ wx + h @ wh + b))
        states.append(h)
    return np.stack(states)


def test_every_step_of_a_loop_edited_and_each_later_step_sees_it() -> None:
    fn, args, _ = zoo._build_rnn()
    t = trace(fn, *args, intervene=tl.when(tl.func("tanh"), tl.scale(-0.5)))
    assert close(t.output, rnn_by_hand(*args, edit_step=lambda i, h: h * -0.5))
    assert len(t.interventions) == len(args[0])
    clean(t)


def test_one_step_of_a_loop_edited_by_its_label() -> None:
    fn, args, _ = zoo._build_rnn()
    # the loop body is one layer of several passes: its third step is pass 3
    t = trace(fn, *args, intervene=tl.when(tl.label("tanh_1:3"), tl.zero_ablate()))
    assert close(t.output, rnn_by_hand(*args, edit_step=lambda i, h: np.zeros_like(h) if i == 2 else h))
    assert [op.func_name for op in t.ops if op.edited] == ["tanh"]
    clean(t)


def test_an_edit_decides_how_often_a_data_dependent_loop_runs() -> None:
    fn, args, _ = zoo._build_rnn_until_settled()

    def by_hand(x, w):
        h, steps = x, 0
        for _ in range(50):
            new = (np.tanh(h @ w) * 3.0) * 0.5 + x  # the edit: every step's tanh, tripled
            steps += 1
            done = np.abs(new - h).max() < 1e-3
            h = new
            if done:
                break
        return h, steps

    t = trace(fn, *args, intervene=tl.when(tl.func("tanh"), tl.scale(3.0)))
    expected, steps = by_hand(*args)
    plain_steps = len([op for op in trace(fn, *args).ops if op.func_name == "tanh"])
    assert close(t.output, expected)
    assert len(t.interventions) == steps == len([op for op in t.ops if op.func_name == "tanh"])
    assert steps != plain_steps  # the edited run took another number of steps
    clean(t)


def test_an_edit_of_the_condition_takes_the_other_branch() -> None:
    fn, args, _ = zoo._build_branch()
    x, w = args
    assert x.mean() > 0  # unedited, the function takes the relu branch
    t = trace(fn, *args, intervene=tl.when(tl.func("mean"), tl.scale(-1.0)))
    assert close(t.output, np.tanh(x @ w) - 1)  # by hand: `if -x.mean() > 0` is False
    assert type(only(t, "mean").out) is np.float64  # a NumPy scalar edited stays a scalar
    clean(t)


def test_several_interventions_at_once_each_at_its_sites() -> None:
    args, _ = _mlp()
    t = trace(
        zoo.mlp,
        *args,
        intervene=[
            tl.when(tl.func("tanh"), tl.scale(2.0)),
            tl.when(tl.func("maximum"), tl.clamp(max=0.05)),
            tl.when(tl.func("tanh"), tl.steer(VECTOR)),
        ],
    )
    x, w1, b1, w2, b2, w3 = args
    h = np.tanh(x @ w1 + b1) * 2.0 + VECTOR
    expected = np.minimum(np.maximum(h @ w2 + b2, 0), np.float32(0.05)) @ w3
    assert close(t.output, expected)
    assert [len(op.edits) for op in t.ops if op.edited] == [2, 1]
    clean(t)


# -- values of other kinds: scalars, lists of arrays, random draws, returned constants -----------
def test_a_scalar_result_edited_stays_a_numpy_scalar() -> None:
    fn, args, _ = zoo._build_mse()
    t = trace(fn, *args, intervene=tl.when(tl.func("mean"), tl.zero_ablate()))
    assert type(t.output) is np.float64 and t.output == 0.0  # by hand: np.float64(0)
    t = trace(fn, *args, intervene=tl.when(tl.func("square"), tl.scale(3.0)))
    assert close(t.output, np.mean(((args[0] - args[1]) ** 2) * 3.0)) and type(t.output) is np.float64
    clean(t)


def test_each_array_of_a_list_result_is_edited() -> None:
    fn, args, _ = zoo._build_indexing()
    x, idx = args

    def by_hand(x, idx):
        rows = x[idx]
        positive = x[x > 0]
        top, bottom = [a * 2.0 for a in np.split(x, 2, axis=0)]  # the edit
        swapped = np.vstack([bottom, top])[:, ::-1]
        total = positive.sum() + rows.mean()
        return swapped.T.reshape(2, -1) * total, np.float32(2) * total

    t = trace(fn, *args, intervene=tl.when(tl.func("split"), tl.scale(2.0)))
    expected = by_hand(x, idx)
    assert all(close(a, e) for a, e in zip(t.output, expected, strict=True))
    site = only(t, "split")
    assert [e.path for e in site.edits] == [(0,), (1,)]
    assert all(close(a, b) for a, b in zip(site.pre_edit, np.split(x, 2, axis=0), strict=True))
    clean(t)


def test_a_random_draw_edited_replays_exactly() -> None:
    fn, args, _ = zoo._build_dropout()
    x, w = args

    np.random.seed(0)
    t = trace(fn, *args, intervene=tl.when(tl.func("rand"), tl.scale(0.25)))
    np.random.seed(0)
    h = x @ w
    mask = np.random.rand(*h.shape) * 0.25 < 0.5  # by hand: most of the mask now passes
    assert close(t.output, np.where(mask, h / 0.5, 0.0))
    clean(t)


def test_a_returned_constant_edited_is_what_the_caller_gets() -> None:
    table = np.arange(6.0).reshape(2, 3)

    def fn(x):
        return x * 2, table  # the table is returned as it is: a constant op

    t = trace(fn, np.ones(3), intervene=tl.when(tl.func("constant"), tl.scale(10.0)))
    assert close(t.output[1], table * 10.0) and close(t.output[0], np.full(3, 2.0))
    assert close(table, np.arange(6.0).reshape(2, 3))  # the function's own array is not written
    clean(t)


# -- in-place ops -------------------------------------------------------------------------------
def in_place_by_hand(x, w, b, edit):
    """zoo.in_place with ``edit(name, array)`` given the array each in-place op wrote, after it wrote."""
    h = x @ w
    h += b
    edit("add", h)
    np.multiply(h, 2, out=h)
    edit("multiply", h)
    h[:, 0] = 0
    edit("setitem", h)
    v = h.reshape(-1)
    v[1:3] += 1.0  # Python: t = v[1:3]; t += 1.0 (writes v); v[1:3] = t (writes v, the same values)
    edit("add_slice", v[1:3])
    edit("setitem_slice", v)
    h.T[0] *= 0.5
    edit("multiply_transposed", h.T[0])
    edit("setitem_transposed", h.T)
    np.maximum(h, 0, out=h)
    edit("maximum", h)
    g = h.copy()
    g.sort(axis=1)
    edit("sort", g)
    return g + h


def _in_place(func_name: str, shape: tuple[int, ...]) -> tl.Selector:
    return tl.where(lambda op: op.in_place and op.func_name == func_name and op.shape == shape)


IN_PLACE_SITES = {  # site name -> selector of that one in-place op, in the order they run
    "add": _in_place("add", (3, 4)),
    "multiply": _in_place("multiply", (3, 4)),
    "setitem": _in_place("setitem", (3, 4)),
    "add_slice": _in_place("add", (2,)),
    "setitem_slice": _in_place("setitem", (12,)),
    "multiply_transposed": _in_place("multiply", (3,)),
    "setitem_transposed": _in_place("setitem", (4, 3)),
    "maximum": _in_place("maximum", (3, 4)),
    "sort": _in_place("sort", (3, 4)),
}


@pytest.mark.parametrize("name", list(IN_PLACE_SITES))
def test_an_in_place_op_edited_in_place_and_every_other_value_intact(name) -> None:
    fn, args, _ = zoo._build_in_place()
    kept = [np.copy(a) for a in args]
    t = trace(fn, *args, intervene=tl.when(IN_PLACE_SITES[name], tl.scale(-3.0)))

    before, after = {}, {}  # by hand: what each in-place op's array held before the edit and after it

    def edit(at, array):
        before[at] = np.copy(array)
        if at == name:
            array[...] = array * -3.0
        after[at] = np.copy(array)

    x, w, b = args
    assert close(t.output, in_place_by_hand(x, w, b, edit))
    edited = [op for op in t.ops if op.edited]
    assert len(edited) == 1 and edited[0].in_place
    assert close(edited[0].pre_edit, before[name]) and close(edited[0].out, after[name])
    # every recorded value is the value that ran, though later ops wrote the same memory
    written = [op for op in t.ops if op.in_place]
    assert len(written) == len(IN_PLACE_SITES)
    for op, at in zip(written, IN_PLACE_SITES, strict=True):
        assert close(op.out, after[at]), at
    assert close(only(t, "matmul").out, x @ w)
    assert close(only(t, "reshape").out, after["setitem"].reshape(-1))
    assert all(close(a, k) for a, k in zip(args, kept, strict=True))  # the caller's arrays are untouched
    clean(t)


def test_a_value_before_its_edit_is_kept_when_the_function_writes_its_memory_later() -> None:
    x = np.arange(6.0).reshape(2, 3)

    def fn(x):
        h = x * 1.0
        row = h[0]  # a view of h: the site
        h *= 3.0  # writes the memory the unedited row lives in
        return h + row

    t = trace(fn, x, intervene=tl.when(tl.func("getitem"), tl.scale(2.0)))
    assert close(t.output, x * 3.0 + x[0] * 2.0)  # by hand: row = h[0] * 2, a new array h's write misses
    site = only(t, "getitem")
    assert close(site.pre_edit, x[0]) and close(site.out, x[0] * 2.0)
    clean(t)


def test_save_leaves_an_edited_value_out_and_still_edits() -> None:
    args, _ = _mlp()
    t = trace(zoo.mlp, *args, save=tl.func("maximum"), intervene=tl.when(tl.func("tanh"), tl.scale(0.5)))
    site = only(t, "tanh")
    assert site.edited and site.out is None and site.pre_edit is None
    assert close(t.output, mlp_by_hand(*args, edit=lambda h: h * 0.5))
    clean(t)


def test_halt_after_an_edited_op_keeps_the_edit() -> None:
    args, _ = _mlp()
    x, w1, b1, w2, b2, _ = args
    t = trace(zoo.mlp, *args, halt=tl.func("maximum"), intervene=tl.when(tl.func("tanh"), tl.scale(0.5)))
    assert t.halted and only(t, "tanh").edited
    assert close(only(t, "maximum").out, np.maximum((np.tanh(x @ w1 + b1) * 0.5) @ w2 + b2, 0))
    clean(t)


# -- helpers see plain arrays and record nothing ------------------------------------------------
def test_a_helper_using_the_functions_own_arrays_records_no_op() -> None:
    held = []

    def fn(x):
        y = x * 2.0
        held.append(y)  # a Tracked array of this very capture
        return np.tanh(y) + 1.0

    def add_held(value, site):
        out = value + held[0] + site.ops.mean(held[0], (0,))
        assert type(out) is np.ndarray  # plain NumPy: recording is paused while helpers run
        return out

    x = np.linspace(-1.0, 1.0, 4)
    plain_ops = [op.func_name for op in trace(fn, x).ops]
    held.clear()
    t = trace(fn, x, intervene=tl.when(tl.func("tanh"), add_held))
    assert [op.func_name for op in t.ops] == plain_ops
    y = x * 2.0
    assert close(t.output, np.tanh(y) + y + y.mean() + 1.0)
    clean(t)


def test_array_ops_give_plain_values_for_tracked_arrays_and_keep_scalars() -> None:
    seen = {}

    def fn(x):
        y = x * 2.0
        s = y.sum()  # a NumPy scalar, tracked as a 0-d array
        seen.update(
            zeros=ARRAY_OPS.zeros_like(y),
            mean=ARRAY_OPS.mean(y, (0,)),
            sum=ARRAY_OPS.sum(y, 1),
            clip=ARRAY_OPS.clip(y, 0.0, 3.0),
            take=ARRAY_OPS.take(y, [1, 0], 0),
            from_numpy=ARRAY_OPS.from_numpy(np.ones(3), y),
            copy=ARRAY_OPS.copy(y),
            scalar_zeros=ARRAY_OPS.zeros_like(s),
            scalar_copy=ARRAY_OPS.copy(s),
        )
        return y + 1.0

    x = np.arange(6.0).reshape(2, 3)
    t = trace(fn, x)
    assert [op.func_name for op in t.ops] == ["input", "multiply", "sum", "add", "output"]  # nothing more
    y = x * 2.0
    expected = dict(
        zeros=np.zeros_like(y),
        mean=y.mean(0, keepdims=True),
        sum=y.sum(1, keepdims=True),
        clip=np.clip(y, 0, 3),
        take=y[[1, 0]],
        from_numpy=np.ones(3),
        copy=y,
    )
    for name, value in expected.items():
        assert type(seen[name]) is np.ndarray and close(seen[name], value), name
    assert type(seen["scalar_zeros"]) is np.float64 and seen["scalar_zeros"] == 0.0
    assert type(seen["scalar_copy"]) is np.float64 and seen["scalar_copy"] == y.sum()
    target = np.zeros(3)
    assert ARRAY_OPS.write_into(target, np.ones(3)) is target and close(target, np.ones(3))


def test_two_threads_editing_at_once_each_get_their_own_edits() -> None:
    args, _ = _mlp()
    plain_ops = len(trace(zoo.mlp, *args).ops)
    scaled, zeroed = mlp_by_hand(*args, edit=lambda h: h * 0.5), mlp_by_hand(*args, edit=np.zeros_like)
    for r in range(ROUNDS):
        results = run_together(
            lambda: trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), tl.scale(0.5))),
            lambda: trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), tl.zero_ablate())),
        )
        raised(results)
        assert close(results[0].output, scaled) and close(results[1].output, zeroed), f"round {r}"
        assert [len(t.ops) for t in results] == [plain_ops, plain_ops], f"round {r}"
    for t in results:
        clean(t)


# -- refusals and cleanup -----------------------------------------------------------------------
def test_an_edit_returning_no_array_or_promoting_the_dtype_is_refused() -> None:
    # (another shape or dtype, refused naming the site: the conformance suite's, on every backend)
    args, _ = _mlp()
    with pytest.raises(tl.InterventionError, match="not an array"):
        trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), lambda v, s: 0.0))
    with pytest.raises(tl.InterventionError, match="float64"):  # a float64 vector promotes float32 values
        trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), tl.steer(VECTOR.astype(np.float64))))


def test_a_selector_that_picks_nothing_or_cannot_pick_live_is_refused() -> None:
    args, _ = _mlp()
    with pytest.raises(tl.LabelNotFoundError, match="picked no site.*tanh"):
        trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanhh"), tl.zero_ablate()))
    with pytest.raises(tl.LabelNotFoundError, match="picked no site"):  # plain functions have no modules
        trace(zoo.mlp, *args, intervene=tl.when(tl.module("layer1"), tl.zero_ablate()))
    with pytest.raises(tl.UnsupportedError, match="followed_by"):  # judged by children, which run after the edit
        tl.when(tl.followed_by(tl.func("tanh")), tl.zero_ablate())
    with pytest.raises(tl.UnsupportedError, match="combine it"):  # a module's output is known when its call returns
        tl.when(tl.module("layer1") & tl.func("tanh"), tl.zero_ablate())
    with pytest.raises(TypeError, match="intervene="):
        trace(zoo.mlp, *args, intervene=tl.zero_ablate())


def test_a_helper_that_cannot_take_value_and_site_is_refused_at_when() -> None:
    """A built-in helper's maker passed uncalled, or a one-argument function, is refused by tl.when, before any
    capture runs, saying what to write instead (it used to fail inside the forward with a bare TypeError)."""
    with pytest.raises(tl.TorchLensError, match=r"tl.zero_ablate makes a helper: call it, tl.zero_ablate\(\)"):
        tl.when(tl.func("tanh"), tl.zero_ablate)
    with pytest.raises(tl.TorchLensError, match=r"call it, tl.scale\(...\)"):
        tl.when(tl.func("tanh"), tl.zero_ablate(), tl.scale)
    with pytest.raises(TypeError, match=r"helper\(value, site\).*\(v\) cannot take"):
        tl.when(tl.func("tanh"), lambda v: v)
    args, _ = _mlp()  # what is accepted: two positional arguments, or more with defaults, or *args
    for helper in (lambda v, s: v, lambda v, s, k=1: v * k, lambda *a: a[0]):
        assert trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), helper)).interventions


def test_helper_arguments_are_checked_where_the_helper_is_made() -> None:
    with pytest.raises(tl.TorchLensError, match=r"tl.scale's factor is a number, not str"):
        tl.scale("2")
    with pytest.raises(tl.TorchLensError, match=r"tl.noise's std is a standard deviation, at least 0, not -1.0"):
        tl.noise(-1.0)
    with pytest.raises(tl.TorchLensError, match=r"tl.noise's seed is an integer, not float"):
        tl.noise(0.1, seed=1.5)
    with pytest.raises(tl.TorchLensError, match=r"tl.steer's scale is a number, not str"):
        tl.steer(VECTOR, scale="x")
    assert repr(tl.scale(np.float32(0.5))) == "scale(0.5)"  # NumPy scalars are numbers
    args, _ = _mlp()  # an array factor multiplies as it is
    per_unit = np.linspace(0.0, 1.0, 16, dtype=np.float32)
    scaled = trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), tl.scale(per_unit)))
    assert scaled.interventions


def test_a_steering_vector_that_does_not_broadcast_is_refused_naming_both_shapes() -> None:
    args, _ = _mlp()
    with pytest.raises(
        tl.InterventionError,
        match=r"tl.steer's vector, shape \[5\], does not broadcast to the "
        r"value at tanh_1_\d+:1, shape \[4, 16\]",
    ):
        trace(zoo.mlp, *args, intervene=tl.when(tl.func("tanh"), tl.steer(np.ones(5, dtype=np.float32))))


def test_splice_module_is_refused_with_a_typed_error() -> None:
    listed = {b["name"]: b for b in tl.backends()}
    assert "intervene" in listed["numpy"]["capabilities"] and "splice" not in listed["numpy"]["capabilities"]
    args, _ = _mlp()
    with pytest.raises(tl.UnsupportedError, match="cannot replace module calls"):
        trace(zoo.mlp, *args, intervene=tl.when(tl.module("mlp"), tl.splice_module(np.tanh)))


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_nothing_stays_patched_after_an_exception_in_a_helper(error) -> None:
    before = _random_functions()
    escaped = []

    def fn(x):
        y = x * 2.0
        escaped.append(y)
        np.random.rand(2)
        return np.tanh(y)

    def failing(value, site):
        raise error("inside the helper")

    with pytest.raises(error, match="inside the helper"):
        trace(fn, np.ones(3), intervene=tl.when(tl.func("tanh"), failing))
    assert _random_functions() == before
    assert type(escaped[0] + 1) is np.ndarray and close(escaped[0] + 1, np.full(3, 3.0))  # records no more
    assert isinstance(escaped[0], Tracked)
    t = trace(fn, np.ones(3), intervene=tl.when(tl.func("tanh"), tl.scale(2.0)))  # the next capture is whole
    assert close(t.output, np.tanh(np.full(3, 2.0)) * 2.0)
    clean(t)
