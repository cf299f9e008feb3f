"""A loaded tinygrad trace whose call arguments were changed is refused before the call runs on real tensors.

Each tampered file passes every check of the loader (its hashes are made to match). Its replay and its audit
must stop with a ReplayError naming the op, from the same call made lazily on empty tensors (never realized),
not with an untyped error from tinygrad or a value of another shape.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

tinygrad = pytest.importorskip("tinygrad")

from saving_checks import rehash, same_values  # noqa: E402
from tinygrad import Tensor, nn  # noqa: E402
from tinygrad.helpers import Context, GlobalCounters  # noqa: E402

import torchlens as tl  # noqa: E402


class ConvThenLinear:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(144, 5)

    def __call__(self, x: Tensor) -> Tensor:
        y = self.conv(x).relu()
        return self.fc(y.reshape(2, -1))[:, 1:4]


def _model_and_input() -> tuple[ConvThenLinear, Tensor]:
    Tensor.manual_seed(0)
    return ConvThenLinear(), Tensor.randn(2, 3, 6, 6).realize()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, Tensor]:
    model, x = _model_and_input()
    folder = tl.save(tl.trace(model, x), tmp_path_factory.mktemp("convlinear") / "trace")
    return folder, model(x).realize()  # the model's own output, untraced


def tampered(saved: pathlib.Path, into: pathlib.Path, func: str, nth: int, position: int, value) -> pathlib.Path:
    """A copy of the saved trace with one argument of the ``nth`` ``func`` op changed, hashes made to match."""
    shutil.copytree(saved, into)
    records = json.loads((into / "trace.json").read_text())
    op = [o for o in records["ops"] if o["func_name"] == func][nth]
    assert op["args"][position] != value
    op["args"][position] = value
    (into / "trace.json").write_text(json.dumps(records, separators=(",", ":")))
    rehash(into)
    return into


# (op, which of its ops, argument position, new value, what the refusal says). Tensor.conv2d's arguments are
# (x, weight, bias, groups, stride, dilation, padding); reshape's (x, *shape).
TAMPERINGS = {
    "conv stride 2": ("conv2d", 0, 4, 2, "gives shape (2, 4, 3, 3), its record says (2, 4, 6, 6)"),
    "conv padding 0": ("conv2d", 0, 6, 0, "gives shape (2, 4, 4, 4), its record says (2, 4, 6, 6)"),
    "conv dilation 2": ("conv2d", 0, 5, 2, "gives shape (2, 4, 4, 4), its record says (2, 4, 6, 6)"),
    "conv groups 3": ("conv2d", 0, 3, 3, "do not fit together"),
    "reshape to other sizes": ("reshape", 0, 2, 100, "do not fit together"),
    "reshape to the same count": ("reshape", 0, 1, 4, "gives shape (4, 72), its record says (2, 144)"),
    "slice of another length": (
        "getitem",
        0,
        1,
        [{"slice": [None, None, None]}, {"slice": [0, 4, None]}],
        "gives shape (2, 4), its record says (2, 3)",
    ),
    "index past the end": ("getitem", 0, 1, [{"slice": [None, None, None]}, 7], "do not fit together"),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_a_tampered_call_is_refused_before_it_runs(saved, tmp_path, name) -> None:
    folder, _ = saved
    func, nth, position, value, says = TAMPERINGS[name]
    tl.load(folder).replay()  # the untampered file first: what passed then must not let the tampered call by
    trace = tl.load(tampered(folder, tmp_path / "t", func, nth, position, value))
    with pytest.raises(tl.ReplayError, match="of this loaded trace is refused") as caught:
        trace.replay()
    assert f"({func})" in str(caught.value) and says in str(caught.value), caught.value
    report = trace.audit()
    assert any("of this loaded trace is refused" in f.detail for f in report.findings if not f.ok), report


def test_the_untampered_file_replays_to_the_models_output(saved) -> None:
    folder, expected = saved
    loaded = tl.load(folder)
    assert same_values("tinygrad", loaded.replay(), expected)
    report = loaded.audit()
    assert report, report


def test_the_check_realizes_nothing(saved, monkeypatch) -> None:
    """Every op of the loaded trace is checked, and no kernel runs for any check."""
    from torchlens_core.replay.checked import PassedChecks
    from torchlens_tinygrad import meta_check

    folder, _ = saved
    checked, kernels = [], []
    real = meta_check._check

    def counting(op, args, kwargs):
        before = GlobalCounters.kernel_count
        real(op, args, kwargs)
        checked.append(op.func_name)
        kernels.append(GlobalCounters.kernel_count - before)

    monkeypatch.setattr(meta_check, "_PASSED", PassedChecks())
    monkeypatch.setattr(meta_check, "_check", counting)
    tl.load(folder).replay()
    assert checked == ["conv2d", "relu", "reshape", "transpose", "linear", "getitem"]
    assert kernels == [0] * len(checked)
    tl.load(folder).replay()
    assert len(checked) == 6  # the same calls again: passed by signature, nothing built


def test_a_live_trace_is_not_checked_again(monkeypatch) -> None:
    """A live trace's ops ran with these arguments in the forward: replay makes no extra call."""
    from torchlens_tinygrad import meta_check

    calls = []
    monkeypatch.setattr(meta_check, "check", lambda *a: calls.append(a))
    model, x = _model_and_input()
    trace = tl.trace(model, x)
    assert same_values("tinygrad", trace.replay(), model(x))
    assert calls == []


class Dropout:
    def __init__(self) -> None:
        self.fc = nn.Linear(8, 16)

    def __call__(self, x: Tensor) -> Tensor:
        with Context(TRAINING=1):
            return self.fc(x).dropout(0.5)


def test_a_random_op_is_checked_without_moving_its_draw(tmp_path, monkeypatch) -> None:
    """The check of a loaded dropout draws from a copy of the recorded RNG state: the replay draws the
    recorded mask all the same, and the live generator is where it was."""
    from torchlens_tinygrad import meta_check

    Tensor.manual_seed(0)
    model, x = Dropout(), Tensor.randn(4, 8).realize()
    trace = tl.trace(model, x)
    expected = trace.ops[-1].out.numpy()
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    checked = []
    real = meta_check._check
    monkeypatch.setattr(meta_check, "_check", lambda op, *a: (checked.append(op.func_name), real(op, *a)))
    live = _rng_state()
    out = loaded.replay()
    assert "dropout" in checked
    assert (out.numpy() == expected).all()
    assert _rng_state() == live


def _rng_state() -> tuple[object, ...]:
    """tinygrad's live generator: its seed, per-device seeds and counters."""
    return (
        Tensor._seed,
        dict(Tensor._device_seeds),
        {device: c.numpy().tolist() for device, c in Tensor._device_rng_counters.items()},
    )
