"""save= and halt= act the same on every installed backend (checked on each backend's own zoo)."""

from __future__ import annotations

from typing import Any

import pytest

import torchlens as tl
from torchlens_core.backend.arrays import max_error
from torchlens_core.backend.manager import backend_infos, backend_named

BACKENDS = [info.name for info in backend_infos() if info.available]


def first_modular_case(backend: str) -> tuple[Any, ...] | None:
    """A zoo case whose trace has a module returning a single array, and that trace."""
    for case in backend_named(backend).conformance_cases() or []:
        if not case.check_modules:
            continue
        model, args, kwargs = case.build()
        if case.reset:
            case.reset()
        full = tl.trace(model, *args, backend=backend, **kwargs)
        for path, record in full.modules.items():
            if record.num_passes == 1 and isinstance(full[path], tl.OpRecord) and len(record.passes[0].ops) > 1:
                return case, model, args, kwargs, full, path
    return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_and_halt(backend: str) -> None:
    capabilities = tl.backends()
    declared = next(b["capabilities"] for b in capabilities if b["name"] == backend)
    if "save" not in declared or "halt" not in declared:
        with pytest.raises(tl.UnsupportedError, match="does not support"):
            tl.trace(lambda: None, backend=backend, save=tl.func("x"), halt=tl.func("x"))
        pytest.skip(f"{backend} does not declare save/halt")
    found = first_modular_case(backend)
    if found is None:
        pytest.skip(f"no {backend} zoo case with a multi-op module")
    case, model, args, kwargs, full, path = found

    if case.reset:
        case.reset()
    part = tl.trace(model, *args, backend=backend, save=tl.module(path), **kwargs)
    assert [op.label for op in part.ops] == [op.label for op in full.ops]
    kept = [op.label for op in part.ops if op.kind == "op" and op.out is not None]
    assert kept == [full[path].label]
    assert max_error(backend, part[path].out, full[path].out) <= case.rtol
    assert part.audit(rtol=case.rtol)

    if case.reset:
        case.reset()
    halted = tl.trace(model, *args, backend=backend, halt=tl.in_module(path), **kwargs)
    assert halted.halted and halted.output is None
    last = halted.ops[-1]
    assert any(p == path for p, _ in last.module_passes) or last.label == full[path].label
    assert len(halted.ops) < len(full.ops)
    assert halted.audit(rtol=case.rtol)
