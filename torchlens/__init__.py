"""TorchLens: see, save and steer a neural network as it runs, in any framework.

import torchlens as tl
trace = tl.trace(model, x)
trace["layer3"].out, trace.summary(), trace.audit()
"""

# tl.backends() (a callable module: torchlens.backends.torch.wrappers lives under it), tl.compat.report(),
# tl.distributed.arm(), tl.options.CaptureOptions
from torchlens import backends, compat, distributed, options
from torchlens_core.capture.api import pluck, record, trace
from torchlens_core.capture.builder import Recording
from torchlens_core.capture.selectors import (
    Selector,
    followed_by,
    func,
    in_module,
    label,
    module,
    preceded_by,
    where,
)
from torchlens_core.compare.bundle import Bundle, bundle
from torchlens_core.compare.classes import register_equivalence
from torchlens_core.compare.report import AlignedPair, Comparison, compare
from torchlens_core.ir.errors import (
    ArchitectureChanged,
    ArgumentTypeError,
    BackendNotFoundError,
    CaptureError,
    DrawingTooLargeError,
    ExtractError,
    FieldError,
    GraphDoesNotHold,
    GraphvizNotFoundError,
    InterventionError,
    LabelNotFoundError,
    LargeDrawingWarning,
    MissingDependencyError,
    OutputPathError,
    PartialCoverage,
    PatternError,
    PluginContractWarning,
    ReplayError,
    TorchLensError,
    TraceFileError,
    UnsupportedError,
)
from torchlens_core.ir.records import CodeLocation, ModulePass, ModuleRecord, OpRecord, ParamRecord
from torchlens_core.ir.trace import Trace
from torchlens_core.ranks import MergeReport, RankFinding, RankMergeError, merge_ranks, merge_report
from torchlens_core.replay.audit import AuditReport, Finding
from torchlens_core.steer.helpers import (
    clamp,
    mean_ablate,
    noise,
    project_off,
    project_onto,
    resample_ablate,
    scale,
    splice_module,
    steer,
    swap_with,
    when,
    zero_ablate,
)
from torchlens_core.store import stream as _stream  # noqa: F401  (registers the opener of tl.trace(save_to=))
from torchlens_core.store.extract import Activations, extract_dataset
from torchlens_core.store.saving import load, save
from torchlens_core.viewer import view
from torchlens_core.views.facets import FacetError, Facets
from torchlens_core.views.flops import register_flops
from torchlens_core.views.hashing import assert_unchanged
from torchlens_core.views.hashing import structural_hash as hash  # tl.hash(trace): the structural hash of a trace
from torchlens_core.views.validate import Coverage, validate

__version__ = "0.1.0"

__all__ = [
    "Coverage",
    "PartialCoverage",
    "compat",
    "validate",
    "Activations",
    "AlignedPair",
    "ArchitectureChanged",
    "Comparison",
    "compare",
    "register_equivalence",
    "AuditReport",
    "Finding",
    "BackendNotFoundError",
    "Bundle",
    "CaptureError",
    "CodeLocation",
    "DrawingTooLargeError",
    "GraphDoesNotHold",
    "LargeDrawingWarning",
    "bundle",
    "InterventionError",
    "LabelNotFoundError",
    "ModulePass",
    "ModuleRecord",
    "OpRecord",
    "ParamRecord",
    "Recording",
    "MergeReport",
    "RankFinding",
    "RankMergeError",
    "distributed",
    "merge_ranks",
    "merge_report",
    "PluginContractWarning",
    "ReplayError",
    "Selector",
    "TorchLensError",
    "Trace",
    "TraceFileError",
    "UnsupportedError",
    "__version__",
    "assert_unchanged",
    "backends",
    "clamp",
    "extract_dataset",
    "followed_by",
    "func",
    "hash",
    "in_module",
    "label",
    "load",
    "mean_ablate",
    "module",
    "options",
    "noise",
    "pluck",
    "preceded_by",
    "project_off",
    "project_onto",
    "record",
    "register_flops",
    "resample_ablate",
    "save",
    "scale",
    "splice_module",
    "steer",
    "swap_with",
    "trace",
    "when",
    "where",
    "zero_ablate",
    "FacetError",
    "Facets",
    "view",
    "ArgumentTypeError",
    "ExtractError",
    "FieldError",
    "GraphvizNotFoundError",
    "MissingDependencyError",
    "OutputPathError",
    "PatternError",
]
