"""PyTorch's fused inference paths, recorded as the kernels they really run.

In inference, ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention``
skip their decomposed forward and call one fused kernel
(``torch._transformer_encoder_layer_fwd``, ``torch._native_multi_head_attention``),
and ``nn.TransformerEncoder`` given a padding mask runs its layers on a nested
tensor. Each first asks ``torch.overrides.has_torch_function`` of its tensors,
which is true whenever a TorchFunctionMode is active: the recorder's mere
presence would send them down the decomposed path, whose numbers differ from
the untraced forward's (by about 1e-7; by whole units at padded positions for
the nested path).

While a capture runs, every such module of the traced model gets an
instance-level ``forward`` (a :class:`SharedPatch`, so other threads and other
captures are untouched) that asks torch's own conditions as the untraced
forward would, without the recorder's mode (mirrored from torch 2.x,
torch/nn/modules/transformer.py and activation.py). When they hold it runs the
fast path itself, under the recorder: the masks' preparation and the fused
kernel are recorded as the ops they are, the kernel reading the module's
parameters as ParamRefs, so the traced output equals the untraced one bit for
bit and replays exactly. The module's submodules (``self_attn``, ``linear1``...)
then have no passes: untraced, they are not called either. When the
conditions fail, the module's own forward runs, as untraced.

The nested-tensor path of ``nn.TransformerEncoder`` cannot be recorded (a
nested tensor has no shape and cannot be compared or saved): the padded path
is recorded instead, with a warning and an entry in
``trace.notes["observer_effect"]``; ``trace.audit(untraced=True)`` measures
the difference.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import activation as _activation

from torchlens_core.capture.threads import SharedPatch

OBSERVER_EFFECT = "observer_effect"  # trace.notes key: {module path: why its traced run differs from untraced}


@attrs.frozen
class _Handler:
    """What one thread's capture needs when a patched module runs: its recorder, and the module's path."""

    recorder: Any
    path: str


# id(module) -> its patch, while at least one capture uses it (the patch holds the module).
_PATCHES: dict[int, SharedPatch] = {}
_LOCK = threading.Lock()


# The conditions are read through torch internals; a torch that lacks one of them gets no
# rewriting (its traced encoders take the decomposed path, and audit(untraced=True) measures it).
_INTERNALS = (
    (torch.overrides, "_pop_mode_temporarily"),
    (torch.overrides, "_get_current_function_mode_stack"),
    (torch.backends, "mha"),
    (_activation, "_check_arg_device"),
    (_activation, "_is_make_fx_tracing"),
    (F, "_canonical_mask"),
    (F, "_none_or_dtype"),
    (torch, "_nested_tensor_from_mask_left_aligned"),
    (torch, "_transformer_encoder_layer_fwd"),
    (torch, "_native_multi_head_attention"),
    (torch.utils.backend_registration, "_privateuse1_backend_name"),
)
SUPPORTED = all(hasattr(owner, name) for owner, name in _INTERNALS)


@contextlib.contextmanager
def recorded_as_run(model: Any, recorder: Any, named: list[tuple[str, nn.Module]] | None = None) -> Iterator[None]:
    """While the block runs, ``model``'s fused-path modules record the path torch really takes.

    ``recorder`` is the capture's TorchFunctionMode (with a ``builder``); ``named``: the model's
    ``named_modules()``, where the caller has them already. Modules whose class or instance overrides
    ``forward`` are left alone.
    """
    targets = []
    root = model if isinstance(model, nn.Module) else getattr(model, "__self__", None)  # model.forward too
    if SUPPORTED and isinstance(root, nn.Module):
        for path, module in named if named is not None and root is model else root.named_modules():
            run = _RUNNERS.get(type(module).forward) if "forward" not in vars(module) else None
            if run is not None:
                targets.append((path, module, run))
    entered: list[tuple[int, SharedPatch, Any]] = []
    try:
        with _LOCK:
            for path, module, run in targets:
                patch = _PATCHES.get(id(module))
                if patch is None:
                    patch = _PATCHES[id(module)] = SharedPatch(module, "forward", _replacement(module, run))
                if threading.get_ident() in patch.handlers:
                    continue  # a capture inside a traced forward: the outer one keeps the module
                use = patch.use(_Handler(recorder, path))
                use.__enter__()
                entered.append((id(module), patch, use))
        yield
    finally:
        with _LOCK:
            for key, patch, use in reversed(entered):
                use.__exit__(None, None, None)
                if not patch.installed and _PATCHES.get(key) is patch:
                    del _PATCHES[key]


@functools.lru_cache(maxsize=64)  # every capture patches the same few classes' modules again
def _binder(forward: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any] | None]:
    """``bind(args, kwargs)``: ``forward``'s arguments by name, defaults filled in, as ``inspect``'s
    ``bind(...).apply_defaults()`` gives them; None where the call does not fit the signature (torch then
    raises its own error). Worked out once per ``forward``: ``Signature.bind`` costs tens of microseconds a
    call."""
    signature = inspect.signature(forward)
    params = list(signature.parameters.values())
    if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):

        def bind_any(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
            try:
                call = signature.bind(*args, **kwargs)
            except TypeError:
                return None
            call.apply_defaults()
            return dict(call.arguments)

        return bind_any
    positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    names = frozenset(p.name for p in params)

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        if len(args) > len(positional):
            return None
        given = dict(zip(positional, args))
        if kwargs:
            if not names.issuperset(kwargs) or not given.keys().isdisjoint(kwargs):
                return None
            given.update(kwargs)
        if len(given) < len(names):
            given = {**defaults, **given}
            if len(given) < len(names):  # a required argument missing
                return None
        return given

    return bind


# runner(handler, module, arguments by name) -> what the fast path returned, or NotImplemented: run the module's
# own forward.
Runner = Callable[[_Handler, Any, dict[str, Any]], Any]


def _replacement(module: Any, run: Runner) -> Callable[[Any, dict[int, Any]], Any]:
    bind = _binder(type(module).forward)

    def make(original: Callable[..., Any], handlers: dict[int, Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            handler = handlers.get(threading.get_ident())
            # Untraced, any other function mode (the user's own) disables the fast path too.
            if handler is None or torch.overrides._get_current_function_mode_stack() != [handler.recorder]:
                return original(*args, **kwargs)
            arguments = bind((module, *args), kwargs)
            if arguments is None:
                return original(*args, **kwargs)  # let torch raise its own error
            out = run(handler, module, arguments)
            return original(*args, **kwargs) if out is NotImplemented else out

        return forward

    return make


# -- the conditions, as an untraced forward sees them ---------------------------------------
def _untraced_has_torch_function(tensors: tuple[Any, ...]) -> bool:
    """``has_torch_function`` without the recorder's mode (the only one active): true for tensor subclasses."""
    with torch.overrides._pop_mode_temporarily():
        return torch.overrides.has_torch_function(tensors)


def _needs_grad(tensors: tuple[Any, ...]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _hooked(module: nn.Module) -> bool:
    return any(
        len(getattr(m, "_forward_hooks", {})) + len(getattr(m, "_forward_pre_hooks", {})) for m in module.modules()
    )


def _layer_tensors(src: Any, layer: Any) -> tuple[Any, ...]:
    sa = layer.self_attn
    return (
        src,
        sa.in_proj_weight,
        sa.in_proj_bias,
        sa.out_proj.weight,
        sa.out_proj.bias,
        layer.norm1.weight,
        layer.norm1.bias,
        layer.norm2.weight,
        layer.norm2.bias,
        layer.linear1.weight,
        layer.linear1.bias,
        layer.linear2.weight,
        layer.linear2.bias,
    )


def _layer_devices() -> tuple[str, ...]:
    return ("cpu", "cuda", "xpu", torch.utils.backend_registration._privateuse1_backend_name)


def _encoder_layer_fused(layer: Any, src: Any, src_mask: Any, padding_mask: Any) -> bool:
    """Would ``TransformerEncoderLayer.forward``, untraced, call ``torch._transformer_encoder_layer_fwd``?"""
    sa = layer.self_attn
    if not (
        isinstance(src, torch.Tensor)
        and torch.backends.mha.get_fastpath_enabled()
        and src.dim() == 3
        and not layer.training
        and sa.batch_first
        and sa.in_proj_bias is not None
        and sa._qkv_same_embed_dim
        and layer.activation_relu_or_gelu
        and layer.norm1.eps == layer.norm2.eps
        and not (src.is_nested and (padding_mask is not None or src_mask is not None))
        and sa.num_heads % 2 == 0
        and not torch.is_autocast_enabled()
        and not _hooked(layer)
    ):
        return False
    tensors = _layer_tensors(src, layer)
    devices = _layer_devices()
    return not (
        _untraced_has_torch_function(tensors)
        or not all(t.device.type in devices for t in tensors)
        or _needs_grad(tensors)
    )


def _attention_fused(mha: Any, query: Any, key: Any, value: Any, padding_mask: Any, attn_mask: Any) -> bool:
    """Would ``MultiheadAttention.forward``, untraced, call ``torch._native_multi_head_attention``?"""
    if not isinstance(query, torch.Tensor):
        return False
    if (attn_mask is not None and torch.is_floating_point(attn_mask)) or (
        padding_mask is not None and torch.is_floating_point(padding_mask)
    ):
        return False
    weight, bias = mha.in_proj_weight, mha.in_proj_bias
    # Without an input bias torch still takes the decomposed path, after merging masks it does not use.
    if not (
        torch.backends.mha.get_fastpath_enabled()
        and query.dim() == 3
        and query is key
        and key is value
        and weight is not None
        and bias is not None
        and query.dtype == bias.dtype == weight.dtype
        and not mha.training
        and mha.num_heads % 2 == 0
        and mha.batch_first
        and mha.bias_k is None
        and mha.bias_v is None
        and not mha.add_zero_attn
        and mha._qkv_same_embed_dim
        and not (query.is_nested and (padding_mask is not None or attn_mask is not None))
        and not torch.is_autocast_enabled()
    ):
        return False
    tensors = (query, key, value, weight, bias, mha.out_proj.weight, mha.out_proj.bias)
    return not (
        _untraced_has_torch_function(tensors)
        or not all(map(_activation._check_arg_device, tensors))
        or _needs_grad(tensors)
        or _activation._is_make_fx_tracing()
    )


def _encoder_nested(encoder: Any, src: Any, mask: Any, padding_mask: Any) -> bool:
    """Would ``TransformerEncoder.forward``, untraced, run its layers on a nested tensor?"""
    layer = encoder.layers[0]
    if not (
        isinstance(src, torch.Tensor)
        and torch.backends.mha.get_fastpath_enabled()
        and getattr(encoder, "use_nested_tensor", False)
        and not layer.training
        and src.dim() == 3
        and padding_mask is not None
        and not src.is_nested
        and mask is None
        and not torch.is_autocast_enabled()
    ):
        return False
    if getattr(encoder, "mask_check", True):
        if torch.compiler.is_compiling():
            return False
        with torch._C.DisableTorchFunction():  # a question, not part of the forward: record nothing
            canonical = F._canonical_mask(
                mask=padding_mask,
                mask_name="src_key_padding_mask",
                other_type=None,
                other_name="",
                target_type=src.dtype,
                check_other=False,
            )
            if not torch._nested_tensor_from_mask_left_aligned(src, canonical.logical_not()):
                return False
    tensors = _layer_tensors(src, layer)
    return not (
        _untraced_has_torch_function(tensors) or src.device.type not in _layer_devices() or _needs_grad(tensors)
    )


# -- the fast paths, as torch runs them ------------------------------------------------------
def _run_encoder_layer(handler: _Handler, layer: Any, a: dict[str, Any]) -> Any:
    src, src_mask, padding_mask = a["src"], a["src_mask"], a["src_key_padding_mask"]
    if not _encoder_layer_fused(layer, src, src_mask, padding_mask):
        return NotImplemented
    padding_mask = F._canonical_mask(
        mask=padding_mask,
        mask_name="src_key_padding_mask",
        other_type=F._none_or_dtype(src_mask),
        other_name="src_mask",
        target_type=src.dtype,
    )
    src_mask = F._canonical_mask(
        mask=src_mask, mask_name="src_mask", other_type=None, other_name="", target_type=src.dtype, check_other=False
    )
    sa = layer.self_attn
    merged_mask, mask_type = sa.merge_masks(src_mask, padding_mask, src)
    return torch._transformer_encoder_layer_fwd(
        src,
        sa.embed_dim,
        sa.num_heads,
        sa.in_proj_weight,
        sa.in_proj_bias,
        sa.out_proj.weight,
        sa.out_proj.bias,
        layer.activation_relu_or_gelu == 2,
        layer.norm_first,
        layer.norm1.eps,
        layer.norm1.weight,
        layer.norm1.bias,
        layer.norm2.weight,
        layer.norm2.bias,
        layer.linear1.weight,
        layer.linear1.bias,
        layer.linear2.weight,
        layer.linear2.bias,
        merged_mask,
        mask_type,
    )


def _run_attention(handler: _Handler, mha: Any, a: dict[str, Any]) -> Any:
    query, padding_mask, attn_mask = a["query"], a["key_padding_mask"], a["attn_mask"]
    if not _attention_fused(mha, query, a["key"], a["value"], padding_mask, attn_mask):
        return NotImplemented
    padding_mask = F._canonical_mask(
        mask=padding_mask,
        mask_name="key_padding_mask",
        other_type=F._none_or_dtype(attn_mask),
        other_name="attn_mask",
        target_type=query.dtype,
    )
    attn_mask = F._canonical_mask(
        mask=attn_mask,
        mask_name="attn_mask",
        other_type=None,
        other_name="",
        target_type=query.dtype,
        check_other=False,
    )
    merged_mask, mask_type = mha.merge_masks(attn_mask, padding_mask, query)
    return torch._native_multi_head_attention(
        query,
        a["key"],
        a["value"],
        mha.embed_dim,
        mha.num_heads,
        mha.in_proj_weight,
        mha.in_proj_bias,
        mha.out_proj.weight,
        mha.out_proj.bias,
        merged_mask,
        a["need_weights"],
        a["average_attn_weights"],
        mask_type,
    )


def _run_encoder(handler: _Handler, encoder: Any, a: dict[str, Any]) -> Any:
    if _encoder_nested(encoder, a["src"], a["mask"], a["src_key_padding_mask"]):
        why = (
            "untraced, it runs its layers on a nested tensor built from src_key_padding_mask (padded positions "
            "come out as 0); a nested tensor cannot be recorded, so the trace has the padded path"
        )
        notes = handler.recorder.builder.notes.setdefault(OBSERVER_EFFECT, {})
        if handler.path not in notes:
            notes[handler.path] = why
            warnings.warn(
                f"TorchLens: the traced {handler.path or 'model'} (nn.TransformerEncoder) differs from "
                f"its untraced run: {why}. Pass enable_nested_tensor=False to the encoder for a "
                f"faithful trace; trace.audit(untraced=True) measures the difference",
                stacklevel=2,
            )
    return NotImplemented


_RUNNERS: dict[Any, Runner] = {
    nn.TransformerEncoderLayer.forward: _run_encoder_layer,
    nn.MultiheadAttention.forward: _run_attention,
    nn.TransformerEncoder.forward: _run_encoder,
}
