"""Interventions on torch, each checked against the same edit made by hand with forward hooks.

What every backend with the ``intervene`` capability must do (each built-in
helper at an op and at a module call, splices, refused and failing edits, the
array operations, gradients through an edit) is checked on each backend's zoo
by the conformance suite (torchlens/conformance/edit_checks.py); these are
torch's own: forward hooks as the reference, in-place ops, pass-through
modules, a GPT-2 block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import torchlens as tl  # noqa: E402

nn = torch.nn


@pytest.fixture(scope="module")
def resnet() -> Any:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


@pytest.fixture(scope="module")
def inputs() -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 64, 64, generator=g), torch.randn(2, 3, 64, 64, generator=g)


def _with_hooks(model: Any, modules: list[Any], edit: Callable[[Any], Any], *args: Any) -> Any:
    """The model's output with ``edit`` applied to every listed module's output by forward hooks."""
    handles = [m.register_forward_hook(lambda m, a, out: edit(out)) for m in modules]
    try:
        with torch.no_grad():
            return model(*args)
    finally:
        for h in handles:
            h.remove()


def _layer1_relus(model: Any) -> list[Any]:
    return [block.relu for block in model.layer1]


RELUS_IN_LAYER1 = tl.func("relu") & tl.in_module("layer1")


def _hand_made(name: str, reference: Any, site_value: Callable[[Any], Any]) -> tuple[Any, Callable[[Any], Any]]:
    """(helper, the same edit written by hand on a tensor); ``site_value(out)`` is the reference's value there."""
    vector = torch.linspace(-1, 1, 64).reshape(64, 1, 1)
    if name == "steer":  # a torch tensor as the vector
        return tl.steer(vector, scale=2.5), lambda v: v + 2.5 * vector
    if name == "swap_with":  # another trace's value at the same site
        return tl.swap_with(reference), site_value
    raise AssertionError(name)


# Each built-in helper's arithmetic, at an op and at a module call of every zoo case, is the conformance suite's
# (torchlens/conformance/edit_checks.py); these two are checked here against forward hooks doing the edit.
HELPERS = ["steer", "swap_with"]


@pytest.mark.parametrize("name", HELPERS)
def test_every_helper_at_op_sites_equals_hooks_doing_it(resnet: Any, inputs: Any, name: str) -> None:
    x, other = inputs
    reference = tl.trace(resnet, other)
    # layer1 runs its ReLU module twice per block: the k-th call of block b is relu op k of that pass
    calls: dict[int, int] = {}
    ref_values = {}
    for block_index, block in enumerate(resnet.layer1):
        ops = [op for op in reference.ops if op.func_name == "relu" and op.module == f"layer1.{block_index}.relu"]
        ref_values[id(block.relu)] = [op.out for op in ops]

    def site_value(module: Any) -> Callable[[Any], Any]:
        def value(v: Any) -> Any:
            k = calls[id(module)] - 1
            return ref_values[id(module)][k]

        return value

    helper, _ = _hand_made(name, reference, lambda v: v)
    traced = tl.trace(resnet, x, intervene=tl.when(RELUS_IN_LAYER1, helper))

    def hooked(module: Any) -> Callable[[Any, Any, Any], Any]:
        def hook(m: Any, a: Any, out: Any) -> Any:
            calls[id(module)] = calls.get(id(module), 0) + 1
            return _hand_made(name, reference, site_value(module))[1](out)

        return hook

    handles = [m.register_forward_hook(hooked(m)) for m in _layer1_relus(resnet)]
    try:
        with torch.no_grad():
            expected = resnet(x)
    finally:
        for h in handles:
            h.remove()
    assert torch.allclose(traced.output, expected, rtol=1e-5, atol=1e-5), (traced.output - expected).abs().max()
    assert len(traced.interventions) == 4 and all(op.edited for op in traced.find(RELUS_IN_LAYER1))
    report = traced.audit()
    assert report, str(report)


@pytest.mark.parametrize("name", HELPERS)
def test_every_helper_at_a_module_site_equals_a_hook_on_it(resnet: Any, inputs: Any, name: str) -> None:
    x, other = inputs
    reference = tl.trace(resnet, other)
    # layer1's output has 64 channels, as the vector and direction do
    helper, by_hand = _hand_made(name, reference, lambda v: reference["layer1"].out)
    traced = tl.trace(resnet, x, intervene=tl.when(tl.module("layer1"), helper))
    expected = _with_hooks(resnet, [resnet.layer1], by_hand, x)
    assert torch.allclose(traced.output, expected, rtol=1e-5, atol=1e-5), (traced.output - expected).abs().max()
    (edit,) = traced.interventions
    assert (edit.site, edit.kind) == ("layer1:1", "module")
    report = traced.audit()
    assert report, str(report)


def test_the_seed_interventions_section_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    import torchvision.models as models

    model = models.alexnet(weights=None)
    x = torch.randn(1, 3, 224, 224)

    ablated = tl.trace(model, x, save=tl.func("relu"), intervene=tl.when(tl.func("relu"), tl.zero_ablate()))
    print(ablated["relu_1_2"].out.abs().max())  # tensor(0.)
    scaled = tl.trace(model, x, save=tl.func("relu"), intervene=tl.when(tl.func("relu"), tl.scale(0.5)))
    assert len(scaled.interventions) == 7

    clean_log = tl.trace(model, x, save=tl.func("relu"))
    patched_log = tl.trace(model, x, save=tl.func("relu"), intervene=tl.when(tl.func("relu"), tl.zero_ablate()))
    bundle = tl.bundle({"clean": clean_log, "patched": patched_log}, baseline="clean")
    comparison = bundle.compare_at("relu_1_2")  # one site; a multi-site selector must resolve uniquely

    assert capsys.readouterr().out.startswith("tensor(0.")
    assert float(ablated["relu_1_2"].out.detach().abs().max()) == 0.0
    # AlexNet in training mode draws dropout masks: the same draws, by seed, for the hand-made runs
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    for helper, by_hand in ((tl.scale(0.5), lambda o: o * 0.5), (tl.zero_ablate(), torch.zeros_like)):
        torch.manual_seed(11)
        traced = tl.trace(model, x, intervene=tl.when(tl.func("relu"), helper))
        torch.manual_seed(11)
        assert torch.equal(traced.output, _with_hooks(model, relus, by_hand, x))
        assert traced.audit()
    clean, patched = comparison.rows
    assert clean.difference.max_abs == 0 and patched.difference.norm == 0 and patched.edited
    assert patched.difference.max_abs == pytest.approx(float(clean_log["relu_1_2"].out.detach().abs().max()))
    assert "patched" in str(comparison) and list(comparison.to_pandas()["run"]) == ["clean", "patched"]
    with pytest.raises(tl.LabelNotFoundError, match="picks 7 sites"):
        bundle.compare_at(tl.func("relu"))
    assert bundle.compare_at(tl.label("relu_1_2")).site == comparison.site


def test_an_in_place_edit_leaves_every_other_recorded_value_intact(resnet: Any, inputs: Any) -> None:
    x, _ = inputs
    plain = tl.trace(resnet, x)
    traced = tl.trace(resnet, x, intervene=tl.when(tl.label("relu_1_3"), tl.scale(-1.0)))
    edited = traced["relu_1_3"]
    assert edited.in_place and edited.edited
    assert torch.equal(edited.pre_edit, plain["relu_1_3"].out)  # the value before, kept apart
    assert torch.equal(edited.out, -plain["relu_1_3"].out)
    # the ops before the edit are untouched, in particular the batch norm whose output relu_ wrote into
    for op in traced.ops[: edited.index]:
        if op.kind == "op":
            assert torch.equal(op.out, plain[op.label].out), op.label
    assert torch.equal(traced.output, _with_hooks(resnet, [resnet.relu], lambda o: -o, x))
    assert traced.audit()


def _gpt2() -> tuple[Any, Any, Any]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(use_cache=False)  # GPT-2 small: 12 layers, 768 wide, random weights
    model = transformers.GPT2LMHeadModel(config).eval()
    clean = torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    corrupted = clean.clone()
    corrupted[0, 3] = (corrupted[0, 3] + 17) % config.vocab_size
    return model, clean, corrupted


def test_activation_patching_a_gpt2_block_equals_hooks_doing_it() -> None:
    model, clean_ids, corrupted_ids = _gpt2()
    clean = tl.trace(model, input_ids=clean_ids, save=tl.module("transformer.h.6"))
    patched = tl.trace(
        model, input_ids=corrupted_ids, intervene=tl.when(tl.module("transformer.h.6"), tl.swap_with(clean))
    )

    with torch.no_grad():
        seen = {}
        h = model.transformer.h[6].register_forward_hook(lambda m, a, out: seen.update(out=out))
        model(input_ids=clean_ids)
        h.remove()
        h = model.transformer.h[6].register_forward_hook(lambda m, a, out: seen["out"])
        expected = model(input_ids=corrupted_ids).logits
        h.remove()
        corrupted = model(input_ids=corrupted_ids).logits
    assert torch.equal(patched.output.logits, expected)
    assert not torch.equal(expected, corrupted)  # the patch did something
    assert patched.audit()
    comparison = tl.bundle({"clean": clean, "patched": patched}, baseline="clean").compare_at("transformer.h.6")
    assert comparison.rows[1].difference.max_abs == 0 and comparison.rows[1].edited


def test_an_error_in_a_helper_leaves_nothing_installed(resnet: Any, inputs: Any) -> None:
    from torch.nn.modules import module as nn_module

    x, _ = inputs

    def broken(value: Any, site: Any) -> Any:
        raise RuntimeError("helper failed")

    for selector in (tl.func("relu"), tl.module("layer2")):
        with pytest.raises(RuntimeError, match="helper failed"):
            tl.trace(resnet, x, intervene=tl.when(selector, broken))
        assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
        assert (
            torch._C._get_torch_function_mode() is None
            if hasattr(torch._C, "_get_torch_function_mode")
            else not torch.overrides._get_current_function_mode_stack()
        )
    with torch.no_grad():
        assert torch.equal(resnet(x), tl.trace(resnet, x).output)


class _PassesThrough(nn.Module):
    """A layer, then nn.Identity (a module returning what it was given: an explicit identity op), the layer's
    output read again unedited, and a parameter returned (returned, not computed: an identity op too)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.same = nn.Identity()

    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        return self.same(h) + h, self.fc.bias


def test_identity_ops_of_pass_through_modules_are_edited_for_what_follows() -> None:
    torch.manual_seed(9)
    model, x = _PassesThrough(), torch.randn(3, 4)
    with torch.no_grad():
        traced = tl.trace(model, x, intervene=tl.when(tl.func("identity"), tl.steer(torch.ones(4), 10.0)))
        summed = _with_hooks(model, [model.same], lambda out: out + 10.0, x)[0]
        plain = tl.trace(model, x)
    assert torch.equal(traced.output[0], summed)
    assert torch.equal(traced.output[1], model.fc.bias + 10.0)  # the returned parameter's identity op, edited
    assert not torch.equal(model.fc.bias, traced.output[1])  # the parameter itself is left as it was
    assert [op.func_name for op in traced.ops if op.edited] == ["identity", "identity"]
    (add,) = [op for op in traced.ops if op.func_name == "add"]
    assert add.parents == ["identity_1_2", "linear_1_1"]  # the edit, and h as the model kept it
    assert traced.audit()
    # without edits the same identity ops are recorded, their passes' outputs what a forward hook sees
    assert [op.func_name for op in plain.ops if op.kind == "op"] == ["linear", "identity", "add", "identity"]
    assert torch.equal(plain["same"].out, model.fc(x).detach())


def test_a_module_site_on_a_pass_through_module_is_edited_as_a_hook_would() -> None:
    torch.manual_seed(9)
    model, x = _PassesThrough(), torch.randn(3, 4)
    with torch.no_grad():
        traced = tl.trace(model, x, save=tl.module("same"), intervene=tl.when(tl.module("same"), tl.scale(-2.0)))
        expected = _with_hooks(model, [model.same], lambda out: out * -2.0, x)
    assert torch.equal(traced.output[0], expected[0])
    assert traced["same"].edited and torch.equal(traced["same"].out, model.fc(x).detach() * -2.0)
    assert traced.audit()
    (add,) = [op for op in traced.ops if op.func_name == "add"]
    assert add.parents == ["identity_1_2", "linear_1_1"]  # the edit, and h as the caller kept it
    with torch.no_grad():
        assert [op.label for op in traced.ops] == [op.label for op in tl.trace(model, x).ops]  # no op added


def test_a_fork_refuses_to_replay_an_edit_of_a_pass_through_and_reruns_it() -> None:
    torch.manual_seed(9)
    model, x = _PassesThrough(), torch.randn(3, 4)
    with torch.no_grad():
        clean = tl.trace(model, x, intervention_ready=True)
        h = model.fc(x)
        live = tl.trace(model, x, intervene=tl.when(tl.module("same"), tl.scale(-2.0)))
        assert torch.allclose(live.output[0], -2.0 * h + h)  # a hook's answer: the caller's own h stays unedited
        for selector, site in (
            (tl.module("same"), "same:1 returns identity_1_2"),
            (tl.label("identity_1_2"), "identity_1_2"),
        ):
            assert clean.find_sites(selector) == ["same:1" if "returns" in site else "identity_1_2:1"]
            fork = clean.fork().when(selector, tl.scale(-2.0))
            with pytest.raises(tl.UnsupportedError, match=f"edits {site}, an array returned without"):
                fork.replay(x)
            assert torch.allclose(fork.rerun(model, x).output[0], live.output[0])
        fine = clean.fork().when(tl.label("linear_1_1"), tl.scale(-2.0))  # the op that computed it replays
        assert torch.allclose(fine.replay(x)[0], -4.0 * h)
        assert torch.allclose(fine.rerun(model, x).output[0], -4.0 * h)


class _Keeps(nn.Module):
    """A block that keeps what it returns (``self.last = y; return y``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        y = torch.relu(self.fc(x))
        self.last = y
        return y


class _KeepsItsOutput(nn.Module):
    """A model reading its block's output again where the block kept it, after what the block returned."""

    def __init__(self, catch: bool = False) -> None:
        super().__init__()
        self.block = _Keeps()
        self.catch = catch

    def forward(self, x: Any) -> Any:
        out = self.block(x) * 3.0
        if self.catch:  # a model that swallows errors: the capture must fail all the same
            try:
                return out + self.block.last
            except Exception:  # noqa: BLE001 - the model under test swallows every error
                return out
        return out + self.block.last


def test_an_edited_module_output_read_again_where_the_model_kept_it_is_refused() -> None:
    """A hook hands the caller the edit while the kept array stays unedited: one recorded value cannot be both."""
    from torch.nn.modules import module as nn_module

    torch.manual_seed(9)
    x = torch.randn(3, 4)
    for catch in (False, True):
        model = _KeepsItsOutput(catch)
        with torch.no_grad(), pytest.raises(tl.InterventionError, match=r"block:1 handed .* relu_1_2:1 itself"):
            tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))
        assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
        assert not torch.overrides._get_current_function_mode_stack()
    with torch.no_grad():
        y = torch.relu(model.block.fc(x))
        # the op itself: every read sees the edit, live and in replay
        traced = tl.trace(model, x, intervene=tl.when(tl.label("relu_1_2:1"), tl.scale(-2.0)))
        assert torch.allclose(traced.output, -8.0 * y) and traced.audit()
        # the block's output read only through what it returned: edited as a hook would, and replayed so
        model.forward = lambda x: model.block(x) * 3.0 + 1.0
        traced = tl.trace(model, x, intervene=tl.when(tl.module("block"), tl.scale(-2.0)))
        assert torch.allclose(traced.output, -6.0 * y + 1.0) and traced.audit()


def test_save_and_halt_keep_working_with_edits(resnet: Any, inputs: Any) -> None:
    x, _ = inputs
    traced = tl.trace(resnet, x, save=tl.func("linear"), intervene=tl.when(tl.module("layer4"), tl.scale(2.0)))
    layer4 = traced["layer4"]
    assert layer4.out is None and layer4.pre_edit is None and layer4.edited  # not saved, still edited
    assert torch.equal(traced.output, _with_hooks(resnet, [resnet.layer4], lambda o: o * 2.0, x))
    steer = tl.steer(torch.ones(64, 1, 1))
    halted = tl.trace(resnet, x, halt=tl.module("layer2"), intervene=tl.when(tl.module("layer1"), steer))
    assert halted.halted and halted["layer1"].edited
    seen = {}
    hooks = [
        resnet.layer1.register_forward_hook(lambda m, a, out: out + 1),
        resnet.layer2.register_forward_hook(lambda m, a, out: seen.update(out=out)),
    ]
    try:
        with torch.no_grad():
            resnet(x)
    finally:
        for h in hooks:
            h.remove()
    assert torch.equal(halted["layer2"].out, seen["out"])


class _ReturnsTwice(torch.nn.Module):
    """A module returning one tensor twice, as a tuple (an encoder giving its state as output and cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y, y


class _ReadsBoth(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.twice = _ReturnsTwice()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.twice(x)
        return a * b + a


def test_a_value_a_module_returns_twice_is_edited_once_at_its_module_site() -> None:
    torch.manual_seed(4)
    model, x = _ReadsBoth(), torch.randn(3, 4)
    seen: list[Any] = []

    def plus_one(value: Any, site: Any) -> Any:
        seen.append(site)
        return value + 1.0

    def hook(module: Any, args: Any, out: tuple[torch.Tensor, torch.Tensor]) -> Any:
        edited = out[0] + 1.0  # a forward hook edits the one tensor once, and returns it twice
        return edited, edited

    handle = model.twice.register_forward_hook(hook)
    with torch.no_grad():
        expected = model(x)
    handle.remove()
    with torch.no_grad():
        traced = tl.trace(model, x, intervene=tl.when(tl.module("twice"), plus_one))
    assert len(seen) == 1  # one op's value: one call of the helper
    assert torch.equal(traced.output, expected)
    assert torch.equal(traced.replay(x), expected)  # replay applies the edit once too, as the capture did
    assert traced.audit()
