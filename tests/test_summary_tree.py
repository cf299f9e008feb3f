"""trace.summary(): every module that ran has a row (containers too), each parameter is counted in one row.

References: the framework's own parameter count (``model.parameters()``) and forward hooks on every
module, which say which modules ran and what each returned.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError  # noqa: E402
from torchlens_core.views.summary import summary_rows  # noqa: E402

DEPTHS = (1, 2, 3, None)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)))


class Stack(torch.nn.Module):
    """Three blocks in a ModuleList, which is never called itself; a parameter held by the model itself."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(16, 2)
        self.scale = torch.nn.Parameter(torch.ones(2))

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) * self.scale


def ran_modules(model, *args, **kwargs) -> dict[str, tuple[int, ...]]:
    """Path -> output shape of every module a forward hook saw run (the framework's own account)."""
    seen: dict[str, tuple[int, ...]] = {}

    def hook(path: str, out) -> None:  # returns None: the module's output stays its own
        seen.setdefault(path, tuple(out.shape) if isinstance(out, torch.Tensor) else None)

    handles = [
        m.register_forward_hook(lambda m, a, out, path=path: hook(path, out))
        for path, m in model.named_modules()
        if path
    ]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def check_counts(model, trace) -> None:
    want = sum(p.numel() for p in model.parameters())
    for depth in DEPTHS:
        rows = summary_rows(trace, depth)
        names = [p.name for row in rows for p in row.params]
        assert len(names) == len(set(names)), f"depth={depth}: a parameter counted twice"
        assert sum(p.numel for row in rows for p in row.params) == want, f"depth={depth}"
    assert f"Params: {want:,} unique" in trace.summary()


def test_blocks_in_a_module_list_have_rows_and_every_parameter_counts() -> None:
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(2, 8)
    trace = tl.trace(model, x)
    text = trace.summary()
    ran = ran_modules(model, x)
    for path in ("blocks.0", "blocks.1", "blocks.2"):  # the blocks that ran, shown though their list never ran
        row = next(line for line in text.splitlines() if f" {path} (Block)" in line)
        assert f"| [{','.join(map(str, ran[path]))}]" in row and "| 304 " in row, row
    assert any("blocks (ModuleList)" in line and "| -" in line for line in text.splitlines()), text
    assert any("(model's own)" in line and "| 2 " in line for line in text.splitlines()), text
    check_counts(model, trace)
    # depth=None: a row for every module, each that ran with the output the hook saw
    rows = {row.path: row for row in summary_rows(trace, None)}
    assert set(rows) == {path for path, _ in model.named_modules()}  # "" is the model's own parameters
    for path, shape in ran.items():
        assert rows[path].shape == "[" + ",".join(map(str, shape)) + "]"
    assert rows["blocks"].shape == "-" and rows["blocks"].expanded and not rows["blocks"].params


def test_depth_counts_levels_of_modules_that_ran() -> None:
    trace = tl.trace(Stack().eval(), torch.randn(2, 8))
    shown = {depth: [row.path for row in summary_rows(trace, depth)] for depth in DEPTHS}
    assert shown[1] == ["", "inp", "blocks", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert "blocks.0.fc" in shown[2] and "blocks.2.norm" in shown[2]
    assert shown[2] == shown[3] == shown[None]
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ArgumentTypeError, match="depth"):
            trace.summary(depth=bad)


def test_a_module_that_never_ran_is_shown_with_its_parameters() -> None:
    class Unused(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = torch.nn.Linear(4, 4)
            self.aux = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))

        def forward(self, x):
            return self.used(x)

    model = Unused()
    trace = tl.trace(model, torch.randn(1, 4))
    rows = {row.path: row for row in summary_rows(trace, 1)}
    assert rows["aux"].shape == "-" and sum(p.numel for p in rows["aux"].params) == 19
    assert "aux.0" not in rows  # nothing in it ran: one row says it all
    check_counts(model, trace)


@pytest.mark.parametrize("name", ["resnet18", "vit_b_16", "efficientnet_b0", "densenet121", "swin_t"])
def test_torchvision_models(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    kwargs = {"image_size": 32} if name == "vit_b_16" else {}
    model = getattr(torchvision.models, name)(**kwargs).eval()
    x = torch.randn(1, 3, 32, 32)
    trace = tl.trace(model, x)
    check_counts(model, trace)
    rows = {row.path for row in summary_rows(trace, None)}
    assert set(ran_modules(model, x)) <= rows


def test_transformers_models_from_configs() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    tied = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    ).eval()
    assert tied.lm_head.weight is tied.transformer.wte.weight  # one tensor, two modules: counted once
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100
        )
    ).eval()
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=100,
            tie_word_embeddings=False,
        )
    ).eval()
    ids = torch.randint(0, 100, (1, 8))
    for model in (tied, bert, llama):
        trace = tl.trace(model, ids)
        check_counts(model, trace)
        layers = [row.path for row in summary_rows(trace, 2)]
        assert sum(path.count(".") == 2 and path.rsplit(".", 1)[1].isdigit() for path in layers) == 2, layers
