"""A module's record lists every parameter and buffer below it, worked out once by the builder for every backend."""

from __future__ import annotations

import pytest

from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.ir.records import ParamRecord


def _param(name: str, buffer: bool = False) -> ParamRecord:
    return ParamRecord(name, (2,), "float32", 2, not buffer, name.rpartition(".")[0], is_buffer=buffer)


def test_modules_declared_without_their_parameters_get_those_below_them() -> None:
    builder = TraceBuilder("numpy")
    for path in ("fc1", "block", "block.inner", "block.inner.deep", "fc"):
        builder.add_module(path, "M")
    builder.add_module("given", "M", ["given.w", "elsewhere"])  # a list given is the backend's, kept as given
    builder.add_module("again", "M")
    builder.add_module("again", "M", ["again.w"])  # declared again with its list: that list, nothing added
    for name in ("fc1.weight", "fc10.weight", "block.inner.deep.w", "block.b", "given.w", "again.w", "top"):
        builder.add_param(_param(name))
    builder.add_param(_param("block.inner.running_mean", buffer=True))
    builder.add_param(_param("block.gap.w"))  # "block.gap" is no module: listed by "block"
    builder.add_outputs((), ())
    trace = builder.finish()
    assert trace.modules["fc1"].params == ["fc1.weight"]  # not fc10's: a prefix ends at a dot
    assert trace.modules["fc"].params == []
    assert trace.modules["block"].params == ["block.inner.deep.w", "block.b", "block.inner.running_mean", "block.gap.w"]
    assert trace.modules["block.inner"].params == ["block.inner.deep.w", "block.inner.running_mean"]
    assert trace.modules["block.inner.deep"].params == ["block.inner.deep.w"]
    assert trace.modules["given"].params == ["given.w", "elsewhere"]
    assert trace.modules["again"].params == ["again.w"]
    assert trace.modules["fc1"].num_params == 2
    assert trace.modules["block"].num_params == 6  # three parameters of 2; the buffer is not counted
    assert trace.modules["given"].num_params == 2  # "elsewhere" names no parameter: nothing counted


def test_a_torch_models_module_lists_are_what_torch_lists_below_each_module() -> None:
    """The reference is torch's own walk of each submodule: ``named_parameters`` and ``named_buffers`` under its
    prefix (parameters first, in torch's order, as the trace declares them)."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    import torchlens as tl

    model = torchvision.models.resnet18(num_classes=10).eval()
    trace = tl.trace(model, torch.randn(1, 3, 32, 32))
    for path, sub in model.named_modules():
        if not path:
            continue
        want = [n for n, _ in sub.named_parameters(prefix=path)] + [n for n, _ in sub.named_buffers(prefix=path)]
        assert trace.modules[path].params == want, path
    assert trace.modules["layer1.0"].num_params == sum(p.numel() for p in model.layer1[0].parameters())


def _declared(names: list[str], paths: list[str]) -> TraceBuilder:
    builder = TraceBuilder("numpy")
    for path in paths:
        builder.add_module(path, "M")
    for name in names:
        builder.add_param(_param(name))
    builder.add_outputs((), ())
    return builder


def test_the_lists_of_a_model_captured_again_are_its_own() -> None:
    """The lists are remembered for the parameter names and module paths they were worked out from: the same
    model again gets the same lists, each trace its own list objects; a model with a parameter more, or a module
    fewer, gets lists worked out for it."""
    names, paths = ["a.w", "a.b.w", "c.w"], ["a", "a.b", "c"]
    first = _declared(names, paths).finish()
    again = _declared(names, paths).finish()
    assert {p: m.params for p, m in again.modules.items()} == {"a": ["a.w", "a.b.w"], "a.b": ["a.b.w"], "c": ["c.w"]}
    again.modules["a"].params.append("x")  # a user's edit of one trace
    assert first.modules["a"].params == ["a.w", "a.b.w"]
    more = _declared([*names, "a.b.v"], paths).finish()
    assert more.modules["a"].params == ["a.w", "a.b.w", "a.b.v"] and more.modules["a.b"].params == ["a.b.w", "a.b.v"]
    fewer = _declared(names, ["a", "c"]).finish()
    assert set(fewer.modules) == {"a", "c"} and fewer.modules["a"].params == ["a.w", "a.b.w"]
    assert _declared(names, paths).finish().modules["a"].params == ["a.w", "a.b.w"]  # not the edited list
