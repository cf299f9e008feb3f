"""Side a of the Hugging Face pairs: transformers' PyTorch model, built from the row's config, run and traced.

Writes everything side b needs (config, inputs, weights, untraced output) and
the module call order of a plain forward (forward pre-hooks, not TorchLens):
the ground truth of where a config-wide bug (an activation, a norm epsilon,
dropout) first acts. Attention runs the ``eager`` implementation, the one the
Flax ports were written against (softmax of explicit scores), not SDPA.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import numpy as np

from bench.compare_menagerie.common import REL_TOL, gap, write_json
from bench.compare_menagerie.hf_archs import Arch, input_spec

SEED = 0


def draw_inputs(arch: Arch, config: dict[str, Any]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    vocab = int(config.get("vocab_size", 128))
    out = {}
    for name, (kind, shape) in input_spec(arch, config).items():
        out[name] = (
            rng.integers(4, vocab, shape).astype(np.int64)
            if kind == "tokens"
            else rng.standard_normal(shape).astype(np.float32)
        )
    return out


def output_arrays(out: Any) -> dict[str, np.ndarray]:
    """Every tensor field of a ModelOutput (or a tuple), as float32 NumPy arrays, by field name."""
    import torch

    items = out.items() if hasattr(out, "items") else enumerate(out if isinstance(out, tuple) else (out,))
    return {str(k): v.detach().float().numpy() for k, v in items if isinstance(v, torch.Tensor)}


def _reinitialize(model: Any) -> None:
    """Weights at unit scale: transformers initializes with std 0.02, which keeps every activation so small that
    a tanh-approximated GELU or an untransposed query weight changes the output by less than 1e-4 relative. Each
    matrix or kernel gets std 1/sqrt(fan-in), each norm scale 1 + 0.1 N(0, 1), each bias and shift 0.1 N(0, 1);
    batch norms get running statistics (they start as the identity), so that a port that drops or swaps one
    shows. Fixed tables (``requires_grad=False``: sinusoidal positions) keep their values."""
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if not p.requires_grad:  # a fixed table (sinusoidal positions) is part of the architecture
                continue
            noise = torch.randn(p.shape, generator=g)
            if p.ndim >= 2:
                p.copy_(noise / max(1, p[0].numel()) ** 0.5)
            elif bool((p == 1).all()):
                p.copy_(1 + 0.1 * noise)
            elif bool((p == 0).all()):
                p.copy_(0.1 * noise)
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                n = module.num_features
                module.running_mean.copy_(0.1 * torch.randn(n, generator=g))
                module.running_var.copy_(0.5 + torch.rand(n, generator=g))


def _call_order(model: Any, inputs: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The submodules in the order a plain forward first calls them, with what the bug sites need to know; and
    every module that calls dropout with a rate above 0 (an ``nn.Dropout``, or a module calling
    ``nn.functional.dropout`` itself, as transformers' BART family does), in call order."""
    import torch

    order: dict[str, dict[str, Any]] = {}
    stack: list[tuple[str, bool]] = []
    dropouts: dict[str, dict[str, Any]] = {}
    handles = []
    for path, module in model.named_modules():

        def pre(mod: Any, _args: Any, path: str = path) -> None:
            stack.append((path, isinstance(mod, torch.nn.Dropout)))
            if path in order or not path:
                return
            eps = next(
                (
                    getattr(mod, k)
                    for k in ("eps", "variance_epsilon", "epsilon")
                    if isinstance(getattr(mod, k, None), float)
                ),
                None,
            )
            kind = type(mod).__module__
            order[path] = {
                "path": path,
                "type": type(mod).__name__,
                "eps": eps,
                "dropout": float(mod.p) if isinstance(mod, torch.nn.Dropout) else None,
                "activation": kind.startswith("transformers.activations") or kind == "torch.nn.modules.activation",
                "conv": isinstance(mod, torch.nn.modules.conv._ConvNd),
                "padding": list(mod.padding)
                if isinstance(mod, torch.nn.modules.conv._ConvNd) and not isinstance(mod.padding, str)
                else None,
                "params": [n for n, _ in mod.named_parameters(recurse=False)],
            }

        def post(_mod: Any, _args: Any, _out: Any) -> None:
            stack.pop()

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    functional = torch.nn.functional.dropout

    def dropout(x: Any, p: float = 0.5, *args: Any, **kwargs: Any) -> Any:
        if p > 0 and stack:
            path, is_module = stack[-1]
            dropouts.setdefault(path, {"path": path, "module": is_module, "p": float(p)})
        return functional(x, p, *args, **kwargs)

    torch.nn.functional.dropout = dropout
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        torch.nn.functional.dropout = functional
        for h in handles:
            h.remove()
    return list(order.values()), list(dropouts.values())


def build(arch: Arch, folder: pathlib.Path) -> dict[str, Any]:
    """Build, run, trace and save side a of ``arch`` into ``folder``; the record says how it went."""
    import torch
    import transformers

    import torchlens as tl

    torch.manual_seed(SEED)
    config = getattr(transformers, arch.config_class)(**arch.config)
    cls = getattr(transformers, arch.side_class("torch"))
    try:
        model = cls._from_config(config, attn_implementation="eager")
    except (ValueError, TypeError):
        model = cls(config)
    model.eval()
    _reinitialize(model)
    arrays = draw_inputs(arch, arch.config)
    np.savez(folder / "inputs.npz", **arrays)
    inputs = {k: torch.from_numpy(v) for k, v in arrays.items()}
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    np.savez(folder / "weights.npz", **state)
    full = {k: v for k, v in config.to_dict().items() if not k.startswith("_")}
    write_json(
        folder / "config.json",
        {
            "arch": arch.name,
            "config_class": arch.config_class,
            "config": arch.config,
            "side_a_config": full,
            "side_a_transformers": transformers.__version__,
            "side_a_class": cls.__name__,
        },
    )
    with torch.no_grad():
        plain = output_arrays(model(**inputs))
    (folder / "a").mkdir(exist_ok=True)
    np.savez(folder / "a" / "output.npz", **plain)
    meta: dict[str, Any] = {
        "status": "built",
        "framework": "torch",
        "class": cls.__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "output_fields": sorted(plain),
        "params": len(state),
    }
    meta["modules"], meta["dropout_calls"] = _call_order(model, inputs)
    started = time.perf_counter()
    trace = tl.trace(model, backend="torch", **inputs)
    meta["trace_seconds"] = round(time.perf_counter() - started, 3)
    meta["ops"] = trace.num_ops
    traced = output_arrays(trace.output) if trace.output is not None else {}
    meta["trace_vs_plain"] = gap(plain, traced) if traced else {"rel": None, "why": "no output recorded"}
    if traced and not meta["trace_vs_plain"]["rel"] <= REL_TOL:
        meta["note"] = "the traced output differs from the plain call's"
    tl.save(trace, folder / "a" / "trace")
    return meta
