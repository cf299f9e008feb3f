"""Facets: named views of one module pass's values (``module.facets['q']``, ``lstm.facets['h_n']``).

A backend knows its framework's modules: through the ``torchlens_facets`` hook
it answers, for one module pass, which facets it has and which recorded
values each is made of (a :class:`FacetPlan` of :class:`FacetSpec`). This
module turns that plan into the mapping users read (:class:`Facets`), adds
per-head forms (``'q.3'``) and the TransformerLens aliases (``'hook_q'``),
raises :class:`FacetError` when a value is missing, and makes a facet an
intervention site (:meth:`Facets.when`). Values always come from the trace:
a facet that no op holds (the attention pattern inside a fused kernel) is
recomputed from recorded values by the backend's own array operations, never
by running the model again. See docs/facets.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.capture.edits import Intervention, Site
from torchlens_core.capture.selectors import in_module, label
from torchlens_core.ir.errors import ArgumentTypeError, InterventionError, LabelNotFoundError, TorchLensError, closest
from torchlens_core.ir.records import Ref, refs_in

if TYPE_CHECKING:
    from torchlens_core.ir.records import ModulePass, ModuleRecord
    from torchlens_core.ir.trace import Trace


class FacetError(TorchLensError, ValueError):
    """A facet cannot be given or edited: its values were not saved, it is recomputed, or the pass is ambiguous."""


RECORDED = "recorded"  # the value an op of the trace holds
RECOMPUTED = "recomputed"  # worked out from recorded values (a fused kernel kept it to itself)


class FacetArrays:
    """The few array operations facets need from a framework; a backend's plan carries one.

    :meth:`select` uses the indexing every supported framework shares; a
    backend implements :meth:`put` (for per-head edits) and :meth:`permute`
    (for aliases in another layout).
    """

    def select(self, x: Any, axis: int, index: int) -> Any:
        """``x`` at ``index`` along ``axis``, that axis dropped."""
        return x[(slice(None),) * axis + (index,)]

    def put(self, x: Any, axis: int, index: int, part: Any) -> Any:
        """A new array: ``x`` with its slice at ``index`` along ``axis`` replaced by ``part``."""
        raise NotImplementedError

    def permute(self, x: Any, axes: tuple[int, ...]) -> Any:
        """``x`` with its axes reordered (NumPy's ``transpose(axes)``)."""
        raise NotImplementedError


@attrs.frozen(slots=True)
class FacetSpec:
    """One facet of a module pass, as a backend describes it.

    ``source`` is a template of recorded values (a :class:`Ref`, or a tuple of
    Refs, ParamRefs and constants). Without ``compute`` the facet is the
    value at ``source``; with it, ``compute(values)`` receives ``source`` with
    the recorded values in place and returns the facet (``how`` is then
    ``"recomputed"``). ``axes`` names the value's axes (``("batch", "head",
    "seq", "head_dim")``); ``split`` is the axis that ``'name.i'`` indexes
    (attention heads, LSTM layers), None if none.
    """

    name: str
    doc: str
    source: Any
    axes: tuple[str, ...] | None = None
    compute: Callable[[Any], Any] | None = attrs.field(default=None, eq=False)
    split: int | None = None

    @property
    def how(self) -> str:
        return RECOMPUTED if self.compute is not None else RECORDED

    @property
    def site(self) -> Ref | None:
        """The recorded value an edit of this facet changes; None for a recomputed facet."""
        return self.source if self.compute is None and isinstance(self.source, Ref) else None


@attrs.frozen(slots=True)
class FacetPlan:
    """A backend's answer for one module pass: what kind of module it is, its facets, and why some are missing."""

    kind: str  # "attention", "recurrent", "residual block"
    facets: tuple[FacetSpec, ...]
    arrays: FacetArrays = attrs.field(eq=False)
    notes: tuple[str, ...] = ()


# TransformerLens's hook names, as aliases of facets: alias -> (facet, axes permutation or None).
# TransformerLens lays q, k, v and z out as (batch, pos, head_index, d_head); TorchLens as (batch, head, seq,
# head_dim), so those aliases are transposed views, and hook_q[:, :, h] is head h as in TransformerLens.
TRANSFORMER_LENS_ALIASES: dict[str, tuple[str, tuple[int, ...] | None]] = {
    "hook_q": ("q", (0, 2, 1, 3)),
    "hook_k": ("k", (0, 2, 1, 3)),
    "hook_v": ("v", (0, 2, 1, 3)),
    "hook_z": ("z", (0, 2, 1, 3)),
    "hook_attn_scores": ("scores", None),
    "hook_pattern": ("pattern", None),
    "hook_resid_pre": ("resid_pre", None),
    "hook_resid_mid": ("resid_mid", None),
    "hook_resid_post": ("resid_post", None),
    "hook_attn_out": ("attn_out", None),
    "hook_mlp_out": ("mlp_out", None),
}


class Facets(Mapping[str, Any]):
    """The facets of one module pass: ``facets['q']``, ``facets['q.0']`` (head 0), ``facets['hook_q']``.

    Iterating gives the facet names; the per-head forms (``'name.i'``) and
    the TransformerLens aliases (:attr:`aliases`) are looked up too but not
    listed. Each value is read from the trace when asked for.
    """

    def __init__(self, module_pass: ModulePass, plan: FacetPlan | None) -> None:
        self.module_pass = module_pass
        # Held strongly (the trace holds no Facets, so no cycle): facets read later still find the values.
        self.trace = module_pass.trace
        self.plan = plan
        self._specs = {spec.name: spec for spec in plan.facets} if plan is not None else {}

    # -- the mapping ----------------------------------------------------------------------
    @property
    def kind(self) -> str | None:
        """What the backend recognised the module as (``"attention"``...), None if nothing."""
        return self.plan.kind if self.plan is not None else None

    @property
    def aliases(self) -> dict[str, str]:
        """The TransformerLens names this pass answers to, with the facet each reads."""
        return {alias: base for alias, (base, _) in TRANSFORMER_LENS_ALIASES.items() if base in self._specs}

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            spec, index, _ = self._find(name)
            if index is not None and spec.site is None:
                self[name]  # a recomputed facet's head count is known once it is computed
        except (LabelNotFoundError, FacetError):
            return False
        return True

    # A view, compared by identity: Mapping's == would compare every value, arrays included.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __getitem__(self, name: str) -> Any:
        spec, index, permutation = self._find(name)
        value = self._value(spec)
        assert self.plan is not None  # a facet was found: without a plan there are none
        arrays = self.plan.arrays
        if permutation is not None:
            value = arrays.permute(value, permutation)
        if index is not None:
            info = backend_named(self.trace.backend, missing_ok=True).array_info(value)
            count = info[0][spec.split] if info is not None else None  # type: ignore[index]
            if count is not None and index >= count:  # a recomputed facet's size is known only now
                raise LabelNotFoundError(self._out_of_range(name, spec, count))
            value = arrays.select(value, spec.split, index)  # type: ignore[arg-type]
        return value

    def spec(self, name: str) -> FacetSpec:
        """The :class:`FacetSpec` behind ``name`` (an alias or per-head form gives its facet's)."""
        return self._find(name)[0]

    def how(self, name: str) -> str:
        """``"recorded"`` (an op of the trace holds it) or ``"recomputed"`` (worked out from recorded values)."""
        return self.spec(name).how

    # -- interventions ----------------------------------------------------------------------
    def site(self, name: str) -> str:
        """The op output an edit of ``name`` changes: ``"unbind_1_15:1[0]"`` (label, pass, leaf)."""
        spec, _, _ = self._find(name)
        ref = self._editable(spec, name)
        op = self.trace.ops[ref.index]
        return f"{op.layer_label}:{op.pass_num}" + ("".join(f"[{k!r}]" for k in ref.path))

    def when(self, name: str, *helpers: Callable[[Any, Site], Any]) -> Intervention:
        """An intervention editing facet ``name`` with ``helpers``: pass it as ``intervene=``.

        ``tl.trace(model, x, intervene=facets.when('q.0', tl.zero_ablate()))``
        zeroes head 0's queries in a new capture of the model. The helpers see
        the facet (head 0's slice, or the alias's layout), and
        ``tl.swap_with(other)`` takes the same facet of ``other``. The site is
        the recorded op that holds the facet, so only recorded facets can be
        edited. For a fork: ``i = facets.when(...); fork.when(i.selector, *i.helpers)``.
        """
        if not helpers:
            raise ArgumentTypeError("facets.when(name, *helpers) needs at least one helper, e.g. tl.zero_ablate()")
        for helper in helpers:
            if not callable(helper):
                raise ArgumentTypeError(
                    f"an intervention helper is a callable helper(value, site) -> value, not {type(helper).__name__}"
                )
        spec, index, permutation = self._find(name)
        ref = self._editable(spec, name)
        op = self.trace.ops[ref.index]
        assert self.plan is not None  # a facet was found: without a plan there are none
        edit = FacetEdit(
            module=self.module_pass.label,
            name=name,
            path=ref.path,
            index=index,
            axis=spec.split,
            permutation=permutation,
            helpers=tuple(helpers),
            arrays=self.plan.arrays,
        )
        selector = label(f"{op.layer_label}:{op.pass_num}")
        if (self.module_pass.path, self.module_pass.pass_num) in op.module_passes:
            # Inside the module: pinned to this call, so a label shared by another call's op cannot match.
            selector = selector & in_module(self.module_pass.label)
        return Intervention(selector, (edit,))

    # -- lookup -----------------------------------------------------------------------------
    def _find(self, name: str) -> tuple[FacetSpec, int | None, tuple[int, ...] | None]:
        """``(spec, head index or None, alias permutation or None)`` for a facet name."""
        if not isinstance(name, str):
            raise ArgumentTypeError(f"facets are named by strings such as 'q' or 'h_n', not {type(name).__name__}")
        if name in self._specs:
            return self._specs[name], None, None
        if name in TRANSFORMER_LENS_ALIASES and TRANSFORMER_LENS_ALIASES[name][0] in self._specs:
            base, permutation = TRANSFORMER_LENS_ALIASES[name]
            return self._specs[base], None, permutation
        base, dot, tail = name.rpartition(".")
        if dot and tail.isdigit() and base in self._specs:
            spec = self._specs[base]
            if spec.split is None:
                raise LabelNotFoundError(
                    f"facet {base!r} of {self.module_pass.label} has no axis to index "
                    f"with {name!r}; read {base!r} whole"
                )
            count = self._split_size(spec)
            if count is not None and int(tail) >= count:
                raise LabelNotFoundError(self._out_of_range(name, spec, count))
            return spec, int(tail), None
        raise LabelNotFoundError(self._missing(name))

    def _missing(self, name: str) -> str:
        where = self.module_pass.label
        if not self._specs:
            return (
                f"{where} has no facet {name!r}: the {self.trace.backend} backend recognised no "
                f"facets in it{self._why()}; docs/facets.md lists the modules each backend knows"
            )
        near = closest(name, [*self._specs, *self.aliases])
        hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
        return (
            f"{where} ({self.kind}) has no facet {name!r}; its facets are "
            f"{', '.join(map(repr, self._specs))}{hint}{self._why()}"
        )

    def _out_of_range(self, name: str, spec: FacetSpec, count: int) -> str:
        axis = spec.axes[spec.split] if spec.axes and spec.split is not None else f"axis {spec.split}"
        return f"{name!r}: facet {spec.name!r} of {self.module_pass.label} has {count} {axis} entries (0..{count - 1})"

    @property
    def _notes(self) -> tuple[str, ...]:
        return self.plan.notes if self.plan is not None else ()

    def _why(self) -> str:
        return f" ({'; '.join(self._notes)})" if self._notes else ""

    def _split_size(self, spec: FacetSpec) -> int | None:
        if spec.site is None:
            return None
        shape = self.trace.ops[spec.site.index].shape
        for k in spec.site.path:
            shape = shape[k] if isinstance(shape, tuple) and isinstance(k, int) and k < len(shape) else None
        return shape[spec.split] if isinstance(shape, tuple) and spec.split is not None else None

    def _editable(self, spec: FacetSpec, name: str) -> Ref:
        if spec.site is None:
            recorded = ", ".join(n for n, s in self._specs.items() if s.site is not None) or "none here"
            raise FacetError(
                f"facet {name!r} of {self.module_pass.label} is {spec.doc}: no op of the trace holds "
                f"it, so it cannot be an intervention site. Edit a recorded facet ({recorded}), or "
                f"capture a form of the model whose own ops compute it (docs/facets.md)"
            )
        if self.trace.ops[spec.site.index].kind != "op":
            raise FacetError(
                f"facet {name!r} of {self.module_pass.label} is the model's input "
                f"({self.trace.ops[spec.site.index].label}): edit the value you pass instead"
            )
        return spec.site

    def _value(self, spec: FacetSpec) -> Any:
        trace = self.trace
        unsaved = [trace.ops[r.index] for r in refs_in(spec.source) if not trace.ops[r.index].saved]
        if unsaved:
            labels = list(dict.fromkeys(op.label for op in unsaved))
            raise FacetError(
                f"facet {spec.name!r} of {self.module_pass.label} reads {', '.join(labels)}, whose "
                f"value save= left out: capture with a save= that also picks "
                f"tl.label({', '.join(map(repr, labels))}), or without save="
            )
        values = trace.resolve(spec.source)
        return spec.compute(values) if spec.compute is not None else values

    def __repr__(self) -> str:
        if not self._specs:
            return f"<Facets of {self.module_pass.label}: none{self._why()}>"
        rows = [f"<Facets of {self.module_pass.label} ({self.kind})"]
        for name, spec in self._specs.items():
            axes = f"({', '.join(spec.axes)})" if spec.axes else ""
            rows.append(f"  {name:<11} {axes:<36} {spec.how:<10} {spec.doc}")
        if self.aliases:
            rows.append(f"  aliases: {', '.join(self.aliases)}")
        rows.extend(f"  note: {note}" for note in self._notes)
        return "\n".join(rows) + ">"


@attrs.frozen(eq=False)
class FacetSite(Site):
    """The :class:`Site` a facet edit's helpers see: ``value_in`` reads the same facet of another trace."""

    facet: str = ""
    facet_module: str = ""  # "blocks.0.attn:1"

    def value_in(self, trace: Trace) -> Any:
        path, _, n = self.facet_module.rpartition(":")
        module = trace.modules.get(path)
        if module is None or int(n) > len(module.passes):
            raise LabelNotFoundError(
                f"the other trace has no call {self.facet_module}, so no facet {self.facet!r} there"
            )
        return module.passes[int(n) - 1].facets[self.facet]


@attrs.frozen(eq=False)
class FacetEdit:
    """The helper :meth:`Facets.when` installs on the op holding a facet: runs the user's helpers on the facet.

    The op's other outputs (``k`` and ``v``, when one op returned all three)
    pass through unchanged; a per-head facet is cut out, edited and put back;
    an alias is edited in its own layout and transposed back.
    """

    module: str
    name: str
    path: tuple[Any, ...]
    index: int | None
    axis: int | None
    permutation: tuple[int, ...] | None
    helpers: tuple[Callable[[Any, Site], Any], ...]
    arrays: FacetArrays = attrs.field(repr=False)

    def __call__(self, value: Any, site: Site) -> Any:
        if site.path != self.path:
            return value
        whole = value if self.permutation is None else self.arrays.permute(value, self.permutation)
        part = whole if self.index is None else self.arrays.select(whole, self.axis, self.index)  # type: ignore
        where = FacetSite(
            site.key,
            site.kind,
            site.func_name,
            site.module,
            site.path,
            site.backend,
            site.ops,
            site.in_place,
            facet=self.name,
            facet_module=self.module,
        )
        info = backend_named(site.backend, missing_ok=True).array_info
        before = info(part)
        edited = part
        for helper in self.helpers:
            edited = helper(edited, where)
        after = info(edited)
        if after != before:
            got = "not an array" if after is None else f"shape {list(after[0])} {after[1]}"
            was = "not an array" if before is None else f"shape {list(before[0])} {before[1]}"
            raise InterventionError(
                f"editing facet {self.name!r} of {self.module} (at {site.key}) changed it from "
                f"{was} to {got}: an edit must keep the shape "
                f"and dtype of what it edits"
            )
        if self.index is not None:
            edited = self.arrays.put(whole, self.axis, self.index, edited)  # type: ignore[arg-type]
        if self.permutation is not None:
            edited = self.arrays.permute(
                edited, tuple(sorted(range(len(self.permutation)), key=self.permutation.__getitem__))
            )
        return edited

    def __repr__(self) -> str:
        inner = ", ".join(
            repr(h) if hasattr(type(h), "__attrs_attrs__") else getattr(h, "__name__", repr(h)) for h in self.helpers
        )
        return f"facet({self.name!r} of {self.module}: {inner})"


# -- what the records call ---------------------------------------------------------------------
def facets_of(module_pass: ModulePass) -> Facets:
    """``module_pass.facets``: the backend's plan for this pass, as a :class:`Facets` mapping."""
    trace = module_pass.trace
    plan = backend_named(trace.backend, missing_ok=True).facets(trace, module_pass)
    if plan is not None and not isinstance(plan, FacetPlan):
        raise TypeError(
            f"the {trace.backend} backend's torchlens_facets returned {type(plan).__name__}, not a FacetPlan"
        )
    return Facets(module_pass, plan)


def module_facets(module: ModuleRecord) -> Facets:
    """``module.facets``: the facets of the module's one pass; several passes must be chosen between."""
    if len(module.passes) == 1:
        return module.passes[0].facets
    if not module.passes:
        raise FacetError(f"{module.path} never ran in this forward, so it has no values to view")
    raise FacetError(
        f"{module.path} ran {len(module.passes)} times; read one call's facets: "
        f"trace.modules[{module.path!r}].passes[i].facets (i from 0 to {len(module.passes) - 1})"
    )
