"""Array adapters: what the core may ask of a torch tensor."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from torchlens_core.backend.array_ops import ArrayOps
from torchlens_core.ir.errors import UnsupportedError


def array_info(value: Any) -> tuple[tuple[int, ...], str, str] | None:
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(value.shape), str(value.dtype).removeprefix("torch."), value.device.type


_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def to_numpy(value: torch.Tensor) -> Any:
    dtype = value.dtype
    if dtype.is_floating_point and dtype not in _NUMPY_FLOATS:
        value = value.detach().float()  # bfloat16, float8: NumPy has no such dtype; float32 holds each value exactly
    # force=True: detached, on the CPU, conjugate and negative bits resolved, in one call (the viewer converts
    # every op's value: this is most of what a small one costs)
    return value.numpy(force=True).copy()


def to_numpy_stacked(values: list[torch.Tensor]) -> Any:
    """:func:`to_numpy` of each, stacked: one copy for many small values (the viewer's pictures). A stack
    copies each value as it is (``torch.stack`` reads a conjugate or negative view's values), so each row
    holds what :func:`to_numpy` gives that value."""
    with torch.no_grad():
        return to_numpy(torch.stack(values))


def array_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - e| / (1 + |e|); inf for a shape or dtype mismatch or NaNs in other places."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return math.inf
    if actual.is_meta or expected.is_meta:
        raise UnsupportedError(
            "meta tensors hold no values: values cannot be compared (trace with real tensors "
            "to audit, or read shapes and dtypes only)"
        )
    with torch.no_grad():
        a, e = actual.detach(), expected.detach().to(actual.device)
        if a.layout != torch.strided or e.layout != torch.strided:  # sparse: compare the values they stand for
            a, e = a.to_dense(), e.to_dense()
        if not (a.is_floating_point() or a.is_complex()):
            return 0.0 if torch.equal(a, e) else math.inf
        if a.is_complex():  # both parts: casting to real would drop the imaginary one
            a, e = torch.view_as_real(a.resolve_conj().cdouble()), torch.view_as_real(e.resolve_conj().cdouble())
        else:
            a, e = a.double(), e.double()
        nan_a, nan_e = torch.isnan(a), torch.isnan(e)
        if not torch.equal(nan_a, nan_e):
            return math.inf
        if a.numel() == 0:
            return 0.0
        keep = ~nan_a
        both_inf = torch.isinf(e) & (a == e)
        diff = torch.where(both_inf | ~keep, torch.zeros_like(a), (a - e).abs() / (1 + e.abs()))
        return float(diff.max())


class TorchArrayOps(ArrayOps):
    """ArrayOps on tensors. Edits stay in the autograd graph: gradients flow through an edited value."""

    def zeros_like(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)

    def mean(self, x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
        return (
            x.mean(dim=axes, keepdim=True)
            if x.is_floating_point() or x.is_complex()
            else x.double().mean(dim=axes, keepdim=True).to(x.dtype)
        )

    def sum(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        return x.sum(dim=axis, keepdim=True, dtype=x.dtype)

    def clip(self, x: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
        return x.clamp(min=low, max=high)

    def total(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()

    def take(self, x: torch.Tensor, indices: Sequence[int], axis: int) -> torch.Tensor:
        return x.index_select(axis, torch.tensor(list(indices), dtype=torch.long, device=x.device))

    def from_numpy(self, array: Any, like: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(array).to(dtype=like.dtype, device=like.device)

    def copy(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def write_into(self, target: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return target.copy_(value)


ARRAY_OPS = TorchArrayOps()
