"""tl.compare on two encoders written the way different people write them (issue 35).

``BertStyle`` is written as Hugging Face's BERT is: separate q, k, v
projections in that order, heads split with ``view``/``transpose``, an additive
mask filled with the dtype's minimum, position ids made from an ``arange`` and
looked up per batch row, the attention spelled out as matmul, softmax, matmul,
and token positions carried as ``[B, S, D]``. ``FusedStyle`` computes the same
function as a compact implementation does: one fused qkv projection split into
k, v and q (another order), positions as an ``[S, D]`` table broadcast onto the
batch, tokens merged into ``[B·S, D]`` around the MLP, the attention as
``scaled_dot_product_attention`` with a boolean mask (``-inf`` inside), and
inputs taken in the other order (mask first). The weights are copied by hand,
so the untraced outputs agree (checked) and every op pair the aligner reports
can be checked against what the code says.

The injected bugs (GELU's tanh approximation, LayerNorm epsilon, a transposed
q weight) are placed in ``FusedStyle`` only; where each must be reported is
known from the code.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402

B, S, D, HEADS, VOCAB, HIDDEN = 2, 5, 16, 2, 11, 32


class BertStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word = nn.Embedding(VOCAB, D)
        self.position = nn.Embedding(S, D)
        self.norm0 = nn.LayerNorm(D, eps=1e-5)
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.attn_out = nn.Linear(D, D)
        self.norm1 = nn.LayerNorm(D, eps=1e-5)
        self.up, self.down = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)
        self.norm2 = nn.LayerNorm(D, eps=1e-5)

    def heads(self, x):
        return x.view(B, S, HEADS, D // HEADS).transpose(1, 2)

    def forward(self, ids, mask):
        positions = torch.arange(S).unsqueeze(0).expand(B, S)
        h = self.norm0(self.word(ids) + self.position(positions))
        q, k, v = self.heads(self.query(h)), self.heads(self.key(h)), self.heads(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D // HEADS)
        scores = scores + (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        context = torch.matmul(scores.softmax(-1), v).transpose(1, 2).reshape(B, S, D)
        h = self.norm1(h + self.attn_out(context))
        return self.norm2(h + self.down(F.gelu(self.up(h))))


class FusedStyle(nn.Module):
    def __init__(self, bug: str = "") -> None:
        super().__init__()
        self.bug = bug
        self.tokens = nn.Embedding(VOCAB, D)
        self.positions = nn.Parameter(torch.zeros(S, D))
        self.ln_embed = nn.LayerNorm(D, eps=1e-5)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln_attn = nn.LayerNorm(D, eps=1e-3 if bug == "ln_eps" else 1e-5)  # Keras's default
        self.fc1, self.fc2 = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)
        self.ln_mlp = nn.LayerNorm(D, eps=1e-5)

    def forward(self, mask, ids):
        x = self.ln_embed(self.tokens(ids) + self.positions)
        k, v, q = self.qkv(x).view(B, S, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)[[1, 2, 0]]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bool()[:, None, None, :])
        x = self.ln_attn(x + self.proj(y.transpose(1, 2).reshape(B, S, D)))
        flat = x.reshape(B * S, D)
        act = F.gelu(self.fc1(flat), approximate="tanh" if self.bug == "gelu_tanh" else "none")
        return self.ln_mlp(x + self.fc2(act).view(B, S, D))


def ported(a: BertStyle, bug: str = "") -> FusedStyle:
    """``a``'s weights in ``FusedStyle``'s layout: the port, with one bug or none."""
    b = FusedStyle(bug)
    with torch.no_grad():
        b.tokens.weight.copy_(a.word.weight)
        b.positions.copy_(a.position.weight)
        q_weight = a.query.weight.T if bug == "transposed_weight" else a.query.weight
        b.qkv.weight.copy_(torch.cat([q_weight, a.key.weight, a.value.weight]))
        b.qkv.bias.copy_(torch.cat([a.query.bias, a.key.bias, a.value.bias]))
        for mine, theirs in (
            (b.proj, a.attn_out),
            (b.fc1, a.up),
            (b.fc2, a.down),
            (b.ln_embed, a.norm0),
            (b.ln_attn, a.norm1),
            (b.ln_mlp, a.norm2),
        ):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    return b.eval()


def inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, S), generator=generator)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, -2:] = 0  # the second row is padded: masked keys matter
    return ids, mask


def reference() -> BertStyle:
    torch.manual_seed(0)
    model = BertStyle().eval()
    with torch.no_grad():  # LayerNorm weights away from 1 and 0, an input scale that makes GELU's tails matter
        for norm in (model.norm0, model.norm1, model.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        model.up.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def traces():
    a = reference()
    ids, mask = inputs()
    found = {"": tl.trace(a, ids, mask)}
    for bug in ("", "gelu_tanh", "ln_eps", "transposed_weight"):
        b = ported(a, bug)
        with torch.no_grad():
            gap = (a(ids, mask) - b(mask, ids)).abs().max().item()
        assert (gap < 1e-5) == (bug == ""), (bug, gap)  # the port is right, and each bug shows in the output
        found[bug or "correct"] = tl.trace(b, mask, ids)
    return found


def test_the_correct_port_agrees_everywhere_though_it_is_written_differently(traces):
    cmp = tl.compare(traces[""], traces["correct"])
    assert cmp.first_divergence is None, str(cmp)
    a, b = traces[""], traces["correct"]
    by_a = {p.a: p for p in cmp.pairs if not p.a_path}
    # inputs matched by value, not position: a's ids are b's second argument
    assert by_a["input_1"].b == "input_2" and by_a["input_2"].b == "input_1"
    assert "compared exactly" in by_a["input_1"].note
    # q, k and v are paired with their own values although b computes k, v, q from one fused projection
    # (b's unbind returns k, v, q: each of a's projections pairs with its own array of that tuple)
    for name, path in (("query", (2,)), ("key", (0,)), ("value", (1,))):
        op_a = next(op for op in a.ops if op.module_outputs == [f"{name}:1"])
        pair = next(p for p in cmp.pairs if p.a == op_a.label)
        assert b[pair.b].func_name == "unbind" and pair.b_path == path, str(cmp)
        assert pair.verdict == "agrees" and pair.basis == "values" and pair.layout.kind == "reshaped"
    # the attention: b's fused scaled_dot_product_attention against a's matmul, softmax, matmul
    fused = next(p for p in cmp.pairs if b[p.b].func_name == "scaled_dot_product_attention")
    assert a[fused.a].func_name == "matmul" and any(a[x].func_name == "softmax" for x in fused.a_group)
    # the merged [B*S, D] tokens around the MLP against a's [B, S, D]
    fc1 = next(p for p in cmp.pairs if b[p.b].module_outputs == ["fc1:1"])
    assert fc1.a == next(op.label for op in a.ops if op.module_outputs == ["up:1"])
    assert fc1.layout.kind == "reshaped" and fc1.verdict == "agrees"
    # every op is compared one to one or sits in a compared group (the views, the spelled-out attention)
    for side in ("a", "b"):
        coverage = cmp.coverage[side]
        assert coverage.compared + coverage.in_groups == coverage.ops and coverage.compared >= coverage.ops / 2
    assert cmp.unaligned == [] and cmp.unmatched_a == [] and cmp.unmatched_b == []


def test_mask_fills_agree_whatever_their_value():
    a = torch.tensor([[0.5, torch.finfo(torch.float32).min, -1e9], [1.0, 2.0, -10000.0]], dtype=torch.float64)
    b = torch.tensor([[0.5, -math.inf, -math.inf], [1.0, 2.0, -math.inf]], dtype=torch.float64)
    from torchlens_core.compare.metrics import agreement, tolerance_for

    assert agreement(a.numpy(), b.numpy(), tolerance_for("float32")).ok
    # a fill against a real value is a difference, and the fills do not inflate the tolerance
    b[1, 0] = -math.inf
    assert not agreement(a.numpy(), b.numpy(), tolerance_for("float32")).ok
    c = a.clone()
    c[0, 0] = 0.6
    assert not agreement(c.numpy(), a.numpy(), tolerance_for("float32")).ok


@pytest.mark.parametrize(
    ("bug", "module_b", "module_a"),
    [("gelu_tanh", None, None), ("ln_eps", "ln_attn", "norm1"), ("transposed_weight", None, "query")],
)
def test_each_porting_bug_is_found_where_it_is(traces, bug, module_b, module_a):
    cmp = tl.compare(traces[""], traces[bug])
    first = cmp.first_divergence
    assert first is not None, str(cmp)
    before = cmp.pairs[: cmp.pairs.index(first)]
    assert all(p.verdict == "agrees" for p in before), str(cmp)
    a, b = traces[""], traces[bug]
    if bug == "gelu_tanh":  # a functional op: found by its class
        assert a[first.a].func_name == "gelu" and b[first.b].func_name == "gelu", str(cmp)
    if module_b is not None:
        assert b[first.b].module_outputs == [f"{module_b}:1"], str(cmp)
    if bug == "transposed_weight":  # b's q is a slice of its fused projection: found as a's query output
        assert a[first.a].module_outputs == [f"{module_a}:1"], str(cmp)
    elif module_a is not None:
        assert a[first.a].module_outputs == [f"{module_a}:1"], str(cmp)
    assert first.basis == "inputs" and first.confidence >= 0.5
    assert cmp.roots[0] is first


def test_nothing_is_left_half_aligned_when_the_two_sides_share_no_value():
    a = reference()
    ids, mask = inputs()
    other = tl.trace(nn.Linear(S, 3).eval(), torch.randn(B, S))
    cmp = tl.compare(tl.trace(a, ids, mask), other)
    assert cmp.first_divergence is None or cmp.first_divergence.basis == "inputs"
    assert all(p.verdict in ("agrees", "diverges", "shape", "unknown") for p in cmp.pairs)


class SpelledGelu(nn.Module):  # GELU's tanh form spelled out, as Keras lowers it on TensorFlow
    def __init__(self) -> None:
        super().__init__()
        self.dense, self.out = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

    def forward(self, x):
        h = self.dense(x)
        inner = h + 0.044715 * torch.pow(h, 3)  # nearly h itself where h is small
        return self.out(0.5 * h * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * inner)))


class FusedGelu(SpelledGelu):  # the same layer with torch's fused op, and a copy of h as Keras's casts make
    def forward(self, x):
        return self.out(F.gelu(self.dense(x).clone(), approximate="tanh"))


def test_an_intermediate_of_a_decomposition_is_not_a_divergence_when_what_follows_agrees():
    torch.manual_seed(0)
    a = SpelledGelu().eval()
    b = FusedGelu().eval()
    b.load_state_dict(a.state_dict())
    x = 0.1 * torch.randn(B, S, D)
    with torch.no_grad():
        assert (a(x) - b(x)).abs().max() < 1e-6
    cmp = tl.compare(tl.trace(a, x), tl.trace(b, x))
    assert cmp.first_divergence is None, str(cmp)  # `inner` is near b's dense output, but it is not its counterpart
    gelu = next(p for p in cmp.pairs if tl.trace(b, x)[p.b].func_name == "gelu")
    assert gelu.verdict == "agrees" and len(gelu.a_group) > 3  # the fused op against the spelled-out form


@pytest.mark.parametrize("bug", ["gelu_tanh", "ln_eps"])
def test_teacher_forcing_runs_through_crossed_pairs_and_arrays_of_tuples(traces, bug):
    cmp = tl.compare(traces[""], traces[bug], teacher_forcing=True)
    first = cmp.first_divergence
    assert first.origin == "introduced" and first.forced and not first.local.ok, str(cmp)
    assert [r.a for r in cmp.roots] == [first.a]  # everything after it inherits
    assert not any("could not force" in p.note for p in cmp.pairs)
    # b's q, k and v come out of one unbind: each forced pair read a's value for its own array of the tuple
    assert sum(p.forced is True for p in cmp.pairs) >= len(cmp.pairs) - 2


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, D), nn.Tanh())
        self.fc2, self.fc3 = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):  # fc2 and fc3 side by side: shape, class and inputs cannot tell them apart
        h = self.pre(x)
        return self.fc2(h) * torch.sigmoid(self.fc3(h))


class Wrapped(nn.Module):  # the port nests the same layers one level down, as Flax's CLIP nests vision_model
    def __init__(self) -> None:
        super().__init__()
        self.vision_model = Stack()

    def forward(self, x):
        return self.vision_model(x)


def test_module_paths_that_differ_by_a_prefix_still_name_the_layers_with_the_bugs():
    torch.manual_seed(0)
    a, b = Stack().eval(), Wrapped().eval()
    b.vision_model.load_state_dict(a.state_dict())
    with torch.no_grad():  # both copied without their transpose
        b.vision_model.fc2.weight.copy_(a.fc2.weight.T)
        b.vision_model.fc3.weight.copy_(a.fc3.weight.T)
    x = torch.randn(B, S, D)
    ta, tb = tl.trace(a, x), tl.trace(b, x)
    cmp = tl.compare(ta, tb)
    # the paths are learnt from the pairs whose values agree (pre.0 ~ vision_model.pre.0...): each diverging
    # projection is told from its twin by its module, not left unaligned
    roots = [(ta[p.a].module_outputs, tb[p.b].module_outputs) for p in cmp.roots]
    assert roots == [(["fc2:1"], ["vision_model.fc2:1"]), (["fc3:1"], ["vision_model.fc3:1"])], str(cmp)
    assert cmp.first_divergence.basis == "inputs" and cmp.unaligned == []
