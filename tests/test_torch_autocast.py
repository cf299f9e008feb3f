"""torch.autocast inside (or around) the traced forward: each op's autocast state is recorded and replayed.

References: the untraced model's own output (values and dtype), and a forward hook on the autocast layer.
"""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import torchlens as tl  # noqa: E402


class AutocastInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.fc(x)
        return self.head(y.float()) + y.float().sum(-1, keepdim=True)


def _model():
    torch.manual_seed(0)
    return AutocastInside().eval()


def test_replay_on_new_inputs_matches_the_model_and_its_dtype():
    model, x = _model(), torch.randn(4, 8)
    trace = tl.trace(model, x)
    seen = {}
    model.fc.register_forward_hook(lambda m, a, out: seen.__setitem__("fc", out))
    x2 = torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x2)
    assert seen["fc"].dtype == torch.bfloat16
    replayed = trace.replay(x2)
    assert replayed.dtype == expected.dtype
    assert torch.equal(replayed, expected)
    fc_op = trace.ops[trace.modules["fc"].passes[0].out_template.index]
    assert fc_op.dtype == "bfloat16"
    assert fc_op.meta["autocast"] == ({"device_type": "cpu", "dtype": torch.bfloat16, "cache": True},)


def test_audit_passes_and_only_the_autocast_ops_carry_the_state():
    model, x = _model(), torch.randn(4, 8)
    trace = tl.trace(model, x)
    assert trace.audit(), trace.audit()
    marked = [op.func_name for op in trace.ops if "autocast" in op.meta]
    assert marked == ["linear"]


def test_save_load_round_trip_keeps_the_autocast_state(tmp_path):
    model, x = _model(), torch.randn(4, 8)
    trace = tl.trace(model, x)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    fc_op = next(op for op in loaded.ops if op.func_name == "linear")
    assert fc_op.meta["autocast"][0]["dtype"] == torch.bfloat16
    assert loaded.audit(), loaded.audit()
    x2 = torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x2)
    assert torch.equal(loaded.replay(x2), expected)


def test_capture_under_an_outer_autocast_replays_under_it():
    torch.manual_seed(1)
    model, x = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 2)).eval(), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trace = tl.trace(model, x)
    x2 = torch.randn(3, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x2)
    replayed = trace.replay(x2)  # no autocast around the replay: the recorded one is used
    assert replayed.dtype == torch.bfloat16 == expected.dtype
    assert torch.equal(replayed, expected)


def test_an_autocast_around_replay_does_not_change_ops_recorded_without_one():
    torch.manual_seed(2)
    model, x = nn.Linear(8, 4).eval(), torch.randn(3, 8)
    trace = tl.trace(model, x)
    with torch.no_grad():
        expected = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        replayed = trace.replay(x)
    assert replayed.dtype == torch.float32
    assert torch.equal(replayed, expected)


def test_autocast_state_is_not_left_on_after_replay():
    model, x = _model(), torch.randn(4, 8)
    trace = tl.trace(model, x)
    trace.replay(x)
    assert not torch.is_autocast_enabled("cpu")
