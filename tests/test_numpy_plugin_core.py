"""What the numpy plugin takes from the core since it was rewritten on the recorder base, checked on its own:
a family of attributes patched as one (np.random's draws), call sites that skip named files only, the core's
NumPy ArrayOps reading a wrapped value as plain and keeping scalars scalars, a Backend's hooks exported by a
module, and the base's rule that an error of a recorded call fails the capture even if the function caught it."""

from __future__ import annotations

import sys
import threading

import pytest

pytest.importorskip("torchlens_numpy")
import numpy as np
from thread_checks import run_together

import torchlens as tl
from torchlens_core.backend.array_ops import NumpyArrayOps
from torchlens_core.backend.base import Backend, hooks_of
from torchlens_core.capture.sites import CallSites
from torchlens_core.capture.threads import SharedPatch, shared_patch


class Greeter:
    def hello(self, name):
        return f"hello {name}"

    def bye(self, name):
        return f"bye {name}"


def _shouting(original, handlers):
    def call(self, name):
        handler = handlers.get(threading.get_ident())
        return original(self, name) if handler is None else handler(original(self, name))

    return call


def test_a_tuple_of_names_is_patched_and_restored_as_one() -> None:
    originals = (vars(Greeter)["hello"], vars(Greeter)["bye"])
    patch = SharedPatch(Greeter, ("hello", "bye"), _shouting)
    inside, release = threading.Barrier(2), threading.Event()

    def capturing():
        with patch.use(str.upper):
            inside.wait(10)
            seen = (Greeter().hello("a"), Greeter().bye("a"))
            assert release.wait(10)
        return seen

    def plain():  # another thread, while the patch is in: the originals
        inside.wait(10)
        try:
            return Greeter().hello("b"), Greeter().bye("b")
        finally:
            release.set()

    assert run_together(capturing, plain) == [("HELLO A", "BYE A"), ("hello b", "bye b")]
    assert (vars(Greeter)["hello"], vars(Greeter)["bye"]) == originals and not patch.installed
    with pytest.raises(KeyboardInterrupt), shared_patch(Greeter, ("hello", "bye"), _shouting).use(str.upper):
        raise KeyboardInterrupt
    assert (vars(Greeter)["hello"], vars(Greeter)["bye"]) == originals


def test_call_sites_skip_named_files_and_not_their_folder(tmp_path) -> None:
    # Two files in one folder: a plugin's capture module (internal) and its example model (the user's code).
    (tmp_path / "hidden_mod.py").write_text("def hidden(f):\n    return f()\n")
    (tmp_path / "model_mod.py").write_text("def model(f):\n    return f()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import hidden_mod
        import model_mod
    finally:
        sys.path.remove(str(tmp_path))
    named = CallSites(np.__file__, files=(hidden_mod.__file__,))
    found = model_mod.model(lambda: hidden_mod.hidden(lambda: named.stack(3)))
    # innermost first: this file's two lambdas, then model_mod's frame; hidden_mod's, between them, is skipped
    assert [c.func_name for c in found] == ["<lambda>", "<lambda>", "model"], found
    whole_folder = CallSites(np.__file__, hidden_mod.__file__)  # a module given: its whole folder is internal
    found = model_mod.model(lambda: hidden_mod.hidden(lambda: whole_folder.stack(3)))
    here = test_call_sites_skip_named_files_and_not_their_folder.__name__
    assert [c.func_name for c in found] == ["<lambda>", "<lambda>", here]


class _Wrapped:
    """A stand-in for a backend's recording array: the helpers must see the plain array it stands for."""

    def __init__(self, plain):
        self.plain = plain


def test_numpy_array_ops_read_wrapped_values_as_plain_and_keep_scalars() -> None:
    ops = NumpyArrayOps(plain=lambda v: v.plain if isinstance(v, _Wrapped) else v)
    x = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(ops.mean(_Wrapped(x), (1,)), x.mean(axis=1, keepdims=True))
    assert np.array_equal(ops.take(_Wrapped(x), [1], 0), x[[1]])
    assert type(ops.total(_Wrapped(x))) is np.float64 and ops.total(_Wrapped(x)) == 15.0
    scalar = np.float32(2.5)
    assert type(ops.zeros_like(_Wrapped(scalar))) is np.float32 and ops.zeros_like(scalar) == 0  # np.zeros_like: 0-d
    assert type(NumpyArrayOps().copy(scalar)) is np.float32  # np.array(copy=True) would make a 0-d array
    target = np.zeros(3)
    assert ops.write_into(_Wrapped(target), _Wrapped(np.ones(3))) is target and target.tolist() == [1.0, 1.0, 1.0]


def test_a_module_exports_a_backends_hooks() -> None:
    class Mine(Backend):
        name = "mine"

        def op_classes(self):
            return {"matmul": ["mine_mm"]}

    hooks = hooks_of(Mine())
    assert hooks["torchlens_op_classes"](backend="mine") == {"matmul": ["mine_mm"]}
    assert hooks["torchlens_op_classes"](backend="other") is None
    assert set(hooks) == {name for name in dir(Backend) if name.startswith("torchlens_")}
    from torchlens_numpy import plugin

    assert plugin.torchlens_op_classes(backend="numpy") == {
        "matmul": ["vdot", "inner"],
        "concat": ["hstack", "vstack", "dstack"],
    }


def test_an_error_of_a_recorded_call_fails_the_capture_even_if_the_function_catches_it() -> None:
    def forgiving(x):
        h = np.tanh(x)
        try:
            h = h * 2  # the edit below gives this op another shape: InterventionError, which is caught here
        except Exception:  # noqa: BLE001 - the function swallows every error
            h = h + 0
        return h

    wrong_shape = tl.when(tl.func("multiply"), lambda value, site: np.zeros(5))
    with pytest.raises(tl.InterventionError):
        tl.trace(forgiving, np.ones(3), backend="numpy", intervene=wrong_shape)
    assert tl.trace(forgiving, np.ones(3), backend="numpy").output.tolist() == (np.tanh(np.ones(3)) * 2).tolist()


def test_a_leaked_view_of_a_value_save_dropped_still_refuses_new_inputs() -> None:
    def leaky(x):
        h = x * 2
        v = np.asarray(h)  # a plain view of h: it enters the graph as a constant
        return np.tanh(x) + v

    t = tl.trace(leaky, np.ones(3), backend="numpy", save=tl.func("tanh"))  # multiply's value is dropped
    assert t["multiply_1"].out is None
    with pytest.raises(tl.UnsupportedError, match="multiply_1"):
        t.replay(np.ones(3) + 1)  # would silently reuse 2 * ones where leaky gives 2 * (ones + 1)


def test_setting_the_real_part_records_a_write_and_the_parts_it_cannot_record_are_refused() -> None:
    """``x.real = v`` on a real array writes the whole array, as NumPy does: recorded, so the traced output, its
    replay and the untraced call agree. On a complex array (a write to part of each element) it is refused with
    a typed error saying what to write instead, and ``x.imag = v`` on a real array raises NumPy's TypeError."""
    import numpy as np

    import torchlens as tl

    def set_real(x: np.ndarray) -> np.ndarray:
        y = x * 2.0
        y.real = x + 1.0
        return y * 3.0

    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    trace = tl.trace(set_real, x, backend="numpy")
    assert np.array_equal(trace.output, set_real(x)) and np.array_equal(trace.output, (x + 1.0) * 3.0)
    assert any(op.in_place for op in trace.ops)
    report = trace.audit()
    assert report, report.failures

    def set_complex(z: np.ndarray) -> np.ndarray:
        w = z * 2
        w.real = np.ones(3)
        return w

    with pytest.raises(tl.UnsupportedError, match=r"x = value \+ 1j \* x.imag"):
        tl.trace(set_complex, np.ones(3, dtype=np.complex128), backend="numpy")

    def set_imag(x: np.ndarray) -> np.ndarray:
        y = x * 2.0
        y.imag = x
        return y

    with pytest.raises(TypeError, match="imaginary"):
        set_imag(x)  # NumPy's own error
    with pytest.raises(TypeError, match="imaginary"):
        tl.trace(set_imag, x, backend="numpy")
