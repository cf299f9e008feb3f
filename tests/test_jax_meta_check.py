"""A loaded JAX trace whose primitive parameters were changed is refused before the primitive is bound.

Each tampered file passes every check of the loader (its hashes are made to match). Its replay and its audit
must stop with a ReplayError naming the op, from JAX's own shape rules run on shapes alone, not with an
error from deep inside lowering or a value of another shape.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nn = pytest.importorskip("flax.linen")

from saving_checks import rehash, same_values  # noqa: E402

import torchlens as tl  # noqa: E402


class ConvThenDense(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        return nn.Dense(5)(x.reshape((x.shape[0], -1)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, jax.Array]:
    model = ConvThenDense()
    x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
    variables = model.init(jax.random.key(1), x)

    def forward(x: jax.Array) -> jax.Array:
        return model.apply(variables, x)

    folder = tl.save(tl.trace(forward, x), tmp_path_factory.mktemp("convdense") / "trace")
    return folder, forward(x)  # the model's own output, untraced


def tampered(saved: pathlib.Path, into: pathlib.Path, primitive: str, param: str, value, nth: int = 0) -> pathlib.Path:
    """A copy of the saved trace with one parameter of the ``nth`` ``primitive`` op changed, hashes made to match."""
    shutil.copytree(saved, into)
    records = json.loads((into / "trace.json").read_text())
    op = [o for o in records["ops"] if o["func_name"] == primitive][nth]
    assert op["call"]["params"][param] != value
    op["call"]["params"][param] = value
    (into / "trace.json").write_text(json.dumps(records, separators=(",", ":")))
    rehash(into)
    return into


# (primitive, which of its ops, parameter, new value, what the refusal says). The model's reshapes: the conv
# bias's to (1, 1, 1, 4), then the activations' to (2, 144).
TAMPERINGS = {
    "conv window strides 2": (
        "conv_general_dilated",
        0,
        "window_strides",
        [2, 2],
        "gives shape (2, 3, 3, 4), its record says (2, 6, 6, 4)",
    ),
    "conv padding 0": (
        "conv_general_dilated",
        0,
        "padding",
        [[0, 0], [0, 0]],
        "gives shape (2, 4, 4, 4), its record says (2, 6, 6, 4)",
    ),
    "conv of one spatial dimension": ("conv_general_dilated", 0, "window_strides", [1], "do not fit its arguments"),
    "dot_general contracting the batch": (
        "dot_general",
        0,
        "dimension_numbers",
        [[[0], [0]], [[], []]],
        "do not fit its arguments",
    ),
    # reshape's shape rule leaves the element count to lowering (MLIR's verifier): the record catches it
    "reshape to other sizes": ("reshape", 1, "new_sizes", [2, 100], "gives shape (2, 100), its record says (2, 144)"),
    "reshape to the same count": ("reshape", 1, "new_sizes", [4, 72], "gives shape (4, 72), its record says (2, 144)"),
}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_a_tampered_parameter_is_refused_before_the_bind(saved, tmp_path, name) -> None:
    folder, _ = saved
    primitive, nth, param, value, says = TAMPERINGS[name]
    tl.load(folder).replay()  # the untampered file first: what passed then must not let the tampered call by
    trace = tl.load(tampered(folder, tmp_path / "t", primitive, param, value, nth))
    with pytest.raises(tl.ReplayError, match="of this loaded trace is refused") as caught:
        trace.replay()
    assert f"({primitive})" in str(caught.value) and says in str(caught.value), caught.value
    report = trace.audit()
    assert any("of this loaded trace is refused" in f.detail for f in report.findings if not f.ok), report


def test_the_untampered_file_replays_to_the_models_output(saved) -> None:
    folder, expected = saved
    loaded = tl.load(folder)
    assert same_values("jax", loaded.replay(), expected)
    report = loaded.audit()
    assert report, report


def test_a_live_trace_is_not_checked_again(monkeypatch) -> None:
    """A live trace's primitives were bound with these parameters in the forward: replay makes no extra call."""
    from torchlens_jax import meta_check

    calls = []
    monkeypatch.setattr(meta_check, "check", lambda *a: calls.append(a))
    model = ConvThenDense()
    x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
    variables = model.init(jax.random.key(1), x)
    trace = tl.trace(lambda x: model.apply(variables, x), x)
    assert np.allclose(trace.replay(), model.apply(variables, x))
    assert calls == []
