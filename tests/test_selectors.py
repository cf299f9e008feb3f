"""Selectors pick the same ops on every backend; trace.find names near misses."""

from __future__ import annotations

import pytest

import torchlens as tl


@pytest.fixture(scope="module")
def resnet() -> tl.Trace:
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return tl.trace(torchvision.models.resnet18(weights=None).eval(), torch.rand(1, 3, 64, 64))


def labels(ops: list[tl.OpRecord]) -> list[str]:
    return [op.label for op in ops]


def test_func_matches_names_regexes_and_in_place_variants(resnet: tl.Trace) -> None:
    relus = resnet.find(tl.func("relu"))
    assert len(relus) == 17 and all(op.func_name == "relu" for op in relus)
    adds = resnet.find(tl.func("add"))
    assert [op.func_name for op in adds] == ["add_"] * 8  # `+=` is add_, and "add" covers it
    assert len(resnet.find(tl.func("conv2d|linear"))) == 21


def test_module_and_in_module(resnet: tl.Trace) -> None:
    assert labels(resnet.find(tl.module("layer3"))) == [resnet["layer3"].label]
    inside = resnet.find(tl.in_module("layer2"))
    assert len(inside) == len(resnet.modules["layer2"].passes[0].ops)
    assert labels(resnet.find(tl.module("layer1.0.relu:2"))) == [resnet["layer1.0.relu:2"].label]
    assert len(resnet.find(tl.module("layer1.0.relu"))) == 2  # both passes


def test_combinators(resnet: tl.Trace) -> None:
    conv_then_bn = resnet.find(tl.func("conv2d") & tl.followed_by(tl.func("batch_norm")))
    assert len(conv_then_bn) == 20
    after_add = resnet.find(tl.preceded_by(tl.func("add")))
    assert {op.func_name for op in after_add} == {"relu"}
    not_in_layers = resnet.find(
        ~tl.in_module("layer1") & ~tl.in_module("layer2") & ~tl.in_module("layer3") & ~tl.in_module("layer4")
    )
    assert labels(not_in_layers)[:4] == ["conv2d_1_1", "batch_norm_1_2", "relu_1_3", "max_pool2d_1_4"]
    either = resnet.find(tl.module("fc") | tl.module("avgpool"))
    assert [op.func_name for op in either] == ["adaptive_avg_pool2d", "linear"]
    by_label = resnet.find(tl.label("relu_1_3", "conv2d_2"))
    assert labels(by_label) == ["relu_1_3", resnet["conv2d_2"].label]
    big = resnet.find(tl.where(lambda op: op.shape is not None and op.shape[1] >= 512))
    assert big and all(op.shape[1] >= 512 for op in big)


def test_no_match_names_the_closest(resnet: tl.Trace) -> None:
    with pytest.raises(KeyError, match="closest labels and module paths: .*layer2"):
        resnet.find(tl.in_module("layer22"))
    with pytest.raises(KeyError, match="relu"):
        resnet.find(tl.func("rellu"))
    with pytest.raises(TypeError):
        tl.func("relu") & "relu"  # type: ignore[operator]


def test_selectors_act_the_same_on_the_numpy_plugin() -> None:
    pytest.importorskip("torchlens_numpy")
    import numpy as np

    def mlp(x, w):
        h = np.maximum(x @ w, 0)
        return np.maximum(h @ w, 0) + h

    rng = np.random.default_rng(0)
    trace = tl.trace(mlp, rng.normal(size=(2, 3)), rng.normal(size=(3, 3)), backend="numpy")
    assert labels(trace.find(tl.func("matmul") & tl.followed_by(tl.func("maximum")))) == ["matmul_1_2", "matmul_2_4"]
    assert labels(trace.find(tl.preceded_by(tl.func("maximum")) & tl.func("add"))) == ["add_1_6"]


def test_selectors_act_the_same_on_jax() -> None:
    pytest.importorskip("jax")
    from torchlens_jax.zoo import cases

    case = next(c for c in cases() if c.name == "nnx_mlp")
    model, args, kwargs = case.build()
    trace = tl.trace(model, *args, backend="jax", **kwargs)
    first = next(iter(trace.modules))
    inside = trace.find(tl.in_module(first))
    assert inside and all(any(p == first for p, _ in op.module_passes) for op in inside)
    assert trace.find(tl.module(first))[0].module_outputs == [f"{first}:1"]
