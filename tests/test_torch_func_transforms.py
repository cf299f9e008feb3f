"""torch.func transforms inside a traced forward, each recorded as one op (backends/torch/transforms.py).

Every model here is held to independent references: its own untraced output
(on the traced input and on a second one, against ``trace.replay(x2)``),
its submodules' forward hooks, and ``trace.audit()``. Before transforms.py
every capture here raised UnsupportedError at the first op inside the
transform. The transformers test needs transformers 4.x, which builds eager
attention masks under ``torch.vmap``; it is skipped where 4.x is not installed
(5.x builds them without vmap: the menagerie's transformers-eager entries cover
it).
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import UnsupportedError  # noqa: E402

F = torch.nn.functional


def _hooked_outputs(model: torch.nn.Module, *args, **kwargs) -> dict[str, list]:
    """Every submodule's outputs, in call order, as its forward hooks see them."""
    seen: dict[str, list] = {}
    handles = [
        m.register_forward_hook(lambda mod, a, out, name=name: seen.setdefault(name, []).append(out))
        for name, m in model.named_modules()
        if name
    ]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _check(model: torch.nn.Module, x: torch.Tensor, x2: torch.Tensor, transforms: int = 1) -> tl.Trace:
    """Trace, then hold it to the model's own outputs, its forward hooks, audit() and replay on ``x2``."""
    trace = tl.trace(model, x)
    with torch.no_grad():
        own, own2 = model(x), model(x2)
    assert torch.equal(trace.output, own)
    report = trace.audit()
    assert report, str(report)
    hooked = _hooked_outputs(model, x)
    for path, outs in hooked.items():
        passes = trace.modules[path].passes
        assert len(passes) == len(outs)
        for mp, out in zip(passes, outs):
            assert torch.equal(mp.out, out), path
    replayed = trace.replay(x2)
    assert not torch.equal(own, own2)  # the second input changes the output: a frozen constant would show
    torch.testing.assert_close(replayed, own2, rtol=0, atol=1e-6)
    kinds = {"vmap", "grad", "grad_and_value", "jvp", "jacrev", "jacfwd", "hessian"}
    assert sum(op.func_name in kinds for op in trace.ops) == transforms
    return trace


class _PerSample(torch.nn.Module):
    """vmap over rows, its function closing over a parameter and a value the forward computed."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        h = self.lin(x)
        centre = h.mean(0)  # read by the closure only: replay on new inputs must recompute it

        def per_row(row, bias):
            return torch.tanh(row * self.scale - centre) + bias

        return torch.vmap(per_row, in_dims=(0, None))(h, x[0]).relu()


def test_vmap_closing_over_forward_values_is_one_op_that_replays_on_new_inputs():
    torch.manual_seed(0)
    trace = _check(_PerSample().eval(), torch.randn(3, 4), torch.randn(3, 4))
    op = next(op for op in trace.ops if op.func_name == "vmap")
    assert "scale" in op.params  # the parameter the closure reads is an input of the op
    mean = next(op for op in trace.ops if op.func_name == "mean")
    assert mean.index in op.parent_indices  # so is the closure's recorded value: the edge is in the graph


class _Derivatives(torch.nn.Module):
    """grad, grad_and_value, jvp, jacrev, jacfwd and hessian of small functions of the forward's values."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        g = torch.func.grad(lambda v: (v.sin() * h[1]).sum())(h[0])
        gv, value = torch.func.grad_and_value(lambda v: (v**3).sum())(h[0])
        _, tangent = torch.func.jvp(torch.tanh, (h[0],), (h[1],))
        jr = torch.func.jacrev(lambda v: v.sin() * v)(h[0])
        jf = torch.func.jacfwd(lambda v: v.cos() * h[2])(h[0])
        hess = torch.func.hessian(lambda v: (v.exp() * h[1]).sum())(h[0])
        return g + gv + value + tangent + jr.sum(0) + jf.sum(1) + hess.sum(0)


def test_derivative_transforms_are_ops_whose_replay_matches_the_model():
    torch.manual_seed(0)
    _check(_Derivatives().eval(), torch.randn(3, 3), torch.randn(3, 3), transforms=6)


class _Masks(torch.nn.Module):
    """transformers 4.x's eager mask, written out: vmap nested over four index dimensions, under torch's own
    TransformGetItemToIndex mode, the mask function reading a padding mask from its closure."""

    def forward(self, scores, padding):
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

        def mask_function(b, h, q, kv):
            return (kv <= q) & padding[b, kv]

        fn = mask_function
        for dims in [(None, None, None, 0), (None, None, 0, None), (None, 0, None, None), (0, None, None, None)]:
            fn = torch.vmap(fn, in_dims=dims, out_dims=0)
        n = scores.shape[-1]
        with TransformGetItemToIndex():
            mask = fn(torch.arange(scores.shape[0]), torch.arange(1), torch.arange(n), torch.arange(n))
        return scores.masked_fill(~mask, -1e4).softmax(-1)


def test_nested_vmap_under_a_function_mode_replays_with_new_padding():
    torch.manual_seed(0)
    model = _Masks()
    scores = torch.randn(2, 1, 5, 5)
    padding = torch.ones(2, 5, dtype=torch.bool)
    padding[1, :2] = False
    trace = tl.trace(model, scores, padding)
    own = model(scores, padding)
    assert torch.equal(trace.output, own)
    assert trace.audit()
    assert [op.func_name for op in trace.ops].count("vmap") == 1  # the outermost vmap; the inner ones are in it
    other = padding.clone()
    other[0, :3] = False
    torch.testing.assert_close(trace.replay(scores, other), model(scores, other), rtol=0, atol=0)


class _Chunked(torch.nn.Module):
    def forward(self, x):
        return torch.vmap(lambda r: r.cumsum(0) * 2, chunk_size=2)(x.exp())


def test_chunked_vmap_splits_and_joins_inside_its_op():
    # vmap_impl splits the input and joins the chunks with torch calls at no transform level: they belong to the op
    trace = _check(_Chunked(), torch.randn(5, 3), torch.randn(5, 3))
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["exp", "vmap"]


class _Noisy(torch.nn.Module):
    def forward(self, x):
        return torch.vmap(lambda r: F.dropout(r, 0.5, training=True), randomness="different")(x) + 1


def test_random_draws_inside_a_transform_replay_alike():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    trace = tl.trace(_Noisy(), x)
    assert trace.audit()
    torch.testing.assert_close(trace.replay(), trace.output, rtol=0, atol=0)
    assert "rng_state" in next(op for op in trace.ops if op.func_name == "vmap").meta


class _FunctionalCall(torch.nn.Module):
    """torch.func.functional_call with weights the forward computes, and inside vmap on a module outside the model."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.gain = torch.nn.Parameter(torch.randn(3, 3))
        self.template = [torch.nn.Linear(3, 3)]  # not a submodule: not part of the traced model

    def forward(self, x):
        weight = self.lin.weight * self.gain
        y = torch.func.functional_call(self.lin, {"weight": weight, "bias": self.lin.bias}, (x,))
        per_row = torch.vmap(
            lambda r: torch.func.functional_call(self.template[0], {"weight": weight.T, "bias": x[0]}, (r,))
        )
        return per_row(y)


def test_functional_call_outside_and_inside_vmap():
    torch.manual_seed(0)
    _check(_FunctionalCall().eval(), torch.randn(4, 3), torch.randn(4, 3))


def _original_entry_points():
    from torch._functorch import apis, eager_transforms

    return (
        apis.vmap_impl,
        eager_transforms.grad_impl,
        eager_transforms._jvp_with_argnums,
        eager_transforms._vjp_with_argnums,
        torch.func.jacrev,
        eager_transforms.hessian,
    )


def _assert_restored(before) -> None:
    assert _original_entry_points() == before, "an entry point was left replaced"
    assert torch._C._len_torch_function_stack() == 0, "a function mode was left on the stack"
    from torch.nn.modules import module as nn_module

    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks


class _WritesOutside(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        def per_row(r):
            self.total.add_(torch.ones(3))  # writes a buffer from inside the transform (vmap lets it)
            return r * 2

        return torch.vmap(per_row)(x)


class _WritesInput(torch.nn.Module):
    def forward(self, x):
        h = x * 1
        return torch.vmap(lambda r: r.mul_(2))(h)


class _Vjp(torch.nn.Module):
    def forward(self, x):
        out, vjp_fn = torch.func.vjp(torch.sin, x * 2)
        return vjp_fn(out)[0]


class _ModuleInside(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.vmap(self.lin)(x)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (_WritesOutside(), "parameter or buffer 'total'"),
        (_WritesInput(), r"wrote into 1 tensor\(s\) from outside"),
        (_Vjp(), "returned function, not only tensors"),
        (_ModuleInside(), "module 'lin' ran inside torch.func.vmap"),
    ],
)
def test_a_value_that_would_stay_inside_the_transform_is_refused_and_nothing_is_left_behind(model, says):
    before = _original_entry_points()
    with pytest.raises(UnsupportedError, match=says):
        tl.trace(model, torch.randn(2, 3))
    _assert_restored(before)


def test_transforms_are_themselves_again_after_the_capture():
    before = _original_entry_points()
    made = []

    class Keeps(torch.nn.Module):
        def forward(self, x):
            made.append(torch.func.jacrev(torch.sin))  # made during the capture, called after it too
            return made[0](x)

    x = torch.randn(3)
    trace = tl.trace(Keeps(), x)
    _assert_restored(before)
    torch.testing.assert_close(made[0](x), torch.diag(x.cos()))
    torch.testing.assert_close(trace.output, torch.diag(x.cos()))


def test_another_threads_transforms_are_not_recorded():
    started, release = threading.Event(), threading.Event()
    results = {}

    def other():
        started.set()
        release.wait(5)
        results["other"] = torch.vmap(torch.sin)(torch.ones(2, 2))

    class Waits(torch.nn.Module):
        def forward(self, x):
            release.set()
            worker.join(5)  # the other thread's vmap runs while this capture holds the entry points
            return torch.vmap(torch.cos)(x)

    worker = threading.Thread(target=other)
    worker.start()
    started.wait(5)
    trace = tl.trace(Waits(), torch.zeros(2, 2))
    assert torch.equal(results["other"], torch.ones(2, 2).sin())
    assert [op.func_name for op in trace.ops if op.kind == "op"] == ["vmap"]


def test_a_loaded_trace_says_it_cannot_replay_the_transform(tmp_path):
    torch.manual_seed(0)
    model, x = _PerSample().eval(), torch.randn(3, 4)
    trace = tl.trace(model, x)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert torch.equal(loaded.output, trace.output)  # the values are saved
    why = loaded.notes["not_replayable"]
    assert list(why) == [op.label for op in trace.ops if op.func_name == "vmap"]
    with pytest.raises(UnsupportedError, match=r"torch\.func\.vmap of .*_PerSample\.forward.*cannot be rebuilt"):
        loaded.replay()


def _transformers_4():
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) != 4:
        pytest.skip(
            f"needs transformers 4.x (eager attention masks built under torch.vmap); "
            f"{transformers.__version__} is installed"
        )
    return transformers


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_transformers_4_eager_attention_traces_and_replays_with_another_padding_mask(family):
    transformers = _transformers_4()
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        family,
        vocab_size=64,
        hidden_size=32,
        n_embd=32,
        intermediate_size=64,
        num_hidden_layers=2,
        n_layer=2,
        num_attention_heads=4,
        n_head=4,
        num_key_value_heads=2,
    )
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    ids = torch.randint(0, 64, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    trace = tl.trace(model, ids, attention_mask=mask, output_attentions=True)
    with torch.no_grad():
        own = model(ids, attention_mask=mask, output_attentions=True)
    assert torch.equal(trace.output.last_hidden_state, own.last_hidden_state)
    assert all(torch.equal(a, b) for a, b in zip(trace.output.attentions, own.attentions))
    assert trace.audit()
    vmaps = [op for op in trace.ops if op.func_name == "vmap"]
    assert vmaps
    inputs = {op.index for op in trace.ops if op.kind == "input"}
    assert any(_reaches(trace, op, inputs) for op in vmaps)  # the padding mask is an edge into the mask op
    other = torch.ones_like(ids)
    other[0, :4] = 0
    with torch.no_grad():
        want = model(ids, attention_mask=other, output_attentions=True)
    got = trace.replay(ids, attention_mask=other, output_attentions=True)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=1e-6)


def _reaches(trace, op, sources) -> bool:
    stack, seen = [op.index], set()
    while stack:
        i = stack.pop()
        if i in sources:
            return True
        if i not in seen:
            seen.add(i)
            stack.extend(trace.ops[i].parent_indices)
    return False
