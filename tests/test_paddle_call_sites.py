"""Paddle's call sites: each op's walk ends at its layer call (PassSites), and gives the source lines all the same.

Checked against the source lines themselves (a comment marks each), in nested and repeated layers, in a helper
function, after a layer call that raised, and on a second capture.
"""

from __future__ import annotations

import pytest

paddle = pytest.importorskip("paddle")

import numpy as np  # noqa: E402
from paddle import nn  # noqa: E402
from source_sites import marked_line, sites  # noqa: E402

import torchlens as tl  # noqa: E402


def _line(marker: str, path: str = __file__) -> int:
    return marked_line(marker, path)


def _scale(x):
    return x * 3.0  # site: helper


class Inner(nn.Layer):
    def forward(self, x):
        y = x * 2.0  # site: inner-mul
        return _scale(y)  # site: inner-helper


class Outer(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        a = self.inner(x)  # site: outer-first
        b = self.inner(a)  # site: outer-second
        return b + 1.0  # site: outer-add


class Failing(nn.Layer):
    def forward(self, x):
        raise ValueError("refused")


class Nested(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.outer = Outer()
        self.failing = Failing()

    def forward(self, x):
        h = self.outer(x)  # site: model-outer
        try:
            self.failing(h)
        except ValueError:
            pass
        return h - 1.0  # site: model-sub


def test_call_sites_inside_nested_and_repeated_layers_are_the_source_lines() -> None:
    model = Nested()
    x = paddle.to_tensor([[1.0, 2.0]])
    here = __file__
    outer = (here, _line("model-outer"), "forward")
    first, second = (here, _line("outer-first"), "forward"), (here, _line("outer-second"), "forward")
    inner_mul, helper = (here, _line("inner-mul"), "forward"), (here, _line("helper"), "_scale")
    inner_helper = (here, _line("inner-helper"), "forward")
    for _ in range(2):
        trace = tl.trace(model, x)
        muls = [op for op in trace.ops if op.func_name in ("multiply", "scale", "mul")]
        assert len(muls) == 4, [op.func_name for op in trace.ops]  # x * 2 and * 3, in each of Inner's two calls
        assert sites(muls[0]) == [inner_mul, first, outer]
        assert sites(muls[1]) == [helper, inner_helper, first]
        assert sites(muls[2]) == [inner_mul, second, outer]  # the second pass: its own call line
        assert sites(muls[3]) == [helper, inner_helper, second]
        rest = [op for op in trace.ops if op.kind == "op" and op not in muls]
        add, sub = rest[-2], rest[-1]  # b + 1.0 in Outer, then h - 1.0 after the layer call that raised
        assert sites(add) == [(here, _line("outer-add"), "forward"), outer]
        assert sites(sub) == [(here, _line("model-sub"), "forward")]
        np.testing.assert_allclose(trace.output.numpy(), (x.numpy() * 2 * 3 * 2 * 3 + 1) - 1)
