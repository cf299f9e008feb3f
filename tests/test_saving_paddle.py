"""tl.save / tl.load on the paddle backend: random ops replay exactly, tampered RNG states (zoo: conformance/)."""

from __future__ import annotations

import json
import pathlib

import pytest

paddle = pytest.importorskip("paddle")

from saving_checks import rehash, same_values, views  # noqa: E402

import torchlens as tl  # noqa: E402


def test_random_ops_replay_exactly_after_load(tmp_path: pathlib.Path) -> None:
    layer = paddle.nn.Dropout(0.5)
    layer.train()
    t = tl.trace(layer, paddle.ones([64, 64]))
    path = tl.save(t, tmp_path / "t")
    paddle.seed(1234)  # the generator moves on; replay must use the state the op ran with
    loaded = tl.load(path)
    assert views(loaded) == views(t)
    assert same_values("paddle", loaded.replay(), t.model_output)
    assert same_values("paddle", loaded.replay(), t.model_output)  # and leaves the global generator alone
    assert loaded.audit()


def test_a_tampered_rng_state_is_refused(tmp_path: pathlib.Path) -> None:
    layer = paddle.nn.Dropout(0.5)
    layer.train()
    path = tl.save(tl.trace(layer, paddle.ones([4, 4])), tmp_path / "t")
    records = json.loads((path / "trace.json").read_text())
    (op,) = [o for o in records["ops"] if o["meta"] != {"dict": []}]
    state = op["meta"]["dict"][0][1]["list"][0]["value"]  # meta {"rng_state": [GeneratorState]}
    assert state["rng_state"][0] == -1  # the CPU generator: [device, seed, offset, engine state]
    for evil in (["x"], {"a": 1}, [-1, 0, 0, "1 2; rm -rf /"], [-2, 0, 0, "1 2"], [-1, 0, 0, ""], [-1, 0.5, 0, "1"]):
        state["rng_state"] = evil
        (path / "trace.json").write_text(json.dumps(records))
        rehash(path)
        with pytest.raises(tl.TraceFileError):
            tl.load(path)


def test_an_op_called_without_its_trailing_arguments_replays_after_load(tmp_path: pathlib.Path) -> None:
    # Paddle's F.gelu(x) calls the C binding as gelu(x): the binding fills `approximate` in, and the
    # loaded call must too (from the type stub's default), not refuse the op.
    from paddle import nn

    paddle.seed(0)
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, normalize_before=True, activation="gelu")
    model.eval()
    x = paddle.randn([2, 5, 16])
    trace = tl.trace(model, x)
    gelu = next(op for op in trace.ops if op.func_name == "gelu")
    assert gelu.args == (gelu.args[0],) and not gelu.kwargs  # recorded as the forward called it
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert not loaded.notes.get("not_replayable")
    assert float((loaded.replay() - model(x)).abs().max()) == 0.0
    assert loaded.audit()
