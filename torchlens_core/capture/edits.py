"""What a capture changes (``intervene=``), applied as ops arrive, the way policy.py decides what it keeps.

An :class:`Intervention` (``tl.when(selector, *helpers)``) pairs a selector
with helpers, each a callable ``helper(value, site) -> value``. Every op the
selector picks is a *site*, and so is every call of a module a
``tl.module(...)`` selector names (each array leaf of what the module
returned). At a site the helpers run in order on the value, and every later op
sees the result, as it would see what a forward hook returned.

The :class:`Editor` does this for one capture: the :class:`TraceBuilder` asks
it about each op as the op is recorded and about each module call as it
returns; the backend hands the model the value the builder gives back (see
docs/backends.md, "Interventions"). Helpers see the framework's arrays and a
:class:`Site`; the array operations they need come from the backend's
``torchlens_array_ops`` hook. An edit is recorded on the op whose value it
changed (``op.edits``, ``op.pre_edit``), so that replay does it again.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.capture.selectors import (
    AllOf,
    AnyOf,
    FollowedBy,
    Module,
    Not,
    PrecededBy,
    Selector,
    Where,
    near_names,
    split_pass,
)
from torchlens_core.ir import tree
from torchlens_core.ir.errors import (
    ArgumentTypeError,
    InterventionError,
    LabelNotFoundError,
    UnsupportedError,
    shown,
)
from torchlens_core.ir.records import EditRecord, OpRecord, Ref, refs_in

if TYPE_CHECKING:
    from torchlens_core.backend.array_ops import ArrayOps
    from torchlens_core.capture.builder import TraceBuilder
    from torchlens_core.ir.trace import Trace

Helper = Callable[[Any, "Site"], Any]


class ModuleSplice:
    """Base of helpers that replace a module's call rather than edit its output (``tl.splice_module``).

    ``replacement(*args, **kwargs)`` runs instead of the module's own forward,
    given the module call's arguments; its ops are recorded inside the
    module's pass.
    """

    replacement: Callable[..., Any]


@attrs.frozen
class Intervention:
    """``tl.when(selector, *helpers)``: at every site ``selector`` picks, run ``helpers`` in order."""

    selector: Selector
    helpers: tuple[Helper, ...]

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.selector, Selector):
            raise ArgumentTypeError(
                f"tl.when takes a selector first, such as tl.func('relu') or tl.module('layer3'), "
                f"not {type(self.selector).__name__} ({shown(self.selector)})"
            )
        if not self.helpers:
            raise ArgumentTypeError("tl.when(selector, *helpers) needs at least one helper, e.g. tl.zero_ablate()")
        for helper in self.helpers:
            if not callable(helper):
                raise ArgumentTypeError(
                    f"an intervention helper is a callable helper(value, site) -> value, "
                    f"not {type(helper).__name__} ({shown(helper)})"
                )
            _check_takes_value_and_site(helper)
        splices = [i for i, h in enumerate(self.helpers) if isinstance(h, ModuleSplice)]
        if splices and (splices != [0] or not _module_parts(self.selector)[1] or _module_parts(self.selector)[0]):
            raise UnsupportedError(
                "tl.splice_module replaces a module's call: use it first, once, with a module "
                "selector such as tl.when(tl.module('layer3'), tl.splice_module(f))"
            )
        _module_parts(self.selector)  # refuses selectors that cannot be judged as the forward runs

    @property
    def splice(self) -> ModuleSplice | None:
        first = self.helpers[0]
        return first if isinstance(first, ModuleSplice) else None

    @property
    def edits(self) -> tuple[Helper, ...]:
        """The helpers that edit values (all but a leading splice)."""
        return self.helpers[1:] if self.splice is not None else self.helpers


def _check_takes_value_and_site(helper: Any) -> None:
    """Refuse, here, a helper that cannot be called as ``helper(value, site)``: otherwise the mistake (a built-in
    helper's maker passed uncalled, ``tl.zero_ablate`` for ``tl.zero_ablate()``) surfaces as a TypeError from
    deep inside the forward, at the first site the selector picks."""
    try:
        signature = inspect.signature(helper)
    except (TypeError, ValueError):  # a callable without a signature (a builtin): called as it is
        return
    try:
        signature.bind(None, None)
    except TypeError:
        name = getattr(helper, "__name__", None) or type(helper).__name__
        if inspect.isfunction(helper) and helper.__module__ == "torchlens_core.steer.helpers":
            call = f"tl.{name}({'...' if signature.parameters else ''})"
            raise ArgumentTypeError(
                f"tl.{name} makes a helper: call it, {call}, and pass what it returns to tl.when"
            ) from None
        raise ArgumentTypeError(
            f"an intervention helper is called as helper(value, site) -> value; {name}{signature} "
            f"cannot take those two arguments"
        ) from None


def interventions(value: Any) -> tuple[Intervention, ...]:
    """``intervene=`` as given (one intervention, or a list of them), checked."""
    if value is None:
        return ()
    items = [value] if isinstance(value, Intervention) else value
    if not isinstance(items, Iterable) or isinstance(items, (str, bytes)):
        raise ArgumentTypeError(
            f"intervene= takes tl.when(selector, *helpers) or a list of them, "
            f"not {type(value).__name__} ({shown(value)})"
        )
    items = tuple(items)
    for item in items:
        if not isinstance(item, Intervention):
            raise ArgumentTypeError(
                f"intervene= takes tl.when(selector, *helpers) or a list of them; one item is "
                f"{type(item).__name__} ({shown(item)})"
            )
    return items


def _module_parts(selector: Selector) -> tuple[Selector | None, list[Module]]:
    """``selector`` split into the part judged op by op and the module calls it names (``tl.module``).

    A module site is the module's output, known only when its call returns:
    ``tl.module`` may be ``|``-ed with op selectors, not ``&``-ed or ``~``-ed
    with them. ``tl.followed_by`` judges an op by its children, which run
    after the edit must already have been made: refused.
    """
    if isinstance(selector, Module):
        return None, [selector]
    if isinstance(selector, AnyOf):
        ops: list[Selector] = []
        modules: list[Module] = []
        for part in selector.parts:
            op_part, module_parts = _module_parts(part)
            ops += [op_part] if op_part is not None else []
            modules += module_parts
        return (ops[0] if len(ops) == 1 else AnyOf(tuple(ops)) if ops else None), modules
    _judged_live(selector)
    return selector, []


def _judged_live(selector: Selector) -> None:
    if isinstance(selector, FollowedBy):
        raise UnsupportedError(
            "tl.followed_by cannot pick intervention sites: it judges an op by its children, "
            "which run after the edit must be made; select the op itself (tl.func, tl.label...)"
        )
    if isinstance(selector, Module):
        raise UnsupportedError(
            "tl.module names a module's output, known when its call returns: combine it with "
            "other selectors only with |, or use tl.in_module for the ops inside a module"
        )
    for inner in getattr(selector, "parts", ()) or (
        [selector.inner] if isinstance(selector, (Not, PrecededBy)) else []
    ):
        _judged_live(inner)


def _verdict(selector: Selector, op: OpRecord, builder: TraceBuilder) -> bool:
    """Does ``selector`` pick ``op``, judged the moment it is recorded?"""
    if isinstance(selector, Where):  # the record as it stands: no children, labels without a final pass
        return bool(selector.predicate(op))
    if isinstance(selector, AllOf):
        return all(_verdict(p, op, builder) for p in selector.parts)
    if isinstance(selector, AnyOf):
        return any(_verdict(p, op, builder) for p in selector.parts)
    if isinstance(selector, Not):
        return not _verdict(selector.inner, op, builder)
    verdict = selector.decide(op, builder)
    if verdict is None:
        raise UnsupportedError(
            f"{shown(selector, 120)} cannot be judged while the op runs, so it cannot pick intervention sites"
        )
    return verdict


def judged_on_trace(item: Intervention, trace: Trace) -> list[tuple[OpRecord, str, str, tuple[Any, ...], str | None]]:
    """The sites ``item`` picks in a finished trace: ``(op edited, kind, site key, path in its output, module)``.

    For a module site the op is the one that computed the returned leaf. An
    edit there must not reach ops inside the module that read the leaf
    before the module returned (a hook on the module would not reach them):
    such a site is refused, with the op to edit instead. A site on a
    pass-through op is found, but a fork refuses to replay it (see
    :func:`replay_refusal`).
    """
    op_part, modules = _module_parts(item.selector)
    found: list[tuple[OpRecord, str, str, tuple[Any, ...], str | None]] = []
    if op_part is not None:
        for op in trace.ops:
            if op.kind == "op" and op_part.test(op, trace):
                module = "{}:{}".format(*op.module_passes[-1]) if op.module_passes else None
                for path in _leaf_paths(op.shape):
                    found.append((op, "op", f"{op.layer_label}:{op.pass_num}", path, module))
    for selector in modules:
        for module_path, record in trace.modules.items():
            for mp in record.passes:
                if not _names(selector, module_path, mp.pass_num):
                    continue
                inside = {trace[label].index for label in mp.ops}
                for ref in refs_in(mp.out_template):
                    source = trace.ops[ref.index]
                    readers = [
                        op.label
                        for op in trace.ops[ref.index + 1 :]
                        if op.index in inside and ref.index in op.parent_indices
                    ]
                    if readers:
                        raise UnsupportedError(
                            f"{mp.label} returns {source.label}, which {readers[0]} inside the module also read: "
                            f"edited on the recorded graph, {readers[0]} would see the edit, which a hook on the "
                            f"module would not give it. Edit {source.label} itself (tl.label), or use rerun"
                        )
                    found.append((source, "module", mp.label, ref.path, mp.label))
    return found


SAME_OBJECT = "same_object"  # op.meta key: later reads of the pass-through's array may be the caller's own
KEPT_READ = "read_where_kept"  # op.meta key: read again where a module returning the op's value kept it


def replay_refusal(op: OpRecord, site: str) -> str | None:
    """Why an edit at ``site`` (on ``op``) cannot be replayed on the recorded graph; None when it can.

    The refused ``op`` is a pass-through whose later reads the backend could
    not tell apart (:meth:`PassThroughs.take`): an array a
    module returned without computing it (``nn.Identity``), the very object
    its caller may still hold (``self.same(h) + h``). An edit replayed there
    would reach the caller's own reads too, which a hook on the module (and a
    live edit, which hands the module's caller a new array) leaves unedited.

    A module site is refused too where the module returned ``op``'s value and
    the model read it again where the module kept it (``self.last = y``), as
    a backend that sees those reads marks (``op.meta[KEPT_READ]``, JAX): the
    edit would reach that read, which a hook (and a live edit, which refuses
    it) leaves unedited. An edit of the op itself reaches every read, live too.
    """
    if op.meta.get(SAME_OBJECT):
        return (
            f"{site if site == op.label else f'{site} returns {op.label}'}, an array returned without being "
            f"computed there (a pass-through, as nn.Identity makes): later reads of it by the caller and "
            f"through the module's output are one in the recorded graph"
        )
    if op.meta.get(KEPT_READ) and site != op.label:
        return (
            f"{site} returns {op.label}, which the model also read where the module kept it (as "
            f"`self.last = y; return y` does): replayed, the edit would reach that read, which a hook leaves "
            f"unedited. Edit {op.label} itself, or use fork.rerun"
        )
    return None


class PassThroughs:
    """What a module site's edit leaves behind in a backend's producer map.

    A module site's edit hands the module's caller a new array; the array the
    module returned lives on, unedited, wherever else the model holds it:

    - A pass-through op (``nn.Identity`` returning its input) took over the
      producer entry of an array the caller may still hold
      (``self.same(h) + h``). :meth:`take` notes the entry when the op is
      linked; :meth:`replaced` gives it back, so that replay reads the
      caller's array unedited, as the model did.
    - An array the module computed is edited on the op that computed it. If
      the module also kept that array (``self.last = y; return y``), a later
      read of it saw the unedited value, which the recorded graph, where the
      op's value is the edit, cannot give it: :meth:`replaced` unlinks the
      array, and a backend calls :meth:`check_read` before taking an unlinked
      array as a constant, which raises for it.

    ``producers`` is the backend's own map, keyed by ``id(array)``. A capture
    whose values are not looked up by object (a walk over a program, whose
    environment maps variables to values, as JAX's does) passes None: the
    values it hands in are its environment's, and it calls :meth:`read` on
    what the model reads. It can also tell a read of a module's returned value
    by the caller from one where the module kept it (:meth:`kept`).
    """

    def __init__(self, producers: dict[int, Any] | None, ops: list[OpRecord]) -> None:
        self.producers: dict[int, Any] = producers if producers is not None else {}
        self.ops = ops
        self.taken: dict[tuple[int, int], Any] = {}
        # id(array) -> (weakref to it, the op whose edit replaced it): arrays no recorded op may read
        self.unedited: dict[int, tuple[weakref.ref[Any], int]] = {}
        # id(value) -> (weakref to it, its op): values a module returned as it computed them, whose later
        # reads are the model's own where the module kept them (:meth:`kept`)
        self.kept_values: dict[int, tuple[weakref.ref[Any], int]] = {}

    def take(self, value: Any, op_index: int) -> None:
        """Call just before mapping ``value`` to pass-through op ``op_index``: later reads of that very object
        are then one with the module's in the recorded graph, so a fork refuses to replay edits there."""
        self.taken[(id(value), op_index)] = self.producers.get(id(value))
        self.ops[op_index].meta[SAME_OBJECT] = True

    def replaced(self, value: Any, op_index: int) -> None:
        """A module site's edit handed the caller a new array in place of ``value``, returned as op
        ``op_index``'s value (call it after linking the new array to the op)."""
        key = (id(value), op_index)
        if key in self.taken:
            previous = self.taken.pop(key)
            if previous is None:
                self.producers.pop(id(value), None)
            else:
                self.producers[id(value)] = previous
            self.ops[op_index].meta.pop(SAME_OBJECT, None)
            return
        if self.ops[op_index].meta.get("identity"):  # the editor's own op at the exit: `value` reads as before
            return
        self.producers.pop(id(value), None)
        self.unedited[id(value)] = (weakref.ref(value), op_index)

    def check_read(self, value: Any) -> None:
        """Raise if ``value``, an array no recorded op is linked to, is one an edit replaced (see above)."""
        found = self.unedited.get(id(value))
        if found is not None and found[0]() is value:
            raise unedited_read(self.ops[found[1]])

    def kept(self, value: Any, op_index: int) -> None:
        """``value`` is the module's own object for op ``op_index``'s value, which a module pass returned as it
        computed it, while the caller reads another object (a capture that tells them apart). A later
        :meth:`read` of ``value`` is the model's own, where the module kept it (``self.last = y``): the op is
        marked (``op.meta[KEPT_READ]``), which :func:`replay_refusal` reads."""
        self.kept_values[id(value)] = (weakref.ref(value), op_index)

    @property
    def watching(self) -> bool:
        """Does :meth:`read` have anything to check?"""
        return bool(self.unedited or self.kept_values)

    def read(self, values: list[Any]) -> None:
        """The model reads ``values``: mark the ops of kept ones (:meth:`kept`), and raise for one an edit
        replaced (:meth:`check_read`)."""
        kept, unedited = self.kept_values, self.unedited
        for value in values:
            found = kept.get(id(value)) if kept else None
            if found is not None and found[0]() is value:
                self.ops[found[1]].meta[KEPT_READ] = True
            if unedited:
                self.check_read(value)


def unedited_read(op: OpRecord) -> InterventionError:
    """The error for a read of the array a module site's edit on ``op`` replaced, kept elsewhere by the model."""
    site = next((e.site for e in reversed(op.edits) if e.kind == "module"), f"{op.layer_label}:{op.pass_num}")
    at = f"{op.layer_label}:{op.pass_num}"
    return InterventionError(
        f"intervene= at {site} handed the module's caller an edited array, and the forward then read the "
        f"module's own, unedited one, which it kept elsewhere (as `self.last = y; return y` does): the "
        f"recorded graph holds one value for {at}, so it cannot record both reads. Edit {at} itself "
        f"(tl.label('{at}')), whose edit every read sees"
    )


def _leaf_paths(shape: Any) -> list[tuple[Any, ...]]:
    """The paths of the arrays in an op's output, from its recorded shape (one array: ``[()]``)."""
    if shape is None or all(isinstance(d, int) for d in shape):
        return [()]
    return [(i,) for i, s in enumerate(shape) if isinstance(s, tuple)]


def site_keys(trace: Trace, selector: Selector) -> list[str]:
    """``trace.find_sites(selector)``: the keys of the sites an intervention with ``selector`` would edit."""
    return list(dict.fromkeys(key for _, _, key, _, _ in judged_on_trace(Intervention(selector, (_keep,)), trace)))


def _keep(value: Any, site: Site) -> Any:
    return value


@attrs.frozen(eq=False)
class Site:
    """Where a helper runs, as the helper sees it.

    ``key`` finds the site in any trace of the model: ``"relu_1_2:1"`` for an
    op (label and pass), ``"layer3:1"`` for a module call's output. ``path``
    is the leaf of the op's or module's output being edited (``()``: all of
    it). ``ops`` holds the backend's array operations
    (:class:`~torchlens_core.backend.array_ops.ArrayOps`).
    """

    key: str
    kind: str  # "op" or "module"
    func_name: str  # the op's function; for a module site, the function of the op that computed the leaf
    module: str | None  # "layer3:1": the module pass (for an op site, the innermost one it ran in)
    path: tuple[Any, ...]
    backend: str
    ops: ArrayOps = attrs.field(repr=False)
    in_place: bool = False  # the op wrote into an existing array: edits are written into it too

    def value_in(self, trace: Trace) -> Any:
        """The value of this same site in another trace of the model (``tl.swap_with``, references)."""
        if self.kind == "module":
            base, n = split_pass(self.key)
            module = trace.modules.get(base)
            if module is None or n is None or n > len(module.passes):
                raise LabelNotFoundError(
                    f"the other trace has no call {self.key} of module {base!r}: "
                    f"it has {len(module.passes) if module else 0} calls of it"
                )
            value = module.passes[n - 1].out
        else:
            try:
                op = trace[self.key]
            except LabelNotFoundError as exc:
                raise LabelNotFoundError(f"the other trace has no site {self.key}: {exc}") from None
            if not op.saved:
                raise UnsupportedError(
                    f"the other trace did not save {self.key}'s value: capture it with a save= "
                    f"that picks it (or no save=)"
                )
            value = op.out
        try:
            leaf = tree.get(value, self.path)
        except (IndexError, KeyError, TypeError, AttributeError):
            leaf = None
        if leaf is None:
            raise UnsupportedError(
                f"the other trace holds no value at {self.key}{list(self.path) or ''} "
                f"(not saved, or a different structure)"
            )
        return leaf

    def run(self, helpers: tuple[Helper, ...], value: Any) -> Any:
        """``value`` after ``helpers``, checked to keep its shape, dtype and device."""
        h = backend_named(self.backend, missing_ok=True)
        before = h.array_info(value)
        edited = value
        for helper in helpers:
            edited = helper(edited, self)
        after = h.array_info(edited)
        if after != before:
            name = ", ".join(map(_name, helpers))
            got = "not an array" if after is None else f"shape {list(after[0])} {after[1]} on {after[2]}"
            was = "not an array" if before is None else f"shape {list(before[0])} {before[1]} on {before[2]}"
            raise InterventionError(
                f"{name} at {self.key}{list(self.path) or ''} changed the value from {was} to {got}: an edit "
                f"must keep the shape, dtype and device of what it edits"
            )
        return self.ops.write_into(value, edited) if self.in_place else edited


def _name(helper: Any) -> str:
    return repr(helper) if hasattr(type(helper), "__attrs_attrs__") else getattr(helper, "__name__", repr(helper))


class Editor:
    """The interventions of one capture, applied as its ops are recorded."""

    @property
    def builder(self) -> TraceBuilder:
        builder = self._builder()
        assert builder is not None, "a capture's editor outlived its builder"
        return builder

    def __init__(self, items: tuple[Intervention, ...], builder: TraceBuilder) -> None:
        self._builder = weakref.ref(builder)  # the builder holds this editor: no cycle (see Policy)
        self.backend = builder.backend
        array_ops = backend_named(self.backend, missing_ok=True).array_ops()
        if array_ops is None:
            raise UnsupportedError(
                f"the {self.backend} backend gives no array operations (torchlens_array_ops), so it cannot intervene"
            )
        self.array_ops: ArrayOps = array_ops
        self.items = items
        parts = [_module_parts(item.selector) for item in items]
        self.op_selectors = [(i, op_part) for i, (op_part, _) in enumerate(parts) if op_part is not None]
        self.module_selectors = [(i, modules) for i, (_, modules) in enumerate(parts) if modules]
        self.sites_found = [0] * len(items)
        self.module_calls_edited: set[tuple[str, int]] = set()
        self.quiet = False  # set while the editor itself records an op

    # -- ops --------------------------------------------------------------------------------
    def edit_op(self, op: OpRecord, value: Any) -> Any:
        """The value later ops see of ``op``, which has just been recorded with ``value``."""
        if self.quiet:
            return value
        edited = value
        for i, selector in self.op_selectors:
            if not _verdict(selector, op, self.builder):
                continue
            self.sites_found[i] += 1
            module = "{}:{}".format(*op.module_passes[-1]) if op.module_passes else None
            for path in self._array_paths(edited):
                site = Site(
                    f"{op.layer_label}:{op.pass_num}",
                    "op",
                    op.func_name,
                    module,
                    path,
                    self.backend,
                    self.array_ops,
                    in_place=op.in_place,
                )
                record = EditRecord(site.key, "op", path, self.items[i].edits, site)
                self._keep_before(op, edited, copy=op.in_place)  # an in-place edit writes into it
                edited = record.apply(edited)
                self._note(op, record, edited)
        return edited

    # -- module calls -----------------------------------------------------------------------
    def splice_for(self, path: str, pass_num: int) -> ModuleSplice | None:
        """The splice replacing call ``pass_num`` of module ``path``, if an intervention names it."""
        for i, modules in self.module_selectors:
            splice = self.items[i].splice
            if splice is not None and any(_names(m, path, pass_num) for m in modules):
                return splice
        return None

    def splice_targets(self) -> set[str]:
        """The module paths some ``tl.splice_module`` names (a backend patches just these)."""
        return {
            split_pass(m.path)[0]
            for i, modules in self.module_selectors
            if self.items[i].splice is not None
            for m in modules
        }

    def wants_module(self, path: str, pass_num: int) -> bool:
        return any(_names(m, path, pass_num) for _, modules in self.module_selectors for m in modules)

    def edit_module_output(self, path: str, pass_num: int, template: Any, value: Any) -> tuple[Any, Any]:
        """What module call ``path:pass_num`` returns to the model after its edits, and its new template."""
        self.module_calls_edited.add((path, pass_num))
        for i, modules in self.module_selectors:
            if not any(_names(m, path, pass_num) for m in modules):
                continue
            self.sites_found[i] += 1
            if not self.items[i].edits:
                continue  # a splice alone: the replacement already ran
            done: dict[Ref, tuple[Any, Ref]] = {}  # a value returned twice ((y, y)) is one op's: edited once
            for leaf_path, ref in tree.leaves(template, lambda x: isinstance(x, Ref)):
                if ref in done:
                    edited_leaf, new_ref = done[ref]
                else:
                    leaf = tree.get(value, leaf_path)
                    source = self.builder.ops[ref.index]
                    site = Site(
                        f"{path}:{pass_num}",
                        "module",
                        source.func_name,
                        f"{path}:{pass_num}",
                        leaf_path,
                        self.backend,
                        self.array_ops,
                    )
                    edited_leaf, new_ref = done[ref] = self._edit_returned(source, ref, leaf, site, self.items[i].edits)
                value = _set_leaf(value, leaf_path, edited_leaf)
                template = _set_leaf(template, leaf_path, new_ref)
        return value, template

    def _edit_returned(
        self, source: OpRecord, ref: Ref, leaf: Any, site: Site, helpers: tuple[Helper, ...]
    ) -> tuple[Any, Ref]:
        """Edit a module's returned leaf: on the op that computed it, unless ops in the module already read it.

        In that case those ops saw the value unedited, as they would with a
        forward hook: the edit goes on an explicit identity op at the module's
        exit instead, so that replay gives them the unedited value too. (A
        pass-through op, ``nn.Identity`` returning its input, is edited itself:
        the backend gives the array it returned, which the caller may still
        hold, back to its own producer; see :class:`PassThroughs`.)
        """
        if any(ref.index in later.parent_indices for later in self.builder.ops[ref.index + 1 :]):
            self.quiet = True
            try:
                source = self.builder.identity_op(ref, leaf)
            finally:
                self.quiet = False
            ref = Ref(source.index)
        edited = site.run(helpers, leaf)  # a new array: the module's own stays as it was
        self._keep_before(source, source.out, copy=False)
        out = _set_leaf(source.out, ref.path, edited) if source.saved else None
        self._note(source, EditRecord(site.key, "module", ref.path, helpers, site), out)
        return edited, ref

    # -- recording --------------------------------------------------------------------------
    def _keep_before(self, op: OpRecord, value: Any, copy: bool) -> None:
        """Before its first edit, keep ``op``'s value as ``op.pre_edit`` (when saved).

        Helpers make new arrays, so the value stays as it was and is kept as
        it is, unless the edit is written back into the op's own array
        (``copy``): then it is copied first.
        """
        if op.saved and not op.edits:
            op.pre_edit = self._copy(value) if copy else value

    def _note(self, op: OpRecord, record: EditRecord, after: Any) -> None:
        if op.saved:
            op.out = after
        op.edits = (*op.edits, record)

    def _copy(self, value: Any) -> Any:
        info = backend_named(self.backend, missing_ok=True).array_info
        return tree.map_leaves(lambda v: self.array_ops.copy(v) if info(v) is not None else v, value)

    def _array_paths(self, value: Any) -> list[tuple[Any, ...]]:
        info = backend_named(self.backend, missing_ok=True).array_info
        return [path for path, _ in tree.leaves(value, lambda v: info(v) is not None)]

    # -- at the end ---------------------------------------------------------------------------
    def check(self, trace: Trace) -> None:
        """Every intervention found a site, and every module call named was given to the editor."""
        for path, n in self._named_calls(trace):
            if (path, n) not in self.module_calls_edited:
                raise UnsupportedError(
                    f"the {self.backend} backend did not hand module call {path}:{n}'s output "
                    f"to the editor, so tl.module sites cannot be edited on it"
                )
        if trace.halted:
            return
        missing = [self.items[i].selector for i, n in enumerate(self.sites_found) if not n]
        if missing:
            named = "; ".join(shown(s, 120) for s in missing)
            raise LabelNotFoundError(
                f"intervene=: {named} picked no site, so nothing was edited; the forward has "
                f"run to the end{near_names(trace, *missing)}"
            )

    def _named_calls(self, trace: Trace) -> list[tuple[str, int]]:
        return [
            (path, mp.pass_num)
            for path, module in trace.modules.items()
            for mp in module.passes
            if self.wants_module(path, mp.pass_num) and mp.out_template is not None
        ]


def _names(selector: Module, path: str, pass_num: int) -> bool:
    base, n = selector.path_pass
    return base == path and (n is None or n == pass_num)


def _set_leaf(obj: Any, path: tuple[Any, ...], leaf: Any) -> Any:
    if not path:
        return leaf
    kids = tree.children(obj) or []
    return tree.rebuild(obj, [_set_leaf(v, path[1:], leaf) if k == path[0] else v for k, v in kids])
