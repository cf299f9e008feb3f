"""tl.hash and tl.assert_unchanged: a structural pin that ignores weights and addresses."""

from __future__ import annotations

from typing import Any

import pytest

import torchlens as tl

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


def make(width: int = 8, act: type = nn.ReLU) -> nn.Module:
    return nn.Sequential(nn.Linear(4, width), act(), nn.Linear(width, 2))


@pytest.fixture(autouse=True)
def cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHLENS_CACHE", str(tmp_path))


def test_hash_ignores_weights_and_addresses_but_not_structure() -> None:
    x = torch.randn(3, 4)
    torch.manual_seed(0)
    a = tl.hash(tl.trace(make(), x))
    torch.manual_seed(1)
    b = tl.hash(tl.trace(make(), torch.randn(3, 4)))  # other weights, other input values, other tensors
    assert a == b and a.startswith("tl2-")
    assert tl.hash(tl.trace(make(width=16), x)) != a
    assert tl.hash(tl.trace(make(act=nn.Tanh), x)) != a


def test_hash_ignores_module_names_unless_asked() -> None:
    x = torch.randn(3, 4)

    class Named(nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            setattr(self, name, nn.Linear(4, 4))
            self.name = name

        def forward(self, x):
            return getattr(self, self.name)(x)

    one, other = tl.trace(Named("encoder"), x), tl.trace(Named("proj"), x)
    assert tl.hash(one) == tl.hash(other)  # the seed's promise: module names are not pinned by default
    assert tl.hash(one, module_names=True) != tl.hash(other, module_names=True)
    pinned = tl.assert_unchanged(Named("encoder"), x, expected=None)
    assert tl.assert_unchanged(Named("proj"), x, pinned) == pinned  # a renamed attribute keeps the pin
    with pytest.raises(tl.ArchitectureChanged):
        tl.assert_unchanged(
            Named("proj"), x, tl.assert_unchanged(Named("encoder"), x, module_names=True), module_names=True
        )


def test_assert_unchanged_pins_and_explains(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(3, 4)
    model = make()
    pinned = tl.assert_unchanged(model, x, expected=None)  # prints and returns a hash
    assert pinned in capsys.readouterr().out
    assert tl.assert_unchanged(model, x, pinned) == pinned  # raises if the architecture changes
    with pytest.raises(tl.ArchitectureChanged) as raised:
        tl.assert_unchanged(make(act=nn.GELU), x, pinned)
    message = str(raised.value)
    assert pinned in message and "-2 op relu" in message and "+2 op gelu" in message
