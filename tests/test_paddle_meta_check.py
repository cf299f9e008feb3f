"""A loaded Paddle trace whose call arguments were changed is refused before the eager op runs.

Each tampered file passes every check of the loader (its hashes are made to match). Its replay and its audit
must stop with a ReplayError naming the op, from Paddle's own InferMeta run on a scratch static program, not
with an error from the eager op or a value of another shape.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

paddle = pytest.importorskip("paddle")

from saving_checks import rehash, same_values  # noqa: E402

import torchlens as tl  # noqa: E402


class ConvThenMatmul(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)
        self.w = self.create_parameter([5, 144])

    def forward(self, x):
        y = paddle.nn.functional.relu(self.conv(x)).reshape([2, -1])
        return paddle.matmul(y, self.w, transpose_y=True)[:, 1:4] * 2.0


def _model_and_input() -> tuple[ConvThenMatmul, paddle.Tensor]:
    paddle.seed(0)
    model = ConvThenMatmul()
    model.eval()
    return model, paddle.randn([2, 3, 6, 6])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, paddle.Tensor]:
    model, x = _model_and_input()
    folder = tl.save(tl.trace(model, x), tmp_path_factory.mktemp("convmatmul") / "trace")
    with paddle.no_grad():
        return folder, model(x)  # the model's own output, untraced


def tampered(saved: pathlib.Path, into: pathlib.Path, func: str, nth: int, where: int | str, value) -> pathlib.Path:
    """A copy of the saved trace with argument ``where`` (a position, or a keyword: added if the call did not
    give it) of the ``nth`` ``func`` op changed, hashes made to match."""
    shutil.copytree(saved, into)
    records = json.loads((into / "trace.json").read_text())
    op = [o for o in records["ops"] if o["func_name"] == func][nth]
    if isinstance(where, int):
        assert op["args"][where] != value
        op["args"][where] = value
    else:
        pairs = dict(op["kwargs"]["dict"])
        assert pairs.get(where) != value
        pairs[where] = value
        op["kwargs"]["dict"] = [[k, v] for k, v in pairs.items()]
    (into / "trace.json").write_text(json.dumps(records, separators=(",", ":")))
    rehash(into)
    return into


# (op, which of its ops, argument, new value, what the refusal says). conv2d's arguments are (x, weight, strides,
# paddings, padding_algorithm, dilations, groups, data_format); the model's reshapes: the conv bias's to
# (1, -1, 1, 1), then the activations' to (2, 144); the matmul's y is the (5, 144) weight, transposed.
TAMPERINGS = {
    "conv strides 2": ("conv2d", 0, 2, {"list": [2, 2]}, "gives shape (2, 4, 3, 3), its record says (2, 4, 6, 6)"),
    "conv padding VALID": ("conv2d", 0, 4, "VALID", "gives shape (2, 4, 4, 4), its record says (2, 4, 6, 6)"),
    "conv strides of three dimensions": ("conv2d", 0, 2, {"list": [1, 1, 1]}, "do not fit together"),
    "matmul weight not transposed": ("matmul", 0, "transpose_y", False, "do not fit together"),
    "matmul activations transposed": ("matmul", 0, "transpose_x", True, "do not fit together"),
    "reshape to other sizes": ("reshape", 1, 1, {"list": [2, 100]}, "do not fit together"),
    "reshape to the same count": ("reshape", 1, 1, {"list": [4, -1]}, "gives shape (4, 72), its record says (2, 144)"),
    "index past the end": ("getitem", 0, 1, [{"slice": [None, None, None]}, 7], "do not fit together"),
    "slice of another length": (
        "getitem",
        0,
        1,
        [{"slice": [None, None, None]}, {"slice": [0, 4, None]}],
        "gives shape (2, 4), its record says (2, 3)",
    ),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_a_tampered_call_is_refused_before_the_eager_op(saved, tmp_path, name) -> None:
    folder, _ = saved
    func, nth, where, value, says = TAMPERINGS[name]
    tl.load(folder).replay()  # the untampered file first: what passed then must not let the tampered call by
    trace = tl.load(tampered(folder, tmp_path / "t", func, nth, where, value))
    with pytest.raises(tl.ReplayError, match="of this loaded trace is refused") as caught:
        trace.replay()
    assert f"({func})" in str(caught.value) and says in str(caught.value), caught.value
    assert paddle.in_dynamic_mode()  # the refused check put this thread back in dygraph mode
    report = trace.audit()
    assert any("of this loaded trace is refused" in f.detail for f in report.findings if not f.ok), report


def test_the_untampered_file_replays_to_the_models_output(saved) -> None:
    folder, expected = saved
    loaded = tl.load(folder)
    assert same_values("paddle", loaded.replay(), expected)
    report = loaded.audit()
    assert report, report


def test_a_live_trace_is_not_checked_again(monkeypatch) -> None:
    """A live trace's ops ran with these arguments in the forward: replay builds no static program."""
    from torchlens_paddle import meta_check

    calls = []
    monkeypatch.setattr(meta_check, "check", lambda *a: calls.append(a))
    model, x = _model_and_input()
    trace = tl.trace(model, x)
    with paddle.no_grad():
        assert same_values("paddle", trace.replay(), model(x))
    assert calls == []


def test_a_loaded_trace_is_checked_where_paddle_has_static_ops(saved, monkeypatch) -> None:
    """Every C op with a static version and the Tensor operators are built; the checks passed before are not."""
    from torchlens_core.replay.checked import PassedChecks
    from torchlens_paddle import meta_check

    folder, _ = saved
    built = []
    real = meta_check._check
    monkeypatch.setattr(meta_check, "_PASSED", PassedChecks())
    monkeypatch.setattr(meta_check, "_check", lambda op, *a: (built.append(op.func_name), real(op, *a)))
    tl.load(folder).replay()
    assert built == ["conv2d", "reshape", "add", "relu", "reshape", "matmul", "getitem", "mul"]
    tl.load(folder).replay()
    assert len(built) == 8  # the same calls again: passed by signature, nothing built


def test_other_threads_stay_in_dygraph_mode_during_a_check(saved, monkeypatch) -> None:
    """A thread started while this one builds a static program runs eagerly: ``paddle.enable_static`` would
    have set the module-level tracer such a thread copies, and left it in static mode for good."""
    from torchlens_paddle import meta_check

    folder, _ = saved
    seen = {}
    real_twin = meta_check._static_twin

    def twin(call):
        builder = real_twin(call)
        if builder is None or getattr(call, "__name__", None) != "conv2d":
            return builder

        def build(*args, **kwargs):
            def eager() -> None:
                seen["dynamic"] = paddle.in_dynamic_mode()
                seen["value"] = (paddle.ones([2]) * 3).numpy().tolist()

            worker = threading.Thread(target=eager)
            worker.start()
            worker.join()
            seen["here"] = paddle.in_dynamic_mode()
            return builder(*args, **kwargs)

        return build

    monkeypatch.setattr(meta_check, "_static_twin", twin)
    monkeypatch.setattr(meta_check, "_PASSED", meta_check.PassedChecks())
    tl.load(folder).replay()
    assert seen == {"dynamic": True, "value": [3.0, 3.0], "here": False}, seen
    assert paddle.in_dynamic_mode()


CHILD = textwrap.dedent("""
    import sys
    import torchlens as tl
    try:
        tl.load(sys.argv[1]).replay()
        print("replay: ran")
    except tl.TorchLensError as exc:
        print(f"replay: {type(exc).__name__}: {exc}")
""")


def test_an_int_past_int64_reaches_the_eager_op_not_the_static_one(saved, tmp_path) -> None:
    """Paddle's parser reads such an int as -1 with Python's OverflowError left set; the eager op then refuses
    the -1, but building the static op calls Python with the error pending and the process dies (SIGSEGV)."""
    folder, _ = saved
    path = tampered(folder, tmp_path / "t", "conv2d", 0, 6, 10**39)  # conv2d's groups
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    assert "replay: ReplayError" in done.stdout and "groups" in done.stdout, done.stdout
