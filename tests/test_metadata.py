"""Per-op metadata on real torch models: FLOPs, distances, branches, config, code context, reports."""

from __future__ import annotations

import json
import math
import pickle

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import torchlens as tl  # noqa: E402


@pytest.fixture(scope="module")
def alexnet_trace():
    model = torchvision.models.alexnet(weights=None)
    return tl.trace(model, torch.randn(1, 3, 224, 224))


# Published multiply-accumulate counts at 224x224 (torchvision's model cards call them GFLOPS).
@pytest.mark.parametrize(("name", "published_macs"), [("alexnet", 0.71e9), ("resnet18", 1.81e9)])
def test_macs_match_published_figures(name, published_macs):
    trace = tl.trace(getattr(torchvision.models, name)(weights=None).eval(), torch.randn(1, 3, 224, 224))
    assert trace.unknown_flops == []
    assert trace.macs == pytest.approx(published_macs, rel=0.01)
    assert trace.flops == pytest.approx(2 * trace.macs, rel=0.02)  # contractions dominate


def test_flops_by_hand_on_a_small_model():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, groups=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 5),
    )
    trace = tl.trace(model, torch.randn(2, 3, 6, 6))
    conv1, relu, conv2, flat, linear = (trace[f"{i}"] for i in range(5))
    out1 = 2 * 8 * 6 * 6
    assert conv1.macs == out1 * 3 * 3 * 3 and conv1.flops == 2 * conv1.macs + out1  # + bias
    assert relu.flops == out1 and relu.macs == 0
    assert conv2.macs == out1 * (8 // 4) * 3 * 3 and conv2.flops == 2 * conv2.macs  # grouped, no bias
    assert flat.flops == 0
    assert linear.macs == 2 * 5 * 288 and linear.flops == 2 * linear.macs + 2 * 5
    assert trace.macs == conv1.macs + conv2.macs + linear.macs


def test_attention_and_matmul_flops():
    q, k, v = torch.randn(2, 4, 10, 16), torch.randn(2, 4, 12, 16), torch.randn(2, 4, 12, 8)

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) @ torch.randn(8, 3)

    trace = tl.trace(f, q, k, v)
    attn, matmul = trace["scaled_dot_product_attention_1"], trace["matmul_1"]
    assert attn.macs == 2 * 4 * 10 * 12 * (16 + 8)
    assert matmul.macs == 2 * 4 * 10 * 8 * 3


def test_unknown_flops_stay_unknown_until_registered():
    def f(x):
        return torch.fft.fft(x).real + 1

    trace = tl.trace(f, torch.randn(8))
    fft = trace.find(tl.func("fft_fft"))[0]
    assert fft.flops is None and fft.macs is None
    assert fft in trace.unknown_flops
    assert "unknown" in trace.summary()

    tl.register_flops("fft_fft", lambda call: (5 * call.out_numel * math.log2(call.out_numel), 0), backend="torch")
    try:
        again = tl.trace(f, torch.randn(8))
        assert again.find(tl.func("fft_fft"))[0].flops == 5 * 8 * 3
        assert again.unknown_flops == []
    finally:
        from torchlens_core.views import flops

        flops._USER.clear()


def test_register_flops_rejects_bad_input():
    with pytest.raises(TypeError, match="function name"):
        tl.register_flops(None, lambda call: (0, 0))
    with pytest.raises(TypeError, match="callable"):
        tl.register_flops("relu", 3)


def test_summary_has_flop_totals(alexnet_trace):
    text = alexnet_trace.summary()
    assert "Forward FLOPs: 1.4 GFLOPs  MACs: 714.2 M" in text


def test_flops_and_macs_print_as_the_summary_says_and_stay_numbers(alexnet_trace):
    flops, macs = alexnet_trace.flops, alexnet_trace.macs
    assert (str(flops), str(macs)) == ("1.4 GFLOPs", "714.2 MMACs")
    assert f"Forward FLOPs: {flops}  MACs: 714.2 M" in alexnet_trace.summary()
    assert repr(flops) == f"1.4 GFLOPs ({int(flops):,})" and repr(macs) == f"714.2 MMACs ({int(macs):,})"
    # a number in every other way: arithmetic, format specs, JSON, pickling
    assert isinstance(flops, float) and type(flops / 1e9) is float and flops / 1e9 == pytest.approx(1.43, abs=0.005)
    assert f"{flops:.3e}" == format(float(flops), ".3e") and round(macs) == int(macs)
    assert json.loads(json.dumps({"flops": flops})) == {"flops": float(flops)}
    again = pickle.loads(pickle.dumps(flops))
    assert again == flops and str(again) == "1.4 GFLOPs"


def test_small_totals_print_without_a_prefix():
    # linear 4->8: 32 MACs, 64 + 8 bias FLOPs; relu: 8; linear 8->2: 16 MACs, 32 + 2 bias FLOPs
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    trace = tl.trace(model, torch.randn(1, 4))
    assert (trace.flops, trace.macs) == (114, 48)
    assert (str(trace.flops), repr(trace.flops), str(trace.macs)) == ("114 FLOPs", "114 FLOPs", "48 MACs")


def test_buffers_are_reported_apart_from_parameters():
    model = torchvision.models.resnet18(weights=None).eval()
    trace = tl.trace(model, torch.randn(1, 3, 64, 64))
    in_params = sum(p.numel() for p in model.parameters())
    in_buffers = sum(b.numel() for b in model.buffers())  # running statistics and batch counters
    assert f"Params: {in_params:,} unique; trainable: {in_params:,}; buffers: {in_buffers:,}\n" in trace.summary()
    assert f", {in_params / 1e6:.1f} M params;" in str(trace).splitlines()[0]
    text = str(trace["bn1"])
    assert "Params: computed from params with shape (64,), (64,); 128 params total (512 B), 128 trainable" in text
    assert "Buffers: reads buffers with shape (64,), (64,); 128 values (512 B), not counted as params" in text


def test_detailed_op_print_matches_the_seed_layout(alexnet_trace):
    text = str(alexnet_trace["conv2d_3_7"])
    lines = text.splitlines()
    assert lines[0] == "Layer conv2d_3_7, operation 7/22:"
    assert "shape=(1, 384, 13, 13), dtype=float32, device=cpu, size=253.5 KB" in lines[1]
    assert "- parent layers: max_pool2d_2_6" in text and "- child layers: relu_3_8" in text
    assert (
        "Params: computed from params with shape (384, 192, 3, 3), (384,); "
        "663,936 params total (2.5 MB), 663,936 trainable"
    ) in text
    assert "Computed inside module: features.6:1" in text
    assert "Config: out_channels=384, in_channels=192, kernel_size=(3, 3), padding=(1, 1)" in text  # the module's
    assert "Time elapsed: " in text
    assert lines[-1] == (
        "    Lookup keys: -17, 7, conv2d_3, conv2d_3:1, conv2d_3_7, conv2d_3_7:1, features.6, features.6:1"
    )


def test_trace_print_is_an_overview(alexnet_trace):
    text = str(alexnet_trace)
    lines = text.splitlines()
    assert lines[0].startswith("Trace of AlexNet (torch): 22 ops, 23 edges")
    assert len(lines) == 1 + len(alexnet_trace)
    assert any(line.split()[:2] == ["conv2d_3_7", "conv2d(max_pool2d_2_6)"] for line in lines)


def test_long_trace_overview_is_elided():
    model = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(100)])
    text = str(tl.trace(model, torch.randn(3)))
    assert "... 42 more ops ..." in text and len(text.splitlines()) == 1 + 40 + 1 + 20


def test_code_context_points_at_the_users_code():
    class Net(torch.nn.Module):
        def forward(self, x):
            return helper(x) * 2

    def helper(x):
        return x + 1

    trace = tl.trace(Net(), torch.randn(3))
    loc = trace["add_1"].code_context[0]
    assert (loc.file, loc.func_name) == (__file__, "helper")
    assert [c.func_name for c in trace["add_1"].code_context] == ["helper", "forward"]
    assert trace["mul_1"].code_context[0].line_number == loc.line_number - 3


def test_bytes_elapsed_and_config():
    model = torch.nn.Conv2d(3, 4, 3, stride=2).double()
    trace = tl.trace(model, torch.randn(1, 3, 9, 9, dtype=torch.float64))
    conv = trace["conv2d_1"]
    assert conv.num_bytes == 1 * 4 * 4 * 4 * 8
    assert conv.elapsed is not None and conv.elapsed > 0
    assert conv.config == {"stride": (2, 2), "padding": (0, 0), "dilation": (1, 1), "groups": 1}
    assert trace["input_1"].elapsed is None


def test_graph_distances_on_a_residual_block():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))) + x  # long path of 3 ops, skip path of 0

    trace = tl.trace(Block(), torch.randn(2, 4))
    add = trace["add_1"].distances
    assert (add.min_from_input, add.max_from_input) == (1, 4)
    assert (add.min_to_output, add.max_to_output) == (1, 1)
    first = trace["linear_1"].distances
    assert (first.min_from_input, first.max_to_output) == (1, 4)
    assert trace["input_1"].distances.min_to_output == 2


def test_constant_sources_have_no_path_from_inputs():
    def f(x):
        return x + torch.ones(3)

    trace = tl.trace(f, torch.randn(3))
    assert trace["ones_1"].distances.min_from_input is None
    assert trace["ones_1"].distances.min_to_output == 2


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = torch.relu(h) * 2
        else:
            h = self.b(h)
        n = 0
        while h.abs().max() > 0.5 and n < 2:
            h = h / 2
            n += 1
        return h + 1


def test_data_dependent_branches_are_marked():
    model = Gate()
    with torch.no_grad():
        model.a.weight.fill_(0.5)
        model.a.bias.fill_(1.0)
    trace = tl.trace(model, torch.ones(1, 4))
    gt = trace["gt_1"].label
    assert trace["relu_1"].conditions == [gt] and trace["relu_1"].in_branch
    assert trace["mul_1"].conditions == [gt]
    divs = trace.find(tl.func("div"))
    assert len(divs) == 2
    assert [d.conditions for d in divs] == [[trace.find(tl.func("gt"))[1].label], [trace.find(tl.func("gt"))[2].label]]
    for label in ("linear_1", "sum_1", "gt_1", "add_1"):
        assert not trace[label].in_branch, label
    assert f"Inside a data-dependent branch decided by: {gt}" in str(trace["relu_1"])


def test_the_other_branch_is_marked_too():
    model = Gate()
    with torch.no_grad():
        model.a.weight.fill_(-0.5)
        model.a.bias.fill_(-1.0)
        model.b.weight.fill_(0.01)
        model.b.bias.zero_()
    trace = tl.trace(model, torch.ones(1, 4))
    assert trace["linear_2"].conditions == [trace["gt_1"].label]
    assert "div" not in {op.func_name for op in trace}


def test_new_table_columns(alexnet_trace):
    pytest.importorskip("pandas")
    df = alexnet_trace.to_pandas().set_index("label")
    row = df.loc["conv2d_3_7"]
    assert row["macs"] == alexnet_trace["conv2d_3_7"].macs
    assert row["num_bytes"] == 1 * 384 * 13 * 13 * 4
    assert row["min_distance_from_input"] == 7 and row["max_distance_to_output"] == 16
    assert row["config"]["groups"] == 1
    assert df["flops"].sum() == alexnet_trace.flops


def test_random_ops_say_their_rng_state_is_recorded():
    trace = tl.trace(torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.ReLU()).train(), torch.randn(4))
    assert "Random: the RNG state before the call is recorded" in str(trace["dropout_1"])
    assert "Random:" not in str(trace["relu_1"])
