"""`import torchlens` stays framework-free, and the public API is pinned."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
    paths = list(core.rglob("*.py"))
    assert len(paths) > 30  # every layer's modules, not just the package's own
    for path in paths:
        assert not pattern.search(path.read_text()), f"{path.relative_to(core)} imports a framework"


def _listed(section: str) -> set[str]:
    """The names docs/api.md lists in a section: backticked `tl.NAME` (users) or `NAME` (plugin authors)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    body = text.split(f"## `{section}`", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`tl\.(\w+)" if section == "tl" else r"`(\w+)`", body))


def test_the_api_page_lists_exactly_what_each_namespace_exports() -> None:
    """`__all__` is the one export list: docs/api.md documents each name of it, and no name that is not in it."""
    import torchlens.backend

    for section, namespace in (("tl", tl), ("torchlens.backend", torchlens.backend)):
        exported, listed = set(namespace.__all__), _listed(section)
        assert listed == exported, (
            f"docs/api.md's {section} section and {namespace.__name__}.__all__ differ: undocumented "
            f"{sorted(exported - listed)}, not exported {sorted(listed - exported)}"
        )
        for name in exported:
            assert getattr(namespace, name) is not None, name


def test_every_public_name_of_the_package_is_exported() -> None:
    """A public name bound in torchlens/__init__.py is in __all__, so on the api page."""
    import types

    public = {
        name
        for name, value in vars(tl).items()
        # submodules are bound as attributes once imported: those users use are in __all__, the test below checks them
        if not name.startswith(("_", "@")) and not isinstance(value, types.ModuleType)
    }
    assert public - set(tl.__all__) == set(), f"add to __all__ and docs/api.md: {sorted(public - set(tl.__all__))}"


def test_every_error_torchlens_raises_is_importable_from_torchlens() -> None:
    """A user catches what tl.* raises with tl.<Name>: no error class of the core is left unexported."""
    import inspect

    from torchlens_core.ir import errors

    raised = {
        name
        for name, cls in vars(errors).items()
        if inspect.isclass(cls)
        and issubclass(cls, (errors.TorchLensError, Warning))
        and cls.__module__ == errors.__name__
        and not name.startswith("_")
    }
    missing = sorted(name for name in raised if getattr(tl, name, None) is not getattr(errors, name))
    assert not missing, f"export these from torchlens/__init__.py: {missing}"


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


def test_a_backend_registered_or_removed_later_is_seen() -> None:
    """Backends are resolved from a cache of what the plugins said: registering or removing one refreshes it."""
    from torchlens_core.backend.base import Backend
    from torchlens_core.backend.manager import BackendInfo, plugin_manager, resolve_backend

    class LateBackend(Backend):
        name = "late_test_backend"

        def info(self) -> BackendInfo:
            return BackendInfo(name=self.name, framework="pytest", install="pip install pytest")

    with pytest.raises(tl.BackendNotFoundError):
        resolve_backend("late_test_backend")
    pm = plugin_manager()
    pm.register(LateBackend(), name="late_test_backend")
    try:
        assert resolve_backend("late_test_backend").name == "late_test_backend"
        assert "late_test_backend" in [b["name"] for b in tl.backends()]
    finally:
        pm.unregister(name="late_test_backend")
    with pytest.raises(tl.BackendNotFoundError):
        resolve_backend("late_test_backend")
