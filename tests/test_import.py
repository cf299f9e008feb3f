"""`import torchlens` stays framework-free, and the public API is pinned."""

from __future__ import annotations

import subprocess
import sys

import torchlens as tl

FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "equinox", "tensorflow", "keras", "paddle", "tinygrad")


def test_import_loads_no_framework() -> None:
    code = (
        "import sys, torchlens as tl\n"
        "tl.backends()\n"  # listing backends loads every plugin module: still no framework
        f"loaded = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"import torchlens imported {result.stdout.strip()}"


def test_core_never_imports_a_framework() -> None:
    import pathlib
    import re

    core = pathlib.Path(tl.__file__).parent.parent / "torchlens_core"
    pattern = re.compile(rf"^\s*(import|from)\s+({'|'.join(FRAMEWORKS)})\b", re.MULTILINE)
    for path in core.glob("*.py"):
        assert not pattern.search(path.read_text()), f"{path.name} imports a framework"


def test_public_api() -> None:
    assert sorted(tl.__all__) == sorted([
        "Activations", "ArchitectureChanged", "AuditReport", "BackendNotFoundError", "CaptureError", "CodeLocation",
        "LabelNotFoundError", "ModulePass", "ModuleRecord", "OpRecord", "ParamRecord", "Recording", "ReplayError",
        "Selector", "TorchLensError", "Trace", "TraceFileError", "UnsupportedError", "__version__",
        "assert_unchanged", "backends", "extract_dataset", "followed_by", "func", "hash", "in_module", "label",
        "load", "module", "pluck", "preceded_by", "record", "register_flops", "save", "trace", "where",
    ])


def test_backends_lists_builtins_with_capabilities() -> None:
    listed = {b["name"]: b for b in tl.backends()}
    assert {"torch", "jax"} <= set(listed)
    assert "modules" in listed["torch"]["capabilities"]
    assert listed["torch"]["install"] == "pip install 'torchlens[torch]'"


def test_unknown_backend_names_installed_ones() -> None:
    import pytest

    with pytest.raises(tl.BackendNotFoundError, match="no backend named 'mxnet'.*torch"):
        tl.trace(lambda x: x, 1.0, backend="mxnet")


def test_every_hook_is_documented_where_declared() -> None:
    from torchlens_core.backend import hookspecs

    hooks = [name for name in dir(hookspecs) if name.startswith("torchlens_")]
    assert len(hooks) >= 10
    for name in hooks:
        doc = getattr(hookspecs, name).__doc__ or ""
        assert len(doc.split()) >= 8, f"hook {name} needs a docstring saying when it is called and what it returns"
