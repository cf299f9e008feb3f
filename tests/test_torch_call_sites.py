"""Each op's call-site walk ends at its module call (PassSites): the contexts must equal a full walk's."""

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.capture import sites  # noqa: E402


def _contexts(trace):
    return [(op.label, op.code_context) for op in trace.ops if op.kind == "op"]


def _full_walks(monkeypatch):
    """Module calls give no frame to stop at: every walk goes to the end, as CallSites.stack does."""
    monkeypatch.setattr(sites.PassSites, "enter", lambda self, path, frame: self.open.append([path, None, None, None]))


def _helper(block, x, scale):
    return block(x) * scale


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Fails(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        raise ValueError(f"refused {tuple(y.shape)}")


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.fails = Block(), Block(), Fails()

    def _gen(self, x):
        for _ in range(2):
            x = self.b(x)
            yield x

    def forward(self, x):
        x = _helper(self.a, x, 2.0)  # the same helper, from two lines
        x = _helper(self.a, x, 0.5)
        try:
            self.fails(x)  # raises: its call never closes
        except ValueError:
            x = x - 1
        x = self.b.forward(x)  # no module call: its ops are the parent's
        for y in self._gen(x):  # a generator resumed here
            x = x + y
        return torch.sigmoid(x)


def test_nested_helpers_failures_generators(monkeypatch):
    model, x = Nested(), torch.randn(2, 4)
    fast = _contexts(tl.trace(model, x))
    with monkeypatch.context() as patch:
        _full_walks(patch)
        full = _contexts(tl.trace(model, x))
    assert fast == full
    # the helper's two calls are told apart by the forward's line
    first, second = (ctx for label, ctx in fast if label.startswith("mul_"))
    assert [c.func_name for c in first[:2]] == ["_helper", "forward"] and first[1] != second[1]
    # inside Block: Block.forward, then the helper, then Nested.forward (three frames)
    relu = next(ctx for label, ctx in fast if label.startswith("relu_"))
    assert [c.func_name for c in relu] == ["forward", "_helper", "forward"]
    # the generator's Block calls, resumed from the forward; the last op, after the failed call
    relus = [ctx for label, ctx in fast if label.startswith("relu_")]
    assert [c.func_name for c in relus[-1]] == ["forward", "_gen", "forward"]
    assert [c.func_name for c in fast[-1][1]] == ["forward"] and fast[-1][0].startswith("sigmoid_")


def test_gpt2_contexts_equal_full_walks(monkeypatch):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 50, (1, 6))
    fast = _contexts(tl.trace(model, input_ids=ids))
    with monkeypatch.context() as patch:
        _full_walks(patch)
        full = _contexts(tl.trace(model, input_ids=ids))
    assert fast == full
    assert sum(len(ctx) == sites.CONTEXT_FRAMES for _, ctx in fast) > len(fast) // 2


@pytest.mark.parametrize("case", ["fused_encoder", "splice", "user_hook"])
def test_patched_forwards_splices_and_hooks_give_full_walk_contexts(monkeypatch, case):
    torch.manual_seed(0)
    if case == "fused_encoder":  # torchlens_torch.fastpath runs the fused kernel under its own forward
        layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
        model, x, options = (
            torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval(),
            torch.randn(1, 5, 8),
            {},
        )
    elif case == "splice":
        model, x = Nested(), torch.randn(2, 4)
        options = {"intervene": tl.when(tl.module("a"), tl.splice_module(lambda v: torch.tanh(v) * 2))}
    else:
        model, x, options = Nested(), torch.randn(2, 4), {}
        model.a.register_forward_hook(lambda module, args, out: torch.exp(out))  # a hook's own ops
    with torch.no_grad():
        fast = _contexts(tl.trace(model, x, **options))
        with monkeypatch.context() as patch:
            _full_walks(patch)
            full = _contexts(tl.trace(model, x, **options))
    assert fast == full
    assert any(ctx for _, ctx in fast) or case == "fused_encoder"  # torch's own modules: no user frame at all
