"""``wrap_torch()``: accepted for scripts written for wrapper-based tracers, and not needed here.

Tracers that patch torch's functions miss references bound before the
patch (``from torch import relu`` at the top of a file) unless torch is
wrapped first. The torch backend intercepts through a ``TorchFunctionMode``,
which sees every call however the function was reached, so nothing needs
wrapping: this does nothing but say so, once.
"""

from __future__ import annotations

from torchlens_core.capture.keywords import warn_once

__all__ = ["wrap_torch"]


def wrap_torch() -> None:
    """Nothing to do: the torch backend sees detached references already (a DeprecationWarning, once)."""
    warn_once(
        "wrap_torch",
        "torchlens.backends.torch.wrappers.wrap_torch() does nothing: the torch backend "
        "intercepts through a function mode, which records `from torch import relu` references "
        "bound before the capture without wrapping torch",
    )
