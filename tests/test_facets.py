"""Facets (docs/facets.md): named views of a module call's values, checked against references outside TorchLens.

Each value is compared with what the framework itself shows: forward hooks
on the projection or the module, the model's own attention weights
(``output_attentions=True`` with eager attention, ``need_weights=True``), an
untraced call, or a hand computation from hooked values. Facet edits are
compared with the same edit made by a forward hook.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError  # noqa: E402
from torchlens_core.views.facets import FacetError  # noqa: E402


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.detach().double(), b.detach().double(), atol=atol, rtol=1e-5)


# -- models ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2).eval()
    return model, torch.randn(2, 3, 32, 32)


def _hf(name: str, implementation: str, **config):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = getattr(transformers, f"{name}Config")(**config)
    cfg._attn_implementation = implementation
    torch.manual_seed(1)
    return getattr(transformers, f"{name}Model")(cfg).eval()


def gpt2(implementation: str = "sdpa"):
    return _hf("GPT2", implementation, n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16)


def llama(implementation: str = "sdpa"):
    return _hf(
        "Llama",
        implementation,
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=37,
        vocab_size=50,
        max_position_embeddings=16,
    )


def bert(implementation: str = "sdpa"):
    return _hf(
        "Bert",
        implementation,
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=37,
        vocab_size=50,
        max_position_embeddings=16,
    )


IDS = torch.tensor([[3, 14, 15, 9, 2, 6, 5], [35, 8, 9, 7, 9, 3, 2]])
LEFT_PADDED = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]])


def hooked(module: torch.nn.Module, run, pre: bool = False) -> list:
    """What ``module`` took (pre) or returned in one untraced ``run()``."""
    seen: list = []
    handle = (
        module.register_forward_pre_hook(lambda m, args: seen.append(args))
        if pre
        else module.register_forward_hook(lambda m, args, out: seen.append(out))
    )
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return seen


# -- the seed's two lines ------------------------------------------------------------------------
def test_seed_vit_q_is_the_qkv_projection_split_per_head(vit) -> None:
    model, x = vit
    log = tl.trace(model, x)
    q = log.modules["blocks.0.attn"].facets["q"]  # the seed's line
    attn = model.blocks[0].attn
    (qkv,) = hooked(attn.qkv, lambda: model(x))
    b, n, _ = qkv.shape
    q_ref, k_ref, v_ref = qkv.reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    facets = log.modules["blocks.0.attn"].facets
    assert facets.kind == "attention"
    assert q.shape == (2, attn.num_heads, n, attn.head_dim)
    assert close(q, q_ref) and close(facets["k"], k_ref) and close(facets["v"], v_ref)
    assert close(facets["qkv"], qkv)
    assert close(facets["q.0"], q_ref[:, 0]) and close(facets["v.2"], v_ref[:, 2])  # head 0, head 2
    assert close(facets["hook_q"], q_ref.transpose(1, 2))  # TransformerLens layout: (batch, pos, head, d_head)
    assert facets.how("q") == "recorded" and facets.site("q.0").startswith("identity_")


def test_seed_lstm_h_n_and_gru_against_the_module_itself() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 6, num_layers=2, batch_first=True)
            self.gru = torch.nn.GRU(6, 5, bidirectional=True)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.gru(out)[0], h

    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 5, 4)
    log = tl.trace(net, x)
    h_n = log.modules["lstm"].facets["h_n"]  # the seed's line
    with torch.no_grad():
        out, (h, c) = net.lstm(x)
        g_out, g_h = net.gru(out)
    lstm, gru = log.modules["lstm"].facets, log.modules["gru"].facets
    assert lstm.kind == "recurrent" and list(lstm) == ["output", "h_n", "c_n"] and list(gru) == ["output", "h_n"]
    assert close(h_n, h) and close(lstm["c_n"], c) and close(lstm["output"], out)
    assert close(lstm["h_n.1"], out[:, -1]), "the last layer's final state is the output's last step"
    assert close(gru["output"], g_out) and close(gru["h_n"], g_h) and close(gru["h_n.1"], g_h[1])
    assert lstm.spec("output").axes == ("batch", "seq", "features")  # batch_first
    assert gru.spec("output").axes == ("seq", "batch", "features")


def test_unbatched_lstm_reads_what_the_module_returned() -> None:
    torch.manual_seed(0)
    lstm, x = torch.nn.LSTM(3, 4), torch.randn(6, 3)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = lstm

        def forward(self, x):
            return self.lstm(x)

    log = tl.trace(Net(), x)
    facets = log.modules["lstm"].facets
    with torch.no_grad():
        out, (h, c) = lstm(x)
    assert close(facets["output"], out) and close(facets["h_n"], h) and close(facets["c_n"], c)
    assert facets.spec("h_n").axes == ("layer_direction", "hidden")


# -- attention patterns: recomputed when a fused kernel kept them --------------------------------------
def test_vit_pattern_recomputed_from_sdpa_equals_timm_written_out_attention(vit) -> None:
    model, x = vit
    log = tl.trace(model, x)
    facets = log.modules["blocks.1.attn"].facets
    assert facets.how("pattern") == "recomputed"
    attn = model.blocks[1].attn
    attn.fused_attn = False  # timm then writes softmax(q k^T * scale) out; its attn_drop sees the pattern
    try:
        (args,) = hooked(attn.attn_drop, lambda: model(x), pre=True)
        (proj_in,) = hooked(attn.proj, lambda: model(x), pre=True)
        (qkv,) = hooked(attn.qkv, lambda: model(x))
    finally:
        attn.fused_attn = True
    pattern = args[0]
    b, n, _ = qkv.shape
    q, k, _ = qkv.reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    assert close(facets["pattern"], pattern)
    assert close(facets["scores"], q @ k.transpose(-2, -1) * attn.scale, atol=1e-4)
    assert close(facets["hook_pattern"], pattern)
    assert close(facets["z"].transpose(1, 2).reshape(b, n, -1), proj_in[0])  # z is what proj reads, per head
    assert close(facets["pattern"].sum(-1), torch.ones(b, attn.num_heads, n))


@pytest.mark.parametrize("mask", [None, LEFT_PADDED], ids=["causal", "causal+padding"])
def test_gpt2_pattern_recomputed_from_sdpa_equals_output_attentions(mask) -> None:
    model = gpt2("sdpa")
    kwargs = {} if mask is None else {"attention_mask": mask}
    log = tl.trace(model, IDS, **kwargs)
    facets = log.modules["h.1.attn"].facets
    assert facets.how("pattern") == "recomputed"
    model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = model(IDS, output_attentions=True, **kwargs).attentions[1]
    # A query with no key to attend to (a left pad): SDPA gives it zeros, eager attention a uniform row; the
    # facet is what the SDPA kernel used. Every other row must agree.
    live = torch.ones(2, 1, 7, 1, dtype=torch.bool) if mask is None else mask.bool()[:, None, :, None]
    live = live.expand_as(expected)
    assert close(facets["pattern"][live], expected[live])
    if mask is not None:
        assert (facets["pattern"][1, :, :2] == 0).all()
    assert close(facets["pattern"].tril(), facets["pattern"]), "causal: no weight on later keys"


def test_gpt2_eager_pattern_is_the_recorded_softmax() -> None:
    model = gpt2("eager")
    log = tl.trace(model, IDS)
    facets = log.modules["h.0.attn"].facets
    with torch.no_grad():
        expected = model(IDS, output_attentions=True).attentions[0]
    assert facets.how("pattern") == "recorded" and facets.how("scores") == "recorded"
    assert torch.equal(facets["pattern"], expected)
    assert close(torch.softmax(facets["scores"], -1), expected)


def test_gpt2_q_k_v_are_the_c_attn_output_split() -> None:
    model = gpt2("sdpa")
    log = tl.trace(model, IDS)
    facets = log.modules["h.0.attn"].facets
    (c_attn,) = hooked(model.h[0].attn.c_attn, lambda: model(IDS))
    heads = [part.view(2, 7, 4, 8).transpose(1, 2) for part in c_attn.split(32, dim=2)]
    for name, ref in zip("qkv", heads):
        assert close(facets[name], ref), name
    assert close(facets["qkv"], c_attn)
    assert close(facets["hook_k"], heads[1].transpose(1, 2))
    (attn_out,) = hooked(model.h[0].attn, lambda: model(IDS))
    z = facets["z"]
    assert close(model.h[0].attn.c_proj(z.transpose(1, 2).reshape(2, 7, 32)), attn_out[0])


def test_gpt2_block_residual_stream_against_module_hooks() -> None:
    model = gpt2("sdpa")
    log = tl.trace(model, IDS)
    facets = log.modules["h.1"].facets
    block = model.h[1]
    (pre,) = hooked(block, lambda: model(IDS), pre=True)
    (post,) = hooked(block, lambda: model(IDS))
    (attn_out,) = hooked(block.attn, lambda: model(IDS))
    (mlp_out,) = hooked(block.mlp, lambda: model(IDS))
    post = post[0] if isinstance(post, tuple) else post
    assert facets.kind == "residual block"
    assert close(facets["resid_pre"], pre[0]) and close(facets["hook_resid_pre"], pre[0])
    assert close(facets["attn_out"], attn_out[0]) and close(facets["mlp_out"], mlp_out)
    assert close(facets["resid_mid"], pre[0] + attn_out[0])
    assert close(facets["resid_post"], post) and close(facets["hook_resid_post"], post)
    assert set(facets.aliases) == {
        "hook_resid_pre",
        "hook_resid_mid",
        "hook_resid_post",
        "hook_attn_out",
        "hook_mlp_out",
    }


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_llama_grouped_query_keys_keep_their_own_heads(implementation: str) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = llama(implementation)
    log = tl.trace(model, IDS)
    facets = log.modules["layers.0.self_attn"].facets
    attn = model.layers[0].self_attn
    (q_lin,) = hooked(attn.q_proj, lambda: model(IDS))
    (k_lin,) = hooked(attn.k_proj, lambda: model(IDS))
    (v_lin,) = hooked(attn.v_proj, lambda: model(IDS))
    ((cos, sin),) = hooked(model.rotary_emb, lambda: model(IDS))
    q, k = apply_rotary_pos_emb(
        q_lin.view(2, 7, 4, 8).transpose(1, 2), k_lin.view(2, 7, 2, 8).transpose(1, 2), cos, sin
    )
    assert facets["k"].shape == (2, 2, 7, 8), "two key heads, not the four repeat_kv makes"
    assert close(facets["q"], q) and close(facets["k"], k)
    assert close(facets["v"], v_lin.view(2, 7, 2, 8).transpose(1, 2))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = model(IDS, output_attentions=True).attentions[0]
    assert close(facets["pattern"], expected)
    assert log.modules["layers.0"].facets.kind == "residual block"


def test_bert_padding_mask_pattern_and_query_projection() -> None:
    model = bert("sdpa")
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    log = tl.trace(model, IDS, attention_mask=mask)
    facets = log.modules["encoder.layer.0.attention.self"].facets
    attn = model.encoder.layer[0].attention.self
    (query,) = hooked(attn.query, lambda: model(IDS, attention_mask=mask))
    assert close(facets["q"], query.view(2, 7, 4, 8).transpose(1, 2))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = model(IDS, attention_mask=mask, output_attentions=True).attentions[0]
    assert close(facets["pattern"], expected)
    assert (facets["pattern"][1, :, :, 5:] == 0).all(), "padded keys get no weight"


# -- nn.MultiheadAttention: one fused op; everything recomputed and checked against its output ------------
class Wrapped(torch.nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first)

    def forward(self, x, **kwargs):
        return self.attn(x, x, x, **kwargs)


CAUSAL = torch.nn.Transformer.generate_square_subsequent_mask(5)
PADDING = torch.tensor([[False] * 5, [False, False, False, True, True]])


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize(
    "masks",
    [{}, {"key_padding_mask": PADDING}, {"attn_mask": CAUSAL, "is_causal": True}, {"attn_mask": CAUSAL.isinf()}],
    ids=["none", "padding", "causal", "bool"],
)
def test_multihead_attention_facets_against_its_own_weights(batch_first: bool, masks: dict) -> None:
    torch.manual_seed(0)
    net = Wrapped(batch_first).eval()
    x = torch.randn(2, 5, 16) if batch_first else torch.randn(5, 2, 16)
    with torch.no_grad():
        _, weights = net(x, average_attn_weights=False, **masks)
        fast = tl.trace(net, x, need_weights=False, **masks)  # the inference fast path when it applies
    traced = tl.trace(net, x, average_attn_weights=False, **masks)
    xb = x if batch_first else x.transpose(0, 1)
    w, b = net.attn.in_proj_weight, net.attn.in_proj_bias
    q_ref = F.linear(xb, w[:16], b[:16]).view(2, 5, 4, 4).transpose(1, 2)
    v_ref = F.linear(xb, w[32:], b[32:]).view(2, 5, 4, 4).transpose(1, 2)
    for log in (traced, fast):
        facets = log.modules["attn"].facets
        assert facets.how("q") == "recomputed"
        assert close(facets["pattern"], weights) and close(facets["q"], q_ref) and close(facets["v"], v_ref)
        assert close(facets["z"], weights @ v_ref)
    if batch_first and "is_causal" not in masks:  # torch's fast path ran: one fused op, facets all the same
        assert any(op.func_name == "native_multi_head_attention" for op in fast)


def test_unbatched_multihead_attention_has_no_batch_axis() -> None:
    torch.manual_seed(0)
    net, x = Wrapped(False).eval(), torch.randn(5, 16)
    log = tl.trace(net, x, average_attn_weights=False)
    facets = log.modules["attn"].facets
    with torch.no_grad():
        _, weights = net(x, average_attn_weights=False)
    assert facets.spec("pattern").axes == ("head", "query", "key") and close(facets["pattern"], weights)
    assert close(facets["pattern.2"], weights[2]) and facets["q"].shape == (4, 5, 4)
    with pytest.raises(tl.LabelNotFoundError, match="has 4 head entries"):
        facets["q.4"]
    assert "q.3" in facets and "q.4" not in facets


def test_recomputed_attention_that_does_not_reproduce_the_kernel_is_refused() -> None:
    torch.manual_seed(0)
    net = Wrapped(True).eval()
    log = tl.trace(net, torch.randn(2, 5, 16))
    with torch.no_grad():
        net.attn.in_proj_weight.mul_(2)  # parameters are held by reference: the recomputation now differs
    with pytest.raises(FacetError, match="does not reproduce.*parameters changed"):
        log.modules["attn"].facets["pattern"]

    model = gpt2("sdpa")
    log = tl.trace(model, IDS, attention_mask=LEFT_PADDED)
    sdpa = next(op for op in log if op.func_name == "scaled_dot_product_attention")
    mask = log.ops[sdpa.kwargs["attn_mask"].index]
    mask.out = ~mask.out  # as if the mask had been misread
    with pytest.raises(FacetError, match=f"does not reproduce {sdpa.label}"):
        log.modules["h.0.attn"].facets["pattern"]


# -- facets as intervention sites ----------------------------------------------------------------------
def _zero_columns(start: int, stop: int):
    def pre(module, args):
        edited = args[0].clone()
        edited[..., start:stop] = 0
        return (edited,)

    return pre


def test_zeroing_one_value_head_equals_a_hook_zeroing_its_output_columns(vit) -> None:
    model, x = vit
    log = tl.trace(model, x)
    facets = log.modules["blocks.0.attn"].facets
    edited = tl.trace(model, x, intervene=facets.when("v.1", tl.zero_ablate()))
    handle = model.blocks[0].attn.proj.register_forward_pre_hook(_zero_columns(64, 128))  # head 1's 64 channels
    try:
        with torch.no_grad():
            expected = model(x)
    finally:
        handle.remove()
    assert close(edited.output, expected)
    after = edited.modules["blocks.0.attn"].facets
    assert (after["v.1"] == 0).all() and (after["z.1"] == 0).all()
    assert torch.equal(after["v.0"], facets["v.0"]) and torch.equal(after["q"], facets["q"])
    assert close(edited.replay(), edited.output) and edited.audit()
    fork = log.fork()
    item = facets.when("v.1", tl.zero_ablate())
    assert close(fork.when(item.selector, *item.helpers).replay(), expected)


def test_an_alias_is_edited_in_its_own_layout(vit) -> None:
    model, x = vit
    log = tl.trace(model, x)
    facets = log.modules["blocks.0.attn"].facets

    def zero_head_2(value, site):
        assert value.shape == (2, 17, 3, 64)  # TransformerLens's (batch, pos, head, d_head)
        out = value.clone()
        out[:, :, 2] = 0
        return out

    edited = tl.trace(model, x, intervene=facets.when("hook_z", zero_head_2))
    handle = model.blocks[0].attn.proj.register_forward_pre_hook(_zero_columns(128, 192))
    try:
        with torch.no_grad():
            expected = model(x)
    finally:
        handle.remove()
    assert close(edited.output, expected)


def test_patching_attn_out_from_a_clean_run_equals_a_module_hook(vit) -> None:
    model, x = vit
    clean = tl.trace(model, x)
    corrupted = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    patched = tl.trace(
        model, corrupted, intervene=clean.modules["blocks.0"].facets.when("attn_out", tl.swap_with(clean))
    )
    (clean_attn,) = hooked(model.blocks[0].attn, lambda: model(x))
    handle = model.blocks[0].attn.register_forward_hook(lambda m, a, out: clean_attn)
    try:
        with torch.no_grad():
            expected = model(corrupted)
    finally:
        handle.remove()
    assert close(patched.output, expected)


def test_editing_a_recorded_gpt2_pattern_head_equals_a_hook() -> None:
    model = gpt2("eager")
    log = tl.trace(model, IDS)
    facets = log.modules["h.0.attn"].facets
    edited = tl.trace(model, IDS, intervene=facets.when("pattern.3", tl.zero_ablate()))
    handle = model.h[0].attn.c_proj.register_forward_pre_hook(_zero_columns(24, 32))  # head 3 = channels 24..31
    try:
        with torch.no_grad():
            expected = model(IDS).last_hidden_state
    finally:
        handle.remove()
    assert close(edited.output.last_hidden_state, expected)
    assert [e.site for e in edited.interventions] == [facets.site("pattern")]


def test_scaling_an_lstm_final_state_equals_a_hook() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 6, batch_first=True)
            self.head = torch.nn.Linear(6, 2)

        def forward(self, x):
            _, (h, _) = self.lstm(x)
            return self.head(h[-1])

    torch.manual_seed(0)
    net, x = Net(), torch.randn(3, 5, 4)
    log = tl.trace(net, x)
    facets = log.modules["lstm"].facets
    edited = tl.trace(net, x, intervene=facets.when("h_n", tl.scale(0.5)))
    handle = net.lstm.register_forward_hook(lambda m, a, out: (out[0], (out[1][0] * 0.5, out[1][1])))
    try:
        with torch.no_grad():
            expected = net(x)
    finally:
        handle.remove()
    assert close(edited.output, expected)


# -- refusals ------------------------------------------------------------------------------------------
def test_a_value_save_left_out_names_the_op_to_save() -> None:
    model = gpt2("sdpa")
    log = tl.trace(model, IDS, save=tl.func("addmm"))
    facets = log.modules["h.0.attn"].facets
    with pytest.raises(FacetError, match=r"reads transpose_\d+_\d+, whose value save= left out.*tl.label"):
        facets["q"]
    holder = log.ops[facets.spec("q").source.index]
    saved = tl.trace(model, IDS, save=tl.func("addmm") | tl.label(holder.label))
    assert saved.modules["h.0.attn"].facets["q"].shape == (2, 4, 7, 8)


def test_refusals_are_typed_and_say_what_to_do(vit) -> None:
    model, x = vit
    log = tl.trace(model, x)
    facets = log.modules["blocks.0.attn"].facets
    with pytest.raises(FacetError, match="recomputed.*cannot be an intervention site.*q, k, v, z"):
        facets.when("pattern", tl.zero_ablate())
    with pytest.raises(tl.LabelNotFoundError, match="did you mean 'pattern'"):
        facets["patern"]
    with pytest.raises(tl.LabelNotFoundError, match="has 3 head entries"):
        facets["q.3"]
    with pytest.raises(tl.LabelNotFoundError, match="no facet 'q'.*recognised no facets"):
        log.modules["patch_embed.proj"].facets["q"]
    with pytest.raises(ArgumentTypeError, match="at least one helper"):
        facets.when("q")
    assert "q.2" in facets and "q.3" not in facets and "hook_pattern" in facets and "nope" not in facets
    assert list(facets) == ["q", "k", "v", "z", "scores", "pattern", "qkv"]

    def grow(value, site):
        return torch.cat([value, value], dim=-1)

    with pytest.raises(tl.InterventionError, match="facet 'q.0'.*changed it"):
        tl.trace(model, x, intervene=facets.when("q.0", grow))
    assert close(model(x), tl.trace(model, x).output), "nothing is left patched after the refused edit"


def test_a_module_called_twice_asks_for_one_call() -> None:
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(3, 3)

        def forward(self, x):
            return self.lstm(self.lstm(x)[0])[0]

    torch.manual_seed(0)
    net, x = Twice(), torch.randn(4, 2, 3)
    log = tl.trace(net, x)
    with pytest.raises(FacetError, match=r"ran 2 times.*passes\[i\]\.facets"):
        log.modules["lstm"].facets  # noqa: B018 - reading it raises
    with torch.no_grad():
        first = net.lstm(x)[0]
        _, (h2, _) = net.lstm(first)
    assert close(log.modules["lstm"].passes[1].facets["h_n"], h2)


def test_facets_survive_save_and_load(vit, tmp_path) -> None:
    model, x = vit
    log = tl.trace(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl.save(log, tmp_path / "vit")
        loaded = tl.load(tmp_path / "vit")
    pattern = log.modules["blocks.1.attn"].facets["pattern"]
    assert torch.equal(loaded.modules["blocks.1.attn"].facets["pattern"], pattern)
