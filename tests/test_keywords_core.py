"""tl.trace keywords on a backend without the torch extras (the numpy plugin): a framework-neutral check."""

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("torchlens_numpy")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import ArgumentTypeError, UnsupportedError  # noqa: E402


def model(x, scale=1.0):
    return np.tanh(x) * scale


def test_options_are_checked_against_a_plain_functions_signature():
    x = np.ones(3)
    with pytest.raises(ArgumentTypeError, match="did you mean tl.trace's halt="):
        tl.trace(model, x, backend="numpy", hlt=tl.func("tanh"))
    assert tl.trace(model, x, backend="numpy", scale=2.0).output.tolist() == (np.tanh(x) * 2).tolist()


def test_a_backend_without_an_escape_detector_refuses_it():
    with pytest.raises(UnsupportedError, match="no escape detector"):
        tl.trace(model, np.ones(3), backend="numpy", escape_detector="shadow")
