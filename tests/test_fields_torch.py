"""Receptive and projective fields on torch, checked against plain autograd and forward differences."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
models = pytest.importorskip("torchvision.models")
nn = torch.nn

import torchlens as tl  # noqa: E402
from torchlens_core.fields import BOUNDED, EXACT, NOT_WINDOWED  # noqa: E402
from torchlens_core.ir.errors import FieldError, TorchLensError  # noqa: E402


# -- helpers: the independent references ------------------------------------------------------
def positive(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights in [0.01, 0.1) and max pools turned into average pools of the same window.

    Every path then carries a positive gradient, so the support of a unit's
    gradient is every input position the graph connects to it: its bounding
    box must equal the analytic box exactly (a max pool passes gradient to
    one input per window only, and a ReLU only where it is active).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) * 0.09 + 0.01)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.MaxPool2d):
            setattr(model, name, nn.AvgPool2d(child.kernel_size, child.stride, child.padding, child.ceil_mode))
        else:
            positive(child, seed)
    return model.eval()


def module_output(model: nn.Module, path: str, x: torch.Tensor) -> torch.Tensor:
    """The module's output in a plain forward (a forward hook), with the graph back to ``x``."""
    seen = {}
    # a clone: a later in-place ReLU would otherwise overwrite the module's output in the graph
    handle = model.get_submodule(path).register_forward_hook(lambda m, i, o: seen.__setitem__("out", o.clone()))
    try:
        model(x)
    finally:
        handle.remove()
    return seen["out"]


def support_box(grad: torch.Tensor, dims: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    where = torch.nonzero(grad != 0)
    return tuple((int(where[:, d].min()), int(where[:, d].max()) + 1) for d in dims)


def gradient_support(model: nn.Module, path: str, x: torch.Tensor, unit: tuple[int, ...]) -> tuple:
    x = x.detach().clone().requires_grad_(True)
    module_output(model, path, x)[unit].backward()
    return support_box(x.grad, (2, 3))


def alexnet_log() -> tuple[nn.Module, torch.Tensor, tl.Trace]:
    torch.manual_seed(0)
    model = models.alexnet(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    return model, x, tl.trace(model, x)


class UNet(nn.Module):
    """Two down, two up (transposed convolutions), skip concatenations."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.mid = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.up2 = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.dec2 = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU())
        self.up1 = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.dec1 = nn.Sequential(nn.Conv2d(8, 4, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)


# -- the seed's code, as written -----------------------------------------------------------------
def test_seed_block_on_alexnet() -> None:
    model, x, log = alexnet_log()
    target = log["features.6"]
    rf = target.receptive_field
    unit = rf.center_unit(batch_index=0)
    box = rf.at((3, 3))
    check = rf.check(unit)
    outgoing = target.projective_field.at((3, 3), target=log["features.8"])

    assert unit == (0, 0, 6, 6)
    # conv3 of AlexNet: receptive field 99, stride 16 (closed form: 11 + 2*4 + 4*4*(2+2) + ... = 99).
    assert [a.size for a in box.axes] == [99, 99] and box.status.kind == EXACT
    assert rf.at((6, 6)).extent == ((62, 161), (62, 161))
    assert check and check.equal and check.support == gradient_support(model, "features.6", x, unit)
    # projective: conv3 (3, 3) reaches conv4 (2..4, 2..4) through a 3x3, padding 1 convolution.
    assert outgoing.extent == ((2, 5), (2, 5)) and outgoing.status.kind == EXACT


def test_alexnet_dense_head_ends_the_windowed_path() -> None:
    _, _, log = alexnet_log()
    flatten = next(op for op in log.ops if op.func_name == "flatten")
    box = log[-1].receptive_field.at(())
    assert box.status.kind == NOT_WINDOWED and box.status.op == flatten.label
    assert box.extent == ((0, 224), (0, 224))
    reach = log["features.6"].projective_field.at((3, 3))  # toward the logits: through the dense head
    assert reach.status.kind == NOT_WINDOWED and reach.status.op == flatten.label
    assert "not_windowed" in str(box.status) and flatten.label in str(box.status)


# -- analytic box == empirical support, every path ----------------------------------------------
CASES = {
    "alexnet": (lambda: models.alexnet(weights=None), 224, ["features.3", "features.8", "features.12"]),
    "vgg11": (lambda: models.vgg11(weights=None), 96, ["features.3", "features.8", "features.13"]),
    "resnet18": (lambda: models.resnet18(weights=None), 96, ["layer1.1", "layer2.0", "layer3.0", "layer4.1"]),
    "unet": (UNet, 32, ["enc2", "mid", "dec2", "head"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_centre_unit_box_equals_gradient_support(name: str) -> None:
    build, size, paths = CASES[name]
    model = positive(build())
    x = torch.rand(1, 3, size, size) + 0.1
    log = tl.trace(model, x)
    for path in paths:
        rf = log[path].receptive_field
        unit = rf.center_unit()
        box = rf.at(tuple(unit[d] for d in rf.axes))
        assert box.status.kind == EXACT, (path, box.status)
        assert box.extent == gradient_support(model, path, x, unit), (name, path, box)
        check = rf.check(unit)
        assert check.equal and check.tightness == (1.0, 1.0), (path, check)


@pytest.mark.parametrize("name", ["resnet18", "unet"])
def test_off_centre_units_and_padding(name: str) -> None:
    """Corner and edge units: the box stops at the input's edge and says how far it runs into padding."""
    build, size, paths = CASES[name]
    model = positive(build())
    x = torch.rand(1, 3, size, size) + 0.1
    log = tl.trace(model, x)
    rf = log[paths[1]].receptive_field
    h, w = (log[paths[1]].shape[d] for d in rf.axes)
    for pos in [(0, 0), (h - 1, w - 1), (0, w // 2), (h // 3, w - 1)]:
        box = rf.at(pos)
        assert box.extent == gradient_support(model, paths[1], x, (0, 0, *pos)), (pos, box)
    corner = rf.at((0, 0))
    assert corner.axes[0].start == 0 and corner.axes[0].pad_before > 0
    assert rf.at((h - 1, w - 1)).axes[1].pad_after > 0


def test_real_max_pools_are_contained_within_stated_tolerance() -> None:
    """Max pools route gradient to one input per window: the support is inside the box, at most
    (pool kernel - 1) = 2 positions short of each edge per pooling layer on the path (AlexNet: 2 pools before
    conv3, so 4 px); with random inputs it is usually exact."""
    model, x, log = alexnet_log()
    rf = log["features.8"].receptive_field
    for pos in [(6, 6), (2, 9)]:
        unit = (0, 5, *pos)
        check = rf.check(unit)
        assert check.contains and check.max_gap <= 4, check
        assert check.support == gradient_support(model, "features.8", x, unit)


# -- per-op rules, every output position ----------------------------------------------------------
LAYERS = [
    nn.Conv2d(1, 1, (3, 5), stride=(2, 1), padding=(1, 2)),
    nn.Conv2d(1, 1, 3, stride=3, padding=2, dilation=2),
    nn.Conv2d(1, 1, 4, padding="same"),
    nn.ConvTranspose2d(1, 1, 3, stride=2, padding=1),
    nn.ConvTranspose2d(1, 1, (2, 4), stride=(2, 3), padding=(0, 1), output_padding=(1, 2)),
    nn.ConvTranspose2d(1, 1, 3, stride=2, dilation=2),
    nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True),
    nn.AdaptiveAvgPool2d((4, 3)),
    nn.Upsample(scale_factor=2, mode="nearest"),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("layer", LAYERS, ids=lambda m: repr(m))
def test_every_position_of_one_layer(layer: nn.Module) -> None:
    """Each output position's box against the Jacobian's support (positive weights: no cancellation)."""
    model = positive(nn.Sequential(layer, nn.ReLU()))
    x = torch.rand(1, 1, 11, 10) + 0.1
    log = tl.trace(model, x)
    jac = torch.autograd.functional.jacobian(model, x)[0, 0, :, :, 0, 0]  # out H, W, in H, W
    rf = log[-1].receptive_field
    pf = log[0].projective_field
    for i in range(jac.shape[0]):
        for j in range(jac.shape[1]):
            box = rf.at((i, j))
            if not jac[i, j].any():  # an output_padding position reads only the bias
                assert all(a.size == 0 for a in box.axes), (i, j, box)
                continue
            assert box.extent == support_box(jac[i, j], (0, 1)), (i, j, box)
            assert box.status.kind == EXACT
    for i in range(x.shape[2]):  # projective: the outputs each input position reaches (the Jacobian's columns)
        for j in range(x.shape[3]):
            reached = torch.nonzero(jac[:, :, i, j])
            box = pf.at((i, j), target=log[-1])
            if reached.numel() == 0:  # a stride larger than the kernel skips this input position
                assert all(a.size == 0 for a in box.axes), (i, j, box)
                continue
            assert box.extent == (
                (int(reached[:, 0].min()), int(reached[:, 0].max()) + 1),
                (int(reached[:, 1].min()), int(reached[:, 1].max()) + 1),
            ), (i, j, box)


def test_padding_amount_has_a_closed_form() -> None:
    """One 7x7 convolution, stride 2, padding 3: position p reads [2p - 3, 2p + 4) before clipping."""
    model = nn.Conv2d(3, 4, 7, stride=2, padding=3)
    log = tl.trace(model, torch.randn(1, 3, 20, 20))
    rf = log[-1].receptive_field
    for p in range(10):
        box = rf.at((p, p))
        start, stop = 2 * p - 3, 2 * p + 4
        axis = box.axes[0]
        assert (axis.start, axis.stop) == (max(start, 0), min(stop, 20))
        assert (axis.pad_before, axis.pad_after) == (max(0, -start), max(0, stop - 20))


# -- projective fields against forward differences -----------------------------------------------
def changed_box(before: torch.Tensor, after: torch.Tensor) -> tuple[tuple[int, int], ...]:
    return support_box((after - before).abs() > 0, (2, 3))


def test_projective_field_matches_a_forward_difference_on_alexnet() -> None:
    model, x, log = alexnet_log()
    h = module_output(model, "features.6", x).detach()
    tail = model.features[7:9]  # relu, conv4: what runs between features.6 and features.8
    bumped = h.clone()
    bumped[:, :, 3, 3] += 100.0
    with torch.no_grad():
        expected = changed_box(tail(h), tail(bumped))
    assert log["features.6"].projective_field.at((3, 3), target=log["features.8"]).extent == expected


@pytest.mark.parametrize("pos", [(16, 16), (0, 0), (5, 30)])
def test_projective_field_through_a_unet(pos: tuple[int, int]) -> None:
    model = positive(UNet())
    x = torch.rand(1, 3, 32, 32) + 0.1
    log = tl.trace(model, x)
    bumped = x.clone()
    bumped[:, :, pos[0], pos[1]] += 1.0
    with torch.no_grad():
        expected = changed_box(model(x), model(bumped))
    box = log[0].projective_field.at(pos)
    assert box.extent == expected and box.status.kind == EXACT


# -- statuses and errors ---------------------------------------------------------------------------
def test_an_op_without_a_rule_is_not_windowed_and_named() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(torch.roll(x, 1, dims=3), torch.ones(1, 1, 3, 3))

    log = tl.trace(f, torch.randn(1, 1, 8, 8))
    roll = next(op for op in log.ops if op.func_name == "roll")
    box = log[-1].receptive_field.at((2, 2))
    assert box.status.kind == NOT_WINDOWED and box.status.op == roll.label and "roll" in box.status.reason


def test_strided_paths_with_gaps_stay_exact_and_an_irregular_merge_is_bounded() -> None:
    """A 1x1 stride-2 convolution reads every other position: a progression, mapped exactly by later windows.
    Two progressions out of phase merge into a set with no single step: the next window gives a bound."""
    wide = nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(1, 1, 1, stride=2), nn.Conv2d(1, 1, 3, padding=1))
    log = tl.trace(wide, torch.randn(1, 1, 16, 16))
    box = log[-1].receptive_field.at((3, 3))
    assert box.status.kind == EXACT and box.extent == ((3, 10), (3, 10))  # {4, 6, 8} widened by a 3x3

    class Gappy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre, self.post = nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(1, 1, 3, padding=1)
            self.a, self.b = nn.Conv2d(1, 1, 1, stride=2), nn.Conv2d(1, 1, 1, stride=2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.pre(x)  # a reads h at even positions, b (after a crop by one) at odd ones
            return self.post(self.a(h) + self.b(torch.nn.functional.pad(h, (-1, 1, -1, 1))))

    model = positive(Gappy())
    x = torch.rand(1, 1, 16, 16) + 0.1
    log = tl.trace(model, x)
    box = log[-1].receptive_field.at((3, 3))
    pre = next(op for op in log.ops if op.module == "pre")
    assert box.status.kind == BOUNDED and box.status.op == pre.label and "gaps" in box.status.reason
    x = x.clone().requires_grad_(True)
    model(x)[0, 0, 3, 3].backward()
    assert box.extent == support_box(x.grad, (2, 3))  # a bound, here a tight one: never smaller than the support


def test_bad_positions_and_units_are_typed_errors() -> None:
    _, _, log = alexnet_log()
    rf = log["features.6"].receptive_field
    with pytest.raises(FieldError, match="spatial grid"):
        rf.at((13, 0))
    with pytest.raises(FieldError, match="spatial grid"):
        rf.at((1,))
    with pytest.raises(FieldError, match="one int per spatial dim"):
        rf.at("centre")
    with pytest.raises(FieldError, match="one int per dim"):
        rf.check((0, 0, 6))
    with pytest.raises(FieldError, match="batch_index"):
        rf.center_unit(batch_index=1)
    with pytest.raises(FieldError, match="does not depend"):
        log["features.8"].projective_field.at((0, 0), target=log["features.6"])
    assert issubclass(FieldError, TorchLensError)


def test_draw_writes_a_png_with_the_box(tmp_path) -> None:
    model = nn.Conv2d(3, 2, 5, padding=2)
    x = torch.rand(1, 3, 40, 40)
    log = tl.trace(model, x)
    path = log[-1].receptive_field.draw((20, 10), tmp_path / "rf.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (280, 280)  # scaled x7 to reach 256
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * 3)[:, 1:]
    pixels = rows.reshape(height, width, 3)
    # box rows [18, 23), cols [8, 13) at scale 7: the top edge is red, the centre is the image
    assert tuple(pixels[18 * 7, 10 * 7]) == (255, 40, 40)
    assert tuple(pixels[20 * 7 + 3, 10 * 7 + 3]) != (255, 40, 40)


def test_check_without_the_gradients_capability_is_a_typed_error(monkeypatch) -> None:
    """A backend that declares no gradients: rf.at still works, rf.check says why it cannot."""
    import attrs

    from torchlens_core.backend.manager import resolve_backend
    from torchlens_core.fields import support
    from torchlens_core.ir.errors import UnsupportedError

    info = resolve_backend("torch")
    without = attrs.evolve(info, capabilities=info.capabilities - {"gradients"})
    monkeypatch.setattr(support, "resolve_backend", lambda name: without)
    log = tl.trace(nn.Conv2d(1, 1, 3), torch.randn(1, 1, 8, 8))
    rf = log[-1].receptive_field
    assert rf.at((2, 2)).extent == ((2, 5), (2, 5))
    with pytest.raises(UnsupportedError, match="no gradients"):
        rf.check(rf.center_unit())


def test_a_module_pass_and_a_label_give_the_same_field() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 2, 3, stride=2))
    log = tl.trace(model, torch.randn(1, 1, 12, 12))
    conv = next(op for op in log.ops if op.func_name == "conv2d" and op.index > 2)
    assert log["2"].receptive_field.at((1, 1)) == conv.receptive_field.at((1, 1))
    assert conv.receptive_field.at((1, 1)).extent == ((1, 6), (1, 6))  # 3x3 of stride 2 over a 3x3 of padding 1


def test_a_module_pass_with_two_outputs_asks_for_one() -> None:
    class Two(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.relu(), x.sigmoid()

    model = nn.Sequential(nn.Conv2d(1, 1, 3), Two())
    log = tl.trace(model, torch.randn(1, 1, 8, 8))
    with pytest.raises(FieldError, match="returns 2 ops; pick one"):
        log["1"].receptive_field  # noqa: B018
