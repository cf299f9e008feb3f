"""The torch capture's caches give the same records as working everything out afresh.

Code sites are cached per code object and instruction offset (torchlens_core.capture.sites):
a repeat capture must report the same user lines as the first, follow a function whose code
was replaced, and never trust an entry left by a freed code object whose id was reused.
Expected lines come from the model's own frame (``f_lineno`` read on the line after the op's).
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchlens_torch")

import torchlens as tl  # noqa: E402
from torchlens_core.capture import sites  # noqa: E402
from torchlens_torch import capture as torch_capture  # noqa: E402


class TwoLines(torch.nn.Module):
    """Two ops on two lines, and a loop running one line three times; remembers those lines."""

    def forward(self, x):
        y = torch.relu(x)
        self.relu_line = sys._getframe().f_lineno - 1  # the line above
        z = torch.sigmoid(y)
        self.sigmoid_line = sys._getframe().f_lineno - 1
        for _ in range(3):
            z = torch.tanh(z)
            self.tanh_line = sys._getframe().f_lineno - 1
        return z


def _sites(trace):
    return [(op.func_name, op.code_context) for op in trace.ops if op.kind == "op"]


def test_lines_match_the_model_frames_and_repeat_captures_agree():
    model, x = TwoLines(), torch.rand(4)
    torch_capture._SITES._forget()
    first = tl.trace(model, x)
    second = tl.trace(model, x)  # every code site now comes from the cache
    assert _sites(first) == _sites(second)
    innermost = {(name, ctx[0].line_number) for name, ctx in _sites(first)}
    assert innermost == {("relu", model.relu_line), ("sigmoid", model.sigmoid_line), ("tanh", model.tanh_line)}
    for _, ctx in _sites(first):
        assert ctx[0].file == __file__ and ctx[0].func_name == "forward"
    tanh_sites = [ctx for name, ctx in _sites(second) if name == "tanh"]
    assert len(tanh_sites) == 3 and len(set(tanh_sites)) == 1


def _forward_from_source(blank_lines: int):
    """A forward compiled at run time under one file name: replacing it gives new code, new lines."""
    source = "\n" * blank_lines + "def forward(self, x):\n    return torch.exp(x)\n"
    namespace = {"torch": torch}
    exec(compile(source, "<generated forward>", "exec"), namespace)
    return namespace["forward"], blank_lines + 2


def test_replaced_code_gets_its_own_lines():
    model, x = TwoLines(), torch.rand(3)
    for blank_lines in (0, 5):  # same file and function name, different code object and line
        forward, line = _forward_from_source(blank_lines)
        model.forward = forward.__get__(model)
        trace = tl.trace(model, x)
        (exp,) = [op for op in trace.ops if op.func_name == "exp"]
        assert exp.code_context[0].file == "<generated forward>"
        assert exp.code_context[0].line_number == line


def test_every_judged_code_object_is_held():
    """Verdicts are keyed by id(code): a freed code object's id may be reused, so each judged one is kept alive."""
    model, x = TwoLines(), torch.rand(4)
    forward, _ = _forward_from_source(3)
    model.forward = forward.__get__(model)
    tl.trace(model, x)
    cache = torch_capture._SITES
    judged = cache.verdicts.keys()
    assert isinstance(cache.verdicts[id(forward.__code__)], dict)  # the user's code: its locations
    assert judged <= cache.held.keys() and all(id(code) == key for key, code in cache.held.items())


def test_the_cache_stays_bounded_and_correct(monkeypatch):
    model, x = TwoLines(), torch.rand(4)
    honest = _sites(tl.trace(model, x))
    monkeypatch.setattr(sites, "_MAX_CODES", 2)  # cleared over and over while one capture runs
    torch_capture._SITES._forget()
    assert _sites(tl.trace(model, x)) == honest
    assert len(torch_capture._SITES.held) <= 2


class Repeats(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y, x, y, x]), x + x, torch.stack([y, x, y])


def test_parents_are_listed_once_in_first_use_order():
    x, y = torch.rand(2), torch.rand(2)
    trace = tl.trace(Repeats(), x, y)
    inputs = [op.label for op in trace.ops if op.kind == "input"]
    by_name = {op.func_name: op for op in trace.ops if op.kind == "op"}
    assert by_name["cat"].parents == inputs
    assert by_name["add"].parents == [inputs[0]]
    assert by_name["stack"].parents == inputs[::-1]
    torch.testing.assert_close(by_name["cat"].out, torch.cat([x, y, x, y, x]))


@pytest.mark.parametrize(
    "options", [{}, {"save": tl.func("relu")}, {"intervene": tl.when(tl.func("relu"), tl.scale(1.0))}]
)
def test_a_dropped_trace_frees_its_values_without_the_cyclic_gc(options) -> None:
    """No reference cycle through the capture's builder, policy or editor holds the recorded values."""
    import gc
    import weakref

    nn = torch.nn
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        t = tl.trace(model, x, **options)
        value = weakref.ref(next(op for op in t.ops if op.func_name == "relu").out)
        del t
        assert value() is None, "the trace's values outlived it: a reference cycle holds them"
    finally:
        if was_enabled:
            gc.enable()
