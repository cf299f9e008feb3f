"""tl.compare on Paddle: ops that return several arrays, and an inference-time dropout that rescales (issue 35).

Paddle's ``batch_norm`` returns the normalized output with its statistics (a
tuple): each array of the tuple is a value of its own, so a batch-norm bug is
reported at the batch norm, not one op later. Paddle's ``Dropout`` in
``downscale_in_infer`` mode multiplies by ``1 - p`` at inference: deterministic,
so it is a difference from an identity dropout, not randomness. Where each
difference is, is known from the code.
"""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import torchlens as tl  # noqa: E402


def net(eps: float = 1e-5, mode: str = "upscale_in_train") -> object:
    paddle.seed(0)
    model = paddle.nn.Sequential(
        paddle.nn.Conv2D(3, 4, 3),
        paddle.nn.BatchNorm2D(4, epsilon=eps),
        paddle.nn.ReLU(),
        paddle.nn.Dropout(0.1, mode=mode),
        paddle.nn.Flatten(),
        paddle.nn.Linear(64, 5),
    )
    model.eval()
    return model


X = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype("float32"))


def test_a_batch_norm_epsilon_is_found_at_the_batch_norm():
    a, b = net(), net(eps=1e-1)
    cmp = tl.compare(tl.trace(a, X, backend="paddle"), tl.trace(b, X, backend="paddle"))
    first = cmp.first_divergence
    assert first is not None and first.a.startswith("batch_norm") and first.verdict == "diverges", str(cmp)
    assert first.a_path == first.b_path == (0,)  # the normalized output, not the statistics beside it
    assert all(p.verdict == "agrees" for p in cmp.pairs[: cmp.pairs.index(first)])
    # the reported error is the layer's own: the two batch norms by hand on the same convolution output
    h = a[0](X).numpy().astype(np.float64)
    mean, var = a[1]._mean.numpy(), a[1]._variance.numpy()
    scale, shift = a[1].weight.numpy(), a[1].bias.numpy()
    expected = [
        (h - mean[:, None, None]) / np.sqrt(var[:, None, None] + eps) * scale[:, None, None] + shift[:, None, None]
        for eps in (1e-5, 1e-1)
    ]
    assert first.agreement.max_abs == pytest.approx(np.max(np.abs(expected[0] - expected[1])), rel=1e-3)


def test_a_dropout_that_rescales_at_inference_is_named_and_not_called_random():
    cmp = tl.compare(
        tl.trace(net(), X, backend="paddle"), tl.trace(net(mode="downscale_in_infer"), X, backend="paddle")
    )
    first = cmp.first_divergence
    assert first is not None and first.a.startswith("dropout"), str(cmp)
    assert "dropout scales by 0.9" in first.note and "random" not in first.note, first.note
