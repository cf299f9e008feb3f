"""``tl.backends()``: the installed backends; and names from older scripts (``torchlens.backends.torch.wrappers``).

The backends themselves are separate packages (``torchlens_torch``,
``torchlens_jax``...) registered under the ``torchlens.backends`` entry-point
group. This package is also what ``tl.backends`` is: importing
``torchlens.backends.torch.wrappers`` binds the name ``backends`` of the
``torchlens`` package to this module, so the module itself answers
``tl.backends()``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from torchlens_core.backend.manager import backends as _installed


class _CallableModule(types.ModuleType):
    def __call__(self) -> list[dict[str, Any]]:
        """Installed backends: name, framework and its version, availability, capabilities."""
        return _installed()


sys.modules[__name__].__class__ = _CallableModule
