"""tl.save / tl.load on the paddle backend: every zoo model round-trips and replays, random ops included."""

from __future__ import annotations

import hashlib
import json
import pathlib

import pytest

paddle = pytest.importorskip("paddle")

import torchlens as tl  # noqa: E402
from torchlens_core.plugins import hook  # noqa: E402

CASES = [c for c in hook().torchlens_conformance_cases(backend="paddle") or [] if not c.slow]


def views(t: tl.Trace) -> list[object]:
    rows = [(o.label, o.func_name, o.shape, o.dtype, o.parents, o.children, o.module_passes, o.module_outputs,
             o.params, o.code_context, o.flops, o.macs, repr(o.config)) for o in t.ops]
    return [rows, t.summary(), t.to_dot(), tl.hash(t), [m.path for m in t.modules.values()], list(t.params)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_zoo_round_trip(case, tmp_path: pathlib.Path) -> None:
    if case.reset:
        case.reset()
    model, args, kwargs = case.build()
    t = tl.trace(model, *args, backend="paddle", **kwargs)
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert views(loaded) == views(t)
    assert "not_replayable" not in loaded.notes  # dropout and rnn too: their RNG state is saved
    assert same(loaded.replay(), t.model_output)
    report = loaded.audit(rtol=case.rtol)
    assert report, str(report)


def same(a: object, b: object) -> bool:
    from torchlens_core import tree

    leaves_a = [v for _, v in tree.leaves(a, lambda v: isinstance(v, paddle.Tensor))]
    leaves_b = [v for _, v in tree.leaves(b, lambda v: isinstance(v, paddle.Tensor))]
    return len(leaves_a) == len(leaves_b) and all((x.numpy() == y.numpy()).all() for x, y in zip(leaves_a, leaves_b))


def test_random_ops_replay_exactly_after_load(tmp_path: pathlib.Path) -> None:
    layer = paddle.nn.Dropout(0.5)
    layer.train()
    t = tl.trace(layer, paddle.ones([64, 64]))
    path = tl.save(t, tmp_path / "t")
    paddle.seed(1234)  # the generator moves on; replay must use the state the op ran with
    loaded = tl.load(path)
    assert views(loaded) == views(t)
    assert same(loaded.replay(), t.model_output)
    assert same(loaded.replay(), t.model_output)  # and leaves the global generator alone
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
        manifest = json.loads((path / "manifest.json").read_text())
        data = (path / "trace.json").read_bytes()
        manifest["files"]["trace.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (path / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(tl.TraceFileError):
            tl.load(path)
