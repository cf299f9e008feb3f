"""The NumPy conformance zoo: small functions with random weights, nothing downloaded.

Every ``build()`` draws its weights and inputs from ``np.random.default_rng(0)``,
so a case is the same each time it is built. No case writes into its inputs
(the suite calls each function twice on the same arrays). NumPy has no
modules, so every case has ``check_modules=False``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from torchlens.backend import Case

__all__ = ["cases"]

Built = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


# -- the functions ------------------------------------------------------------------------------
def mlp(x, w1, b1, w2, b2, w3):
    h = np.tanh(x @ w1 + b1)
    h = np.maximum(h @ w2 + b2, 0)  # relu
    return h @ w3


def conv1d(signal, kernels, bias):
    """Sliding windows for a bank of filters, np.convolve for the first one."""
    width = kernels.shape[1]
    windows = sliding_window_view(signal, width)  # (length - width + 1, width)
    bank = windows @ kernels[:, ::-1].T + bias  # convolution flips the kernel
    first = np.convolve(signal, kernels[0], mode="valid")
    return np.concatenate([bank, first[:, None]], axis=1)


def softmax_attention(q, k, v):
    scores = q @ k.T / np.sqrt(q.shape[-1])
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights = weights / np.sum(weights, axis=-1, keepdims=True)
    return np.einsum("ij,jd->id", weights, v)


def rnn(xs, wx, wh, b):
    """An Elman RNN written as a Python loop over the time steps."""
    h = np.zeros(wh.shape[0], dtype=xs.dtype)
    states = []
    for x_t in xs:
        h = np.tanh(x_t @ wx + h @ wh + b)
        states.append(h)
    return np.stack(states)


def rnn_until_settled(x, w):
    """A data-dependent loop: iterate until the update is small (at most 50 steps)."""
    h = x
    for _ in range(50):
        new = np.tanh(h @ w) * 0.5 + x
        done = np.abs(new - h).max() < 1e-3
        h = new
        if done:
            break
    return h


def _layer_norm(x, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def residual_block(x, w1, w2):
    h = np.maximum(_layer_norm(x) @ w1, 0)
    return x + h @ w2


def branch(x, w):
    """Takes one of two paths depending on the sign of ``x.mean()``."""
    if x.mean() > 0:
        return np.maximum(x @ w, 0)
    return np.tanh(x @ w) - 1


def in_place(x, w, b):
    """In-place ops, all on intermediates (the caller's arrays are never written)."""
    h = x @ w
    h += b  # augmented assignment: np.add(h, b, out=(h,))
    np.multiply(h, 2, out=h)
    h[:, 0] = 0  # setitem
    v = h.reshape(-1)  # a view of h ...
    v[1:3] += 1.0  # ... written through a slice of the view
    h.T[0] *= 0.5  # written through a transposed view
    np.maximum(h, 0, out=h)
    g = h.copy()
    g.sort(axis=1)
    return g + h


def tuple_output(x, w1, w2):
    h = np.maximum(x @ w1, 0)
    return h @ w2, h


def dict_output(x, w1, w2):
    h = 1 / (1 + np.exp(-(x @ w1)))  # sigmoid
    return {"logits": h @ w2, "hidden": h}


def dropout(x, w):
    """Draws from the global RNG (np.random.rand): recorded as random ops, replayed exactly."""
    h = x @ w
    mask = np.random.rand(*h.shape) < 0.5
    return np.where(mask, h / 0.5, 0.0)


def indexing(x, idx):
    """Basic, fancy and boolean indexing, splits, stacks, transposes and scalar reductions."""
    rows = x[idx]  # fancy
    positive = x[x > 0]  # boolean mask
    top, bottom = np.split(x, 2, axis=0)
    swapped = np.vstack([bottom, top])[:, ::-1]
    total = positive.sum() + rows.mean()  # NumPy scalars, tracked
    return swapped.T.reshape(2, -1) * total, np.float32(2) * total


def mse_loss(pred, target):
    """Returns a NumPy scalar, as NumPy does."""
    return np.mean((pred - target) ** 2)


def _make_closure() -> Callable[[np.ndarray], np.ndarray]:
    rng = _rng()
    w, b = _weights(rng, 6, 6), _weights(rng, 6)

    def closure_weights(x):  # w and b are constants of the trace, copied once
        for _ in range(3):
            x = np.tanh(x @ w + b)
        return x

    return closure_weights


# -- the cases ------------------------------------------------------------------------------------
def _build_mlp() -> Built:
    rng = _rng()
    return (
        mlp,
        (
            _weights(rng, 4, 8),
            _weights(rng, 8, 16),
            _weights(rng, 16),
            _weights(rng, 16, 16),
            _weights(rng, 16),
            _weights(rng, 16, 3),
        ),
        {},
    )


def _build_conv1d() -> Built:
    rng = _rng()
    return conv1d, (rng.standard_normal(32), rng.standard_normal((4, 5)), rng.standard_normal(4)), {}


def _build_attention() -> Built:
    rng = _rng()
    return softmax_attention, tuple(_weights(rng, 6, 8) for _ in range(3)), {}


def _build_rnn() -> Built:
    rng = _rng()
    return rnn, (_weights(rng, 7, 3), _weights(rng, 3, 5), _weights(rng, 5, 5), _weights(rng, 5)), {}


def _build_rnn_until_settled() -> Built:
    rng = _rng()
    return rnn_until_settled, (rng.standard_normal(4), rng.standard_normal((4, 4)) * 0.2), {}


def _build_residual() -> Built:
    rng = _rng()
    return residual_block, (_weights(rng, 3, 8), _weights(rng, 8, 16), _weights(rng, 16, 8)), {}


def _build_branch() -> Built:
    rng = _rng()
    return branch, (np.abs(rng.standard_normal((2, 4))), rng.standard_normal((4, 3))), {}


def _build_in_place() -> Built:
    rng = _rng()
    return in_place, (rng.standard_normal((3, 4)), rng.standard_normal((4, 4)), rng.standard_normal(4)), {}


def _build_tuple_output() -> Built:
    rng = _rng()
    return tuple_output, (_weights(rng, 2, 6), _weights(rng, 6, 6), _weights(rng, 6, 2)), {}


def _build_dict_output() -> Built:
    rng = _rng()
    return dict_output, (_weights(rng, 2, 6), _weights(rng, 6, 6), _weights(rng, 6, 2)), {}


def _build_dropout() -> Built:
    rng = _rng()
    return dropout, (_weights(rng, 3, 5), _weights(rng, 5, 5)), {}


def _build_indexing() -> Built:
    rng = _rng()
    return indexing, (rng.standard_normal((4, 6)), np.array([3, 0, 0])), {}


def _build_mse() -> Built:
    rng = _rng()
    return mse_loss, (rng.standard_normal(5), rng.standard_normal(5)), {}


def _build_closure() -> Built:
    return _make_closure(), (_weights(_rng(), 2, 6),), {}


def _seed_global_rng() -> None:
    np.random.seed(0)


def cases() -> list[Case]:
    return [
        Case("mlp", _build_mlp, check_modules=False),
        Case("conv1d", _build_conv1d, check_modules=False),
        Case("softmax_attention", _build_attention, check_modules=False),
        Case("rnn", _build_rnn, check_modules=False),
        Case("rnn_until_settled", _build_rnn_until_settled, check_modules=False),
        Case("residual_block", _build_residual, check_modules=False),
        Case("branch", _build_branch, check_modules=False),
        Case("in_place", _build_in_place, check_modules=False),
        Case("tuple_output", _build_tuple_output, check_modules=False),
        Case("dict_output", _build_dict_output, check_modules=False),
        Case("dropout", _build_dropout, check_modules=False, reset=_seed_global_rng),
        Case("indexing", _build_indexing, check_modules=False),
        Case("mse_loss", _build_mse, check_modules=False),
        Case("closure_weights", _build_closure, check_modules=False),
    ]
