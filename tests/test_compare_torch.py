"""tl.compare on PyTorch: same-framework uses (a refactor, float64 vs float32, a clean vs an intervened run).

The expected answer of each test is known by construction (which layer was
changed, which op was edited), independently of the aligner.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402


class Block(nn.Module):
    def __init__(self, eps: float = 1e-5, p: float = 0.0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8, eps=eps)
        self.drop = nn.Dropout(p)
        self.head = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        h = self.norm(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        h = self.drop(torch.nn.functional.gelu(h))
        return self.head(h.flatten(1))


def pair(**changes):
    torch.manual_seed(0)
    a = Block().eval()
    b = Block(**changes)
    b.load_state_dict(a.state_dict())
    return a, b


X = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))  # the same whatever ran before


def test_a_copy_agrees_everywhere_and_pairs_op_for_op():
    a, b = pair()
    ta, tb = tl.trace(a, X), tl.trace(b.eval(), X)
    cmp = tl.compare(ta, tb)
    assert cmp.first_divergence is None
    assert [(p.a, p.b) for p in cmp.pairs] == [(op.label, op.label) for op in ta.ops]


def test_a_changed_epsilon_is_located_at_the_layer_norm():
    a, b = pair(eps=1e-2)
    cmp = tl.compare(tl.trace(a, X), tl.trace(b.eval(), X))
    first = cmp.first_divergence
    assert first is not None and first.a == "layer_norm_1_4" and first.module == "norm", str(cmp)
    assert all(p.verdict == "agrees" for p in cmp.pairs[: cmp.pairs.index(first)])
    assert cmp.roots == [first]
    # the reported error is the layer's own: against the layer run by hand on the same input
    h = torch.relu(a.conv(X)).permute(0, 2, 3, 1)
    expected = (
        (
            nn.functional.layer_norm(h, (8,), a.norm.weight, a.norm.bias, 1e-5)
            - nn.functional.layer_norm(h, (8,), a.norm.weight, a.norm.bias, 1e-2)
        )
        .abs()
        .max()
        .item()
    )
    assert first.agreement.max_abs == pytest.approx(expected, rel=1e-5)


def test_dropout_left_in_training_mode_is_reported_as_randomness():
    a, b = pair(p=0.5)
    cmp = tl.compare(tl.trace(a, X), tl.trace(b.train(), X))
    first = cmp.first_divergence
    assert first is not None and "random op in b" in first.note and "dropout" in first.note, str(cmp)
    assert first.a == "dropout_1_7"


def test_float64_against_float32_agrees_within_float32_tolerance():
    a, _ = pair()
    b = Block().double().eval()
    b.load_state_dict(a.state_dict())
    cmp = tl.compare(tl.trace(a, X), tl.trace(b, X.double()))
    assert cmp.first_divergence is None, str(cmp)
    assert max(p.agreement.max_abs for p in cmp.pairs) > 0  # really two precisions
    assert cmp.pairs[1].agreement.tolerance.rtol == 1e-4  # float32's, the looser of the two


def test_a_clean_run_against_an_intervened_one_diverges_at_the_edit():
    a, _ = pair()
    clean = tl.trace(a, X)
    edited = tl.trace(a, X, intervene=tl.when(tl.func("relu"), tl.scale(0.5)))
    cmp = tl.compare(clean, edited)
    first = cmp.first_divergence
    assert first is not None and first.a == "relu_1_2", str(cmp)
    assert first.agreement.max_abs == pytest.approx(clean["relu_1_2"].out.abs().max().item() / 2, rel=1e-6)


def test_to_networkx_matches_the_recorded_parents():
    networkx = pytest.importorskip("networkx")
    a, _ = pair()
    t = tl.trace(a, X)
    graph = t.to_networkx()
    assert sorted(graph.predecessors("layer_norm_1_4")) == ["permute_1_3"]
    assert graph.nodes["conv2d_1_1"]["module"] == "conv" and graph.nodes["conv2d_1_1"]["shape"] == (2, 8, 6, 6)
    assert networkx.is_directed_acyclic_graph(graph)
    assert graph.number_of_nodes() == len(t.ops)


def test_parameters_pair_through_the_ops_and_a_transposed_weight_stands_out():
    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))

        def forward(self, x):
            return self.layers(x)

    torch.manual_seed(0)
    a, b = Mlp().eval(), Mlp().eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.layers[2].weight.copy_(a.layers[2].weight.T)  # copied without its transpose
    x = torch.randn(3, 6)
    cmp = tl.compare(tl.trace(a, x), tl.trace(b, x))
    assert cmp.first_divergence.a == "linear_2_3" and cmp.first_divergence.module == "layers.2", str(cmp)
    by_name = {p.a: p for p in cmp.params}
    assert sorted(by_name) == sorted(name for name, _ in a.named_parameters())
    assert all(by_name[n].b == n for n in by_name)  # same model: each parameter with itself
    odd = by_name["layers.2.weight"]
    assert odd.layout.perm == (1, 0) and odd.verdict == "agrees" and "layout axes (1, 0)" in odd.note
    assert all(p.layout.kind == "same" and not p.note for n, p in by_name.items() if n != "layers.2.weight")
    assert cmp.unmatched_params == ([], [])


def test_teacher_forcing_on_torch_finds_one_introduced_error_and_inherited_ones_after_it():
    a, b = pair(eps=1e-2)
    cmp = tl.compare(tl.trace(a, X), tl.trace(b.eval(), X), teacher_forcing=True)
    first = cmp.first_divergence
    assert first.a == "layer_norm_1_4" and first.origin == "introduced", str(cmp)
    later = [p for p in cmp.pairs[cmp.pairs.index(first) + 1 :] if p.diverges]
    assert later and all(p.origin == "inherited" for p in later), str(cmp)
    # b's linear run on a's flatten output is a's linear: the same weights, exactly
    head = next(p for p in cmp.pairs if p.a == "linear_1_9")
    assert head.local.max_abs == 0.0 and head.forced
    assert cmp.roots == [first]


def test_match_maps_module_paths_that_the_two_sides_name_differently():
    torch.manual_seed(0)
    a = nn.Sequential()
    a.add_module("features", nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
    a.add_module("head", nn.Flatten())
    b = nn.Sequential()
    b.add_module("body", nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
    b.add_module("out", nn.Flatten())
    b.body.load_state_dict(a.features.state_dict())
    ta, tb = tl.trace(a, X), tl.trace(b, X)
    plain = tl.compare(ta, tb)
    mapped = tl.compare(ta, tb, match={"features": "body", "head": "out"})
    conv_plain = next(p for p in plain.pairs if p.a == "conv2d_1_1")
    conv_mapped = next(p for p in mapped.pairs if p.a == "conv2d_1_1")
    assert "module output" not in conv_plain.evidence and "module output" in conv_mapped.evidence
    assert conv_mapped.confidence > conv_plain.confidence
    assert mapped.first_divergence is None and [p.b for p in mapped.pairs] == [p.b for p in plain.pairs]


def test_bfloat16_against_float32_is_held_to_bfloat16_tolerance():
    a, _ = pair()
    b = Block().eval()
    b.load_state_dict(a.state_dict())
    b = b.to(torch.bfloat16)
    ta, tb = tl.trace(a, X), tl.trace(b, X.to(torch.bfloat16))
    cmp = tl.compare(ta, tb)
    by_a = {p.a: p for p in cmp.pairs}
    # the input and the convolution agree at bfloat16's precision...
    assert by_a["input_1"].agreement.tolerance.rtol == 2e-2
    assert by_a["input_1"].verdict == "agrees" and by_a["conv2d_1_1"].verdict == "agrees", str(cmp)
    assert 0 < by_a["input_1"].agreement.max_abs <= 2.0**-8 * float(X.abs().max())  # one bf16 rounding
    # ...and not at float32's: bfloat16's rounding of the input is already a difference there
    strict = tl.compare(ta, tb, rtol=1e-4, atol=1e-6)
    assert strict.first_divergence is not None and strict.first_divergence.a == "input_1"
