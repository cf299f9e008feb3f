"""Forks, replay on new inputs, saved edits and bundles, on torch models, checked against plain forwards and hooks."""

from __future__ import annotations

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
    g = torch.Generator().manual_seed(4)
    return torch.randn(2, 3, 64, 64, generator=g), torch.randn(2, 3, 64, 64, generator=g)


def _hooked(model: Any, module: Any, edit: Any, x: Any) -> Any:
    handle = module.register_forward_hook(lambda m, a, out: edit(out))
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def test_replay_on_new_inputs_equals_the_model_on_them(resnet: Any, inputs: Any) -> None:
    x, x2 = inputs
    log = tl.trace(resnet, x)
    with torch.no_grad():
        assert torch.equal(log.replay(x2), resnet(x2))
        assert torch.equal(log.replay(), resnet(x))  # and the recorded inputs are left as they were


def test_a_fork_replays_and_reruns_its_edits_and_leaves_the_trace_alone(resnet: Any, inputs: Any) -> None:
    x, x2 = inputs
    log = tl.trace(resnet, x, intervention_ready=True)
    before = [(op.label, op.edits) for op in log.ops]
    fork = log.fork().when(tl.module("layer2"), tl.scale(-1.0)).when(tl.label("relu_1_3"), tl.clamp(max=0.5))
    edit_layer2 = lambda out: -out

    def by_hand(v: Any) -> Any:
        handles = [
            resnet.layer2.register_forward_hook(lambda m, a, out: edit_layer2(out)),
            resnet.relu.register_forward_hook(
                lambda m, a, out: out.clamp(max=0.5) if out.shape[1] == 64 and out.shape[-1] == 32 else out
            ),
        ]
        try:
            with torch.no_grad():
                return resnet(v)
        finally:
            for h in handles:
                h.remove()

    assert torch.equal(fork.replay(), by_hand(x))
    assert torch.equal(fork.replay(x2), by_hand(x2))
    rerun = fork.rerun(resnet, x2)
    assert torch.equal(rerun.output, by_hand(x2)) and len(rerun.interventions) == 2
    assert [(op.label, op.edits) for op in log.ops] == before  # forking never changes the original
    with torch.no_grad():
        assert torch.equal(log.replay(), resnet(x))
    assert fork.find_sites(tl.module("layer2")) == ["layer2:1"] == log.find_sites(tl.module("layer2"))
    assert log.find_sites(tl.func("relu") & tl.in_module("layer1.0")) == ["relu_2_7:1", "relu_2_7:2"]


def test_a_fork_of_an_edited_trace_keeps_its_edits_and_adds_its_own(resnet: Any, inputs: Any) -> None:
    x, _ = inputs
    steer = torch.full((64, 1, 1), 0.25)
    live = tl.trace(resnet, x, intervene=tl.when(tl.module("layer1"), tl.steer(steer)))
    both = tl.trace(
        resnet,
        x,
        intervene=[tl.when(tl.module("layer1"), tl.steer(steer)), tl.when(tl.module("layer3"), tl.zero_ablate())],
    )
    fork = live.fork().when(tl.module("layer3"), tl.zero_ablate())
    assert torch.equal(fork.replay(), both.output)
    assert torch.equal(fork.rerun(resnet, x).output, both.output)
    assert len(fork.interventions) == 2


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        if h.sum() > 0:  # a branch on a value
            h = h * 2
        return h * h.abs().max().item()  # and a number read out of an array


def test_new_inputs_that_would_change_a_baked_in_value_are_refused_naming_the_op() -> None:
    torch.manual_seed(1)
    model = Branchy()
    with torch.no_grad():
        model.fc.bias.fill_(1.0)
        model.fc.weight.fill_(0.1)
    x = torch.ones(1, 4)
    log = tl.trace(model, x)
    same = x.clone()
    assert torch.equal(log.replay(same), model(same))
    with pytest.raises(tl.GraphDoesNotHold, match=r"gt_1_\d+.*bool\(\)"):
        log.replay(-x * 100)  # the branch goes the other way
    with pytest.raises(tl.GraphDoesNotHold, match=r"max_1_\d+.*item\(\)"):
        log.replay(x * 1.5)  # the same branch, another number read out
    with pytest.raises(tl.GraphDoesNotHold, match="gt_1"):
        log.fork().when(tl.module("fc"), tl.scale(-100.0)).replay()  # an edit can flip it too
    rerun = log.fork().when(tl.module("fc"), tl.scale(-100.0)).rerun(model, x)
    with torch.no_grad():
        handle = model.fc.register_forward_hook(lambda m, a, out: out * -100.0)
        assert torch.equal(rerun.output, model(x))
        handle.remove()
    with pytest.raises(TypeError, match="shape"):
        log.replay(torch.ones(2, 4))


def test_edits_are_saved_and_replay_after_loading(resnet: Any, inputs: Any, tmp_path: Any) -> None:
    x, x2 = inputs
    other = tl.trace(resnet, x2)
    edited = tl.trace(
        resnet,
        x,
        intervene=[
            tl.when(tl.module("layer1"), tl.steer(torch.ones(64, 1, 1)), tl.scale(0.5)),
            tl.when(tl.func("relu") & tl.in_module("layer2"), tl.noise(0.1, seed=2), tl.clamp(max=1.0)),
            tl.when(tl.label("conv2d_1_1"), tl.project_off(torch.linspace(0, 1, 64), dim=1)),
        ],
    )
    loaded = tl.load(tl.save(edited, tmp_path / "edited"))
    assert [repr(e) for e in loaded.interventions] == [repr(e) for e in edited.interventions]
    assert torch.equal(loaded.replay(), edited.output) and loaded.audit()
    assert torch.equal(loaded["layer1"].pre_edit, edited["layer1"].pre_edit)
    patched = tl.trace(resnet, x, intervene=tl.when(tl.module("layer3"), tl.swap_with(other)))
    reloaded = tl.load(tl.save(patched, tmp_path / "patched"))
    why = reloaded.notes["not_replayable"]
    assert list(why) == [patched["layer3"].label] and "swap_with" in next(iter(why.values()))
    with pytest.raises(tl.UnsupportedError, match="swap_with"):
        reloaded.replay()


def test_a_bundle_compares_runs_site_by_site(resnet: Any, inputs: Any) -> None:
    import numpy as np

    x, x2 = inputs
    clean = tl.trace(resnet, x)
    noisy = tl.trace(resnet, x, intervene=tl.when(tl.module("layer2"), tl.noise(0.5, seed=0)))
    other = tl.trace(resnet, x2)
    bundle = tl.bundle({"clean": clean, "noisy": noisy, "other": other}, baseline="clean")
    at = bundle.compare_at("layer3")
    a, b = clean["layer3"].out.detach().double().numpy(), noisy["layer3"].out.detach().double().numpy()
    row = at.rows[1].difference
    assert row.max_abs == pytest.approx(np.abs(a - b).max())
    assert row.rel_l2 == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(a))
    assert row.cosine == pytest.approx((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))
    assert not at.rows[1].edited and bundle.compare_at("layer2").rows[1].edited
    frame = at.to_pandas()
    assert list(frame["run"]) == ["clean", "noisy", "other"] and frame["max_abs_diff"][0] == 0
    with pytest.raises(tl.LabelNotFoundError, match="baseline"):
        tl.bundle({"a": clean}, baseline="b")
    with pytest.raises(TypeError, match="not a trace"):
        tl.bundle({"a": clean, "b": 3}, baseline="a")


def test_intervention_ready_refuses_what_forking_cannot_use(resnet: Any, inputs: Any) -> None:
    x, _ = inputs
    with pytest.raises(tl.UnsupportedError, match="halt"):
        tl.trace(resnet, x, halt=tl.module("layer1"), intervention_ready=True)
    halted = tl.trace(resnet, x, halt=tl.module("layer1"))
    with pytest.raises(tl.UnsupportedError, match="halted"):
        halted.fork()
