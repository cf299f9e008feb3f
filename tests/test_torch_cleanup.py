"""A torch capture leaves torch's global state exactly as it found it, even when memory runs out in its cleanup.

References: torch's own hook registries (``torch.nn.modules.module._global_*``), its compiler stance and the
thread's TorchFunctionMode stack, compared before and after. A ``MemoryError`` is injected once into the step
of the cleanup that used to leave state behind (a handle's ``remove()``, the mode's pop, the stance's restore).
"""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402

import torchlens as tl  # noqa: E402


def _registries():
    found = {name: getattr(nn_module, name) for name in dir(nn_module) if name.startswith("_global_")}
    return {name: dict(v) if isinstance(v, dict) else v for name, v in found.items()}


def _stance():
    from torch._dynamo import eval_frame

    return eval_frame._stance.stance


def _state():
    return _registries(), _stance(), torch._C._len_torch_function_stack()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _raise_once(monkeypatch, owner, name):
    """``owner.name`` raises MemoryError on its first call, then behaves as before; returns the call count."""
    original = getattr(owner, name)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
    return calls


def test_registries_exactly_as_found_after_many_captures():
    model, x = _model(), torch.randn(3, 4)
    before = _state()
    for _ in range(3):
        tl.trace(model, x)
    assert _state() == before
    assert not nn_module._global_forward_hooks_with_kwargs


def test_registries_as_found_after_a_user_hook_and_a_capture():
    seen = []
    handle = nn_module.register_module_forward_hook(lambda m, a, k, out: seen.append(type(m)), with_kwargs=True)
    try:
        before = _registries()
        tl.trace(_model(), torch.randn(3, 4))
        assert _registries() == before  # the user's own entries, untouched
        assert nn.Sequential in seen
    finally:
        handle.remove()
        nn_module._global_forward_hooks_with_kwargs.pop(handle.id, None)  # torch's handle leaves it


def test_memory_error_while_removing_a_hook_handle(monkeypatch):
    from torch.utils.hooks import RemovableHandle

    model, x = _model(), torch.randn(3, 4)
    before = _state()
    _raise_once(monkeypatch, RemovableHandle, "remove")
    tl.trace(model, x)
    monkeypatch.undo()
    assert _state() == before
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    model(x)  # the capture's hook does not run on later module calls (it would record into the dead capture)
    assert calls == [1]


def test_memory_error_in_the_first_cleanup_step(monkeypatch):
    from torchlens_core.capture.branches import BranchTracker

    model, x = _model(), torch.randn(3, 4)
    before = _state()
    _raise_once(monkeypatch, BranchTracker, "close")
    with pytest.raises(MemoryError):
        tl.trace(model, x)
    monkeypatch.undo()
    assert _state() == before


def test_memory_error_while_popping_the_function_mode(monkeypatch):
    original, armed = torch._C._pop_torch_function_stack, []

    def failing():  # armed at the end of the forward: the next pop is the capture's own, leaving
        if armed and armed.pop():
            raise MemoryError
        return original()

    class ArmsAtTheEnd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            y = self.fc(x)
            armed.append(True)
            return y

    model, x = ArmsAtTheEnd(), torch.randn(3, 4)
    before = _state()
    monkeypatch.setattr(torch._C, "_pop_torch_function_stack", failing)
    monkeypatch.setattr(torch.overrides, "_pop_torch_function_stack", failing)  # what TorchFunctionMode pops by
    trace = tl.trace(model, x)
    monkeypatch.undo()
    assert not armed  # the failure was injected
    assert _state() == before
    assert torch.equal(trace.replay(x), model(x).detach())


def test_memory_error_while_restoring_the_compiler_stance(monkeypatch):
    model, x = _model(), torch.randn(3, 4)
    before = _state()
    assert before[1] == "default"
    original = torch.compiler.set_stance

    def set_stance(*args, **kwargs):
        stance = original(*args, **kwargs)
        failing = {"n": 0}

        class Stance:
            def __enter__(self):
                return stance.__enter__()

            def __exit__(self, *exc):
                failing["n"] += 1
                if failing["n"] == 1:
                    raise MemoryError
                return stance.__exit__(*exc)

        return Stance()

    monkeypatch.setattr(torch.compiler, "set_stance", set_stance)
    tl.trace(model, x)
    monkeypatch.undo()
    assert _state() == before


def test_memory_error_in_the_forward_leaves_nothing():
    class OutOfMemory(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            self.fc(x)
            raise MemoryError

    before = _state()
    with pytest.raises(MemoryError):
        tl.trace(OutOfMemory(), torch.randn(3, 4))
    assert _state() == before


def test_a_restore_that_keeps_failing_is_let_through():
    from torchlens_torch.restore import RETRIES, until_done

    tries = []

    def never():
        tries.append(1)
        raise MemoryError

    with pytest.raises(MemoryError):
        until_done(never)
    assert len(tries) == RETRIES
