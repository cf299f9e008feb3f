"""PyTorch's fused inference paths are recorded as the kernels that really run (torchlens_torch.fastpath).

Untraced, nn.TransformerEncoderLayer and nn.MultiheadAttention in eval mode, without autograd, call one
fused kernel; a TorchFunctionMode's mere presence makes them take the decomposed path instead. Every check
here compares with an untraced forward: its output (exactly), the aten kernels it ran (seen by a
TorchDispatchMode, which does not disable the fast path) and its module outputs (seen by a global forward
hook, which does not either: a hook on the layer itself would).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens_torch import fastpath  # noqa: E402

FUSED = {"_transformer_encoder_layer_fwd", "_native_multi_head_attention"}


class _Kernels(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def untraced(model: Any, *args: Any, **kwargs: Any) -> tuple[Any, set[str], dict[str, Any]]:
    """The plain forward's output, the fused kernels it ran, and its module outputs by ``path:pass``."""
    paths = {id(m): p for p, m in model.named_modules() if p} if isinstance(model, nn.Module) else {}
    seen: dict[str, Any] = {}

    def hook(module: Any, inputs: Any, output: Any) -> None:
        if id(module) in paths:
            path = paths[id(module)]
            n = sum(key.rpartition(":")[0] == path for key in seen) + 1
            seen[f"{path}:{n}"] = output

    handle = nn_module.register_module_forward_hook(hook)
    try:
        with _Kernels() as kernels:
            out = model(*args, **kwargs)
    finally:
        handle.remove()
    return out, kernels.names & FUSED, seen


def leaves(x: Any) -> list[Any]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in leaves(v)]
    return []


def assert_exact(a: Any, b: Any) -> None:
    xs, ys = leaves(a), leaves(b)
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.shape == y.shape and torch.equal(x, y), f"differ by {(x - y).abs().max().item():.3g}"


def check_faithful(model: Any, *args: Any, **kwargs: Any) -> tl.Trace:
    """Trace under no_grad and compare with the untraced forward in every way; returns the trace."""
    with torch.no_grad():
        own, kernels, modules = untraced(model, *args, **kwargs)
        trace = tl.trace(model, *args, **kwargs)
        assert_exact(trace.output, own)
        assert_exact(trace.replay(), own)
        report = trace.audit(rtol=0.0, untraced=True)
    assert report, str(report)
    recorded = {op.func_name for op in trace.ops if op.kind == "op"}
    assert {k.lstrip("_") for k in kernels} <= recorded, "a fused kernel that ran untraced was not recorded"
    assert not ({k.lstrip("_") for k in FUSED} - {k.lstrip("_") for k in kernels}) & recorded, (
        "a fused kernel recorded that the untraced forward did not run"
    )
    passes = {mp.label: mp for m in trace.modules.values() for mp in m.passes}
    assert set(passes) == set(modules), "module calls differ from the untraced forward's"
    for label, mp in passes.items():
        assert_exact(mp.out, modules[label])
    assert_nothing_left(model)
    return trace


def assert_nothing_left(model: Any) -> None:
    assert not fastpath._PATCHES
    for m in model.modules():
        assert "forward" not in vars(m)
    assert not torch.overrides._get_current_function_mode_stack()
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks


def encoder_layer(
    batch_first: bool = True, norm_first: bool = False, activation: str = "relu", nhead: int = 4
) -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(
        32, nhead, dim_feedforward=64, activation=activation, batch_first=batch_first, norm_first=norm_first
    ).eval()


def tokens(batch_first: bool = True) -> Any:
    torch.manual_seed(1)
    x = torch.randn(2, 7, 32)
    return x if batch_first else x.transpose(0, 1).contiguous()


def padding() -> Any:
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[1, 5:] = True
    return mask


def causal() -> Any:
    return nn.Transformer.generate_square_subsequent_mask(7)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")], ids=["post_relu", "pre_gelu"])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both"])
def test_encoder_layer(batch_first: bool, norm_first: bool, activation: str, masks: str) -> None:
    layer = encoder_layer(batch_first, norm_first, activation)
    kwargs: dict[str, Any] = {}
    if masks in ("padding", "both"):
        kwargs["src_key_padding_mask"] = padding()
    if masks in ("causal", "both"):
        kwargs["src_mask"] = causal()
    trace = check_faithful(layer, tokens(batch_first), **kwargs)
    fused = [op for op in trace.ops if op.func_name == "transformer_encoder_layer_fwd"]
    assert len(fused) == (1 if batch_first else 0)
    if fused:  # one op reading the layer's twelve parameters, and every submodule idle
        assert set(fused[0].params) == set(trace.params)
        assert all(m.num_passes == 0 for path, m in trace.modules.items() if path)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "float_padding"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention(batch_first: bool, masks: str, need_weights: bool) -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    x = tokens(batch_first)
    kwargs: dict[str, Any] = {"need_weights": need_weights}
    if masks == "padding":
        kwargs["key_padding_mask"] = padding()
    elif masks == "float_padding":  # float masks never take the fused kernel
        kwargs["key_padding_mask"] = torch.zeros(2, 7).masked_fill(padding(), float("-inf"))
    elif masks == "causal":
        kwargs["attn_mask"] = causal() == float("-inf")
    trace = check_faithful(attention, x, x, x, **kwargs)
    fused = [op.func_name for op in trace.ops if op.func_name == "native_multi_head_attention"]
    assert len(fused) == (batch_first and masks != "float_padding")


def test_cross_attention_and_training_take_the_decomposed_path() -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x, memory = tokens(), torch.randn(2, 5, 32)
    trace = check_faithful(attention, x, memory, memory)
    assert not any(op.func_name == "native_multi_head_attention" for op in trace.ops)
    layer = encoder_layer().train()
    torch.manual_seed(3)
    with torch.no_grad():
        trace = tl.trace(layer, tokens())
    assert "dropout" in {op.func_name for op in trace.ops}
    assert not any(op.func_name == "transformer_encoder_layer_fwd" for op in trace.ops)


def test_odd_heads_and_autograd_take_the_decomposed_path() -> None:
    check_faithful(encoder_layer(nhead=1), tokens())  # an odd head count is never fused
    layer = encoder_layer()
    own = layer(tokens())  # autograd on, weights needing it: decomposed untraced too
    trace = tl.trace(layer, tokens())
    assert torch.equal(trace.output, own)
    assert not any(op.func_name == "transformer_encoder_layer_fwd" for op in trace.ops)


class GPT2Like(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        self.head = nn.Linear(32, 50)

    def forward(self, ids: Any) -> Any:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.blocks(self.tokens(ids), mask=mask, is_causal=True))


class BertLike(nn.Module):
    def __init__(self, nested: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, activation="gelu", batch_first=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested)
        self.pool = nn.Linear(32, 32)

    def forward(self, ids: Any, attention_mask: Any) -> Any:
        h = self.encoder(self.tokens(ids), src_key_padding_mask=attention_mask == 0)
        return h, torch.tanh(self.pool(h[:, 0]))


def ids_and_mask() -> tuple[Any, Any]:
    torch.manual_seed(2)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    return torch.randint(0, 50, (2, 9)), mask


def test_gpt2_like_stack() -> None:
    trace = check_faithful(GPT2Like().eval(), ids_and_mask()[0])
    assert sum(op.func_name == "transformer_encoder_layer_fwd" for op in trace.ops) == 3
    assert [trace.modules[f"blocks.layers.{i}"].num_passes for i in range(3)] == [1, 1, 1]


def test_bert_like_stack() -> None:
    trace = check_faithful(BertLike().eval(), *ids_and_mask())
    assert sum(op.func_name == "transformer_encoder_layer_fwd" for op in trace.ops) == 2


def test_nested_tensor_encoder_is_reported_not_hidden() -> None:
    # Untraced, the encoder runs its layers on a nested tensor (padded positions come out as 0); a nested
    # tensor cannot be recorded, so the trace differs. The capture says so, and so does the audit.
    model = BertLike(nested=True).eval()
    ids, mask = ids_and_mask()
    with torch.no_grad():
        own = model(ids, mask)
        with pytest.warns(UserWarning, match="differs from its untraced run"):
            trace = tl.trace(model, ids, mask)
        assert not torch.equal(trace.output[0], own[0])  # the difference is real ...
        report = trace.audit(untraced=True)
    assert "encoder" in trace.notes[fastpath.OBSERVER_EFFECT]
    assert not report  # ... and the audit reports it, naming the output
    failure = next(f for f in report.failures if f.check == "untraced parity")
    assert failure.op == trace.output_labels[0] and "tracing changed" in failure.detail
    assert_nothing_left(model)


def test_a_function_target_is_not_rewritten_and_the_audit_measures_it() -> None:
    layer = encoder_layer()

    def run(x: Any) -> Any:  # modules reached through a plain function are not known before the forward
        return layer(x)

    with torch.no_grad():
        own = layer(tokens())
        trace = tl.trace(run, tokens())
        report = trace.audit(rtol=0.0, untraced=True)
    error = (trace.output - own).abs().max().item()
    assert error > 0 and not report
    assert "tracing changed" in next(f for f in report.failures if f.check == "untraced parity").detail


def test_the_modules_of_a_bound_forward_are_rewritten_too() -> None:
    model = GPT2Like().eval()
    ids = ids_and_mask()[0]
    with torch.no_grad():
        own = model(ids)
        trace = tl.trace(model.forward, ids)
        assert trace.audit(rtol=0.0, untraced=True)
    assert torch.equal(trace.output, own)
    assert sum(op.func_name == "transformer_encoder_layer_fwd" for op in trace.ops) == 3
    assert_nothing_left(model)


def test_a_users_function_mode_keeps_the_decomposed_path() -> None:
    class Passing(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    layer = encoder_layer()
    with torch.no_grad(), Passing():  # untraced under the user's mode: decomposed, and so is the trace
        own = layer(tokens())
        trace = tl.trace(layer, tokens())
    assert torch.equal(trace.output, own)
    assert not any(op.func_name == "transformer_encoder_layer_fwd" for op in trace.ops)


def test_nothing_left_after_an_exception_or_a_halt() -> None:
    model = GPT2Like().eval()
    with torch.no_grad(), pytest.raises(IndexError):
        tl.trace(model, torch.full((1, 4), 99))  # an out-of-range token id fails inside the forward
    assert_nothing_left(model)
    with torch.no_grad():
        halted = tl.trace(model, ids_and_mask()[0], halt=tl.module("blocks.layers.0"))
    assert halted.halted and halted.ops[-1].func_name == "transformer_encoder_layer_fwd"
    assert_nothing_left(model)


def test_a_plain_forward_in_another_thread_keeps_its_own_path() -> None:
    layer = encoder_layer()
    x = tokens()
    with torch.no_grad():
        own = layer(x)
    started, release = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    class Waits(nn.Module):  # holds the capture open while the other thread runs the layer plainly
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: Any) -> Any:
            started.set()
            release.wait(30)
            return self.layer(x)

    def plain() -> None:
        started.wait(30)
        with torch.no_grad(), _Kernels() as kernels:
            results["out"] = layer(x)
        results["kernels"] = kernels.names & FUSED
        release.set()

    other = threading.Thread(target=plain)
    other.start()
    with torch.no_grad():
        trace = tl.trace(Waits(), x)
    other.join(30)
    assert results["kernels"] == {"_transformer_encoder_layer_fwd"} and torch.equal(results["out"], own)
    assert torch.equal(trace.output, own)
    assert_nothing_left(layer)


def test_the_fused_op_survives_save_and_load(tmp_path: Any) -> None:
    layer = encoder_layer()
    with torch.no_grad():
        own = layer(tokens(), src_key_padding_mask=padding())
        trace = tl.trace(layer, tokens(), src_key_padding_mask=padding())
    loaded = tl.load(tl.save(trace, tmp_path / "trace"))
    assert not loaded.notes.get("not_replayable")
    with torch.no_grad():
        assert torch.equal(loaded.replay(), own)
