"""The compiled path: record the walk without running it, then compute every recorded value in one XLA call.

The per-equation walk (:class:`torchlens_jax.walk.Walker`) binds each
primitive eagerly, one Python dispatch per equation. Here the same walk runs
with :meth:`DeferredWalker._evaluate` replaced: instead of computing an
equation it appends it to a straight-line :class:`Program` and hands the
builder a :class:`Pending` placeholder (shape, dtype and device come from the
equation's abstract values). Every record (labels, arguments as Refs, module
passes, code context, custom-rule regions) is made by the very same code as on
the per-equation path; only the values differ in where they come from.

Once the walk is over (or halted: ``halt=`` cuts the program where the
forward stopped), the program runs. The first time a program is captured it
runs eagerly, equation by equation (each op timed, no compile: a one-off
capture costs what the per-equation walk costs). From the second time
(:data:`COMPILE_ON_SIGHTING`) it is compiled with ``jax.jit`` into one
executable whose outputs are exactly the values the trace keeps: the ops whose
value ``save=`` kept (or has not decided yet) and the model's outputs. Each
placeholder is then replaced by its value. All the values of one trace come
from that one executable, so no op mixes two computations; XLA computes each
returned intermediate as a value of its own, which may differ from an eager
bind of the same op in the last bits (``trace.audit()`` replays eagerly and
compares within its tolerance).

Executables are cached (:data:`CACHE`, bounded, least recently used out) by
the program itself: every primitive with its parameters, where each input
comes from, the shapes, dtypes and devices of the arguments, and which values
are returned. Parameters, inputs and constants are arguments of the
executable, never baked in, so a model whose weights change value reuses it,
while one whose structure or input shapes change makes another program, and
compiles. A program with a parameter that cannot be a key (an array, an inner jaxpr with
constants) always runs eagerly: it would otherwise compile again on every capture.

Which path a capture takes is :func:`fast_path_refusal`: the compiled path
needs a straight-line jaxpr whose values nothing in the walk reads.

Each argument of a program also says where it came from (``Program.origins``:
a parameter, an input, a constant), so that the capture cache
(:mod:`torchlens_jax.capture_cache`) can run the executable again on a later
capture's arrays without walking the jaxpr.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from time import perf_counter
from typing import Any

import attrs
import numpy as np

from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.ir.records import ParamRef, Ref
from torchlens_jax.arrays import device_name, dtype_name, is_jax_array
from torchlens_jax.walk import CALL_JAXPR, Val, Walker

# Switch for the compiled path; False sends every capture down the per-equation path.
COMPILED_CAPTURE = True
# Primitives whose value the walk itself must read as it goes (a cond's branch, each while/scan iteration), or
# whose result depends on state outside their arguments: any of them sends the whole capture down the
# per-equation path.
PER_EQUATION_PRIMITIVES = frozenset({"scan", "while", "cond", "rng_uniform"})
CACHE_SIZE = 64
# A program is compiled the n-th time it is captured; before, it runs eagerly, equation by equation (no
# compile: a one-off capture costs what the per-equation walk costs). 1 compiles at once.
COMPILE_ON_SIGHTING = 2

_ARG, _SLOT, _LIT = 0, 1, 2


@attrs.define(slots=True, eq=False)
class Pending:
    """The value of program slot ``slot``, not computed yet."""

    slot: int


@attrs.define(slots=True)
class Program:
    """Equations in the order the walk recorded them. Each step: primitive, parameters, its inputs as
    ``(_ARG, argument index)``, ``(_SLOT, slot)`` or ``(_LIT, type, Python scalar, its key)``, and its output
    slots."""

    steps: list[tuple[Any, dict[str, Any], tuple[tuple[Any, ...], ...], tuple[int, ...]]] = attrs.Factory(list)
    args: list[Any] = attrs.Factory(list)  # the arrays it reads: parameters, inputs, constants
    # where each argument came from: ("param", name), ("input", input node index) or ("const",); see origin()
    origins: list[tuple[Any, ...]] = attrs.Factory(list)
    arg_at: dict[tuple[int, tuple[Any, ...]], int] = attrs.Factory(dict)  # (id(array), origin) -> argument index
    slots: int = 0

    def source(self, value: Any, origin: tuple[Any, ...] = ("const",)) -> tuple[Any, ...]:
        if isinstance(value, Pending):
            return (_SLOT, value.slot)
        if hasattr(value, "shape") and hasattr(value, "dtype") and not _is_scalar(value):
            # One array read as a parameter and as a constant (a closure holding the same object) stays two
            # arguments: a repeat capture from the capture cache passes the new parameter, keeps the constant.
            at = self.arg_at.get((id(value), origin))
            if at is None:
                at = self.arg_at[(id(value), origin)] = len(self.args)
                self.args.append(_on_device(value) if origin == ("const",) else value)
                self.origins.append(origin)
            return (_ARG, at)
        # a jaxpr literal: part of the program, and of its cache key, which must tell it from every other
        return (_LIT, type(value), value, _literal_key(value))

    def run(self, args: list[Any], wanted: tuple[int, ...]) -> list[Any]:
        """Evaluate the program (under ``jax.jit`` this traces it); the values of slots ``wanted``."""
        env: list[Any] = [None] * self.slots
        for prim, params, sources, outs in self.steps:
            vals = [args[s[1]] if s[0] == _ARG else env[s[1]] if s[0] == _SLOT else s[2] for s in sources]
            out = prim.bind(*vals, **params)
            for slot, o in zip(outs, out if prim.multiple_results else (out,)):
                env[slot] = o
        return [env[k] for k in wanted]


class DeferredWalker(Walker):
    """The walk, recording every op as the per-equation walk does, with values left for the program."""

    def __init__(self, builder: TraceBuilder, scopes: Any, device: str) -> None:
        super().__init__(builder, scopes)
        self.program = Program()
        self.step_ops: list[int] = []  # the op each step of the program is
        self.device = device
        # Filled by execute(): the slots the executable returned, in order, and the executable (None: eager run).
        self.order: tuple[int, ...] = ()
        self.compiled: Compiled | None = None

    def _evaluate(self, eqn: Any, ins: list[Val]) -> tuple[Any, list[Any], float | None]:
        prim, p = eqn.primitive, self.program
        outs = tuple(Pending(p.slots + j) for j in range(len(eqn.outvars)))
        sources = tuple([p.source(x.value, self.origin(x.ref)) for x in ins])
        p.steps.append((prim, eqn.params, sources, tuple(o.slot for o in outs)))
        self.step_ops.append(len(self.builder.ops))  # the op the builder records next, from this equation
        p.slots += len(outs)
        infos = [(tuple(map(int, v.aval.shape)), dtype_name(v.aval.dtype), self.device) for v in eqn.outvars]
        return (outs if prim.multiple_results else outs[0]), infos, None  # timed by the eager run, if one runs

    def origin(self, ref: Any) -> tuple[Any, ...]:
        """Where a concrete value the program reads comes from: a parameter, an input (through the identity
        ops that hand one on: a module returning its input), or a constant of the jaxpr (no ref)."""
        ops = self.builder.ops
        while isinstance(ref, Ref) and not ref.path:
            op = ops[ref.index]
            if op.kind == "input":
                return ("input", ref.index)
            if not op.meta.get("identity"):
                return ("unknown", ref.index)  # no computed value reaches the program concrete: never cached
            ref = op.args[0]
        if isinstance(ref, ParamRef):
            return ("param", ref.name)
        return ("const",) if ref is None or not isinstance(ref, Ref) else ("unknown", ref.index)


def fast_path_refusal(closed: Any, builder: TraceBuilder) -> str | None:
    """Why this capture must take the per-equation path, or None when the compiled path gives the same trace."""
    if not COMPILED_CAPTURE:
        return "compiled capture switched off (torchlens_jax.compiled.COMPILED_CAPTURE)"
    options = builder.options
    if builder.editor is not None:
        return "intervene=: later equations read the edited values as the walk goes"
    if options.save_grads is not False:
        return "save_grads=: the backward replays the per-equation walk's records"
    if options.lookback and options.lookback_payload_policy != "metadata_only":
        return "lookback values are detached as they are recorded"
    if builder.stream is not None:
        return "save_to=: the compiled path computes every value at once; the walk writes each out as it goes"
    if closed.effects:
        return f"effects ({', '.join(sorted(map(str, closed.effects)))}): callbacks run in order, as they ran"
    found = _per_equation(closed.jaxpr)
    if found:
        return f"{found}: the walk reads its values as it goes (branch taken, iterations recorded one by one)"
    return None


def _per_equation(jaxpr: Any) -> str | None:
    """The first primitive in ``jaxpr`` (call-like primitives expanded, as the walk expands them) that needs
    values during the walk."""
    from jax.extend.core import ClosedJaxpr

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in PER_EQUATION_PRIMITIVES:
            return name
        sub = eqn.params.get(CALL_JAXPR.get(name, ""))
        if sub is not None:
            found = _per_equation(sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub)
            if found:
                return found
    return None


def device_of(arrays: list[Any]) -> str:
    """Where the executable runs, hence where its outputs live: the first committed JAX array's device."""
    import jax

    for a in arrays:
        if is_jax_array(a) and getattr(a, "committed", False):
            return device_name(a)
    return device_name(jax.device_put(0))


# -- executing and caching ---------------------------------------------------------------------
@attrs.define(slots=True)
class Compiled:
    executable: Any
    n_outputs: int

    def run(self, args: list[Any]) -> tuple[list[Any], float]:
        """Every value the executable returns for ``args``, computed, and the seconds that took.

        One execution's outputs become ready together (they share its completion event), so waiting for
        the last is waiting for all: ``jax.block_until_ready`` on the whole list waited on each in turn,
        18 µs for 24 outputs, half a small model's jitted call."""
        start = perf_counter()
        values = self.executable(args)
        if values:
            values[-1].block_until_ready()
        return values, perf_counter() - start


class ExecutableCache:
    """Compiled programs by :func:`program_key`, bounded, least recently used evicted; ``compiles`` counts
    every compilation, for tests and the bench. A program is compiled the second time it is met: the first
    capture of a model runs its program eagerly (what the per-equation path costs, no compile)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self.entries: OrderedDict[Any, Compiled] = OrderedDict()
        self.seen: OrderedDict[Any, int] = OrderedDict()  # programs run eagerly so far, and how often
        self.compiles = 0
        self.lock = threading.Lock()

    def get(self, program: Program, wanted: tuple[int, ...], force: bool = False) -> tuple[Compiled | None, bool]:
        """The executable for ``program`` returning slots ``wanted`` and whether it came from the cache; None
        (run the program eagerly) the first time a program is seen, or when it has no key. ``force``:
        compile it now, whatever the sightings (the capture cache's first hit: the program will run again)."""
        key = program_key(program, wanted)
        if key is None:
            return None, False
        with self.lock:
            try:
                found = self.entries.get(key)
            except Exception:  # noqa: BLE001 - a parameter whose == is not a plain bool (an array): never compiled
                return None, False
            if found is not None:
                self.entries.move_to_end(key)
                return found, True
            sightings = self.seen.get(key, 0) + 1
            # a one-off capture must not pay for XLA compiling the model
            if sightings < COMPILE_ON_SIGHTING and not force:
                self.seen[key] = sightings
                self.seen.move_to_end(key)
                while len(self.seen) > self.size:
                    self.seen.popitem(last=False)
                return None, False
        compiled = _compile(program, wanted)
        with self.lock:
            self.compiles += 1
            self.seen.pop(key, None)
            self.entries[key] = compiled
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
        return compiled, False

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.seen.clear()


CACHE = ExecutableCache()


def _compile(program: Program, wanted: tuple[int, ...]) -> Compiled:
    import jax

    # Traced and compiled by its first call (whose notes["compiled"]["seconds"] include the compile), then one
    # C++ dispatch per call: a jitted function, not an AOT-compiled one, whose Python call path cost twice as
    # much (measured with 24 outputs). It must not keep this capture's arrays (weights, inputs) alive: it
    # closes over the steps alone, and every array is an argument.
    steps = Program(steps=program.steps, slots=program.slots)
    return Compiled(jax.jit(lambda args: steps.run(args, wanted)), len(wanted))


def program_key(program: Program, wanted: tuple[int, ...]) -> Any:
    """A hashable description of everything the executable depends on; None when a parameter is unhashable."""
    try:
        steps = tuple(
            (prim, tuple(zip(params, map(_param_key, params.values()))), sources, outs)
            for prim, params, sources, outs in program.steps
        )
        # (the dtype itself: its text costs a NumPy call per argument)
        args = tuple(
            (tuple(a.shape), a.dtype, bool(getattr(a, "weak_type", False)), type(a).__name__, device_name(a))
            for a in program.args
        )
        key = (steps, args, wanted)
        hash(key)
    except TypeError:
        return None
    return key


_PLAIN_PARAMS = frozenset({int, bool, str, type(None)})  # most parameters: themselves, with no checks


def _param_key(value: Any) -> Any:
    """An equation parameter as a key: an inner jaxpr by its text (its constants too, unless it has none,
    by identity: a program holding them is then compiled again for every capture, never reused wrongly)."""
    kind = type(value)
    if kind in _PLAIN_PARAMS:
        return value
    if kind is float:  # by its bits: -0.0 == 0.0 would share an executable between programs that differ
        return ("float", value.hex())
    if kind is tuple or kind is list:
        return (kind.__name__, tuple(map(_param_key, value)))
    from jax.extend.core import ClosedJaxpr, Jaxpr

    if isinstance(value, Jaxpr):
        return ("jaxpr", str(value))
    if isinstance(value, ClosedJaxpr):
        return ("closed_jaxpr", str(value.jaxpr), tuple(map(id, value.consts)) if value.consts else ())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_param_key(v) for v in value))
    if isinstance(value, (float, complex, np.floating, np.complexfloating)):  # NumPy's, subclasses: by bits too
        return (type(value).__name__, value, _literal_key(value))
    return value


def execute(walker: DeferredWalker, extra: list[Val]) -> dict[str, Any] | None:
    """Run the walker's program once and put every value where its placeholder is: the ops' outputs,
    and the values of ``extra`` (the model's outputs, replaced in place).

    What ran, for trace.notes: the compiled executable (its output count, whether it was cached), or
    None when the program was run eagerly, equation by equation (its first capture: see ExecutableCache).
    """
    ops = walker.builder.ops
    wanted = dict.fromkeys(s for op in ops for s in _slots(op.out))
    for x in extra:
        wanted.update(dict.fromkeys(_slots(x.value)))
    order = tuple(wanted)
    program = walker.program
    compiled, cached = CACHE.get(program, order)
    walker.order, walker.compiled = order, compiled
    if compiled is None:
        values = _run_eagerly(program, order, walker.step_ops, ops)
    else:
        values, elapsed = compiled.run(program.args)
    by_slot = dict(zip(order, values))
    for op in ops:
        if _slots(op.out):
            op.out = _filled(op.out, by_slot)
    for x in extra:
        if _slots(x.value):  # an output returned as it came in (an input, a parameter) needs no filling
            x.value = _filled(x.value, by_slot)
    if compiled is None:
        return None
    return {
        "outputs": compiled.n_outputs,
        "slots": program.slots,
        "steps": len(program.steps),
        "cached": cached,
        "seconds": elapsed,
    }


def _run_eagerly(program: Program, wanted: tuple[int, ...], step_ops: list[int], ops: list[Any]) -> list[Any]:
    """The program bound equation by equation, as the per-equation walk binds it, each op timed."""
    import jax

    env: list[Any] = [None] * program.slots
    args = program.args
    for (prim, params, sources, outs), at in zip(program.steps, step_ops):
        vals = [args[s[1]] if s[0] == _ARG else env[s[1]] if s[0] == _SLOT else s[2] for s in sources]
        start = perf_counter()
        out = jax.block_until_ready(prim.bind(*vals, **params))  # dispatch is async
        ops[at].elapsed = perf_counter() - start
        for slot, o in zip(outs, out if prim.multiple_results else (out,)):
            env[slot] = o
    return [env[k] for k in wanted]


def _slots(value: Any) -> list[int]:
    """The placeholders in an op's output (one, or a tuple of them for a multiple-result primitive)."""
    if isinstance(value, Pending):
        return [value.slot]
    if isinstance(value, tuple):
        return [v.slot for v in value if isinstance(v, Pending)]
    return []


def _filled(value: Any, by_slot: dict[int, Any]) -> Any:
    if isinstance(value, Pending):
        return by_slot[value.slot]
    return tuple(by_slot[v.slot] if isinstance(v, Pending) else v for v in value)


def _on_device(const: Any) -> Any:
    """A jaxpr constant held in host memory (NumPy, JAX's literal arrays) as a JAX array of the same abstract
    value (dtype and weak type): an executable argument in host memory is copied to the device at every call,
    which on a small model cost a third of the call (linen_mlp's five scalars: 94 against 66 µs, with the wait
    for the outputs below)."""
    import jax

    if is_jax_array(const):
        return const
    moved = jax.device_put(const)
    return moved if jax.typeof(moved) == jax.typeof(const) else const


def _literal_key(value: Any) -> Any:
    """What tells a literal from others equal to it under ==: a float's bits (-0.0 == 0.0, yet 1 / x differs)
    and the dtype JAX typed it with (``TypedFloat(1.0, dtype=float16)`` == ``TypedFloat(1.0, dtype=float32)``)."""
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, (float, np.floating)):
        return float(value).hex(), dtype
    if isinstance(value, (complex, np.complexfloating)):
        return repr(complex(value)), dtype
    return dtype


def _is_scalar(value: Any) -> bool:
    return isinstance(value, np.generic)
