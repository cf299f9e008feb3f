"""torch.compile and torch.export under capture (torchlens_torch.compiled)."""

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import UnsupportedError  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(torch.compiler, "set_stance"), reason="torch < 2.6 has no set_stance")


def _stance():
    from torch._dynamo import eval_frame

    return eval_frame._stance.stance


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.block = torch.nn.Sequential(
            torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True), torch.nn.Conv2d(8, 8, 3, padding=1)
        )
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = self.conv(x)
        x = x + self.block(x)
        return self.head(x.mean(dim=(2, 3)))


def _same_traces(a, b):
    assert [op.label for op in a.ops] == [op.label for op in b.ops]
    assert list(a.modules) == list(b.modules) and list(a.params) == list(b.params)
    for x, y in zip(a.ops, b.ops):
        assert x.module_passes == y.module_passes and x.parents == y.parents
        assert torch.equal(x.out, y.out), x.label


def _compile_stats():
    from torch._dynamo.utils import counters

    return dict(counters["stats"]), dict(counters["recompiles"]) if "recompiles" in counters else {}


def test_compiled_model_traces_as_the_eager_model_and_stays_compiled():
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model)
    with torch.no_grad():
        expected = compiled(x)  # compiles once
        before = _compile_stats()
        traced = tl.trace(compiled, x)
        _same_traces(traced, tl.trace(model, x))
        assert traced.model_name == "Net" and "conv" in traced.modules
        assert torch.allclose(traced.output, expected, atol=1e-5)
        assert traced.audit()
        assert _stance() == "default"
        compiled(x)  # runs its compiled code again: no new graph, no recompile
        assert _compile_stats() == before


def test_a_compiled_submodule_and_a_compiled_function_are_recorded():
    torch.manual_seed(0)

    @torch.compile
    def gate(x):
        return torch.sigmoid(x) * x

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Net()

        def forward(self, x):
            return gate(self.net(x))

    model, x = Outer().eval(), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        eager = tl.trace(model, x)
        model.net.block = torch.compile(model.net.block)
        with pytest.warns(UserWarning, match="global hooks"):  # torch's own warning, for the nested wrapper
            traced = tl.trace(model, x)
    _same_traces(traced, eager)  # paths without "_orig_mod", the function's ops recorded
    assert {op.func_name for op in traced.ops} >= {"sigmoid", "mul", "batch_norm", "relu"}
    assert "net.block.0" in traced.modules and not any("_orig_mod" in p for p in [*traced.modules, *traced.params])


def test_the_stance_comes_back_after_an_exception_in_the_model():
    class Fails(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("inside the model")

    with pytest.raises(RuntimeError, match="inside the model"):
        tl.trace(torch.compile(Fails()), torch.randn(2))
    assert _stance() == "default"


def test_exported_programs_are_refused_with_the_way_out():
    model, x = Net().eval(), torch.randn(2, 3, 8, 8)
    program = torch.export.export(model, (x,))
    with pytest.raises(UnsupportedError, match=r"ep\.module\(\)"):
        tl.trace(program, x, backend="torch")
    traced = tl.trace(program.module(), x)
    assert {"conv2d", "batch_norm", "linear", "add"} <= {op.func_name for op in traced.ops}
    with torch.no_grad():
        assert torch.allclose(traced.output, model(x), atol=1e-5)


def test_a_compiled_resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32)
    compiled = torch.compile(model)
    with torch.no_grad():
        expected = compiled(x)
        before = _compile_stats()
        traced = tl.trace(compiled, x)
        _same_traces(traced, tl.trace(model, x))
        assert torch.allclose(traced.output, expected, atol=1e-4) and traced.audit()
        compiled(x)
        assert _compile_stats() == before
