"""Per-op gradients on torch, checked against torch's own: tensor hooks placed by hand, autograd.grad, .grad."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import torchlens as tl  # noqa: E402

nn = torch.nn


def _grads_at_outputs(model: Any, modules: dict[str, Any], x: Any) -> tuple[dict[str, list[Any]], Any]:
    """Each listed module's output gradients, one per call, by forward hooks that hook the outputs; and x.grad."""
    seen: dict[str, list[Any]] = {name: [] for name in modules}
    order: dict[str, list[int]] = {name: [] for name in modules}

    def hooked(name: str) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            slot = len(order[name])
            order[name].append(slot)
            seen[name].append(None)
            out.register_hook(lambda g: seen[name].__setitem__(slot, g))

        return hook

    handles = [m.register_forward_hook(hooked(name)) for name, m in modules.items()]
    x = x.detach().clone().requires_grad_(True)
    try:
        model(x).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return seen, x.grad


def test_the_seed_backward_section_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    import torchvision.models as models

    torch.manual_seed(0)
    model = models.alexnet(weights=None).eval()

    x = torch.randn(1, 3, 224, 224, requires_grad=True)
    log = tl.trace(model, x, capture=tl.options.CaptureOptions(save_grads=True))
    log.log_backward(log[log.output_layers[0]].out.sum())

    grad = log["relu_1_2"].grad  # gradient tensor flowing through that op
    print(grad.shape)  # torch.Size([1, 64, 55, 55])

    narrow = tl.trace(model, x, capture=tl.options.CaptureOptions(save_grads=tl.func("relu")))
    narrow.log_backward(narrow[narrow.output_layers[0]].out.sum())

    assert capsys.readouterr().out.strip() == "torch.Size([1, 64, 55, 55])"
    relus = [m for m in model.features if isinstance(m, nn.ReLU)]
    seen, x_grad = _grads_at_outputs(model, {"relu0": relus[0]}, x)
    assert torch.allclose(grad, seen["relu0"][0], atol=1e-6)
    assert torch.allclose(log["input_1"].grad, x_grad, atol=1e-6)
    assert torch.allclose(narrow["relu_1_2"].grad, grad, atol=1e-6)
    assert narrow["conv2d_1_1"].grad is None and narrow["conv2d_1_1"].grad_status == "not selected by save_grads="
    assert "Gradient: none (not selected" in str(narrow["conv2d_1_1"])
    assert "grad_fn_handle: ConvolutionBackward0" in str(log["conv2d_3_7"])


def test_resnet_gradients_are_right_after_in_place_ops_and_at_module_outputs() -> None:
    torch.manual_seed(1)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    log = tl.trace(model, x.clone().requires_grad_(True), save_grads=True)
    log.log_backward(lambda out: out.sum())
    block = model.layer1[0]
    seen, x_grad = _grads_at_outputs(model, {"relu": block.relu, "layer2": model.layer2, "bn2": block.bn2}, x)
    # layer1.0 runs its ReLU twice: after bn1, and in place after the residual +=; each pass has its own gradient
    relus = [op for op in log.ops if op.module == "layer1.0.relu"]
    assert len(relus) == 2 and all(op.in_place for op in relus)
    for op, expected in zip(relus, seen["relu"]):
        assert torch.allclose(op.grad, expected, atol=1e-5), op.label
    # the += wrote into bn2's output, which relu_ then overwrote: each version keeps its own gradient
    add = next(op for op in log.ops if op.func_name == "add_" and op.module == "layer1.0")
    after_relu = relus[1].grad
    expected_add = after_relu * (relus[1].out > 0)  # through relu: the gradient passes where the output is positive
    assert torch.allclose(add.grad, expected_add, atol=1e-5)
    bn2 = next(op for op in log.ops if op.module == "layer1.0.bn2")
    assert torch.allclose(bn2.grad, seen["bn2"][0], atol=1e-5) and torch.allclose(bn2.grad, add.grad, atol=1e-5)
    assert torch.allclose(log["layer2"].grad, seen["layer2"][0], atol=1e-5)  # a module path gives its output's
    assert torch.allclose(log["input_1"].grad, x_grad, atol=1e-5)
    weight = dict(model.named_parameters())["layer1.0.conv1.weight"]
    (expected_w,) = torch.autograd.grad(model(x).sum(), weight)
    assert torch.allclose(log.params["layer1.0.conv1.weight"].grad, expected_w, atol=1e-4)


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x: Any) -> Any:
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x.view(-1, 5) * 2  # a view on the way
        return x


def test_each_pass_of_a_reused_module_and_each_view_has_its_own_gradient() -> None:
    torch.manual_seed(2)
    model = Recurrent()
    x = torch.randn(6, 5)
    log = tl.trace(model, x, save_grads=True)
    log.log_backward(log.output.pow(2).sum())
    seen: list[Any] = []

    def hook(module: Any, args: Any, out: Any) -> None:
        slot = len(seen)
        seen.append(None)
        out.register_hook(lambda g: seen.__setitem__(slot, g))

    handle = model.fc.register_forward_hook(hook)
    model(x).pow(2).sum().backward()
    handle.remove()
    passes = [log[f"linear_1:{k}"] for k in range(1, 5)]
    assert len(seen) == 4
    for op, expected in zip(passes, seen):
        assert torch.allclose(op.grad, expected, atol=1e-5), op.label
    views = [op for op in log.ops if op.func_name == "view"]
    muls = [op for op in log.ops if op.func_name == "mul"]
    for view, mul in zip(views, muls):  # d(2v)/dv = 2: the view's gradient is twice the product's
        assert torch.allclose(view.grad, 2 * mul.grad, atol=1e-6)


def test_a_trace_without_a_graph_is_replayed_under_autograd() -> None:
    torch.manual_seed(3)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 48, 48)
    live = tl.trace(model, x.clone().requires_grad_(True), save_grads=True)
    live.log_backward(lambda out: (out * out).sum())
    with torch.no_grad():  # no graph at all: the backward must come from a replay
        plain = tl.trace(model, x, save_grads=True)
    plain.log_backward(lambda out: (out * out).sum())
    # (a loaded trace, replayed likewise: the conformance suite's test_a_loaded_trace_gives_the_same_gradients)
    for op in live.ops:
        if op.kind in ("input", "op") and op.grad is not None and op.dtype == "float32":
            assert torch.allclose(plain.ops[op.index].grad, op.grad, atol=1e-4, rtol=1e-4), op.label
    assert torch.allclose(plain.params["fc.weight"].grad, live.params["fc.weight"].grad, atol=1e-4)


def test_gradients_are_refused_where_they_cannot_be_given() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.randn(2, 3)
    # (save_grads= with halt=, log_backward without save_grads=: the conformance suite's, on every backend)
    with pytest.raises(TypeError, match="save_grads"):
        tl.trace(model, x, save_grads="relu")
    with pytest.raises(TypeError, match="given twice"):
        tl.trace(model, x, save_grads=tl.func("relu"), capture=tl.options.CaptureOptions(save_grads=True))
    log = tl.trace(model, x, save_grads=True)
    log.log_backward(log.output.sum())
    with pytest.raises(tl.UnsupportedError, match="freed"):
        log.log_backward(log.output.sum())
    log.log_backward(lambda out: out.sum())  # a function of the output replays instead
    assert log["relu_1_2"].grad is not None


def test_hooks_leave_nothing_on_the_user_s_tensors() -> None:
    model = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    log = tl.trace(model, x, save_grads=True)
    log.log_backward(lambda out: out.sum())
    assert not x._backward_hooks and not model.weight._backward_hooks
    y = model(x).sum()
    y.backward()  # a plain backward afterwards: nothing of the trace runs or changes
    assert torch.allclose(log["input_1"].grad, torch.ones(2, 3) @ model.weight)
