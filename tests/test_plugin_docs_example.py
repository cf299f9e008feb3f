"""docs/writing-a-backend.md's complete example backend: written out from the page, traced, and put through the suite.

The block under ``<!-- example: tiny_backend.py -->`` is the page's code as
a reader copies it. It must trace its toy MLP faithfully (checked against a
plain call and against NumPy computing the same layers), and the installed
conformance suite must pass it, found through an entry point as an installed
backend would be.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import numpy as np
import pytest
from conformance_plugin_checks import counts, make_site, run_pytest

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "writing-a-backend.md"


def _example() -> str:
    found = re.search(r"<!-- example: tiny_backend\.py -->\n```python\n(.*?)\n```\n", DOC.read_text(), re.S)
    assert found, "docs/writing-a-backend.md lost its example backend block"
    return found.group(1) + "\n"


@pytest.fixture
def tiny(tmp_path: pathlib.Path):
    from torchlens_core.backend.manager import plugin_manager

    (tmp_path / "tiny_backend.py").write_text(_example())
    spec = importlib.util.spec_from_file_location("tiny_backend", tmp_path / "tiny_backend.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tiny_backend"] = module
    spec.loader.exec_module(module)
    pm = plugin_manager()
    pm.register(module.backend, name="tiny")
    try:
        yield module
    finally:
        pm.unregister(name="tiny")
        sys.modules.pop("tiny_backend", None)


def test_the_example_traces_its_model_faithfully(tiny) -> None:
    import torchlens as tl

    model, (x,), _ = tiny._build_mlp()
    trace = tl.trace(model, x)  # claimed: the model is the toy framework's Module
    assert trace.backend == "tiny"
    # the reference: the same layers in plain NumPy, and the model's own untraced output
    w1, b1, w2, b2 = (p.data for p in (model.fc1.weight, model.fc1.bias, model.fc2.weight, model.fc2.bias))
    expected = np.maximum(x.data @ w1 + b1, 0) @ w2 + b2
    np.testing.assert_allclose(trace.output.data, expected, rtol=1e-6)
    np.testing.assert_array_equal(trace.output.data, model(x).data)
    assert [op.func_name for op in trace.ops] == [
        "input",
        "matmul",
        "add",
        "identity",
        "relu",
        "matmul",
        "add",
        "output",
    ]
    relu = next(op for op in trace.ops if op.func_name == "relu")
    assert relu.parents == [trace.modules["keep"].passes[0].ops[0]]  # read through Keep's identity op
    assert trace.ops[1].params == ("fc1.weight",) and trace.ops[1].parents == ["input_1"]
    assert sorted(trace.modules) == ["fc1", "fc2", "keep"]
    assert trace.modules["fc1"].params == ["fc1.weight", "fc1.bias"]
    report = trace.audit(untraced=True)
    assert report, str(report)
    np.testing.assert_array_equal(trace.replay().data, model(x).data)


def test_the_example_leaves_the_framework_as_it_was_after_an_error(tiny) -> None:
    import torchlens as tl

    class Broken(tiny.Module):
        def forward(self, x):
            tiny.call("relu", x)
            raise RuntimeError("inside the model")

    with pytest.raises(RuntimeError, match="inside the model"):
        tl.trace(Broken(), tiny.Array(np.ones(3)), backend="tiny")
    assert tiny.FUNCTIONS == tiny.KERNELS and tiny.MODULE_HOOKS == []


def test_the_example_passes_the_installed_suite(tmp_path: pathlib.Path) -> None:
    code = tmp_path / "src"
    code.mkdir()
    (code / "tiny_backend.py").write_text(_example())
    site = make_site(tmp_path, {"tiny": "tiny_backend:backend"})
    work = tmp_path / "tiny_repo"
    work.mkdir()
    done = run_pytest(work, site, "--torchlens-backend", "tiny", "-rs", extra_path=(code,))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    found = counts(output)
    # output parity, audit, module outputs, round trip, other inputs, lost edges, no reference cycles, replay's
    # refusals, a loaded trace on new inputs, and ops named at the end as when added (a rule of contract 4, which
    # it passes: it reads no label while capturing); the intervention, splice and gradient checks skipped: the
    # example does not declare them. It has no FLOP formulas: written for contract 2, it is warned of
    # flops_are_known, a rule of contract 3, which is reported xfailed
    assert (found.get("passed"), found.get("skipped"), found.get("xfailed")) == (10, 12, 1), output[-3000:]
    assert "declares plugin contract 2; test_flops_are_known is a rule of contract 3" in output, output[-3000:]


# -- the guide names everything an author implements or calls: it cannot drift from the code unseen -----------
GUIDE = DOC.read_text()
OVERVIEW = (DOC.parent / "backends.md").read_text()


def test_every_hook_is_in_the_hook_table() -> None:
    from torchlens_core.backend import hookspecs

    hooks = [name for name in vars(hookspecs) if name.startswith("torchlens_")]
    assert len(hooks) > 20
    missing = [name for name in hooks if f"`{name}" not in OVERVIEW]
    assert not missing, f"docs/backends.md's hook table lacks {missing}"


def test_every_backend_method_is_listed() -> None:
    from torchlens_core.backend import Backend

    methods = [
        name for name, value in vars(Backend).items() if callable(value) and not name.startswith(("_", "torchlens_"))
    ]
    assert "detach" in methods and "capture" in methods
    assert not [m for m in methods if f"| `{m}(" not in GUIDE and f"`{m}(" not in GUIDE], "writing-a-backend.md"
    assert not [m for m in methods if f"`{m}`" not in OVERVIEW], "backends.md's list of Backend methods"


def test_every_capability_is_in_the_table() -> None:
    from torchlens_core.backend.manager import CAPABILITIES

    assert not [c for c in CAPABILITIES if f"| `{c}` |" not in GUIDE]
    assert not [c for c in CAPABILITIES if f"`{c}`" not in OVERVIEW]


def test_backend_info_and_case_fields_are_the_documented_ones() -> None:
    import attrs

    from torchlens_core.backend import BackendInfo, Case

    fields = [f.name for f in attrs.fields(BackendInfo)]
    assert fields == ["name", "framework", "install", "aliases", "capabilities", "contract"]
    assert "BackendInfo(name, framework, install, aliases, capabilities, contract)" in OVERVIEW
    with pytest.raises(TypeError):  # the docs once said `extra`
        BackendInfo(name="x", framework="numpy", extra="")  # type: ignore[call-arg]
    for field in attrs.fields(Case):
        assert f"- `{field.name}" in GUIDE, f"writing-a-backend.md does not document Case.{field.name}"


def test_every_add_op_keyword_is_in_the_reference() -> None:
    import inspect

    from torchlens_core.capture import TraceBuilder

    for method in (
        "add_op",
        "add_input",
        "identity_op",
        "add_module",
        "enter_module",
        "exit_module",
        "add_outputs",
        "finish",
        "to_python",
    ):
        assert f"`{method}(" in GUIDE, method
    keywords = [
        p.name
        for p in inspect.signature(TraceBuilder.add_op).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert not [k for k in keywords if f"{k}=" not in GUIDE], "add_op's keywords"
