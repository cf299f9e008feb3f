"""Facets of torch modules (``module.facets['q']``): which recorded values are an attention's q, k, v, pattern...

Recipes read the trace, never the model. Each recognises a module call by
the kernel that ran directly inside it, whatever library the module comes
from:

- attention: one ``scaled_dot_product_attention`` (timm ``Attention``,
  Hugging Face GPT-2/BERT/Llama with SDPA), or ``softmax(q @ k^T ...) @ v``
  written out (eager attention). q, k, v and the per-head output z are the
  kernel's recorded arguments and output; the pattern and scores are
  recorded when written out, else recomputed from q, k and the kernel's mask
  and causal flag, and checked to reproduce the kernel's output;
- ``nn.MultiheadAttention``: its one fused op (``multi_head_attention_forward``
  or the inference fast path); q, k, v, z and the pattern are recomputed from
  the recorded inputs and the module's parameters, checked against the
  recorded output;
- LSTM, GRU, RNN: ``output``, ``h_n`` (and ``c_n``) as the module returned them;
- a pre-norm residual block (GPT-2, ViT, Llama decoder layers): the residual
  stream before, between and after its attention and MLP, and what each adds.

Grouped-query keys and values are given with their own heads: a
``repeat_kv`` before the product is looked through.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from torchlens_core.ir.records import ModulePass, OpRecord, ParamRef, Ref, refs_in, shape_at
from torchlens_core.ir.trace import Trace
from torchlens_core.views.facets import FacetArrays, FacetError, FacetPlan, FacetSpec


class TorchFacetArrays(FacetArrays):
    def put(self, x: torch.Tensor, axis: int, index: int, part: torch.Tensor) -> torch.Tensor:
        # index_copy is out of place and differentiable: a per-head edit keeps the autograd graph.
        return x.index_copy(axis, torch.tensor([index], device=x.device), part.unsqueeze(axis))

    def permute(self, x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
        return x.permute(*axes)


ARRAYS = TorchFacetArrays()

HEADS = ("batch", "head", "seq", "head_dim")
PATTERN = ("batch", "head", "query", "key")
STREAM = ("batch", "seq", "d_model")
SDPA = "scaled_dot_product_attention"
MHA_KERNELS = ("multi_head_attention_forward", "native_multi_head_attention")
RNN_KERNELS = {
    "lstm": ("output", "h_n", "c_n"),
    "gru": ("output", "h_n"),
    "rnn_tanh": ("output", "h_n"),
    "rnn_relu": ("output", "h_n"),
}
ATTENTION_FUNCS = (SDPA, "softmax", *MHA_KERNELS)
# Ops that hand on their input's value unchanged when dtype and shape stay (a float32 .to(float32), an
# eval-mode dropout): a residual read through one of them is still the residual.
SAME_VALUE = ("to", "type", "float", "contiguous", "clone", "identity", "detach", "dropout")
MATMULS = ("matmul", "__matmul__", "bmm")

SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
F_MHA_ARGS = (
    "query",
    "key",
    "value",
    "embed_dim_to_check",
    "num_heads",
    "in_proj_weight",
    "in_proj_bias",
    "bias_k",
    "bias_v",
    "add_zero_attn",
    "dropout_p",
    "out_proj_weight",
    "out_proj_bias",
    "training",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "use_separate_proj_weight",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "static_k",
    "static_v",
    "average_attn_weights",
    "is_causal",
)
F_MHA_DEFAULTS = {
    "training": True,
    "key_padding_mask": None,
    "need_weights": True,
    "attn_mask": None,
    "use_separate_proj_weight": False,
    "q_proj_weight": None,
    "k_proj_weight": None,
    "v_proj_weight": None,
    "static_k": None,
    "static_v": None,
    "average_attn_weights": True,
    "is_causal": False,
}
NATIVE_MHA_ARGS = (
    "query",
    "key",
    "value",
    "embed_dim",
    "num_heads",
    "in_proj_weight",
    "in_proj_bias",
    "out_proj_weight",
    "out_proj_bias",
    "mask",
    "need_weights",
    "average_attn_weights",
    "mask_type",
)


def facets(trace: Trace, module_pass: ModulePass) -> FacetPlan | None:
    """The ``torchlens_facets`` hook: the first recipe that recognises the call, else None (or only notes)."""
    call = _Call(trace, module_pass)
    notes: list[str] = []
    for recipe in (_recurrent, _multihead, _attention, _residual_block):
        plan = recipe(call, notes)
        if plan is not None:
            return plan
    return FacetPlan("unrecognised", (), ARRAYS, tuple(notes)) if notes else None


class _Call:
    """One module pass and the lookups the recipes share."""

    def __init__(self, trace: Trace, module_pass: ModulePass) -> None:
        self.trace = trace
        self.mp = module_pass
        self.key = (module_pass.path, module_pass.pass_num)
        self.ops = [trace[label] for label in module_pass.ops]
        self.inside = {op.index for op in self.ops}
        self.direct = [op for op in self.ops if op.module_passes and op.module_passes[-1] == self.key]
        self.start = min(self.inside) if self.inside else len(trace.ops)

    def op(self, ref: Ref) -> OpRecord:
        return self.trace.ops[ref.index]

    def shape(self, ref: Any) -> Any:
        return shape_at(self.trace.ops[ref.index].shape, ref.path) if isinstance(ref, Ref) else None

    def dims(self, ref: Any) -> int:
        shape = self.shape(ref)
        return len(shape) if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape) else -1

    def parent(self, op: OpRecord) -> Ref | None:
        """The op's one non-empty array argument, if it has exactly one (a cat onto an empty cache has one)."""
        refs = [r for r in refs_in((op.args, op.kwargs)) if 0 not in (self.shape(r) or (1,))]
        return refs[0] if len(refs) == 1 else None

    def children(self, op: OpRecord) -> list[OpRecord]:
        return [self.trace[label] for label in op.children]


def _bind(op: OpRecord, names: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
    bound = dict(defaults)
    bound.update(zip(names, op.args))
    bound.update(op.kwargs)
    return bound


def _spec(
    name: str,
    doc: str,
    source: Any,
    axes: tuple[str, ...] | None = None,
    compute: Callable[[Any], Any] | None = None,
    split: int | None = None,
) -> FacetSpec:
    return FacetSpec(name=name, doc=doc, source=source, axes=axes, compute=compute, split=split)


# -- LSTM, GRU, RNN --------------------------------------------------------------------------------
def _recurrent(call: _Call, notes: list[str]) -> FacetPlan | None:
    kernels = [op for op in call.direct if op.func_name in RNN_KERNELS]
    if not kernels:
        return None
    if len(kernels) > 1:
        notes.append(f"{len(kernels)} recurrent kernels ran directly in this call, so which is which is unclear")
        return None
    op = kernels[0]
    names = RNN_KERNELS[op.func_name]
    template = call.mp.out_template
    # nn.LSTM returns (output, (h_n, c_n)), nn.GRU and nn.RNN (output, h_n): read them where the module returned
    # them (an unbatched input's squeeze, an unsorted PackedSequence's reordering included); another shape of
    # return is read from the kernel's own outputs.
    hidden = template[1] if isinstance(template, tuple) and len(template) == 2 else None
    if len(names) == 3 and isinstance(hidden, tuple) and len(hidden) == 2:
        sources: tuple[Any, ...] = (template[0], hidden[0], hidden[1])
    elif len(names) == 2 and isinstance(hidden, Ref):
        sources = (template[0], hidden)
    else:
        sources = tuple(Ref(op.index, (i,)) for i in range(len(names)))
    weights = next((i for i, a in enumerate(op.args) if isinstance(a, list)), 2)
    packed = weights == 3  # lstm/gru(data, batch_sizes, hx, weights, ...) for a PackedSequence
    batch_first = bool(op.args[weights + 6]) if not packed and len(op.args) > weights + 6 else False
    specs = []
    for name, source in zip(names, sources):
        ndim = call.dims(source)
        if name == "output":
            axes = (
                (("batch", "seq", "features") if batch_first else ("seq", "batch", "features"))
                if ndim == 3
                else ("seq", "features")
                if ndim == 2
                else None
            )
            doc = "every step's hidden state of the last layer (both directions side by side)"
            specs.append(_spec(name, doc, source, axes))
        else:
            axes = ("layer_direction", "batch", "hidden") if ndim == 3 else ("layer_direction", "hidden")
            what = "hidden" if name == "h_n" else "cell"
            specs.append(
                _spec(
                    name, f"the final {what} state of each layer and direction ('{name}.i': one)", source, axes, split=0
                )
            )
    return FacetPlan("recurrent", tuple(specs), ARRAYS)


# -- nn.MultiheadAttention --------------------------------------------------------------------------
def _multihead(call: _Call, notes: list[str]) -> FacetPlan | None:
    kernels = [op for op in call.direct if op.func_name in MHA_KERNELS]
    if not kernels:
        return None
    if len(kernels) > 1:
        notes.append(f"{len(kernels)} multi-head attention kernels ran directly in this call")
        return None
    op = kernels[0]
    native = op.func_name == "native_multi_head_attention"
    bound = _bind(op, NATIVE_MHA_ARGS, {}) if native else _bind(op, F_MHA_ARGS, F_MHA_DEFAULTS)
    unusual = [k for k in ("bias_k", "bias_v", "static_k", "static_v") if bound.get(k) is not None]
    if bound.get("add_zero_attn"):
        unusual.append("add_zero_attn")
    if unusual:
        notes.append(f"{op.label} ran with {', '.join(unusual)}, which the facets do not reconstruct")
        return None
    if not isinstance(bound.get("in_proj_weight"), ParamRef) and not bound.get("use_separate_proj_weight"):
        notes.append(f"{op.label}'s projection weights are not parameters of the traced model")
        return None
    source = {**bound, "native": native, "out": Ref(op.index, (0,))}
    kernel = f"recomputed from {op.label}'s inputs and the module's parameters (as they are now)"
    # An unbatched call (2-D query) has no batch axis in what it returns; nor have its facets.
    batched = native or call.dims(bound["query"]) != 2
    heads, pattern = (HEADS, PATTERN) if batched else (HEADS[1:], PATTERN[1:])

    def pick(name: str) -> Callable[[Any], Any]:
        return lambda values: _multihead_values(values, op.label)[name][(slice(None) if batched else 0)]

    specs = (
        _spec("q", f"queries, {kernel}", source, heads, pick("q"), split=heads.index("head")),
        _spec("k", f"keys, {kernel}", source, heads, pick("k"), split=heads.index("head")),
        _spec("v", f"values, {kernel}", source, heads, pick("v"), split=heads.index("head")),
        _spec(
            "z", f"each head's output before out_proj, {kernel}", source, heads, pick("z"), split=heads.index("head")
        ),
        _spec(
            "scores", f"q k^T * scale + masks, {kernel}", source, pattern, pick("scores"), split=pattern.index("head")
        ),
        _spec(
            "pattern", f"softmax of the scores, {kernel}", source, pattern, pick("pattern"), split=pattern.index("head")
        ),
    )
    return FacetPlan("attention", specs, ARRAYS)


def _multihead_values(b: dict[str, Any], kernel: str) -> dict[str, torch.Tensor]:
    """q, k, v, z, scores and pattern of one recorded multi-head attention call, checked against its output."""
    native = b["native"]
    query, key, value = b["query"], b["key"], b["value"]
    unbatched = not native and query.dim() == 2
    if native:  # the fast path takes batch-first inputs
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    elif unbatched:
        query, key, value = (t.unsqueeze(1) for t in (query, key, value))
    dtype = torch.promote_types(query.dtype, torch.float32)
    length, batch, embed = query.shape
    heads = int(b["num_heads"])
    head_dim = embed // heads
    bias = b["in_proj_bias"]
    b_q, b_k, b_v = bias.to(dtype).chunk(3) if bias is not None else (None, None, None)
    if not native and b["use_separate_proj_weight"]:
        w_q, w_k, w_v = (b[n].to(dtype) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    else:
        w_q, w_k, w_v = b["in_proj_weight"].to(dtype).chunk(3)

    def split_heads(x: torch.Tensor) -> torch.Tensor:  # (seq, batch, embed) -> (batch, head, seq, head_dim)
        return x.reshape(x.shape[0], batch, heads, -1).permute(1, 2, 0, 3)

    q = split_heads(F.linear(query.to(dtype), w_q, b_q))
    k = split_heads(F.linear(key.to(dtype), w_k, b_k))
    v = split_heads(F.linear(value.to(dtype), w_v, b_v))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
    source = k.shape[-2]
    if native:
        scores = scores + _mha_mask(b["mask"], batch, heads, length, source, dtype, padding=b["mask_type"] == 1)
    else:
        scores = scores + _mha_mask(b["attn_mask"], batch, heads, length, source, dtype, padding=False)
        scores = scores + _mha_mask(b["key_padding_mask"], batch, heads, length, source, dtype, padding=True)
    pattern = _safe_softmax(scores)
    z = pattern @ v
    if native or not (b["training"] and b["dropout_p"] > 0):  # with dropout the output used other weights
        merged = z.permute(2, 0, 1, 3).reshape(length, batch, embed)
        out = F.linear(
            merged, b["out_proj_weight"].to(dtype), None if b["out_proj_bias"] is None else b["out_proj_bias"].to(dtype)
        )
        out = out.transpose(0, 1) if native else out.squeeze(1) if unbatched else out
        _check(
            out,
            b["out"],
            None,
            kernel,
            "the module's recorded output",
            "were the module's parameters changed after the capture?",
        )
    return {"q": q, "k": k, "v": v, "z": z, "scores": scores, "pattern": pattern}


def _mha_mask(
    mask: torch.Tensor | None, batch: int, heads: int, length: int, source: int, dtype: torch.dtype, padding: bool
) -> torch.Tensor | float:
    """A multi-head attention mask as an additive (batch, head, query, key) bias; True means masked out."""
    if mask is None:
        return 0.0
    bias = (
        torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)
        if mask.dtype == torch.bool
        else mask.to(dtype)
    )
    if padding and bias.dim() == 2:  # key_padding_mask: (batch, key)
        return bias.reshape(batch, 1, 1, source)
    if bias.dim() == 2:  # (query, key)
        return bias.reshape(1, 1, length, source)
    return bias.reshape(batch, heads, length, source)  # (batch * head, query, key) or already 4-D


# -- attention: one SDPA kernel, or softmax(q k^T) v written out -----------------------------------
def _attention(call: _Call, notes: list[str]) -> FacetPlan | None:
    kernels = [op for op in call.direct if op.func_name == SDPA]
    if len(kernels) > 1:
        notes.append(
            f"{len(kernels)} attention kernels ran directly in this call ({kernels[0].label}...), so "
            f"which one the facets would name is unclear"
        )
        return None
    if kernels:
        return _fused_attention(call, kernels[0], notes)
    found = [core for core in (_written_out(call, op) for op in call.direct if op.func_name == "softmax") if core]
    if len(found) > 1:
        notes.append(f"{len(found)} softmax(q k^T) v products ran directly in this call")
        return None
    return _written_out_plan(call, *found[0], notes) if found else None


def _fused_attention(call: _Call, op: OpRecord, notes: list[str]) -> FacetPlan | None:
    b = _bind(op, SDPA_ARGS, SDPA_DEFAULTS)
    q, k_used, v_used = b["query"], b["key"], b["value"]
    if not all(isinstance(r, Ref) and call.dims(r) == 4 for r in (q, k_used, v_used)):
        notes.append(f"{op.label} does not take (batch, head, seq, head_dim) arrays")
        return None
    k, v = _unrepeat(call, k_used), _unrepeat(call, v_used)
    scale = b["scale"] if b["scale"] is not None else 1.0 / math.sqrt(call.shape(q)[-1])
    source = (q, k_used, v_used, b["attn_mask"], Ref(op.index))
    dropout = float(b["dropout_p"] or 0.0) > 0.0
    how = f"recomputed from q, k and {op.label}'s mask and scale, as the kernel keeps it inside " + (
        "(not checked: dropout ran)" if dropout else "(checked against its output)"
    )

    def recompute(name: str) -> Callable[[Any], Any]:
        def compute(values: Any) -> torch.Tensor:
            q_, k_, v_, mask, z = values
            scores = _sdpa_scores(q_, k_, mask, bool(b["is_causal"]), scale)
            pattern = _safe_softmax(scores)
            if not dropout:
                _check(
                    pattern @ _repeat_heads(v_.to(pattern.dtype), pattern.shape[1]),
                    z,
                    pattern,
                    op.label,
                    f"{op.label}'s recorded output",
                    "its mask or scaling was not understood",
                )
            return scores if name == "scores" else pattern

        return compute

    specs = [
        *_qkv_specs(call, q, k, v, f"as {op.label} took them"),
        _spec("z", f"each head's attention output ({op.label}'s output)", Ref(op.index), HEADS, split=1),
        _spec("scores", f"q k^T * scale + mask, {how}", source, PATTERN, recompute("scores"), split=1),
        _spec("pattern", f"the attention probabilities, {how}", source, PATTERN, recompute("pattern"), split=1),
    ]
    return FacetPlan("attention", (*specs, *_fused_projection(call, q, k, v)), ARRAYS, tuple(notes))


def _written_out(call: _Call, softmax: OpRecord) -> tuple[OpRecord, OpRecord, OpRecord] | None:
    """``(q k^T matmul, softmax, pattern @ v matmul)`` around one softmax over keys, or None."""
    scores = softmax.args[0] if softmax.args else None
    dim = softmax.kwargs.get("dim", softmax.args[1] if len(softmax.args) > 1 else None)
    if not isinstance(scores, Ref) or call.dims(scores) != 4 or dim not in (-1, 3):
        return None
    product = _walk_back_to_product(call, scores)
    if product is None:
        return None
    frontier, seen = [softmax], set()
    while frontier:  # forward through casts and dropout to the product with v
        op = frontier.pop()
        for child in call.children(op):
            if child.index in seen or child.index not in call.inside:
                continue
            seen.add(child.index)
            if (
                child.func_name in MATMULS
                and child.args
                and isinstance(child.args[0], Ref)
                and child.args[0].index == op.index
            ):
                return product, softmax, child
            if child.func_name in (*SAME_VALUE, "type_as"):
                frontier.append(child)
    return None


def _walk_back_to_product(call: _Call, scores: Ref) -> OpRecord | None:
    """The ``q @ k^T`` matmul the scores come from, through scaling, masking and casts (a few ops back)."""
    target = call.shape(scores)
    frontier = [call.op(scores)]
    for _ in range(6):
        nxt = []
        for op in frontier:
            if op.func_name in MATMULS and op.shape == target:
                return op
            if op.index in call.inside and op.func_name in (
                "add",
                "sub",
                "mul",
                "div",
                "masked_fill",
                "where",
                *SAME_VALUE,
            ):
                nxt += [call.op(r) for r in refs_in(op.args) if call.shape(r) == target]
        frontier = nxt
    return None


def _written_out_plan(
    call: _Call, product: OpRecord, softmax: OpRecord, weighted: OpRecord, notes: list[str]
) -> FacetPlan | None:
    q, k_t = (product.args + (None, None))[:2]
    if not isinstance(q, Ref) or not isinstance(k_t, Ref):
        return None
    transposed = call.op(k_t)
    swaps = (
        {transposed.args[1] % 4, transposed.args[2] % 4}
        if transposed.func_name == "transpose"
        and len(transposed.args) == 3
        and all(isinstance(a, int) for a in transposed.args[1:])
        else set()
    )
    if swaps != {2, 3} or not isinstance(transposed.args[0], Ref):
        notes.append(f"the keys of {product.label} do not come from a transpose(-2, -1)")
        return None
    scaled = call.op(q)
    if scaled.func_name in ("mul", "div") and scaled.index in call.inside:  # q * scale before the product
        refs = refs_in(scaled.args)
        if len(refs) == 1 and call.shape(refs[0]) == call.shape(q):
            q = refs[0]
    v_used = weighted.args[1] if len(weighted.args) > 1 else None
    if not isinstance(v_used, Ref) or call.dims(q) != 4 or call.dims(v_used) != 4:
        return None
    k, v = _unrepeat(call, transposed.args[0]), _unrepeat(call, v_used)
    specs = [
        *_qkv_specs(call, q, k, v, f"as {product.label} and {weighted.label} took them"),
        _spec("z", f"each head's attention output ({weighted.label})", Ref(weighted.index), HEADS, split=1),
        _spec(
            "scores",
            f"the softmax's input ({call.op(softmax.args[0]).label}): q k^T scaled and masked as the model did",
            softmax.args[0],
            PATTERN,
            split=1,
        ),
        _spec("pattern", f"the attention probabilities ({softmax.label})", Ref(softmax.index), PATTERN, split=1),
    ]
    return FacetPlan("attention", (*specs, *_fused_projection(call, q, k, v)), ARRAYS, tuple(notes))


def _qkv_specs(call: _Call, q: Ref, k: Ref, v: Ref, where: str) -> list[FacetSpec]:
    grouped = call.shape(k)[1] != call.shape(q)[1]
    note = "; grouped-query: query head h reads key head h // (heads // kv_heads)" if grouped else ""
    return [
        _spec("q", f"queries, {where} ({call.op(q).label})", q, HEADS, split=1),
        _spec("k", f"keys, {where} ({call.op(k).label}){note}", k, HEADS, split=1),
        _spec("v", f"values, {where} ({call.op(v).label}){note}", v, HEADS, split=1),
    ]


def _fused_projection(call: _Call, q: Ref, k: Ref, v: Ref) -> list[FacetSpec]:
    """``qkv``: the one projection q, k and v were split from (timm's qkv Linear, GPT-2's c_attn), if any."""
    chains = [_chain(call, r) for r in (q, k, v)]
    common = next((i for i in chains[0] if i in chains[1] and i in chains[2]), None)
    if common is None:
        return []
    prefix = call.mp.path + "."
    for index in chains[0][chains[0].index(common) :]:
        op = call.trace.ops[index]
        for returned in op.module_outputs:
            path = returned.rpartition(":")[0]
            if path.startswith(prefix) and "." not in path[len(prefix) :]:
                axes = ("batch", "seq", "features") if len(op.shape or ()) == 3 else None
                return [
                    _spec(
                        "qkv",
                        f"the fused projection's output ({path}), that q, k and v were split from",
                        Ref(index),
                        axes,
                    )
                ]
    return []


def _chain(call: _Call, ref: Ref) -> list[int]:
    """The ops ``ref`` comes from through one-input ops inside the call (reshapes, splits), nearest first."""
    found: list[int] = []
    op = call.op(ref)
    while op.index in call.inside and len(found) < 16:
        found.append(op.index)
        parent = call.parent(op)
        if parent is None:
            break
        op = call.op(parent)
    return found


def _unrepeat(call: _Call, ref: Ref) -> Ref:
    """Grouped-query keys/values before ``repeat_kv`` (``x[:, :, None].expand(...).reshape(...)``)."""
    op = call.op(ref)
    source: Any = None
    if op.func_name == "repeat_interleave":
        source = op.args[0] if op.args else None
    elif op.func_name in ("reshape", "view", "flatten"):
        expand = call.op(op.args[0]) if op.args and isinstance(op.args[0], Ref) else None
        if expand is not None and expand.func_name == "expand" and isinstance(expand.args[0], Ref):
            inserted = call.op(expand.args[0])
            if inserted.func_name in ("getitem", "unsqueeze") and inserted.args and isinstance(inserted.args[0], Ref):
                source = inserted.args[0]
    if not isinstance(source, Ref) or call.dims(source) != 4:
        return ref
    before, after = call.shape(source), call.shape(ref)
    same = before[0] == after[0] and before[2:] == after[2:] and after[1] % before[1] == 0
    return source if same else ref


def _sdpa_scores(q: torch.Tensor, k: torch.Tensor, mask: Any, is_causal: bool, scale: float) -> torch.Tensor:
    """What ``scaled_dot_product_attention`` feeds its softmax (its reference implementation), in float32 or wider."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k = q.to(dtype), _repeat_heads(k.to(dtype), q.shape[1])
    scores = (q @ k.transpose(-2, -1)) * scale
    length, source = q.shape[-2], k.shape[-2]
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    if isinstance(mask, torch.Tensor):
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(dtype)
    return scores


def _repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys; a query that may attend to nothing gets zeros, as torch's attention kernels give."""
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def _check(
    computed: torch.Tensor, recorded: torch.Tensor, pattern: torch.Tensor | None, kernel: str, what: str, hint: str
) -> None:
    """A recomputed facet must reproduce the kernel's recorded output: a wrong mask must not pass silently."""
    expected = recorded.detach().to(computed.dtype)
    diff = (computed.detach() - expected).abs() / (1 + expected.abs())
    if pattern is not None:  # queries that attend to nothing: kernels differ (zeros, NaN); not compared
        diff = diff.masked_fill((pattern == 0).all(dim=-1, keepdim=True), 0.0)
    error = float(diff.max()) if diff.numel() else 0.0
    tolerance = max(1e-4, 8 * torch.finfo(recorded.dtype).eps) if recorded.is_floating_point() else 1e-4
    if not error <= tolerance:
        raise FacetError(
            f"the attention recomputed for {kernel} does not reproduce {what} (error {error:.3g}, "
            f"tolerance {tolerance:.1g}): {hint}. Capture the model with attention written out "
            f"(transformers: attn_implementation='eager'; timm: attn.fused_attn = False) to read the "
            f"recorded pattern"
        )


# -- pre-norm residual blocks ----------------------------------------------------------------------
def _residual_block(call: _Call, notes: list[str]) -> FacetPlan | None:
    outs = refs_in(call.mp.out_template)
    if not outs:
        return None
    last = call.op(outs[0])
    if last.func_name != "add" or last.index not in call.inside or len(refs_in(last.args)) != 2:
        return None
    shape = last.shape
    pair = _residual_and_branch(call, last, shape)
    if pair is None:
        return None
    mid_ref, mlp_ref = pair
    mid = call.trace.ops[_same_value_origin(call, mid_ref)]
    if mid.func_name != "add" or mid.index not in call.inside or mid.module_passes[-1] != call.key:
        return None
    pair = _residual_and_branch(call, mid, shape)
    if pair is None or _same_value_origin(call, pair[0]) >= call.start:
        return None  # the residual must be what entered the block, not a third sub-layer's sum
    pre_ref, attn_ref = pair
    kernels = {op.func_name for op in call.ops if pre_ref.index < op.index < mid.index}
    later = {op.func_name for op in call.ops if mid.index < op.index < last.index}
    if not kernels & set(ATTENTION_FUNCS) or later & set(ATTENTION_FUNCS):
        return None  # attention, then an MLP: otherwise "attn_out" and "mlp_out" would name the wrong things
    axes = STREAM if shape is not None and len(shape) == 3 else None
    specs = (
        _spec("resid_pre", f"the residual stream entering the block ({call.op(pre_ref).label})", pre_ref, axes),
        _spec("attn_out", f"what the attention sub-layer adds ({call.op(attn_ref).label})", attn_ref, axes),
        _spec("resid_mid", f"the stream after the attention sub-layer ({mid.label})", Ref(mid.index), axes),
        _spec("mlp_out", f"what the MLP sub-layer adds ({call.op(mlp_ref).label})", mlp_ref, axes),
        _spec("resid_post", f"the stream leaving the block ({last.label})", outs[0], axes),
    )
    return FacetPlan("residual block", specs, ARRAYS, tuple(notes))


def _residual_and_branch(call: _Call, add: OpRecord, shape: Any) -> tuple[Ref, Ref] | None:
    """An add's two inputs as (residual, branch): the residual is the one computed first."""
    refs = refs_in(add.args)
    if len(refs) != 2 or any(call.shape(r) != shape for r in refs):
        return None
    first, second = sorted(refs, key=lambda r: r.index)
    return first, second


def _same_value_origin(call: _Call, ref: Ref) -> int:
    """The earliest op whose value ``ref`` holds unchanged (through same-dtype casts, copies, no-op dropout)."""
    op = call.op(ref)
    while op.func_name in SAME_VALUE and not ref.path:
        parent = call.parent(op)
        if parent is None or call.shape(parent) != op.shape or call.op(parent).dtype != op.dtype:
            break
        if op.func_name == "dropout" and op.kwargs.get("training", True) and op.kwargs.get("p", 0.5) > 0:
            break
        ref, op = parent, call.op(parent)
    return op.index
