"""torchlens_core: the framework-neutral heart of TorchLens.

The IR (records, trace), the hook specs and plugin manager, and everything a
trace does without a framework (lookup, summary, replay driver, audit). This
package never imports a framework.
"""

from torchlens_core.api import pluck, record, trace
from torchlens_core.audit import AuditReport, Finding
from torchlens_core.backend import Backend
from torchlens_core.builder import Recording, TraceBuilder
from torchlens_core.errors import (
    BackendNotFoundError,
    CaptureError,
    LabelNotFoundError,
    TorchLensError,
    TraceFileError,
    UnsupportedError,
)
from torchlens_core.extract import Activations, extract_dataset
from torchlens_core.flops import register_flops
from torchlens_core.hashing import ArchitectureChanged, assert_unchanged, structural_hash
from torchlens_core.hookspecs import hookimpl
from torchlens_core.plugins import BackendInfo, backends
from torchlens_core.records import CodeLocation, ModulePass, ModuleRecord, OpRecord, ParamRecord, ParamRef, Ref
from torchlens_core.replay import ReplayError
from torchlens_core.saving import load, save
from torchlens_core.selectors import (
    Selector,
    followed_by,
    func,
    in_module,
    label,
    module,
    preceded_by,
    where,
)
from torchlens_core.trace import Trace

__all__ = [
    "Activations", "ArchitectureChanged", "AuditReport", "Backend", "BackendInfo", "BackendNotFoundError",
    "CaptureError", "CodeLocation", "Finding", "register_flops", "assert_unchanged", "structural_hash",
    "LabelNotFoundError", "ModulePass", "ModuleRecord", "OpRecord", "ParamRecord", "ParamRef",
    "Recording", "Ref", "ReplayError", "Selector", "TorchLensError", "Trace", "TraceBuilder", "TraceFileError",
    "UnsupportedError",
    "backends", "extract_dataset", "followed_by", "func", "hookimpl", "in_module", "label", "load", "module", "pluck",
    "preceded_by", "record", "save", "trace", "where",
]
