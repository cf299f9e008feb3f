"""The fields derived from the graph and the parameters (docs/metadata.md, "Derived fields"), each checked
against a computation written here: plain breadth-first walks over ``op.parents`` / ``op.children``,
pairwise scans for siblings and co-parents, torch's own ``module.parameters()`` for the counts, forward
hooks for module nesting, and ``trace[key]`` for every lookup key. Then the same fields on a loaded and a
streamed (``save_to=``) trace, on the numpy plugin, and the cost: the index behind them built once per trace.
"""

from __future__ import annotations

import pathlib
from collections import deque
from typing import Any

import pytest

import torchlens as tl
from torchlens_core.ir import graph_index

try:  # the numpy plugin's test runs without torch (the core session); the rest need torch and torchvision
    import torch
    import torchvision
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch and torchvision")
nn: Any = torch.nn if torch is not None else None

GRAPH_FIELDS = (
    "num_parents",
    "num_children",
    "has_parents",
    "has_children",
    "is_input",
    "is_output",
    "is_output_parent",
    "is_final_output",
    "input_ancestors",
    "has_input_ancestor",
    "root_ancestors",
    "output_descendants",
    "has_output_descendant",
    "siblings",
    "co_parents",
    "lookup_keys",
    "module_call_depth",
    "is_module_output",
)
PARAM_FIELDS = (
    "param_names",
    "buffer_names",
    "param_shapes",
    "num_params",
    "num_params_trainable",
    "num_params_frozen",
)


class Branchy(nn.Module if nn is not None else object):  # type: ignore[misc]
    """Two inputs, two outputs, a branch nothing returned depends on, an op computed from a parameter alone,
    one value taken by several ops, a frozen layer and a module called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.shared = nn.Linear(6, 6)
        self.scale = nn.Parameter(torch.ones(6))
        self.frozen = nn.Linear(6, 3)
        self.frozen.requires_grad_(False)
        self.norm = nn.BatchNorm1d(6)

    def forward(self, x: Any, y: Any) -> Any:
        h = torch.relu(self.a(x))
        g = torch.sigmoid(self.b(y))
        s = self.scale * 2  # from a parameter alone: no input behind it
        _dead = torch.tanh(h) * 3  # nothing returned depends on it
        m = h * g + s
        m = self.shared(self.norm(m))
        m = self.shared(m + h)  # the second call of `shared`
        return self.frozen(m), g.sum()


def ancestors_by_walk(trace: tl.Trace, op: tl.OpRecord) -> set[str]:
    seen, todo = {op.label}, deque([op.label])
    while todo:
        for parent in trace[todo.popleft()].parents:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def descendants_by_walk(trace: tl.Trace, op: tl.OpRecord) -> set[str]:
    seen, todo = {op.label}, deque([op.label])
    while todo:
        for child in trace[todo.popleft()].children:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def check_graph_fields(trace: tl.Trace) -> None:
    ops = list(trace)
    order = {op.label: op.index for op in ops}
    inputs = {op.label for op in ops if op.kind == "input"}
    outputs = {op.label for op in ops if op.kind == "output"}
    roots = {op.label for op in ops if not op.parents}
    keys = trace._ipython_key_completions_()
    for op in ops:
        up, down = ancestors_by_walk(trace, op), descendants_by_walk(trace, op)
        assert op.num_parents == len(set(op.parents)) and op.num_children == len(set(op.children))
        assert op.has_parents == bool(op.parents) and op.has_children == bool(op.children)
        assert op.is_input == (op.label in inputs) and op.is_output == (op.label in outputs)
        assert op.is_output_parent == any(c in outputs for c in op.children)
        assert op.is_final_output == (op.label in outputs or any(c in outputs for c in op.children))
        assert op.input_ancestors == tuple(sorted(up & inputs, key=order.get)), op.label
        assert op.has_input_ancestor == bool(up & inputs)
        assert op.root_ancestors == tuple(sorted(up & roots, key=order.get)), op.label
        assert op.output_descendants == tuple(sorted(down & outputs, key=order.get)), op.label
        assert op.has_output_descendant == bool(down & outputs)
        siblings = [o.label for o in ops if o is not op and set(o.parents) & set(op.parents)]
        co_parents = [o.label for o in ops if o is not op and set(o.children) & set(op.children)]
        assert op.siblings == tuple(siblings) and op.co_parents == tuple(co_parents), op.label
        # Every key finds the op, and every key that finds it is listed.
        assert all(trace[k] is op for k in op.lookup_keys), op.label
        assert {k for k in keys if trace[k] is op} == {k for k in op.lookup_keys if isinstance(k, str)}
        assert [k for k in op.lookup_keys if isinstance(k, int)] == [op.index - len(ops), op.index]
        assert op.is_module_output == bool(op.module_outputs)
        assert op.is_inplace is op.in_place
        assert op.flops_forward == op.flops and op.macs_forward == op.macs


def call_depths(model: nn.Module, *args: Any) -> dict[str, list[int]]:
    """For every module path, how deep each of its calls was (1: called by the model itself), from hooks."""
    depth, seen = [0], {}
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def pre(_m: Any, _a: Any, name: str = name) -> None:
            depth[0] += 1
            seen.setdefault(name, []).append(depth[0])

        def post(_m: Any, _a: Any, _o: Any) -> None:
            depth[0] -= 1

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return seen


def check_module_fields(trace: tl.Trace, model: nn.Module, *args: Any) -> None:
    depths = call_depths(model, *args)
    checked = 0
    for path, record in trace.modules.items():
        for mp in record.passes:
            assert mp.num_ops == sum(f"{path}:{mp.pass_num}" in op.modules for op in trace)
            if mp.ops:
                assert mp.module_call_depth == depths[path][mp.pass_num - 1], mp.label
                checked += 1
            out = mp.output_ops
            if len(out) == 1 and len(record.passes) == 1 and not list(model.get_submodule(path).children()):
                # The op a leaf module returned ran inside it and every module around it.
                assert out[0].module_call_depth == depths[path][0], path
    assert checked > 0
    for op in trace:
        assert op.module_call_depth == len(op.modules)


def check_param_fields(trace: tl.Trace, model: nn.Module) -> None:
    named = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for op in trace:
        names = [n for n in op.params if n in named]
        assert op.param_names == tuple(names)
        assert op.buffer_names == tuple(n for n in op.params if n in buffers)
        assert op.param_shapes == tuple(tuple(named[n].shape) for n in names)
        assert op.num_params == sum(named[n].numel() for n in names)
        assert op.num_params_trainable == sum(named[n].numel() for n in names if named[n].requires_grad)
        assert op.num_params_frozen == sum(named[n].numel() for n in names if not named[n].requires_grad)
    # Each leaf layer with parameters that ran once: the op it returned used exactly its parameters.
    for path, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        if not own or list(module.children()) or trace.modules[path].num_passes != 1:
            continue
        op = trace[path]
        assert op.num_params == sum(p.numel() for p in own), path
        assert sorted(op.param_shapes) == sorted(tuple(p.shape) for p in own), path
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (trace.num_params, trace.num_params_trainable, trace.num_params_frozen) == (
        total,
        trainable,
        total - trainable,
    )


@pytest.fixture(scope="module")
def resnet() -> Any:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    model.layer1.requires_grad_(False)  # some frozen parameters, so the frozen counts are not all zero
    return model


@pytest.fixture(scope="module")
def image() -> Any:
    torch.manual_seed(1)
    return torch.randn(1, 3, 32, 32)


@pytest.fixture(scope="module")
def branchy() -> tuple[nn.Module, tuple[Any, Any]]:
    torch.manual_seed(2)
    return Branchy().eval(), (torch.randn(4, 6), torch.randn(4, 6))


@needs_torch
def test_resnet_fields_match_walks_hooks_and_parameters(resnet: Any, image: Any) -> None:
    trace = tl.trace(resnet, image)
    check_graph_fields(trace)
    check_module_fields(trace, resnet, image)
    check_param_fields(trace, resnet)
    # Each parameter of ResNet-18 is used by exactly one op: the ops' counts add up to the model's.
    assert sum(op.num_params for op in trace) == sum(p.numel() for p in resnet.parameters())
    assert sum(op.num_params_frozen for op in trace) == sum(p.numel() for p in resnet.layer1.parameters())
    # ResNet's ReLUs run in place; its convolutions do not. The residual adds have siblings (the branch).
    assert all(op.is_inplace for op in trace if op.func_name == "relu")
    assert not any(op.is_inplace for op in trace if op.func_name == "conv2d")
    (skip,) = trace["layer1.0.conv1"].siblings  # the block's input also goes round it, to the residual add
    assert trace[skip].func_name == "add_" and trace[skip].module == "layer1.0"
    assert trace["fc"].is_final_output and not trace["avgpool"].is_final_output


@needs_torch
def test_branchy_fields(branchy: tuple[nn.Module, tuple[Any, Any]]) -> None:
    model, args = branchy
    trace = tl.trace(model, *args)
    check_graph_fields(trace)
    check_module_fields(trace, model, *args)
    check_param_fields(trace, model)
    dead = trace["tanh_1"]
    assert dead.has_input_ancestor and not dead.has_output_descendant and dead.output_descendants == ()
    scaled = trace["mul_1"]  # self.scale * 2
    assert scaled.param_names == ("scale",) and not scaled.has_input_ancestor and scaled.input_ancestors == ()
    assert scaled.root_ancestors == (scaled.label,)
    assert set(trace["add_1"].input_ancestors) == {"input_1", "input_2"}
    assert trace["frozen"].num_params_frozen == 6 * 3 + 3 and trace["frozen"].num_params_trainable == 0
    assert trace["sigmoid_1"].output_descendants == ("output_1", "output_2")
    assert trace["norm"].buffer_names == ("norm.running_mean", "norm.running_var")


def field_values(trace: tl.Trace) -> dict[str, tuple[Any, ...]]:
    return {op.label: tuple(getattr(op, f) for f in GRAPH_FIELDS + PARAM_FIELDS) for op in trace}


@needs_torch
def test_fields_of_loaded_and_streamed_traces(
    branchy: tuple[nn.Module, tuple[Any, Any]], resnet: Any, image: Any, tmp_path: pathlib.Path
) -> None:
    for model, args in (branchy, (resnet, (image,))):
        live = tl.trace(model, *args)
        expected = field_values(live)
        folder = tl.save(live, tmp_path / f"saved_{type(model).__name__}")
        loaded = tl.load(folder)
        assert field_values(loaded) == expected
        check_graph_fields(loaded)
        streamed = tl.trace(model, *args, save_to=tmp_path / f"streamed_{type(model).__name__}")
        assert field_values(streamed) == expected
        assert field_values(tl.load(tmp_path / f"streamed_{type(model).__name__}")) == expected
        assert (loaded.num_params, streamed.num_params) == (live.num_params, live.num_params)


def test_numpy_plugin_fields() -> None:
    pytest.importorskip("torchlens_numpy")
    import numpy as np

    from torchlens_numpy import zoo

    rng = np.random.default_rng(0)
    x, w1, w2 = rng.normal(size=(2, 3)), rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    trace = tl.trace(zoo.tuple_output, x, w1, w2, backend="numpy")
    check_graph_fields(trace)
    # h is returned and also feeds the second matmul: an op with two children, one an output node.
    relu = [op for op in trace if op.func_name == "maximum"][0]
    assert relu.is_output_parent and relu.num_children == 2 and len(relu.output_descendants) == 2
    trace = tl.trace(zoo.in_place, x, w1, rng.normal(size=4), backend="numpy")
    check_graph_fields(trace)
    assert any(op.is_inplace for op in trace)


class Chain(nn.Module if nn is not None else object):  # type: ignore[misc]
    def forward(self, x: Any) -> Any:
        for _ in range(2500):
            x = (x * 1.0001) + 0.5
        return x


@needs_torch
def test_fields_on_every_op_build_the_index_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading each field on every op of a 5,000-op trace builds the graph index once: no per-op walks."""
    builds = []
    real = graph_index.build

    def counting(trace: tl.Trace) -> Any:
        builds.append(trace)
        return real(trace)

    monkeypatch.setattr(graph_index, "build", counting)
    trace = tl.trace(Chain(), torch.ones(2))
    assert trace.num_ops == 5000
    for op in trace:
        for name in GRAPH_FIELDS:
            getattr(op, name)
    assert len(builds) == 1
    first, last = trace.ops[1], trace.ops[-2]
    assert first.output_descendants == ("output_1",) and last.input_ancestors == ("input_1",)
    assert first.siblings == () and last.co_parents == ()
