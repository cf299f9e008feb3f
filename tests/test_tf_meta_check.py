"""A loaded TensorFlow trace whose op attributes or small integer arguments were changed is refused before the op runs.

Each tampered file passes every check of the loader (its hashes are made to match). Its replay and its audit
must stop with a ReplayError naming the op, from TensorFlow's own shape inference run on a scratch graph, not
with an error from the eager kernel or a value of another shape.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from saving_checks import rehash, same_values  # noqa: E402

import torchlens as tl  # noqa: E402


def _model_and_input() -> tuple[tf.keras.Model, tf.Tensor]:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((6, 6, 3)),
            tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(5),
        ]
    )
    return model, tf.random.normal((2, 6, 6, 3), seed=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, tf.Tensor]:
    model, x = _model_and_input()
    folder = tl.save(tl.trace(model, x), tmp_path_factory.mktemp("convdense") / "trace")
    return folder, model(x)  # the model's own output, untraced


def tampered_attr(saved: pathlib.Path, into: pathlib.Path, func: str, attr: str, value, nth: int = 0) -> pathlib.Path:
    """A copy of the saved trace with one attribute of the ``nth`` ``func`` op changed, hashes made to match."""
    shutil.copytree(saved, into)
    records = json.loads((into / "trace.json").read_text())
    attrs = [o for o in records["ops"] if o["func_name"] == func][nth]["call"]["attrs"]
    at = attrs[::2].index(attr) * 2 + 1
    assert attrs[at] != value
    attrs[at] = value
    (into / "trace.json").write_text(json.dumps(records, separators=(",", ":")))
    rehash(into)
    return into


def tampered_array(
    saved: pathlib.Path, into: pathlib.Path, func: str, arg: int, value: list[int], nth: int = 0
) -> pathlib.Path:
    """A copy of the saved trace with the saved array argument ``arg`` of the ``nth`` ``func`` op changed."""
    shutil.copytree(saved, into)
    records = json.loads((into / "trace.json").read_text())
    index = [o for o in records["ops"] if o["func_name"] == func][nth]["args"][arg]["array"]
    entry = records["arrays"][index]
    old = np.frombuffer((into / "arrays.bin").read_bytes(), entry["storage"], count=len(value), offset=entry["offset"])
    new = np.asarray(value, entry["storage"])
    assert entry["nbytes"] == new.nbytes and not np.array_equal(old, new)
    data = bytearray((into / "arrays.bin").read_bytes())
    data[entry["offset"] : entry["offset"] + new.nbytes] = new.tobytes()
    (into / "arrays.bin").write_bytes(bytes(data))
    rehash(into)
    return into


# (op, which of its ops, what is changed, new value, what the refusal says). The model's reshapes: the conv
# bias's to (1, 1, 1, 4), then the activations' to (2, 144).
TAMPERINGS = {
    "conv strides 2": (
        "conv2d",
        0,
        ("attr", "strides"),
        {"list": [1, 2, 2, 1]},
        "gives shape (2, 3, 3, 4), its record says (2, 6, 6, 4)",
    ),
    "conv padding VALID": (
        "conv2d",
        0,
        ("attr", "padding"),
        {"bytes": "VALID"},
        "gives shape (2, 4, 4, 4), its record says (2, 6, 6, 4)",
    ),
    "conv strides of three dimensions": (
        "conv2d",
        0,
        ("attr", "strides"),
        {"list": [1, 1, 1]},
        "do not fit its arguments",
    ),
    "matmul transposing the activations": ("matmul", 0, ("attr", "transpose_a"), True, "do not fit its arguments"),
    "reshape to other sizes": ("reshape", 1, ("array", 1), [2, 100], "do not fit its arguments"),
    "reshape to the same count": ("reshape", 1, ("array", 1), [4, 72], "gives shape (4, 72), its record says (2, 144)"),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_a_tampered_call_is_refused_before_the_kernel(saved, tmp_path, name) -> None:
    folder, _ = saved
    func, nth, (what, which), value, says = TAMPERINGS[name]
    tl.load(folder).replay()  # the untampered file first: what passed then must not let the tampered call by
    if what == "attr":
        path = tampered_attr(folder, tmp_path / "t", func, which, value, nth)
    else:
        path = tampered_array(folder, tmp_path / "t", func, which, value, nth)
    trace = tl.load(path)
    with pytest.raises(tl.ReplayError, match="of this loaded trace is refused") as caught:
        trace.replay()
    assert f"({func})" in str(caught.value) and says in str(caught.value), caught.value
    report = trace.audit()
    assert any("of this loaded trace is refused" in f.detail for f in report.findings if not f.ok), report


def test_the_untampered_file_replays_to_the_models_output(saved) -> None:
    folder, expected = saved
    loaded = tl.load(folder)
    assert same_values("tf", loaded.replay(), expected)
    report = loaded.audit()
    assert report, report


def test_a_live_trace_is_not_checked_again(monkeypatch) -> None:
    """A live trace's ops ran with these arguments in the forward: replay makes no extra call."""
    from torchlens_tf import meta_check

    calls = []
    monkeypatch.setattr(meta_check, "check", lambda *a: calls.append(a))
    model, x = _model_and_input()
    trace = tl.trace(model, x)
    assert np.allclose(trace.replay(), model(x))
    assert calls == []


def test_a_loaded_trace_is_checked(saved, monkeypatch) -> None:
    """The check runs on the loaded trace's computing ops, not on its variable reads."""
    from torchlens_tf import meta_check

    folder, _ = saved
    calls = []
    monkeypatch.setattr(meta_check, "check", lambda op, args: calls.append(op.func_name))
    tl.load(folder).replay()
    assert calls == ["conv2d", "reshape", "squeeze", "bias_add", "relu", "shape", "reshape", "matmul", "bias_add"]
