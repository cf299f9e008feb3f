"""The core's layering: each layer imports only the layers below it, and the 0.1 paths still import."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

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


def test_the_cores_old_top_level_names_warn_and_name_their_public_home() -> None:
    """torchlens_core is private: a name it exported before torchlens.backend existed still loads, for a version,
    with a DeprecationWarning that says where to import it from."""
    code = (
        "import warnings\n"
        "import torchlens as tl, torchlens.backend as backend, torchlens_core\n"
        "for name, home in (('TraceBuilder', backend), ('Backend', backend), ('load', tl), ('Trace', backend)):\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        value = getattr(torchlens_core, name)\n"
        "    assert value is getattr(home, name), name\n"
        "    [w] = caught\n"
        "    assert w.category is DeprecationWarning and f'import {name} from {home.__name__}' in str(w.message)\n"
        "assert not hasattr(torchlens_core, 'old_paths')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_plugin_needs_only_the_plugin_author_namespace() -> None:
    """The numpy example plugin, written as a third party would, imports TorchLens only through torchlens.backend
    (and torchlens for the errors users catch): the core's module paths are private."""
    plugin = CORE.parent / "plugins" / "torchlens-numpy" / "torchlens_numpy"
    imports = re.compile(r"^\s*(?:from|import)\s+(torchlens[\w.]*)", re.MULTILINE)
    used = {m for path in plugin.glob("*.py") for m in imports.findall(path.read_text())}
    used = {m for m in used if not m.startswith("torchlens_numpy")}  # the plugin's own modules
    assert used, "no TorchLens import found: the pattern is wrong"
    assert used <= {"torchlens", "torchlens.backend"}, f"private paths used by the plugin: {sorted(used)}"
    import torchlens.backend

    for name in torchlens.backend.__all__:
        assert getattr(torchlens.backend, name) is not None


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


def test_the_architecture_map_names_every_layer_and_module() -> None:
    """docs/concepts.md's map of torchlens_core is the one map: every layer, in import order, and every module."""
    text = (CORE.parent / "docs" / "concepts.md").read_text()
    tree = text.split("```\ntorchlens_core/\n", 1)[1].split("```", 1)[0]
    listed: dict[str, set[str]] = {}
    layer = None
    for line in tree.splitlines():
        found = re.match(r"  (\w+)/ ", line)
        if found:
            layer = found.group(1)
            listed[layer] = set()
        if layer is not None:
            listed[layer] |= set(re.findall(r"\b(\w+)\.py\b", line))
    assert list(listed) == LAYERS, "the map lists the layers bottom to top, as LAYERS does"
    for name in LAYERS:
        modules = {p.stem for p in (CORE / name).glob("*.py") if p.stem != "__init__"}
        missing, gone = sorted(modules - listed[name]), sorted(listed[name] - modules)
        assert not missing, f"docs/concepts.md's map misses torchlens_core/{name}/: {missing}"
        assert not gone, f"docs/concepts.md names modules torchlens_core/{name}/ lacks: {gone}"
