"""TorchLens: see, save and steer a neural network as it runs, in any framework.

    import torchlens as tl
    trace = tl.trace(model, x)
    trace["layer3"].out, trace.summary(), trace.audit()
"""

from torchlens_core import (
    Activations,
    ArchitectureChanged,
    AuditReport,
    BackendNotFoundError,
    CaptureError,
    CodeLocation,
    LabelNotFoundError,
    ModulePass,
    ModuleRecord,
    OpRecord,
    ParamRecord,
    Recording,
    ReplayError,
    Selector,
    TorchLensError,
    Trace,
    TraceFileError,
    UnsupportedError,
    assert_unchanged,
    backends,
    extract_dataset,
    followed_by,
    func,
    in_module,
    label,
    load,
    module,
    pluck,
    preceded_by,
    record,
    register_flops,
    save,
    structural_hash,
    trace,
    where,
)

hash = structural_hash  # tl.hash(trace): the structural hash of a trace

__version__ = "0.1.0"

__all__ = [
    "Activations", "ArchitectureChanged", "AuditReport", "BackendNotFoundError", "CaptureError", "CodeLocation",
    "LabelNotFoundError", "ModulePass", "ModuleRecord", "OpRecord", "ParamRecord", "Recording", "ReplayError",
    "Selector", "TorchLensError", "Trace", "TraceFileError", "UnsupportedError", "__version__", "assert_unchanged",
    "backends", "extract_dataset", "followed_by", "func", "hash", "in_module", "label", "load", "module", "pluck",
    "preceded_by", "record", "register_flops", "save", "trace", "where",
]
