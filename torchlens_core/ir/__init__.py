"""The IR: the data a trace is — op, module and parameter records, the Trace, typed errors.

The bottom layer. It imports nothing above it: importing ``torchlens_core.ir``
loads no capture, replay, view or storage code. The conveniences on
:class:`Trace` and :class:`OpRecord` (``summary()``, ``draw()``, ``audit()``,
``op.flops``...) are one-line delegations that import their layer when called.
"""

from torchlens_core.ir.errors import (
    ArchitectureChanged,
    BackendNotFoundError,
    CaptureError,
    ExtractError,
    GraphvizNotFoundError,
    LabelNotFoundError,
    ReplayError,
    TorchLensError,
    TraceFileError,
    UnsupportedError,
)
from torchlens_core.ir.records import (
    CodeLocation,
    Distances,
    ModulePass,
    ModuleRecord,
    OpRecord,
    ParamRecord,
    ParamRef,
    Ref,
)
from torchlens_core.ir.trace import Trace

__all__ = [
    "ArchitectureChanged",
    "BackendNotFoundError",
    "CaptureError",
    "CodeLocation",
    "Distances",
    "ExtractError",
    "GraphvizNotFoundError",
    "LabelNotFoundError",
    "ModulePass",
    "ModuleRecord",
    "OpRecord",
    "ParamRecord",
    "ParamRef",
    "Ref",
    "ReplayError",
    "TorchLensError",
    "Trace",
    "TraceFileError",
    "UnsupportedError",
]
