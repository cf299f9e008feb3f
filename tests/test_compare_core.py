"""tl.compare on the numpy plugin: alignment, layouts, verdicts and reports, with no framework installed.

Every model is written twice by hand — the second a port of the first, with
or without a known bug — so the expected answer (which op diverges, which
layout relates two values) is known from the code, not from TorchLens.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torchlens_numpy")
import numpy as np

import torchlens as tl
from torchlens_core.compare.metrics import agreement, tolerance_for

RNG = np.random.default_rng(0)
W = RNG.standard_normal((8, 3)).astype(np.float32)
V = RNG.standard_normal((8 * 4 * 4, 5)).astype(np.float32)
X = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
X_NHWC = np.ascontiguousarray(X.transpose(0, 2, 3, 1))


def channels_first(x):
    h = np.einsum("oc,nchw->nohw", W, x)
    h = np.maximum(h, 0)
    h = np.tanh(h.reshape(1, -1) @ V)
    return h * 2.0


def channels_last(x):  # the correct port: NHWC maps, back to NCHW before the flatten
    h = np.einsum("oc,nhwc->nhwo", W, x)
    h = np.maximum(h, 0)
    h = np.transpose(h, (0, 3, 1, 2))
    h = np.tanh(h.reshape(1, -1) @ V)
    return h * 2.0


def channels_last_flat(x):  # the port that flattens NHWC but permutes the weight to match: also correct
    h = np.maximum(np.einsum("oc,nhwc->nhwo", W, x), 0)
    v = V.reshape(8, 4, 4, 5).transpose(1, 2, 0, 3).reshape(-1, 5)
    return np.tanh(h.reshape(1, -1) @ v) * 2.0


def nhwc_flatten_bug(x):  # flattens NHWC with the NCHW weight: the matmul is where it goes wrong
    h = np.maximum(np.einsum("oc,nhwc->nhwo", W, x), 0)
    return np.tanh(h.reshape(1, -1) @ V) * 2.0


def tanh_bug(x):  # a cheaper tanh: agrees to ~1e-3 only
    h = np.maximum(np.einsum("oc,nchw->nohw", W, x), 0)
    z = h.reshape(1, -1) @ V
    return (z / np.sqrt(1.0 + z * z) * 1.001) * 2.0


def trace(fn, x):
    return tl.trace(fn, x, backend="numpy")


def labels_of(cmp):
    return [(p.a, p.b) for p in cmp.pairs]


def test_same_function_pairs_every_op_with_itself():
    a, b = trace(channels_first, X), trace(channels_first, X)
    cmp = tl.compare(a, b)
    assert cmp.first_divergence is None and cmp.roots == []
    assert labels_of(cmp) == [(op.label, op.label) for op in a.ops]
    assert cmp.unmatched_a == [] and cmp.unmatched_b == []
    assert all(p.verdict == "agrees" and p.agreement.max_abs == 0 for p in cmp.pairs)


def test_a_channels_last_port_agrees_through_a_permuted_layout():
    cmp = tl.compare(trace(channels_first, X), trace(channels_last, X_NHWC))
    assert cmp.first_divergence is None, str(cmp)
    by_a = {p.a: p for p in cmp.pairs}
    assert by_a["input_1"].layout.kind == "permuted" and by_a["input_1"].layout.perm == (0, 2, 3, 1)
    assert by_a["einsum_1_1"].layout.perm == (0, 2, 3, 1) and by_a["maximum_1_2"].b == "maximum_1_2"
    # the transpose back is the extra op of b: it belongs to the reshape's group, not to nobody
    assert by_a["reshape_1_3"].b_group == ("transpose_1_3", "reshape_1_4")
    assert by_a["tanh_1_5"].b == "tanh_1_6" and by_a["tanh_1_5"].layout.kind == "same"


def test_a_flatten_after_a_permuted_layout_is_a_carried_layout_not_a_divergence():
    cmp = tl.compare(trace(channels_first, X), trace(channels_last_flat, X_NHWC))
    assert cmp.first_divergence is None, str(cmp)
    flat = next(p for p in cmp.pairs if p.a == "reshape_1_3")
    assert flat.layout.kind == "carried" and flat.layout.perm == (0, 2, 3, 1)
    expected = np.asarray(a_value := trace(channels_first, X)["reshape_1_3"].out)
    assert np.array_equal(
        flat.layout.apply(a_value.astype(np.float64)).ravel(),
        expected.reshape(1, 8, 4, 4).transpose(0, 2, 3, 1).ravel(),
    )


def test_nhwc_flatten_without_the_weight_permutation_diverges_at_the_matmul():
    cmp = tl.compare(trace(channels_first, X), trace(nhwc_flatten_bug, X_NHWC))
    first = cmp.first_divergence
    assert first is not None and (first.a, first.verdict) == ("matmul_1_4", "diverges"), str(cmp)
    before = cmp.pairs[: cmp.pairs.index(first)]
    assert [p.a for p in before] == ["input_1", "einsum_1_1", "maximum_1_2", "reshape_1_3"]
    assert all(p.verdict == "agrees" for p in before)
    assert cmp.roots == [first]
    assert "First divergence: matmul_1_4" in str(cmp)


def test_a_small_numerical_difference_is_located_and_measured():
    a, b = trace(channels_first, X), trace(tanh_bug, X)
    cmp = tl.compare(a, b)
    first = cmp.first_divergence
    assert first is not None and first.a == "tanh_1_5", str(cmp)
    assert set(first.b_group) >= {"sqrt_1_6", "truediv_1_7"} or len(first.b_group) > 1
    expected = np.max(np.abs(np.asarray(a["tanh_1_5"].out, np.float64) - np.asarray(b[first.b].out, np.float64)))
    assert math.isclose(first.agreement.max_abs, expected, rel_tol=1e-12)
    assert cmp.pairs[cmp.pairs.index(first) - 1].verdict == "agrees"
    # everything after inherits the error: one root
    assert cmp.roots == [first] and cmp.pairs[-1].diverges


def test_tolerance_overrides_turn_a_divergence_into_agreement():
    cmp = tl.compare(trace(channels_first, X), trace(tanh_bug, X), rtol=1e-1)
    assert cmp.first_divergence is None, str(cmp)


def test_a_size_change_is_a_shape_divergence():
    def narrower(x):
        h = np.maximum(np.einsum("oc,nchw->nohw", W[:6], x), 0)
        return np.tanh(h.reshape(1, -1) @ V[:96]) * 2.0

    cmp = tl.compare(trace(channels_first, X), trace(narrower, X))
    first = cmp.first_divergence
    assert first is not None and first.a == "einsum_1_1" and first.verdict == "shape", str(cmp)
    assert "(1, 8, 4, 4) vs (1, 6, 4, 4)" in first.note


def test_loaded_traces_compare_as_live_ones(tmp_path):
    a, b = trace(channels_first, X), trace(nhwc_flatten_bug, X_NHWC)
    tl.save(a, tmp_path / "a")
    tl.save(b, tmp_path / "b")
    live, loaded = tl.compare(a, b), tl.compare(tl.load(tmp_path / "a"), tl.load(tmp_path / "b"))
    assert labels_of(live) == labels_of(loaded)
    assert [p.verdict for p in live.pairs] == [p.verdict for p in loaded.pairs]


def test_to_pandas_has_a_row_per_pair():
    cmp = tl.compare(trace(channels_first, X), trace(nhwc_flatten_bug, X_NHWC))
    frame = cmp.to_pandas()
    assert list(frame["a"]) == [p.a for p in cmp.pairs]
    assert list(frame["verdict"]) == [p.verdict for p in cmp.pairs]
    assert frame.loc[frame["a"] == "matmul_1_4", "max_abs"].item() == cmp.first_divergence.agreement.max_abs


def test_bad_arguments_are_typed_errors():
    a = trace(channels_first, X)
    with pytest.raises(tl.TorchLensError, match="two traces"):
        tl.compare(a, "b")
    with pytest.raises(tl.TorchLensError, match="match="):
        tl.compare(a, a, match={"x": 1})
    with pytest.raises(tl.TorchLensError, match="rtol="):
        tl.compare(a, a, rtol=-1)


def test_user_equivalences_are_evidence():
    tl.register_equivalence("my_gemm", funcs=("my_gemm_fn",))
    from torchlens_core.compare.classes import normalized, op_class

    op = trace(channels_first, X)["matmul_1_4"]
    assert normalized("__add__") == normalized("AddV2") == normalized("add_") == "add"
    assert op_class(op) == "matmul"
    with pytest.raises(tl.TorchLensError):
        tl.register_equivalence("", funcs=("x",))


def test_ulp_and_tolerance_follow_the_dtype():
    one = np.array([1.0])
    step = agreement(one + 2.0**-23, one, tolerance_for("float32"), "float32")
    assert step.ulp == 1.0 and step.ok  # one float32 ulp at 1.0
    assert agreement(one + 2.0**-7, one, tolerance_for("bfloat16"), "bfloat16").ulp == 1.0
    assert tolerance_for("float32", "bfloat16") == tolerance_for("bfloat16")  # the looser wins
    assert not agreement(one * 1.01, one, tolerance_for("float32"), "float32").ok
    assert agreement(one * 1.01, one, tolerance_for("bfloat16"), "bfloat16").ok


def test_to_networkx_is_the_op_graph():
    networkx = pytest.importorskip("networkx")
    t = trace(channels_last, X_NHWC)
    graph = t.to_networkx()
    assert isinstance(graph, networkx.DiGraph)
    # the code above: input -> einsum -> maximum -> transpose -> reshape -> matmul -> tanh -> mul -> output
    assert list(networkx.topological_sort(graph)) == [
        "input_1",
        "einsum_1_1",
        "maximum_1_2",
        "transpose_1_3",
        "reshape_1_4",
        "matmul_1_5",
        "tanh_1_6",
        "multiply_1_7",
        "output_1",
    ]
    assert graph.nodes["einsum_1_1"]["shape"] == (1, 4, 4, 8) and graph.nodes["tanh_1_6"]["func_name"] == "tanh"
    assert graph.number_of_edges() == 8 and graph.graph["framework"] == "numpy"


def shifted_tanh(x):  # the bug: an offset after the tanh, inside the doubling's group
    h = np.maximum(np.einsum("oc,nchw->nohw", W, x), 0)
    return (np.tanh(h.reshape(1, -1) @ V) + np.float32(1e-3)) * 2.0


def test_teacher_forcing_tells_the_op_that_introduced_an_error_from_those_that_inherit_it():
    a, b = trace(channels_first, X), trace(shifted_tanh, X)
    cmp = tl.compare(a, b, teacher_forcing=True)
    first = cmp.first_divergence
    assert (first.a, first.b_group) == ("multiply_1_6", ("add_1_6", "multiply_1_7")), str(cmp)
    assert first.origin == "introduced" and not first.local.ok and first.forced
    assert cmp.pairs[cmp.pairs.index(first) - 1].verdict == "agrees"  # the tanh itself agrees
    # the group's own error, by hand: b's shifted doubling on a's tanh
    t = np.asarray(a["tanh_1_5"].out)
    own = np.max(np.abs(t * 2.0 - (t + np.float32(1e-3)) * 2.0))
    assert first.local.max_abs == pytest.approx(float(own), rel=1e-5)
    # the output node after it passes the value on: its error is all inherited
    last = cmp.pairs[-1]
    assert last.diverges and last.origin == "inherited" and last.local.max_abs == 0.0
    assert last.amplification == pytest.approx(1.0)
    assert cmp.roots == [first]
    assert "diverges, introduced" in str(cmp)


def test_teacher_forcing_needs_b_replayable():
    a = trace(channels_first, X)
    b = trace(tanh_bug, X)
    b.notes["not_replayable"] = {"tanh_1_5": "not rebuilt"}
    with pytest.raises(tl.UnsupportedError, match="could not be rebuilt"):
        tl.compare(a, b, teacher_forcing=True)
    with pytest.raises(tl.TorchLensError, match="teacher_forcing="):
        tl.compare(a, a, teacher_forcing="yes")


def test_the_drawing_colours_ops_by_their_pairs_verdict():
    cmp = tl.compare(trace(channels_first, X), trace(nhwc_flatten_bug, X_NHWC))
    dot_a, dot_b = cmp.to_dot("a"), cmp.to_dot("b")

    def fill(dot, index):
        line = next(line for line in dot.splitlines() if line.strip().startswith(f'"op {index}" ['))
        return line.split('fillcolor="')[1].split('"')[0]

    assert fill(dot_a, 1) == "#c7e9c0"  # einsum agrees
    assert fill(dot_a, 4) in ("#fcbba1", "#fb6a4a", "#cb181d")  # the matmul diverges
    assert fill(dot_b, 3) == "#c7e9c0" and fill(dot_b, 4) != "#c7e9c0"  # b's reshape agrees, its matmul not
    with pytest.raises(tl.TorchLensError, match="side="):
        cmp.to_dot("c")


def test_a_backend_plugin_names_its_own_ops_for_the_equivalence_table():
    from torchlens_core.compare.classes import op_class

    def gram(x):
        return np.inner(x.reshape(3, -1), x.reshape(3, -1))

    t = trace(gram, X)
    inner = next(op for op in t.ops if op.func_name == "inner")
    tl.compare(t, t)  # asks each compared backend's plugin (torchlens_op_classes) for its names
    assert op_class(inner) == "matmul"


TABLE = RNG.standard_normal((4, 6)).astype(np.float32)


def scaled_once(x):  # a [1, 4, 6] scale computed once and broadcast by the multiply
    scale = np.tanh(x.mean(axis=0, keepdims=True))
    return (x * scale) @ TABLE.T


def scaled_per_row(x):  # the port materializes the scale for every row, and merges batch and tokens
    scale = np.tanh(np.repeat(x.mean(axis=0, keepdims=True), x.shape[0], axis=0))
    flat = (x * scale).reshape(-1, 6)
    return (flat @ TABLE.T).reshape(x.shape[0], 4, 4)


def test_a_broadcast_and_merged_axes_are_layouts_not_shape_divergences():
    x = RNG.standard_normal((3, 4, 6)).astype(np.float32)
    cmp = tl.compare(trace(scaled_once, x), trace(scaled_per_row, x))
    assert cmp.first_divergence is None, str(cmp)
    by_a = {p.a: p for p in cmp.pairs}
    assert by_a["tanh_1_2"].b == "tanh_1_3" and by_a["tanh_1_2"].layout.kind == "broadcast", str(cmp)
    assert by_a["matmul_1_4"].layout.kind == "reshaped" and by_a["matmul_1_4"].verdict == "agrees"

    # a broadcast is checked element for element: a port whose rows differ is not the broadcast value
    def uneven(x):
        rows = np.repeat(x.mean(axis=0, keepdims=True), x.shape[0], axis=0)
        scale = np.tanh(rows * np.float32([[[1.0]], [[1.0]], [[1.01]]]))
        return ((x * scale).reshape(-1, 6) @ TABLE.T).reshape(x.shape[0], 4, 4)

    first = tl.compare(trace(scaled_once, x), trace(uneven, x)).first_divergence
    assert first is not None and first.a == "tanh_1_2" and first.verdict == "diverges"


def positions_cumsum(ids, mask):  # position ids from the mask, as RoBERTa makes them
    return np.cumsum(mask, axis=1) * mask + ids * 0


def positions_arange(mask, ids):  # the other port: inputs in the other order, the same positions
    return (np.arange(1, mask.shape[1] + 1)[None, :] * mask) + ids * 0


def test_inputs_pair_by_value_and_integers_compare_exactly():
    ids = RNG.integers(0, 50, (2, 5))
    mask = np.ones((2, 5), dtype=np.int64)
    cmp = tl.compare(
        tl.trace(positions_cumsum, ids, mask, backend="numpy"), tl.trace(positions_arange, mask, ids, backend="numpy")
    )
    by_a = {p.a: p for p in cmp.pairs}
    assert by_a["input_1"].b == "input_2" and by_a["input_2"].b == "input_1", str(cmp)
    assert cmp.first_divergence is None and all("exactly" in p.note for p in cmp.pairs), str(cmp)
    # one position off is a divergence of an exact comparison, not a small float error
    off = tl.compare(
        tl.trace(positions_cumsum, ids, mask, backend="numpy"),
        tl.trace(lambda m, i: positions_arange(m, i) + 1, mask, ids, backend="numpy"),
    )
    first = off.first_divergence
    assert first is not None and first.a == "output_1" and first.agreement.tolerance.rtol == 0, str(off)
    assert first.agreement.max_abs == 1.0


K = RNG.standard_normal((6, 6)).astype(np.float32)


def scale_after(x):  # scores, then the scale: as torch's DistilBERT does
    k = x @ K.T
    return np.tanh((x @ k.transpose(0, 2, 1)) * np.float32(0.5))


def scale_before(x):  # the scale on the query first: as its Flax port does
    k = x @ K.T
    return np.tanh((x * np.float32(0.5)) @ k.transpose(0, 2, 1))


def scale_before_wrong(x):  # a real bug at the same place: the wrong scale
    k = x @ K.T
    return np.tanh((x * np.float32(0.25)) @ k.transpose(0, 2, 1))


def test_a_scale_applied_before_the_matmul_on_one_side_and_after_on_the_other_is_no_divergence():
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    cmp = tl.compare(trace(scale_after, x), trace(scale_before, x))
    assert cmp.first_divergence is None, str(cmp)
    wrong = tl.compare(trace(scale_after, x), trace(scale_before_wrong, x))
    assert wrong.first_divergence is not None and wrong.first_divergence.verdict == "diverges", str(wrong)


def token_types(ids):  # zeros made from the ids (as a token-type default), then used
    types = np.zeros_like(ids)
    return np.tanh(ids * 0.1 + types)


def negative_flags(ids):  # the port: an all-False check of the same ids, used the same way
    flags = ids < 0
    return np.tanh(ids * 0.1 + flags)


def test_values_that_say_little_pair_only_with_ops_of_their_kind():
    ids = RNG.integers(0, 50, (2, 5))
    cmp = tl.compare(tl.trace(token_types, ids, backend="numpy"), tl.trace(negative_flags, ids, backend="numpy"))
    assert cmp.first_divergence is None, str(cmp)
    pairs = {p.a: p.b for p in cmp.pairs}
    assert "zeros_like_1_1" not in pairs, pairs  # all zeros against all False: equal, and no counterparts
    assert pairs["tanh_1_4"] == "tanh_1_4"
