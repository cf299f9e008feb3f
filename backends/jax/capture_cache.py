"""The capture cache: a repeat capture of a jitted target at jit's speed, without make_jaxpr or the walk.

A capture of a jitted target (:mod:`torchlens_jax.jitted`) whose values come
from the compiled path (:mod:`torchlens_jax.compiled`) is kept here as a
:class:`Skeleton`: every record of the trace without its values (ops, module
passes, parameter records, the output template, the notes), where each value
comes from (an output of the program's executable, an input, a parameter, a
constant of the jaxpr), and the program itself. A later capture with the same
key (:mod:`torchlens_jax.cache_keys`) runs the executable on the current
parameter and input arrays (new weights give new values: they are arguments)
and builds a fresh trace from the skeleton: new records, each value filled in,
labels, parents, module passes, code context and metadata as the first
capture recorded them. The executable's outputs are the trace's
``model_output``, as on the compiled path. ``trace.notes["capture"]`` says the
trace came from here.

Only a jitted target is cached: the user has accepted jit's contract (traced
once per signature; globals and closures baked in), so reusing the trace is
what the jitted function itself does. A plain function may read a global that
changes between calls, which no key can see: it is traced every time.

Entries live as long as the jitted target (held weakly: a dropped function
frees them), at most :data:`CACHE_SIZE` over all targets, least recently used
out.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import attrs

from torchlens_core.ir import tree
from torchlens_core.ir.records import ModuleRecord, OpRecord, ParamRecord, Ref, op_from_fields
from torchlens_core.ir.trace import Trace
from torchlens_jax import compiled as compiled_path
from torchlens_jax.cache_keys import Probe
from torchlens_jax.compiled import Compiled, DeferredWalker, Pending, Program
from torchlens_jax.custom_rules import keep_again, kept_rules
from torchlens_jax.record_templates import FIELD_AT, Template, fresh, fresh_template, template
from torchlens_jax.scopes import fill
from torchlens_jax.walk import Val

# Switch for the cache; False traces every capture (the per-capture paths of compiled.py are unchanged).
CAPTURE_CACHE = True
CACHE_SIZE = 64
# Programs with random primitives are never cached: where their keys come from (an argument, a seed or key the
# forward makes from Python state) is left to the ordinary path, which traces every capture anew.
RANDOM_PRIMITIVES = frozenset(
    {
        "random_seed",
        "random_bits",
        "random_split",
        "random_fold_in",
        "random_wrap",
        "random_unwrap",
        "threefry2x32",
        "rng_bit_generator",
        "rng_uniform",
    }
)
CAPTURE_NOTE = (
    "the capture cache (a repeat capture of a jitted target, under jit's contract): the records of "
    "its first capture, every value from one call of the cached executable; no make_jaxpr, no walk"
)

# Where a value comes from, on a hit: (_SLOT, slot), (_SLOTS, slots) for a several-output op, (_INPUT, position),
# (_PARAM, position), (_CONST, value), (_NONE,) for a value save= left out, (_OUTPUT, path into model_output).
_SLOT, _SLOTS, _INPUT, _PARAM, _CONST, _NONE, _OUTPUT = range(7)


class Uncacheable(Exception):
    """This capture's values cannot all be found again from its arguments: it is not kept."""


@attrs.define(slots=True, eq=False)
class Skeleton:
    """One capture of a jitted target, without its values; :func:`answer` makes traces of it."""

    backend: str
    model_name: str
    ops: list[Template]
    sources: list[tuple[Any, ...]]  # where each op's value comes from
    modules: list[tuple[Template, list[Template]]]  # each module's record and its passes'
    params: list[Template]  # in the order of Probe.params
    output_template: Any
    out_slots: Any  # the model output's structure, Slots where its arrays go
    out_sources: list[tuple[Any, ...]]
    notes: dict[str, Any]
    halted: bool
    rules: dict[int, list[Any]]  # custom_jvp / custom_vjp rules, by the op they start at
    steps: Program  # the program without arguments: what the executable computes
    order: tuple[int, ...]  # the slots the executable returns
    arg_sources: list[tuple[Any, ...]]  # each argument of the executable
    compiled: Compiled | None = None  # None until the first hit compiles it


# -- the cache ---------------------------------------------------------------------------------
class CaptureCache:
    """Skeletons by (jitted target, key). Targets are held weakly: when one is collected, its entries go."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self.entries: OrderedDict[tuple[int, Any], Skeleton] = OrderedDict()
        self.owners: dict[int, weakref.ref[Any]] = {}
        self.hits = self.stores = 0
        # Reentrant: a target collected while the lock is held (its refcount dropping inside) calls _forget.
        self.lock = threading.RLock()

    def get(self, probe: Probe) -> Skeleton | None:
        with self.lock:
            ref = self.owners.get(id(probe.owner))
            if ref is None or ref() is not probe.owner:
                return None
            try:
                found = self.entries.get((id(probe.owner), probe.key))
            except Exception:  # noqa: BLE001 - a static argument whose == is not a plain bool (an array): no hit
                return None
            if found is not None:
                self.entries.move_to_end((id(probe.owner), probe.key))
                self.hits += 1
            return found

    def put(self, probe: Probe, skeleton: Skeleton) -> None:
        owner_id = id(probe.owner)

        def forget(_: Any, at: int = owner_id) -> None:
            self._forget(at)

        try:
            ref = weakref.ref(probe.owner, forget)
        except TypeError:  # a target without weak references: its entries could never be freed
            return
        with self.lock:
            known = self.owners.get(owner_id)
            if known is None or known() is not probe.owner:
                self._forget(owner_id)
                self.owners[owner_id] = ref
            self.entries[(owner_id, probe.key)] = skeleton
            self.entries.move_to_end((owner_id, probe.key))
            self.stores += 1
            while len(self.entries) > self.size:
                (gone, _), _ = self.entries.popitem(last=False)
                if not any(at == gone for at, _ in self.entries):
                    self.owners.pop(gone, None)

    def _forget(self, owner_id: int) -> None:
        with self.lock:
            self.owners.pop(owner_id, None)
            for key in [k for k in self.entries if k[0] == owner_id]:
                del self.entries[key]

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.owners.clear()

    def __len__(self) -> int:
        return len(self.entries)


CACHE = CaptureCache()


def lookup(probe: Probe | None) -> Skeleton | None:
    if probe is None or not CAPTURE_CACHE or not compiled_path.COMPILED_CAPTURE:
        return None
    return CACHE.get(probe)


# -- keeping a capture -------------------------------------------------------------------------
def value_sources(walker: DeferredWalker, outs: list[Val]) -> tuple[list[Any], list[Any]] | None:
    """Where each op's value and each model output comes from, read before the program fills them in; None
    when some value could not be found again (the capture is then not kept)."""
    ops = walker.builder.ops
    try:
        op_sources = [_source(op.out, op.index, walker) for op in ops]
        out_indices = [x.ref.index if isinstance(x.ref, Ref) and not x.ref.path else None for x in outs]
        return op_sources, [_source(x.value, index, walker) for x, index in zip(outs, out_indices)]
    except Uncacheable:
        return None


def _source(value: Any, index: int | None, walker: DeferredWalker) -> tuple[Any, ...]:
    if isinstance(value, Pending):
        return (_SLOT, value.slot)
    if value is None:
        return (_NONE,)
    if type(value) is tuple and value and all(isinstance(v, Pending) for v in value):
        return (_SLOTS, tuple(v.slot for v in value))
    if index is None:
        raise Uncacheable("a part of a several-output op's value that the program does not compute")
    origin = walker.origin(Ref(index))
    if origin[0] == "const":
        return (_CONST, value)
    return _origin_source(origin)


def _origin_source(origin: tuple[Any, ...]) -> tuple[Any, ...]:
    if origin[0] == "input":
        return (_INPUT, origin[1])  # input node k is the k-th input: capture adds them first, in order
    if origin[0] == "param":
        return (_PARAM, origin[1])  # a name, made a position by store()
    raise Uncacheable(f"a value of unknown origin ({origin})")


def store(
    probe: Probe,
    trace: Trace,
    walker: DeferredWalker,
    sources: tuple[list[Any], list[Any]],
    out_slots: Any,
    params: list[Any],
    inputs: list[Any],
) -> bool:
    """Keep ``trace``, just captured for ``probe`` from the model view's ``params`` (named arrays) and the
    ``inputs`` it made input nodes of, as a skeleton; False when it cannot be kept."""
    if not CAPTURE_CACHE:
        return False
    try:
        return _store(probe, trace, walker, sources, out_slots, params, inputs)
    except Exception:  # noqa: BLE001 - a record this cannot copy: the capture is returned all the same, uncached
        return False


def _store(
    probe: Probe,
    trace: Trace,
    walker: DeferredWalker,
    sources: tuple[list[Any], list[Any]],
    out_slots: Any,
    params: list[Any],
    inputs: list[Any],
) -> bool:
    program = walker.program
    if any(step[0].name in RANDOM_PRIMITIVES for step in program.steps):
        return False
    if compiled_path.program_key(program, walker.order) is None:  # runs eagerly every time: nothing to reuse
        return False
    # A hit finds the parameters and inputs itself (cache_keys.probe): they must be the very arrays this
    # capture read, in the same order, or a hit would give one parameter's value another's name.
    if not (_same_objects(probe.params, [p.value for p in params]) and _same_objects(probe.inputs, inputs)):
        return False
    param_names = [p.name for p in params]
    position = {name: j for j, name in enumerate(param_names)}
    try:
        arg_sources = [
            (_CONST, value) if origin == ("const",) else _origin_source(origin)
            for origin, value in zip(program.origins, program.args)
        ]
        op_sources, out_sources = ([_positioned(s, position) for s in part] for part in sources)
        arg_sources = [_positioned(s, position) for s in arg_sources]
    except Uncacheable:
        return False
    for (kind, *rest), value in zip(arg_sources, program.args):  # and each argument of the program is one of them
        found = probe.params[rest[0]] if kind == _PARAM else probe.inputs[rest[0]] if kind == _INPUT else value
        if found is not value:
            return False
    # the output nodes, added after the walk
    by_op: list[tuple[Any, ...] | None] = [*op_sources, *[None] * (len(trace.ops) - len(op_sources))]
    for path, ref in tree.leaves(trace.output_template, lambda x: isinstance(x, Ref)):
        by_op[ref.index] = (_OUTPUT, path)
    if len(by_op) != len(trace.ops) or any(s is None for s in by_op):
        return False
    elapsed_free = {"elapsed": None}  # the compiled path times no op
    notes = fresh({k: v for k, v in trace.notes.items() if k not in ("compiled", "capture")})
    skeleton = Skeleton(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=[template(op, **elapsed_free) for op in trace.ops],
        sources=[s for s in by_op if s is not None],  # (every one: checked above)
        modules=[(template(m), [template(mp) for mp in m.passes]) for m in trace.modules.values()],
        params=[template(trace.params[name]) for name in param_names],
        output_template=fresh_template(trace.output_template),
        out_slots=fresh_template(out_slots),
        out_sources=out_sources,
        notes=notes,
        halted=trace.halted,
        rules=kept_rules(trace.ops),
        steps=Program(steps=program.steps, slots=program.slots),
        order=walker.order,
        arg_sources=arg_sources,
        compiled=walker.compiled,
    )
    CACHE.put(probe, skeleton)
    return True


def _same_objects(found: list[Any], expected: list[Any]) -> bool:
    return len(found) == len(expected) and all(a is b for a, b in zip(found, expected))


def _positioned(source: tuple[Any, ...], position: dict[str, int]) -> tuple[Any, ...]:
    if source[0] == _PARAM and isinstance(source[1], str):
        if source[1] not in position:
            raise Uncacheable(f"parameter {source[1]} is not the model's")
        return (_PARAM, position[source[1]])
    return source


# -- answering a capture -----------------------------------------------------------------------
def executable_args(probe: Probe, skeleton: Skeleton) -> list[Any]:
    """The arguments of ``skeleton``'s executable for this capture: its parameters and inputs, and constants."""
    return [
        probe.params[s[1]] if s[0] == _PARAM else probe.inputs[s[1]] if s[0] == _INPUT else s[1]
        for s in skeleton.arg_sources
    ]


def answer(probe: Probe, skeleton: Skeleton) -> Trace | None:
    """A new trace from ``skeleton``, every value computed by one call of its executable on ``probe``'s arrays
    (None: no executable could be made, and the capture takes the ordinary path)."""
    args = executable_args(probe, skeleton)
    compiled, cached = skeleton.compiled, True
    if compiled is None:  # the first hit: compile now (once; a race compiles twice, harmlessly)
        program = Program(steps=skeleton.steps.steps, args=args, slots=skeleton.steps.slots)
        compiled, cached = compiled_path.CACHE.get(program, skeleton.order, force=True)
        if compiled is None:  # no key after all (store() checked there was one): the ordinary path
            return None
        skeleton.compiled = compiled
    values, elapsed = compiled.run(args)
    by_slot = dict(zip(skeleton.order, values))

    def resolve(source: tuple[Any, ...]) -> Any:
        kind = source[0]
        if kind == _SLOT:
            return by_slot[source[1]]
        if kind == _SLOTS:
            return tuple(by_slot[k] for k in source[1])
        if kind == _INPUT:
            return probe.inputs[source[1]]
        if kind == _PARAM:
            return probe.params[source[1]]
        if kind == _CONST:
            return source[1]
        return None

    model_output = None
    if not skeleton.halted:
        model_output = fill(skeleton.out_slots, [resolve(s) for s in skeleton.out_sources])
    ops = []
    for op, source in zip(skeleton.ops, skeleton.sources):  # the hot loop: one record per op, made inline
        values = op.values.copy()
        for i, copier in op.copies:
            values[i] = copier(values[i])
        if source[0] == _OUTPUT:
            values[_OUT] = tree.get(model_output, source[1])
        elif values[_SAVED]:
            values[_OUT] = by_slot[source[1]] if source[0] == _SLOT else resolve(source)
        ops.append(op_from_fields(values))  # (the template's dtype is a str; nothing of a new record is on disk)
    modules = {}
    for module, passes in skeleton.modules:
        record = module.make(_PASSES, [p.make() for p in passes])
        modules[record.path] = record
    params = {}
    for record, value in zip(skeleton.params, probe.params):
        made = record.make(_VALUE, value)
        params[made.name] = made
    notes = fresh(skeleton.notes)
    notes["capture"] = CAPTURE_NOTE
    notes["compiled"] = {
        "outputs": compiled.n_outputs,
        "slots": skeleton.steps.slots,
        "steps": len(skeleton.steps.steps),
        "cached": cached,
        "seconds": elapsed,
    }
    trace = Trace(
        skeleton.backend,
        skeleton.model_name,
        ops,
        modules,
        params,
        fresh_template(skeleton.output_template),
        model_output,
        notes,
        skeleton.halted,
    )
    ref = weakref.ref(trace)
    for made_op in ops:
        made_op.trace_ref = ref
    for module in modules.values():
        for mp in module.passes:
            mp.trace_ref = ref
    keep_again(ops, skeleton.rules)
    return trace


_SAVED, _OUT = FIELD_AT[OpRecord]["saved"], FIELD_AT[OpRecord]["out"]
_PASSES, _VALUE = FIELD_AT[ModuleRecord]["passes"], FIELD_AT[ParamRecord]["value"]
