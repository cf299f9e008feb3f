"""tl.save / tl.load on the tinygrad backend: every zoo model round-trips (lookup, summary, tables, drawing, hash)."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("tinygrad")

import torchlens as tl  # noqa: E402
from torchlens_core.plugins import hook  # noqa: E402

CASES = [c for c in hook().torchlens_conformance_cases(backend="tinygrad") or [] if not c.slow]


def views(t: tl.Trace) -> list[object]:
    rows = [(o.label, o.func_name, o.shape, o.dtype, o.parents, o.children, o.module_passes, o.module_outputs,
             o.params, o.code_context, o.flops, o.macs, repr(o.config)) for o in t.ops]
    return [rows, t.summary(), t.to_dot(), tl.hash(t), [m.path for m in t.modules.values()], list(t.params)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_zoo_round_trip(case, tmp_path: pathlib.Path) -> None:
    if case.reset:
        case.reset()
    model, args, kwargs = case.build()
    t = tl.trace(model, *args, backend="tinygrad", **kwargs)
    loaded = tl.load(tl.save(t, tmp_path / "t"))
    assert views(loaded) == views(t)
    missing = loaded.notes.get("not_replayable", {})
    if missing:  # only ops whose random state has no saved form (see the module docstring)
        assert all("could not be saved" in why for why in missing.values()), missing
        with pytest.raises(tl.UnsupportedError):
            loaded.replay()
        return
    report = loaded.audit(rtol=case.rtol)
    assert report, str(report)

