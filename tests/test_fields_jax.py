"""Receptive and projective fields on JAX (channels-last Flax NNX), checked against jax.grad and jax.jacobian."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")
jnp = jax.numpy

import torchlens as tl  # noqa: E402
from torchlens_core.fields import EXACT, NOT_WINDOWED  # noqa: E402
from torchlens_core.ir.errors import FieldError  # noqa: E402


class UNet(nnx.Module):
    """NHWC: two down (average pools), two up (transposed convolutions), skip concatenations, a strided skip."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.enc1 = nnx.Conv(3, 4, (3, 3), padding="SAME", rngs=rngs)
        self.enc2 = nnx.Conv(4, 8, (3, 3), padding="SAME", rngs=rngs)
        self.mid = nnx.Conv(8, 8, (3, 3), padding="SAME", rngs=rngs)
        self.skip = nnx.Conv(4, 8, (1, 1), strides=(4, 4), rngs=rngs)  # ResNet-style: a strided 1x1 shortcut
        self.up2 = nnx.ConvTranspose(8, 8, (2, 2), strides=(2, 2), rngs=rngs)
        self.dec2 = nnx.Conv(16, 8, (3, 3), padding="SAME", rngs=rngs)
        self.up1 = nnx.ConvTranspose(8, 4, (2, 2), strides=(2, 2), rngs=rngs)
        self.dec1 = nnx.Conv(8, 4, (3, 3), padding="SAME", rngs=rngs)
        self.head = nnx.Conv(4, 2, (1, 1), rngs=rngs)
        self.dense = nnx.Linear(2, 3, rngs=rngs)

    def forward(self, x: jax.Array, upto: str = "dense") -> jax.Array:
        seen = {}
        seen["enc1"] = e1 = self.enc1(x)
        seen["enc2"] = e2 = self.enc2(nnx.avg_pool(jax.nn.relu(e1), (2, 2), strides=(2, 2)))
        e2 = jax.nn.relu(e2)
        seen["mid"] = m = self.mid(nnx.avg_pool(e2, (2, 2), strides=(2, 2))) + self.skip(jax.nn.relu(e1))
        seen["dec2"] = d2 = self.dec2(jnp.concatenate([self.up2(jax.nn.relu(m)), e2], axis=-1))
        seen["dec1"] = d1 = self.dec1(jnp.concatenate([self.up1(jax.nn.relu(d2)), jax.nn.relu(e1)], axis=-1))
        seen["head"] = h = self.head(jax.nn.relu(d1))
        seen["dense"] = self.dense(h.mean(axis=(1, 2)))
        return seen[upto]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.forward(x)


def positive_unet() -> UNet:
    """Weights in [0.01, 0.1): every connected input position gets a nonzero gradient (no ReLU is off)."""
    model = UNet(nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(1), 64))
    nnx.update(model, jax.tree.map(lambda p: jax.random.uniform(next(keys), p.shape, minval=0.01, maxval=0.1), state))
    return model


def support_box(grad: np.ndarray, dims: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    where = np.nonzero(np.asarray(grad) != 0)
    return tuple((int(where[d].min()), int(where[d].max()) + 1) for d in dims)


X = jax.random.uniform(jax.random.key(2), (1, 24, 24, 3), minval=0.1, maxval=1.0)


@pytest.mark.parametrize("path", ["enc2", "mid", "dec2", "dec1", "head"])
def test_centre_unit_box_equals_gradient_support_channels_last(path: str) -> None:
    model = positive_unet()
    log = tl.trace(model, X)
    rf = log[path].receptive_field
    assert rf.axes == (1, 2) and rf.input_axes == (1, 2)  # NHWC
    unit = rf.center_unit()
    assert unit[3] == 0 and unit[0] == 0
    box = rf.at((unit[1], unit[2]))
    grad = jax.grad(lambda x: model.forward(x, path)[unit])(X)
    assert box.status.kind == EXACT
    assert box.extent == support_box(grad, (1, 2)), (path, box)
    check = rf.check(unit)
    assert check.equal and check.support == box.extent


def test_corner_units_and_padding_channels_last() -> None:
    model = positive_unet()
    log = tl.trace(model, X)
    rf = log["dec2"].receptive_field
    for pos in [(0, 0), (11, 11), (0, 7)]:
        unit = (0, *pos, 1)
        grad = jax.grad(lambda x, unit=unit: model.forward(x, "dec2")[unit])(X)
        assert rf.at(pos).extent == support_box(grad, (1, 2)), pos
    assert rf.at((0, 0)).axes[0].pad_before > 0


def test_dense_head_is_not_windowed_naming_the_reduction() -> None:
    log = tl.trace(positive_unet(), X)
    box = log[-1].receptive_field.at(())
    reduce_op = next(op for op in log.ops if op.func_name == "reduce_sum")
    assert box.status.kind == NOT_WINDOWED and box.status.op == reduce_op.label
    assert box.extent == ((0, 24), (0, 24))


@pytest.mark.parametrize("pos", [(12, 12), (0, 0), (3, 20)])
def test_projective_field_matches_a_forward_difference(pos: tuple[int, int]) -> None:
    model = positive_unet()
    log = tl.trace(model, X)
    bumped = X.at[:, pos[0], pos[1], :].add(1.0)
    changed = np.asarray(model.forward(bumped, "head") != model.forward(X, "head"))
    box = log[0].projective_field.at(pos, target=log["head"])
    assert box.extent == support_box(changed, (1, 2)) and box.status.kind == EXACT


CONVS = [  # (window strides, padding, lhs dilation, rhs dilation, kernel)
    ((2, 1), ((1, 1), (2, 0)), (1, 1), (1, 1), (3, 4)),
    ((3, 2), ((2, 2), (0, 1)), (1, 1), (2, 3), (3, 2)),
    ((1, 1), ((1, 1), (2, 2)), (2, 3), (1, 1), (3, 3)),  # a transposed convolution's form
]


@pytest.mark.parametrize("case", CONVS)
def test_every_position_of_a_conv_general_dilated(case) -> None:
    strides, padding, lhs, rhs, kernel = case
    w = jnp.full((*kernel, 1, 1), 0.5)

    def f(x: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, w, strides, padding, lhs, rhs, ("NHWC", "HWIO", "NHWC"))

    x = jnp.ones((1, 9, 8, 1))
    log = tl.trace(f, x)
    jac = np.asarray(jax.jacobian(f)(x))[0, :, :, 0, 0, :, :, 0]
    rf = log[-1].receptive_field
    for i in range(jac.shape[0]):
        for j in range(jac.shape[1]):
            box = rf.at((i, j))
            if not jac[i, j].any():
                assert all(a.size == 0 for a in box.axes)
                continue
            assert box.extent == support_box(jac[i, j], (0, 1)), (i, j, box)


def test_every_position_of_a_padded_pool() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3, 2, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 0), (0, 0)))

    x = jnp.ones((1, 9, 8, 2))
    log = tl.trace(f, x)
    jac = np.asarray(jax.jacobian(f)(x))[0, :, :, 0, 0, :, :, 0]
    rf = log[-1].receptive_field
    assert rf.axes == (1, 2)
    for i in range(jac.shape[0]):
        for j in range(jac.shape[1]):
            assert rf.at((i, j)).extent == support_box(jac[i, j], (0, 1)), (i, j)


def test_bad_position_is_a_typed_error() -> None:
    log = tl.trace(positive_unet(), X)
    with pytest.raises(FieldError, match="spatial grid"):
        log["head"].receptive_field.at((24, 0))
