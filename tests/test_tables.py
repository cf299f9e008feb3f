"""Traces as pandas tables: one row per op, parameter and module, with documented dtypes."""

from __future__ import annotations

import pytest

import torchlens as tl
from torchlens_core.views.tables import MODULE_COLUMNS, OP_COLUMNS, PARAM_COLUMNS

pd = pytest.importorskip("pandas")
torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def log() -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(torchvision.models.alexnet(weights=None).eval(), torch.randn(1, 3, 64, 64))


def test_ops_table(log: tl.Trace) -> None:
    df = log.to_pandas()
    assert list(df.columns) == list(OP_COLUMNS) and len(df) == len(log.ops)
    assert {c: str(t) for c, t in df.dtypes.items()} == {
        c: str(pd.Series([], dtype=t).dtype) for c, t in OP_COLUMNS.items()
    }
    row = df.set_index("label").loc["conv2d_3_7"]
    assert row.func_name == "conv2d" and row.module == "features.6" and row["shape"] == (1, 384, 3, 3)
    assert row.parents == ("max_pool2d_2_6",) and row.num_params == 384 * 192 * 9 + 384
    assert row.file.endswith("container.py") is False and row.line > 0  # the user-level call site
    assert df.kind.tolist()[0] == "input" and df.kind.tolist()[-1] == "output"
    assert int(df.num_params.sum()) == sum(p.numel for p in log.params.values())


def test_params_and_modules_tables(log: tl.Trace) -> None:
    params = log.params.to_pandas()
    assert list(params.columns) == list(PARAM_COLUMNS) and len(params) == 16
    assert int(params.numel.sum()) == 61_100_840 and params.trainable.all()
    modules = log.modules.to_pandas()
    assert list(modules.columns) == list(MODULE_COLUMNS)
    classifier = modules.set_index("path").loc["classifier"]
    assert classifier.type == "Sequential" and classifier.num_passes == 1
    assert classifier.num_params == log.modules["classifier"].num_params > 0


def test_without_pandas_the_error_says_how_to_install(log: tl.Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pandas(name: str, *args: object, **kwargs: object) -> object:
        if name == "pandas":
            raise ImportError("no pandas")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(tl.TorchLensError, match=r'pip install "torchlens\[tables\]"') as caught:
        log.to_pandas()
    assert isinstance(caught.value, ImportError)  # `except ImportError` around optional features still works
    with pytest.raises(tl.TorchLensError, match="pandas"):
        log.params.to_pandas()
