"""The core's layering: each layer imports only the layers below it, and the 0.1 paths still import."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
import warnings

import pytest

CORE = pathlib.Path(__file__).resolve().parent.parent / "torchlens_core"
# bottom to top
LAYERS = [
    "ir",
    "backend",
    "capture",
    "replay",
    "steer",
    "grads",
    "fields",
    "views",
    "compare",
    "ranks",
    "store",
    "viewer",
]


def _upward_imports(path: pathlib.Path) -> list[tuple[int, str, bool]]:
    """(line, module, at_import_time) for each import of a layer above ``path``'s own."""
    layer = path.relative_to(CORE).parts[0]
    tree = ast.parse(path.read_text())
    type_only = set()  # imports under `if TYPE_CHECKING:` never run
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            type_only.update(id(n) for n in ast.walk(node))
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchlens_core."):
            target = node.module.split(".")[1]
            if target in LAYERS and LAYERS.index(target) > LAYERS.index(layer) and id(node) not in type_only:
                found.append((node.lineno, node.module, id(node) not in in_function))
    return found


@pytest.mark.parametrize(
    "path", sorted(p for p in CORE.rglob("*.py") if p.parent != CORE), ids=lambda p: str(p.relative_to(CORE))
)
def test_no_layer_imports_a_layer_above_it(path: pathlib.Path) -> None:
    upward = _upward_imports(path)
    if path.parent.name == "ir":
        # The IR's conveniences (trace.summary(), op.flops...) import their layer when called.
        assert not [u for u in upward if u[2]], f"{path.name} imports above the IR at import time: {upward}"
    else:
        assert not upward, f"{path.relative_to(CORE)} imports a layer above its own: {upward}"


def test_importing_the_ir_loads_nothing_above_it() -> None:
    code = "import sys, torchlens_core.ir\nprint(sorted(m for m in sys.modules if m.startswith('torchlens_core.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    above = [m for m in eval(loaded) if m.split(".")[1] in LAYERS[1:]]
    assert above == [], above
    assert not [
        m
        for m in eval(loaded)
        if m.startswith(("torch", "jax", "tensorflow", "paddle", "tinygrad")) and not m.startswith("torchlens")
    ]


def test_every_layer_imports_on_its_own() -> None:
    for layer in LAYERS:
        subprocess.run([sys.executable, "-c", f"import torchlens_core.{layer}"], check=True)


@pytest.mark.parametrize(
    "old",
    [
        "builder",
        "records",
        "trace",
        "tree",
        "conformance",
        "plugins",
        "hookspecs",
        "flops",
        "saving",
        "selectors",
        "policy",
        "errors",
        "arrays",
        "sites",
    ],
)
def test_old_module_paths_are_the_moved_modules(old: str) -> None:
    from torchlens_core.old_paths import MOVED

    new = importlib.import_module(f"torchlens_core.{MOVED[old]}")
    sys.modules.pop(f"torchlens_core.{old}", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        aliased = importlib.import_module(f"torchlens_core.{old}")
    assert aliased is new
    assert aliased.__spec__.name == f"torchlens_core.{MOVED[old]}"  # its own spec, not the alias's
    assert any(issubclass(w.category, DeprecationWarning) and MOVED[old] in str(w.message) for w in caught)


def test_third_party_imports_of_the_old_layout_still_work() -> None:
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from torchlens_core.backend import Backend, lazy\n"
        "from torchlens_core.conformance import Case\n"
        "from torchlens_core.builder import TraceBuilder\n"
        "from torchlens_core.replay import Observe, interpret\n"
        "from torchlens_core import tree\n"
        "from torchlens_core.records import Ref\n"
        "import torchlens_core, torchlens_core.capture\n"
        "assert TraceBuilder is torchlens_core.capture.TraceBuilder is torchlens_core.TraceBuilder\n"
        "assert Backend is torchlens_core.Backend and tree.map_leaves and Ref(0).index == 0\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_package_is_installed() -> None:
    """A non-editable install ships only the packages pyproject.toml lists: each package of the tree is there."""
    import tomllib

    listed = set(tomllib.loads((CORE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(CORE.parent).parts[:-1]) for p in CORE.rglob("__init__.py")}
    found |= {".".join(p.relative_to(CORE.parent).parts[:-1]) for p in (CORE.parent / "torchlens").rglob("__init__.py")}
    # a folder of data files only (the conformance suite's expected failures) is a package too, for setuptools: one
    # left out is shipped with a warning on every install, and not at all by its next major version
    for root in (CORE, CORE.parent / "torchlens"):
        found |= {
            ".".join(p.parent.relative_to(CORE.parent).parts)
            for p in root.rglob("*")
            if p.is_file()
            and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts
            and p.parent not in (CORE, CORE.parent / "torchlens")
        }
    missing = sorted(found - listed)
    assert not missing, f"add these packages to [tool.setuptools] packages in pyproject.toml: {missing}"
