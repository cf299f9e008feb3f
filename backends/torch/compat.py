"""The torch backend's rows of ``tl.compat.report``: the model's wrapper, modules, parameters and inputs.

Checks that can fail are the capture's own (``torchlens_torch.compiled``):
a report never disagrees with what ``tl.trace`` then does. Nothing runs the
model.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.views.compat import CompatRow
from torchlens_torch.compiled import check_compiled_support, is_compiled_wrapper, refuse_unrunnable


def rows(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[CompatRow]:
    found = _wrapper(model)
    if isinstance(model, torch.nn.Module):
        found += _modules(model)
    found += _inputs(args, kwargs)
    found += _devices(model, args, kwargs)
    found += _markers(model)
    return found


def _wrapper(model: Any) -> list[CompatRow]:
    try:
        refuse_unrunnable(model)
        check_compiled_support(model)
    except UnsupportedError as exc:
        return [CompatRow("wrapper", type(model).__name__, "known_broken", str(exc))]
    found = []
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    compiled = [m for m in modules if is_compiled_wrapper(m)]
    if compiled:
        found.append(
            CompatRow(
                "wrapper",
                "torch.compile",
                "pass",
                f"{len(compiled)} compiled module(s): the capture holds torch.compiler.set_stance("
                f"'force_eager'), so they run and are recorded as their Python; nothing recompiles",
            )
        )
    for module in modules:
        kind = type(module).__name__
        if kind == "DataParallel":
            if torch.cuda.is_available() and torch.cuda.device_count() > 1:
                found.append(
                    CompatRow(
                        "wrapper",
                        kind,
                        "known_broken",
                        "DataParallel runs replicas in other threads, which a capture does not record: "
                        "trace model.module",
                    )
                )
            else:
                found.append(
                    CompatRow(
                        "wrapper",
                        kind,
                        "scope",
                        "with one device DataParallel calls its module "
                        "directly; paths start with 'module.' (or trace model.module)",
                    )
                )
        elif kind == "DistributedDataParallel":
            found.append(
                CompatRow(
                    "wrapper",
                    kind,
                    "scope",
                    "DDP's forward may broadcast buffers between ranks: "
                    "trace model.module on each rank (tl.distributed for collectives in the forward)",
                )
            )
        elif kind == "FullyShardedDataParallel" or type(module).__name__.startswith("FSDP"):
            found.append(
                CompatRow(
                    "wrapper",
                    kind,
                    "known_broken",
                    "FSDP gathers sharded parameters inside its own hooks; rank traces of sharded "
                    "modules are refused by tl.merge_ranks: trace an unsharded copy",
                )
            )
    return found or [
        CompatRow("wrapper", type(model).__name__, "pass", "an eager module or function: recorded as it runs")
    ]


def _modules(model: torch.nn.Module) -> list[CompatRow]:
    modules = list(model.modules())
    found = [CompatRow("modules", "count", "pass", f"{len(modules)} modules, each call a module pass")]
    lazy = [
        type(m).__name__
        for m in modules
        if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()
    ]
    if lazy:
        found.append(
            CompatRow(
                "modules",
                "lazy modules",
                "scope",
                f"{', '.join(sorted(set(lazy)))} with uninitialized parameters: the first forward "
                f"(the capture's) creates them, and that trace records their initialization",
            )
        )
    hooked = [type(m).__name__ for m in modules if m._forward_hooks or m._forward_pre_hooks]
    if hooked:
        found.append(
            CompatRow(
                "modules",
                "own hooks",
                "pass",
                f"hooks on {len(hooked)} module(s) run as usual; ops they run are recorded",
            )
        )
    seen: dict[int, str] = {}
    tied = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen and seen[id(p)] != name:
            tied.append(f"{name} = {seen[id(p)]}")
        seen.setdefault(id(p), name)
    if tied:
        found.append(
            CompatRow(
                "parameters",
                "sharing",
                "pass",
                f"shared parameters are recorded once, under their first name ({'; '.join(tied[:3])})",
            )
        )
    quantized = [n for n, p in model.named_parameters() if p.is_quantized]
    if quantized or any("quantized" in type(m).__module__ for m in modules):
        found.append(
            CompatRow(
                "parameters",
                "quantized",
                "not_tested",
                "quantized modules run their packed kernels; nothing here verifies their traces",
            )
        )
    return found


def _inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[CompatRow]:
    tensors = [leaf for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, torch.Tensor))]
    found = []
    for t in tensors:
        if t.is_meta:
            found.append(
                CompatRow(
                    "inputs",
                    "meta tensors",
                    "scope",
                    "meta tensors hold no values: the trace has "
                    "shapes and dtypes, and audit() refuses to compare values",
                )
            )
        elif t.layout != torch.strided:
            found.append(
                CompatRow(
                    "inputs", f"{t.layout} tensors", "pass", "recorded as they run; audit() compares them densified"
                )
            )
        elif t.is_quantized:
            found.append(CompatRow("inputs", "quantized tensors", "not_tested", "nothing here verifies their traces"))
        elif t.is_complex():
            found.append(CompatRow("inputs", "complex tensors", "pass", "audit() compares both parts"))
    if not tensors:
        found.append(
            CompatRow(
                "inputs",
                "tensors",
                "scope",
                "no tensor among the inputs: ops on tensors the model "
                "makes itself are recorded, and constants feed them",
            )
        )
    else:
        found.append(CompatRow("inputs", "tensors", "pass", f"{len(tensors)} input tensor(s)"))
    return list(dict.fromkeys(found))


def _devices(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[CompatRow]:
    tensors = [leaf for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, torch.Tensor))]
    if isinstance(model, torch.nn.Module):
        tensors += list(model.parameters()) + list(model.buffers())
    kinds = sorted({t.device.type for t in tensors})
    if "cuda" in kinds and not torch.cuda.is_available():
        return [CompatRow("device", "cuda", "known_broken", "tensors are on CUDA but no CUDA device is visible here")]
    if "cuda" in kinds:
        return [
            CompatRow(
                "device",
                "cuda",
                "not_tested",
                f"CUDA visible ({torch.cuda.device_count()} device(s)); "
                f"the capture is device-agnostic, and this project's CI runs on CPU",
            )
        ]
    return [CompatRow("device", ", ".join(kinds) or "cpu", "pass", "CPU tensors")]


def _markers(model: Any) -> list[CompatRow]:
    owner = type(model).__module__.split(".")[0]
    known = {"torchvision": "pass", "transformers": "pass", "timm": "pass"}
    if owner in known:
        return [CompatRow("framework", owner, known[owner], f"{owner} models are part of this project's zoos")]
    if any(c.__name__ == "LightningModule" for c in type(model).__mro__):
        return [
            CompatRow(
                "framework",
                "lightning",
                "not_tested",
                "a LightningModule traces as the nn.Module it is; nothing here runs Lightning's loop",
            )
        ]
    return []
