"""Paddle: initializers that write a tensor by sharing their result into it, and paddle.amp.auto_cast.

``paddle.nn.initializer.*`` (and conv/norm layers reshaping a parameter) write ``var`` by
``out._share_underline_tensor_to(var)``; the write used to go unseen, so later reads of ``var`` replayed the
value it held before. ``auto_cast`` casts inside the C ops, which a trace does not record: it has no effect on
CPU (the trace is faithful there) and is refused where it takes effect. References: the untraced function run
from the same seed, and the layer's parameters before and after.
"""

from __future__ import annotations

import sys

import pytest

paddle = pytest.importorskip("paddle")
import numpy as np  # noqa: E402

import torchlens as tl  # noqa: E402


def init_empty(x):
    w = paddle.empty([3, 3])
    paddle.nn.initializer.KaimingUniform()(w)
    return x @ w


def test_initializer_written_tensor_replays_as_the_untraced_function():
    x = paddle.randn([2, 3])
    paddle.seed(0)
    trace = tl.trace(init_empty, x)
    assert trace.audit(), trace.audit()
    x2 = paddle.randn([2, 3])
    paddle.seed(0)
    expected = init_empty(x2)
    np.testing.assert_array_equal(trace.replay(x2).numpy(), expected.numpy())


class Reinitializes(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.w = self.create_parameter([3, 3])

    def forward(self, x):
        y = x @ self.w
        paddle.nn.initializer.Normal()(self.w)
        return y + x @ self.w


def test_parameter_reinitialized_in_the_forward():
    model, x = Reinitializes(), paddle.randn([2, 3])
    before = model.w.numpy().copy()
    paddle.seed(1)
    trace = tl.trace(model, x)
    after = model.w.numpy().copy()
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(trace.params["w"].value.numpy(), before)  # what replay starts from
    assert trace.audit(), trace.audit()
    expected = x.numpy() @ before + x.numpy() @ after
    np.testing.assert_allclose(trace.replay(x).numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(model.w.numpy(), after)  # replay left the layer alone


class AutocastInside(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(8, 4)

    def forward(self, x):
        with paddle.amp.auto_cast(level="O1", dtype="bfloat16"):
            y = self.fc(x)
        return y


@pytest.mark.filterwarnings("ignore:amp_guard can only be enabled")
def test_auto_cast_without_effect_on_cpu_is_traced_faithfully():
    model, x = AutocastInside(), paddle.randn([2, 8])
    assert not paddle.is_compiled_with_cuda() or paddle.get_device() == "cpu"
    trace = tl.trace(model, x)
    assert trace.audit(), trace.audit()
    x2 = paddle.randn([2, 8])
    out = trace.replay(x2)
    assert out.dtype == model(x2).dtype
    np.testing.assert_array_equal(out.numpy(), model(x2).numpy())


@pytest.mark.filterwarnings("ignore:amp_guard can only be enabled")
def test_auto_cast_taking_effect_inside_the_forward_is_refused(monkeypatch):
    import torchlens_paddle.intercept as intercept

    guard = sys.modules["paddle.amp.auto_cast"].amp_guard
    monkeypatch.setattr(intercept, "amp_casting", lambda: True)  # as on a CUDA place, where it casts
    with pytest.raises(tl.UnsupportedError, match="auto_cast is in effect inside the traced forward"):
        tl.trace(AutocastInside(), paddle.randn([2, 8]))
    assert sys.modules["paddle.amp.auto_cast"].amp_guard is guard  # the patch was put back


def test_auto_cast_around_the_capture_is_refused(monkeypatch):
    import torchlens_paddle.capture as capture

    monkeypatch.setattr(capture, "amp_casting", lambda: True)
    with pytest.raises(tl.UnsupportedError, match="auto_cast is in effect around tl.trace"):
        tl.trace(paddle.nn.Linear(3, 2), paddle.randn([2, 3]))
