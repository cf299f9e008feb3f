"""Optional features without their extra: a TorchLensError that names the extra to install, never a raw ImportError.

These run in every session, the core one included (no framework, no zarr):
the missing package is simulated by a None entry in sys.modules, which makes
``import`` fail exactly as for a package that is not installed.
"""

from __future__ import annotations

import pathlib
import sys
import types

import numpy as np
import pytest

import torchlens as tl


def test_extract_dataset_without_zarr_names_the_extract_extra(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "zarr", None)
    with pytest.raises(tl.TorchLensError, match=r'need zarr 3.*pip install "torchlens\[extract\]"') as caught:
        tl.extract_dataset(lambda x: x * 2, [np.zeros(3)], layers="mul_1", output_dir=tmp_path / "store")
    assert isinstance(caught.value, ImportError)  # `except ImportError` still catches it
    assert not (tmp_path / "store").exists()  # said before anything was written
    with pytest.raises(tl.TorchLensError, match=r"torchlens\[extract\]"):
        tl.Activations(tmp_path / "store")


def test_zarr_2_is_refused_with_the_same_advice(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = types.ModuleType("zarr")
    old.__version__ = "2.18.3"  # the store is Zarr v3, written with the zarr 3 API
    monkeypatch.setitem(sys.modules, "zarr", old)
    with pytest.raises(tl.TorchLensError, match=r'not zarr 2\.18\.3: pip install "torchlens\[extract\]"'):
        tl.extract_dataset(lambda x: x, [np.zeros(3)], layers="x", output_dir=tmp_path / "store")


def test_tables_without_pandas_name_the_tables_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchlens_core.views import tables

    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(tl.TorchLensError, match=r'tables need pandas.*pip install "torchlens\[tables\]"') as caught:
        tables.params_frame({})
    assert isinstance(caught.value, ImportError)


def test_the_extras_named_in_errors_exist() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("zarr") for r in extras["extract"])
    assert any(r.startswith("pandas") for r in extras["tables"])
