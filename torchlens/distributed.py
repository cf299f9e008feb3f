"""``tl.distributed``: explicit ``torch.distributed`` collectives in a traced forward as boundary nodes.

    tl.distributed.arm()                  # before rank-local capture; or `with tl.distributed.arm(): ...`
    trace = tl.trace(model, x)            # each rank: all_reduce, all_gather... are ops of its trace
    tl.save(trace, f"rank{rank}")
    # later, anywhere (no torch needed):
    traces = [tl.load(f"rank{r}") for r in range(world_size)]
    print(tl.merge_report(traces))        # same graph? compatible collectives? shards refused
    merged = tl.merge_ranks(traces)       # one trace; each collective joins every rank's inputs

Importing this module imports no framework: :func:`arm` loads the torch
backend's implementation (``torchlens_torch.distributed``). See
docs/distributed.md for what is recorded and the merged-trace contract.
"""

from __future__ import annotations

import sys
from typing import Any

from torchlens_core.ir.errors import MissingDependencyError

_IMPLEMENTATION = "torchlens_torch.distributed"


def arm() -> Any:
    """Record the explicit ``torch.distributed`` collectives of traced forwards, process-wide, until :func:`disarm`.

    Returns a handle; ``with tl.distributed.arm(): ...`` disarms at the end
    (unless it was armed before). Forwards that are not being traced, and
    other threads, call the collectives as before.
    """
    try:
        from torchlens_torch.distributed import arm as arm_torch
    except ImportError as exc:
        raise MissingDependencyError(
            f"tl.distributed.arm() records torch.distributed collectives and needs PyTorch "
            f"(pip install 'torchlens[torch]'): {exc}"
        ) from exc
    return arm_torch()


def disarm() -> None:
    """Put the original collectives back (nothing happens if not armed)."""
    implementation = sys.modules.get(_IMPLEMENTATION)
    if implementation is not None:
        implementation.disarm()


def armed() -> bool:
    """Is :func:`arm` in effect?"""
    implementation = sys.modules.get(_IMPLEMENTATION)
    return implementation is not None and implementation.armed()


__all__ = ["arm", "armed", "disarm"]
