"""In-place writes whose target arrives by keyword (``torch.nn.init.kaiming_uniform_(tensor=w)``,
``torch.relu_(input=t)``, ``F.relu(input=t, inplace=True)``) are recorded as writes into that tensor.

References: the untraced function run from the same RNG state, and the model's parameters before and after.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402


def init_by_keyword(x):
    w = torch.empty(3, 4)
    torch.nn.init.kaiming_uniform_(tensor=w)
    return x @ w.t()


def init_by_position(x):
    w = torch.empty(3, 4)
    torch.nn.init.kaiming_uniform_(w)
    return x @ w.t()


@pytest.mark.parametrize("fn", [init_by_keyword, init_by_position])
def test_initialized_weight_replays_and_audits(fn):
    x, x2 = torch.randn(2, 4), torch.randn(2, 4)
    torch.manual_seed(0)
    trace = tl.trace(fn, x)
    assert trace.audit(), trace.audit()
    torch.manual_seed(0)
    expected = fn(x2)  # the untraced function draws the same weights from the same state
    assert torch.equal(trace.replay(x2), expected)
    init = next(op for op in trace.ops if op.func_name == "kaiming_uniform_")
    assert init.in_place and "rng_state" in init.meta


def test_initialized_weight_after_save_and_load(tmp_path):
    x, x2 = torch.randn(2, 4), torch.randn(2, 4)
    torch.manual_seed(3)
    trace = tl.trace(init_by_keyword, x)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert loaded.audit(), loaded.audit()
    torch.manual_seed(3)
    assert torch.equal(loaded.replay(x2), init_by_keyword(x2))


def test_recorded_empty_keeps_its_value_before_the_write():
    torch.manual_seed(0)
    trace = tl.trace(init_by_keyword, torch.randn(2, 4))
    empty = next(op for op in trace.ops if op.func_name == "empty")
    assert "mutated_after_recording" not in empty.meta
    assert torch.equal(empty.out, empty.meta["uninitialized"])


class ReinitializesItsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4, 3))

    def forward(self, x):
        nn.init.uniform_(tensor=self.w, a=-1.0, b=1.0)
        return x @ self.w


def test_replay_does_not_write_into_the_model_parameter():
    model, x = ReinitializesItsWeight(), torch.randn(2, 4)
    torch.manual_seed(5)
    trace = tl.trace(model, x)
    after_capture = model.w.detach().clone()
    assert torch.equal(trace.params["w"].value, torch.zeros(4, 3))  # the value the forward started from
    replayed = trace.replay(x)
    assert torch.equal(model.w.detach(), after_capture)  # replay wrote into a copy
    assert torch.equal(replayed, x @ after_capture)
    assert trace.audit(), trace.audit()


@pytest.mark.parametrize(
    "write",
    [
        lambda h: torch.relu_(input=h),
        lambda h: F.relu(input=h, inplace=True),
        lambda h: torch.nn.init.constant_(tensor=h, val=0.5),
    ],
)
def test_keyword_writes_protect_earlier_values(write):
    def fn(x):
        h = x * 2
        kept = h[0]  # a view read after the write: sees it
        before = h.sum()
        write(h)
        return h + before, kept * 1

    x = torch.randn(3, 4)
    trace = tl.trace(fn, x)
    assert trace.audit(), trace.audit()
    mul = next(op for op in trace.ops if op.func_name == "mul")
    assert torch.equal(mul.out, x * 2)  # the value the op computed, not the one written later
    for got, want in zip(trace.replay(x * 3), fn(x * 3)):
        assert torch.equal(got, want)


def test_initializer_drawing_from_its_own_generator(tmp_path):
    generator = torch.Generator().manual_seed(7)

    def fn(x):
        w = torch.empty(3, 4)
        torch.nn.init.kaiming_uniform_(tensor=w, generator=generator)
        return x @ w.t() + torch.randn(3, generator=generator)

    x = torch.randn(2, 4)
    trace = tl.trace(fn, x)
    assert trace.audit(), trace.audit()
    x2 = torch.randn(2, 4)
    generator.manual_seed(7)
    expected = fn(x2)  # the untraced function from the generator's state at capture
    assert torch.equal(trace.replay(x2), expected)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert torch.equal(loaded.replay(x2), expected)
