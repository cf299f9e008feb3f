"""paddle: what makes a capture cheaper is faithful and taken down again (issue 17).

Layer calls are seen by replacing ``__call__`` on the model's layer classes (or on ``paddle.nn.Layer`` when
a class has a ``__call__`` of its own), the modules of C ops are given a class whose lookups give the
wrappers, and dtype names are cached by identity. Each is checked here against an independent reference
(forward hooks, a plain call) and for leaving nothing behind; no timing is asserted.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
from paddle import nn  # noqa: E402

import torchlens as tl  # noqa: E402


class Block(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.act(self.fc(x)) + x)


class OwnCall(nn.Layer):
    """A layer class with a ``__call__`` of its own: ops before ``super().__call__`` are outside its pass."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = self.create_parameter([n_in, n_out])

    def forward(self, x):
        return paddle.matmul(x, self.weight)

    def __call__(self, x):
        return super().__call__(x * 2.0)


class WithOwnCall(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.own = OwnCall(4, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.own(x))


class Boom(nn.Layer):
    def __init__(self, exc: BaseException, width: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.exc = exc

    def forward(self, x):
        self.fc(x)
        raise self.exc


def _classes_untouched(*models: nn.Layer) -> None:
    """No layer class (nor Layer itself) keeps a replaced ``__call__``; the C op modules are plain modules."""
    layer_call = nn.Layer.__dict__["__call__"]
    assert not getattr(layer_call, "_torchlens_wrapper", False)
    for model in models:
        for sub in model.sublayers(include_self=True):
            for cls in type(sub).__mro__:
                assert not getattr(cls.__dict__.get("__call__"), "_torchlens_wrapper", False), cls
    assert type(paddle._C_ops) is types.ModuleType
    assert type(paddle._legacy_C_ops) is types.ModuleType
    assert type(paddle._C_ops.relu).__name__ == "builtin_function_or_method"


def _hooked_outputs(model: nn.Layer, x) -> dict[str, np.ndarray]:
    """Every sublayer's output as Paddle's own forward post-hooks see it, in a plain call: the reference."""
    seen: dict[str, np.ndarray] = {}

    def hook_for(path: str):
        def hook(layer, inputs, out) -> None:
            seen.setdefault(path, out.numpy())

        return hook

    handles = [layer.register_forward_post_hook(hook_for(path)) for path, layer in model.named_sublayers()]
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _assert_module_outputs_match_hooks(trace, model: nn.Layer, x) -> None:
    reference = _hooked_outputs(model, x)
    assert set(reference) == {path for path, _ in model.named_sublayers()}
    for path, expected in reference.items():
        np.testing.assert_array_equal(trace.modules[path].passes[0].out.numpy(), expected, err_msg=path)


def test_module_passes_equal_what_forward_hooks_see_and_nothing_stays_replaced() -> None:
    paddle.seed(0)
    model = Block()
    x = paddle.randn([2, 4])
    trace = tl.trace(model, x)
    _assert_module_outputs_match_hooks(trace, model, x)
    assert trace.modules["fc"].passes[0].ops == [op.label for op in trace.ops if op.func_name == "linear"][:1]
    np.testing.assert_array_equal(trace.output.numpy(), model(x).numpy())
    assert trace.audit()
    _classes_untouched(model)


def test_a_class_with_its_own_call_keeps_its_ops_outside_its_pass() -> None:
    paddle.seed(0)
    model = WithOwnCall()
    x = paddle.randn([2, 4])
    trace = tl.trace(model, x)
    _assert_module_outputs_match_hooks(trace, model, x)
    scale = next(op for op in trace.ops if op.kind not in ("input", "output"))  # x * 2.0, in OwnCall.__call__
    assert scale.label not in trace.modules["own"].passes[0].ops  # as with hooks: outside the layer's pass
    assert [op.func_name for op in trace.ops if op.label in trace.modules["own"].passes[0].ops] == ["matmul"]
    np.testing.assert_array_equal(trace.output.numpy(), model(x).numpy())
    _classes_untouched(model)


def test_user_hooks_run_inside_the_pass_and_their_output_is_the_layers() -> None:
    """A pre-hook's ops belong to the layer's pass; the output recorded is the one after the user's post-hook."""
    paddle.seed(0)
    model = Block()
    x = paddle.randn([2, 4])
    pre = model.fc.register_forward_pre_hook(lambda layer, inputs: (inputs[0] * 3.0,))
    post = model.act.register_forward_post_hook(lambda layer, inputs, out: out - 1.0)
    try:
        trace = tl.trace(model, x)
        _assert_module_outputs_match_hooks(trace, model, x)
        np.testing.assert_array_equal(trace.output.numpy(), model(x).numpy())
    finally:
        pre.remove()
        post.remove()
    fc_ops = [op for op in trace.ops if op.label in trace.modules["fc"].passes[0].ops]
    assert [op.func_name for op in fc_ops] == ["mul", "linear"]
    act_ops = [op for op in trace.ops if op.label in trace.modules["act"].passes[0].ops]
    assert [op.func_name for op in act_ops] == ["relu", "sub"]
    assert trace.audit()


@pytest.mark.parametrize("exc", [ValueError("inside the model"), KeyboardInterrupt()], ids=["exception", "interrupt"])
def test_an_error_in_the_forward_leaves_no_class_replaced(exc: BaseException) -> None:
    model = Boom(exc)
    with pytest.raises(type(exc)):
        tl.trace(model, paddle.randn([2, 3]))
    _classes_untouched(model)
    own = WithOwnCall()  # the Layer-wide replacement is taken back too
    own.fc = Boom(exc, width=4)
    with pytest.raises(type(exc)):
        tl.trace(own, paddle.randn([2, 4]))
    _classes_untouched(own)


def test_halt_leaves_no_class_replaced() -> None:
    model = WithOwnCall()
    x = paddle.randn([2, 4])
    full = tl.trace(model, x)
    first = next(op for op in full.ops if op.kind not in ("input", "output"))
    halted = tl.trace(model, x, halt=tl.label(first.label))
    assert [op.label for op in halted.ops if op.kind not in ("input", "output")] == [first.label]
    _classes_untouched(model)


def test_a_changed_model_is_seen_by_the_next_capture() -> None:
    """Nothing about the layers is kept between captures: a replaced sublayer, of a new class with a
    ``__call__`` of its own, is recorded in the next capture, and a layer taken out is not."""
    paddle.seed(0)
    model = Block()
    x = paddle.randn([2, 4])
    first = tl.trace(model, x)
    assert first.modules["act"].type_name == "ReLU"
    own = OwnCall(4, 4)
    model.act = own
    second = tl.trace(model, x)
    assert second.modules["act"].type_name == "OwnCall"
    _assert_module_outputs_match_hooks(second, model, x)
    np.testing.assert_array_equal(second.output.numpy(), model(x).numpy())
    # a layer outside the traced model (a function traced: no layers declared) opens no pass
    relu = nn.ReLU()
    third = tl.trace(lambda t: relu(t) + 1.0, x)
    assert [op.module_passes for op in third.ops if op.func_name == "relu"] == [()]
    _classes_untouched(model, relu)


def test_an_op_someone_else_replaced_is_left_alone_and_still_theirs_afterwards() -> None:
    """The C op modules' lookups give a wrapper only where the module still holds the original op."""
    original = paddle._C_ops.relu
    calls = []

    def counting_relu(x):
        calls.append(1)
        return original(x)

    paddle._C_ops.relu = counting_relu
    try:
        trace = tl.trace(lambda t: nn.functional.relu(t) + 1.0, paddle.randn([3]))
        assert calls  # theirs ran, not replaced by a wrapper of the original
        assert paddle._C_ops.relu is counting_relu
        assert type(paddle._C_ops) is types.ModuleType
    finally:
        paddle._C_ops.relu = original
    assert [op.func_name for op in trace.ops if op.kind not in ("input", "output")] == ["add"]
    traced = tl.trace(lambda t: nn.functional.relu(t) + 1.0, paddle.randn([3]))  # the original is wrapped again
    assert [op.func_name for op in traced.ops if op.kind not in ("input", "output")] == ["relu", "add"]


def test_dtype_names_are_cached_by_identity_not_by_id_alone() -> None:
    from torchlens_paddle import arrays

    assert arrays.dtype_name(paddle.float16) == "float16"
    stale = object()  # an entry left by an object whose id paddle.float16 now has
    arrays._DTYPE_NAMES[id(paddle.float16)] = (stale, "bogus")
    assert arrays.dtype_name(paddle.float16) == "float16"
    for dtype in ("float32", "float64", "int32", "int64", "bool", "bfloat16"):
        assert arrays.dtype_name(paddle.zeros([2], dtype=dtype).dtype) == dtype
    trace = tl.trace(lambda v: (v + 1, v.astype("int64")), paddle.zeros([2], dtype="float64"))
    assert [op.dtype for op in trace.ops if op.kind not in ("input", "output")] == ["float64", "int64"]


def test_a_layer_call_someone_else_replaced_still_runs_and_is_theirs_afterwards() -> None:
    original = nn.Layer.__dict__["__call__"]
    calls = []

    def counting_call(self, *inputs, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *inputs, **kwargs)

    nn.Layer.__call__ = counting_call
    try:
        paddle.seed(0)
        model = Block()
        x = paddle.randn([2, 4])
        trace = tl.trace(model, x)
        assert calls.count("Linear") == 2 and calls.count("ReLU") == 1
        assert nn.Layer.__dict__["__call__"] is counting_call
        _assert_module_outputs_match_hooks(trace, model, x)
    finally:
        nn.Layer.__call__ = original
    _classes_untouched(model)
