"""Running statistics written by the norm kernels: ``trace.params`` holds them as they were before the forward.

A training-mode BatchNorm updates ``running_mean`` / ``running_var`` inside the
kernel (torch, Paddle) or through variable writes (Keras, tinygrad). Each test
copies the buffers before the forward (the independent reference), traces,
and checks the trace kept those copies' values, the model moved on, replay is
exact, and replay changed neither the model nor the trace. Each backend's test
skips where its framework is not installed (one per nox session).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import torchlens as tl


def _check(
    trace: tl.Trace, before: dict[str, np.ndarray], after: dict[str, np.ndarray], moved: list[str], to_numpy, read_model
) -> None:
    for name, value in before.items():
        np.testing.assert_array_equal(to_numpy(trace.params[name].value), value, err_msg=name)
    for name in moved:
        assert not np.array_equal(after[name], before[name]), f"{name} did not move: the test checks nothing"
    report = trace.audit()
    assert report, report
    replayed = trace.replay()
    np.testing.assert_allclose(to_numpy(replayed), to_numpy(trace.output), rtol=1e-6, atol=1e-6)
    for name, value in read_model().items():  # replay left the model ...
        np.testing.assert_array_equal(value, after[name], err_msg=name)
    for name, value in before.items():  # ... and the trace alone
        np.testing.assert_array_equal(to_numpy(trace.params[name].value), value, err_msg=name)


# -- torch --------------------------------------------------------------------------------------------
def test_torch_batch_and_instance_norm_statistics() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.inorm = nn.InstanceNorm2d(4, track_running_stats=True)
            self.bn1d = nn.BatchNorm1d(4, momentum=None)  # cumulative average: the kernel writes too

        def forward(self, x):
            h = self.bn(self.conv(x))
            h = self.bn(h)  # reused: the second call reads the statistics the first one wrote
            h = self.inorm(torch.relu(h)).mean((2, 3))
            # read after the update, inside the forward
            return self.bn1d(h) + self.bn.running_mean + self.inorm.running_var.sum()

    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(3, 2, 6, 6)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        expected = reference(x)

    def buffers(m=model):
        return {k: v.detach().clone().numpy() for k, v in m.named_buffers()}

    before = buffers()
    trace = tl.trace(model, x)
    after = buffers()
    for name, value in buffers(reference).items():  # the traced forward moved the model as a plain one does
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    np.testing.assert_allclose(trace.output.detach().numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    moved = [
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
        "inorm.running_mean",
        "inorm.running_var",
        "bn1d.running_mean",
        "bn1d.running_var",
    ]
    _check(trace, before, after, moved, lambda v: v.detach().numpy(), buffers)


def test_torch_functional_batch_norm_on_tensors_held_by_the_model() -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch import nn

    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.zeros(3))
            self.register_buffer("var", torch.ones(3))

        def forward(self, x):
            # keywords, and torch.batch_norm's own argument order
            h = F.batch_norm(x, running_mean=self.mean, running_var=self.var, training=True, momentum=0.5)
            return torch.batch_norm(h, None, None, self.mean, self.var, True, 0.5, 1e-5, False)

    model = Functional()
    x = torch.randn(5, 3) * 3 + 1

    def buffers():
        return {k: v.clone().numpy() for k, v in model.named_buffers()}

    before = buffers()
    trace = tl.trace(model, x)
    _check(trace, before, buffers(), ["mean", "var"], lambda v: v.detach().numpy(), buffers)


def test_torch_eval_mode_norm_writes_nothing() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).eval()
    trace = tl.trace(model, torch.randn(2, 3))
    for name, buffer in model.named_buffers():  # nothing written: held by reference, as parameters are
        assert trace.params[name].value is buffer


# -- paddle -------------------------------------------------------------------------------------------
def test_paddle_batch_norm_statistics() -> None:
    paddle = pytest.importorskip("paddle")
    from paddle import nn

    class Net(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2D(2, 4, 3)
            self.bn = nn.BatchNorm2D(4)
            self.bn1d = nn.BatchNorm1D(4)

        def forward(self, x):
            h = self.bn(self.bn(self.conv(x))).mean((2, 3))
            return self.bn1d(h) + self.bn._mean

    paddle.seed(0)
    model = Net()
    model.train()
    x = paddle.randn([3, 2, 6, 6])
    reference = copy.deepcopy(model)
    expected = reference(x).numpy()

    def buffers(m=model):  # Paddle holds the statistics as parameters that take no gradient
        return {
            k: np.array(v.numpy(), copy=True) for k, v in m.named_parameters() if k.endswith(("._mean", "._variance"))
        }

    before = buffers()
    trace = tl.trace(model, x)
    after = buffers()
    for name, value in buffers(reference).items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    np.testing.assert_allclose(trace.output.numpy(), expected, rtol=1e-6, atol=1e-6)
    moved = ["bn._mean", "bn._variance", "bn1d._mean", "bn1d._variance"]
    _check(trace, before, after, moved, lambda v: v.numpy(), buffers)


# -- tf / keras ---------------------------------------------------------------------------------------
def test_keras_batch_normalization_statistics() -> None:
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")

    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 2))
    h = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    outputs = keras.layers.BatchNormalization(name="bn2")(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inputs, outputs)
    x = np.random.default_rng(0).normal(size=(3, 6, 6, 2)).astype("float32")

    def buffers():
        return {
            f"{layer}.{w.name}": np.array(w.numpy(), copy=True)
            for layer in ("bn", "bn2")
            for w in model.get_layer(layer).non_trainable_weights
        }

    before = buffers()
    trace = tl.trace(model, x, training=True)
    after = buffers()
    _check(trace, before, after, list(before), np.asarray, buffers)


# -- tinygrad -----------------------------------------------------------------------------------------
def test_tinygrad_batch_norm_statistics() -> None:
    pytest.importorskip("tinygrad")
    from tinygrad import Tensor, nn
    from tinygrad.helpers import Context

    class Net:
        def __init__(self) -> None:
            self.conv = nn.Conv2d(2, 4, 3)
            self.bn = nn.BatchNorm(4)

        def __call__(self, x):
            return self.bn(self.bn(self.conv(x))).mean((2, 3)) + self.bn.running_mean

    Tensor.manual_seed(0)
    model = Net()
    x = Tensor.randn(3, 2, 6, 6).realize()

    def buffers():
        return {
            f"bn.{k}": np.array(getattr(model.bn, k).numpy(), copy=True)
            for k in ("running_mean", "running_var", "num_batches_tracked")
        }

    with Context(TRAINING=1):
        before = buffers()
        trace = tl.trace(model, x)
        after = buffers()
        _check(trace, before, after, list(before), lambda v: v.numpy(), buffers)
