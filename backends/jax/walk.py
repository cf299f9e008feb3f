"""The evaluator: walk a jaxpr eagerly, binding each primitive equation once and recording it as an op.

(:class:`torchlens_jax.compiled.DeferredWalker` is this walk with the binding
deferred: it records the same ops and computes their values afterwards.)

Higher-order primitives are not ops of their own. Call-like ones (jit,
custom_jvp/vjp calls, closed_call, remat) are expanded into their inner
equations; ``scan`` and ``while`` run their body once per iteration, each
iteration's ops being passes of the same layers; ``cond`` runs the branch its
index picks, and only that branch is recorded. Those indices, and each while
iteration's condition, are the only values the walk turns into Python ones:
each is reported (``TraceBuilder.to_python``), so that replay on new inputs
checks the graph still holds. Any other primitive that holds a jaxpr is
recorded as one op and counted in the trace's notes as opaque.

Module scoping comes from the name stack of each equation: a scope made by
:class:`~torchlens_jax.scopes.CallScopes` opens a pass of that module, and
the call's output marker closes it, naming what the call returned. What a
pass does when it opens and closes (pass-through ops for values the call did
not compute, ``intervene=``'s module sites, ``tl.splice_module``) is the
core's :class:`~torchlens_core.capture.passes.ModulePasses`, which the torch,
TF, Paddle and tinygrad captures share; the walk only says what a returned
value is to it: a :class:`Val` of its environment, which carries its Ref.
"""

from __future__ import annotations

import operator
import os
from collections import Counter
from collections.abc import Callable
from itertools import compress
from time import perf_counter
from typing import Any

import attrs
import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, Literal

import torchlens_core
from torchlens_core.capture import api
from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.capture.edits import PassThroughs
from torchlens_core.capture.passes import ModulePasses
from torchlens_core.capture.sites import CONTEXT_FRAMES
from torchlens_core.ir import tree
from torchlens_core.ir.errors import UnsupportedError
from torchlens_core.ir.records import CodeLocation, OpRecord, ParamRef, Ref
from torchlens_jax.arrays import array_info
from torchlens_jax.custom_rules import CustomRule, keep
from torchlens_jax.scopes import MARKER_NAME, CallScopes, fill, unfill

# Call-like primitives and the parameter holding the jaxpr they run.
CALL_JAXPR = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}
# Those whose derivative is a rule of their own, not their equations' (see torchlens_jax.custom_rules).
CUSTOM_RULES = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


@attrs.define(slots=True)
class Val:
    """A value in the walk's environment, and what an op's arguments say for it:
    a Ref, a ParamRef, or nothing (a constant, which goes into the arguments as it is)."""

    value: Any
    ref: Ref | ParamRef | None = None

    @property
    def arg(self) -> Any:
        return self.value if self.ref is None else self.ref


class Walker(ModulePasses):
    def __init__(self, builder: TraceBuilder, scopes: CallScopes | None = None) -> None:
        self.builder = builder
        self.scopes = scopes
        self.active: list[int] = []  # open module calls, innermost last, as on builder.module_stack
        self.expanded: Counter[str] = Counter()
        self.opaque: Counter[str] = Counter()
        # Ops whose values picked the cond branch or kept the while loop going that we are inside.
        self.conditions: tuple[int, ...] = ()
        # Vals a module call returned as the module had them (a later read is the model's own, where the module
        # kept it), and those a module site's edit replaced for the call's caller (no recorded op may read them).
        self.pass_throughs = PassThroughs(None, builder.ops)
        self.name_stacks: dict[int, tuple[Any, tuple[int, ...]]] = {}  # id -> (name stack, its calls): _calls

    # -- walking ---------------------------------------------------------------------------
    def run(
        self,
        jaxpr: Any,
        consts: list[Val],
        args: list[Val],
        chain: tuple[int, ...] = (),
        loc: tuple[Any, ...] = (),
        in_loop: bool = False,
        helper: bool = False,
    ) -> list[Val]:
        """Evaluate ``jaxpr`` on ``args``; the values of its outputs.

        ``chain`` is the module calls the enclosing equation ran inside (the name
        stack of a sub-jaxpr is relative to its parent's); ``loc`` says where this
        jaxpr sits, so that inside loops every equation gets one layer for all
        its iterations; ``helper`` marks jaxprs made by the walk itself (the
        slicing and stacking of a scan), whose code site is not the user's.
        """
        env: dict[Any, Val] = {}

        def read(var: Any) -> Val:
            return Val(var.val) if isinstance(var, Literal) else env[var]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        passes = self.pass_throughs
        # save_to=: the values are written out as they are recorded, so the walk lets each go after its last
        # read here (a trace larger than memory holds only the values still to be read)
        last_reads = _last_reads(jaxpr) if self.builder.stream is not None else None
        for i, eqn in enumerate(jaxpr.eqns):
            ins = [read(v) for v in eqn.invars]
            if passes.kept_values or passes.unedited:  # values a module kept, or an edit replaced
                passes.read(ins)
            eqn_chain = chain + self._calls(eqn)
            self._align(eqn_chain)
            outs = self._eqn(eqn, ins, eqn_chain, (*loc, i), in_loop, helper)
            for var, val in zip(eqn.outvars, outs):
                if not isinstance(var, DropVar):
                    env[var] = val
            if last_reads is not None:
                for var in last_reads.get(i, ()):
                    env.pop(var, None)
        self._align(chain)  # calls begun in here end in here (each loop iteration is a pass)
        outs = [read(v) for v in jaxpr.outvars]
        if passes.kept_values or passes.unedited:
            passes.read(outs)
        return outs

    def run_closed(
        self,
        closed: Any,
        args: list[Val],
        chain: tuple[int, ...],
        loc: tuple[Any, ...],
        in_loop: bool,
        helper: bool = False,
    ) -> list[Val]:
        return self.run(closed.jaxpr, [Val(c) for c in closed.consts], args, chain, loc, in_loop, helper)

    def _eqn(
        self, eqn: Any, ins: list[Val], chain: tuple[int, ...], loc: tuple[Any, ...], in_loop: bool, helper: bool
    ) -> list[Val]:
        name = eqn.primitive.name
        if name == MARKER_NAME:
            return self._marker(eqn, ins)
        sub = eqn.params.get(CALL_JAXPR.get(name, ""))
        if isinstance(sub, (Jaxpr, ClosedJaxpr)):
            self.expanded[name] += 1
            closed = sub if isinstance(sub, ClosedJaxpr) else ClosedJaxpr(sub, ())
            if name in CUSTOM_RULES:
                return self._custom_rule(eqn, closed, ins, chain, loc, in_loop, helper)
            return self.run_closed(closed, ins, chain, loc, in_loop, helper)
        if name == "scan":
            return self._scan(eqn, ins, chain, loc, in_loop)
        if name == "cond":
            return self._cond(eqn, ins, chain, loc, in_loop)
        if name == "while":
            return self._while(eqn, ins, chain, loc, in_loop)
        meta = {}
        config, inner = _config(eqn.params)
        if inner:  # a higher-order primitive we do not expand: one op, run as a whole
            self.opaque[name] += 1
            meta = {"opaque": True, "inner_eqns": sum(len(j.eqns) for j in inner)}
        return self._record(eqn, ins, loc if in_loop else None, helper, meta, config)

    # -- one op ----------------------------------------------------------------------------
    def _record(
        self,
        eqn: Any,
        ins: list[Val],
        loc: tuple[Any, ...] | None,
        helper: bool,
        meta: dict[str, Any],
        config: dict[str, Any],
    ) -> list[Val]:
        """Record one equation (``config``: its parameters that are settings, :func:`_config`'s)."""
        prim, params = eqn.primitive, eqn.params
        out, infos, elapsed = self._evaluate(eqn, ins)
        outs = tuple(out) if prim.multiple_results else (out,)
        shapes = [i[0] if i else None for i in infos]
        first = next((i for i in infos if i), None)
        if prim.multiple_results:  # the record's dtype is the first output's; gradients need each one's
            meta = {**meta, "out_dtypes": tuple(i[1] if i else None for i in infos)}
        args, parents, names = [], [], []  # (one loop: this runs for every equation)
        for x in ins:
            ref = x.ref
            if ref is None:
                args.append(x.value)
                continue
            args.append(ref)
            if type(ref) is Ref:
                parents.append(ref.index)
            elif type(ref) is ParamRef:
                names.append(ref.name)
        op = self.builder.add_op(
            prim.name,
            (prim, params),
            tuple(args),
            config,
            tuple(parents) if len(parents) < 2 else tuple(dict.fromkeys(parents)),
            outs if prim.multiple_results else out,
            shape=tuple(shapes) if prim.multiple_results else shapes[0],
            dtype=first[1] if first else None,
            device=first[2] if first else None,
            params=tuple(dict.fromkeys(names)) if names else (),
            code_context=() if helper else _code_context(eqn),
            layer_key=None if loc is None else ("jax-loop", loc),
            meta=meta,
            elapsed=elapsed,
            conditions=self.conditions,
        )
        if self.builder.editor is not None:  # intervene=: later equations read what the edit made of the value
            out = self.builder.seen_value(op, outs if prim.multiple_results else out)
            outs = tuple(out) if prim.multiple_results else (out,)
        if prim.multiple_results:
            return [Val(o, Ref(op.index, (j,))) for j, o in enumerate(outs)]
        return [Val(out, Ref(op.index))]

    def _evaluate(self, eqn: Any, ins: list[Val]) -> tuple[Any, list[Any], float | None]:
        """Run one equation now: its output (a tuple for a multiple-result primitive), each output's
        ``array_info``, and the seconds it took. :mod:`torchlens_jax.compiled` defers this instead."""
        prim = eqn.primitive
        start = perf_counter()
        out = jax.block_until_ready(prim.bind(*[x.value for x in ins], **eqn.params))  # dispatch is async
        elapsed = perf_counter() - start
        return out, [array_info(o) for o in (tuple(out) if prim.multiple_results else (out,))], elapsed

    # -- what a returned value is to the walk (the hooks of ModulePasses) ---------------------------
    def is_array(self, value: Any) -> bool:
        return type(value) is Val

    def producer(self, value: Val) -> Ref | None:
        return value.ref if isinstance(value.ref, Ref) else None

    def pass_source(self, value: Val, ref: Ref | None) -> tuple[Any, Any]:
        if ref is not None:
            return ref, value.value
        import jax.numpy as jnp

        array = jnp.asarray(value.value)  # a jaxpr literal is a Python scalar: outputs are arrays
        return (value.ref if isinstance(value.ref, ParamRef) else array), array

    def passed(self, value: Val, op: OpRecord, seen: Any) -> Val:
        # intervene= may select the identity op too: what comes after reads the edited value, as replay does
        return Val(seen, Ref(op.index))

    def values_of(self, output: Any) -> Any:
        return tree.map_leaves(lambda v: v.value if type(v) is Val else v, output)

    def relink(self, value: Val, ref: Ref, edited: Any) -> Val:
        """Later equations read the marker's output, and so the edit. The marker's input, which the model may
        have kept (``self.last = y``), stays the unedited value, which no recorded op may read when the edit
        was made on the op that computed it (:meth:`PassThroughs.replaced`)."""
        if edited is value.value and ref == value.ref:
            return value
        if edited is not value.value:
            self.pass_throughs.replaced(value, ref.index)
        return Val(edited, ref)

    def describe(self, value: Any) -> tuple[tuple[int, ...], str, str]:
        info = array_info(value)
        assert info is not None  # the recorder describes arrays only (is_array)
        return info

    def outputs(self, slots: Any, outs: list[Val]) -> tuple[Any, list[Val]]:
        """The model returned ``outs`` (the array leaves of ``slots``): its template of Refs, and the values it
        returned (an output no op computed, an input, a parameter, a constant, gets a pass-through op)."""
        template, returned = self.returned(fill(slots, outs), None)
        return template, unfill(slots, returned, len(outs))

    def _custom_rule(
        self,
        eqn: Any,
        closed: Any,
        ins: list[Val],
        chain: tuple[int, ...],
        loc: tuple[Any, ...],
        in_loop: bool,
        helper: bool,
    ) -> list[Val]:
        """A custom_jvp / custom_vjp function: its equations are ops, and its rule is kept for gradients.

        Each output gets an op inside the call (an identity op for an operand
        or constant returned as it is), so that the backward can tell a reader
        of the output, which JAX differentiates through the rule, from a
        reader of the operand itself.
        """
        start = len(self.builder.ops)
        outs = self.run_closed(closed, ins, chain, loc, in_loop, helper)
        outs = [
            x if isinstance(x.ref, Ref) and x.ref.index >= start else self.pass_through(x, self.producer(x))[1]
            for x in outs
        ]
        out_refs = tuple(x.ref for x in outs if isinstance(x.ref, Ref))
        assert len(out_refs) == len(outs)  # each an output of an op inside the call, made so above
        info = getattr(closed.jaxpr, "debug_info", None)
        name = str(getattr(info, "func_name", "") or eqn.params.get("name", "") or eqn.primitive.name)
        keep(
            self.builder.ops,
            CustomRule(
                name,
                (eqn.primitive, eqn.params),
                tuple(x.arg for x in ins),
                out_refs,
                start,
                len(self.builder.ops),
            ),
        )
        return outs

    # -- module calls ----------------------------------------------------------------------
    def _calls(self, eqn: Any) -> tuple[int, ...]:
        """The module calls named in an equation's name stack, outermost first."""
        if self.scopes is None:
            return ()
        # The equations of one scope share one name stack object (immutable), whose printing costs more than
        # the rest of this: read once per object. The object is held, so that its id is not reused meanwhile.
        stack = eqn.source_info.name_stack
        known = self.name_stacks.get(id(stack))
        if known is None or known[0] is not stack:
            known = self.name_stacks[id(stack)] = (stack, self.scopes.calls_in(str(stack)))
        return known[1]

    def _align(self, chain: tuple[int, ...]) -> None:
        """Make the open module calls those of ``chain``: end the others, begin the new ones."""
        if self.scopes is None:  # no call is scoped: none is ever open
            return
        n = 0
        while n < len(self.active) and n < len(chain) and self.active[n] == chain[n]:
            n += 1
        while len(self.active) > n:  # left without its marker: what the call returned is not known
            self.builder.exit_module(self.scopes.calls[self.active.pop()], None)
        for k in chain[n:]:
            self.enter_pass(self.scopes.calls[k])
            self.active.append(k)
            if self.scopes.splicer is not None:
                self._check_splice(k)

    def _check_splice(self, k: int) -> None:
        """``tl.splice_module`` replaced traced calls; refuse a pass that the splice judges otherwise.

        The n-th traced call of a module is not always its n-th pass: a call in
        a loop body runs as several passes, one in a cond branch not taken as
        none. When a splice names some of those passes and not others, the
        jaxpr cannot do what it asks: refused, never silently done otherwise.
        """
        path, n = self.builder.module_stack[-1]
        wanted = self.splice(path) is not None
        assert self.scopes is not None  # (called for a scoped call)
        if wanted != (k in self.scopes.spliced):
            what = (
                "names call {c}, whose code was traced as it is"
                if wanted
                else "does not name call {c}, whose code was traced replaced"
            ).format(c=f"{path}:{n}")
            raise UnsupportedError(
                f"tl.splice_module {what}: on jax a module call is replaced where the forward is traced, and this "
                f"call's traced code also runs passes the splice judges otherwise (a loop body, a cond branch, a "
                f"jitted function called again). Splice every call of the module: "
                f"tl.when(tl.module({path!r}), tl.splice_module(f))"
            )

    def _marker(self, eqn: Any, ins: list[Val]) -> list[Val]:
        """Call ``k``'s output marker: the call returned ``ins``, and its pass closes here. The marker's
        outputs are what every later equation reads of the call, so handing them what ``intervene=`` made of
        the call's output edits it for all of them, as a forward hook returning a new value would."""
        scopes = self.scopes
        k = scopes.call_of_marker(eqn.params) if scopes else None
        if scopes is None or k is None or not self.active or self.active[-1] != k:
            return ins  # another capture's marker (from a jit cache): a plain pass-through
        here = self.builder.module_stack[-1]
        for x in ins:  # later reads of the marker's input, computed in the call, are where the module kept it
            ref = self.producer(x)
            if ref is not None and self.computed_in(ref, here):
                self.pass_throughs.kept(x, ref.index)
        self.active.pop()
        slots = scopes.templates[k]
        outs = unfill(slots, self.exit_pass(scopes.calls[k], fill(slots, ins)), len(ins))
        # what the call computed and returned as it is gets a Val of its own: reads of it are the caller's
        return [Val(y.value, y.ref) if y is x else y for x, y in zip(ins, outs)]

    # -- control flow ----------------------------------------------------------------------
    def _scan(self, eqn: Any, ins: list[Val], chain: tuple[int, ...], loc: tuple[Any, ...], in_loop: bool) -> list[Val]:
        import jax
        import jax.numpy as jnp

        p = eqn.params
        n, n_consts, n_carry = p["length"], p["num_consts"], p["num_carry"]
        consts, carry, xs = ins[:n_consts], ins[n_consts : n_consts + n_carry], ins[n_consts + n_carry :]
        ys_at: list[list[Val]] = [[] for _ in range(n)]
        for it in range(n):
            i = n - 1 - it if p["reverse"] else it
            rows = [
                self._helper(
                    lambda a, i=i: jax.lax.index_in_dim(a, i, keepdims=False), [x], chain, (*loc, "x", j), True
                )[0]
                for j, x in enumerate(xs)
            ]
            outs = self.run_closed(p["jaxpr"], consts + carry + rows, chain, (*loc, "body"), True)
            carry, ys_at[i] = outs[:n_carry], outs[n_carry:]
        ys = []
        for j, var in enumerate(eqn.outvars[n_carry:]):
            if n == 0:
                ys.append(Val(jnp.zeros(var.aval.shape, var.aval.dtype)))
            else:
                ys.append(
                    self._helper(lambda *r: jnp.stack(r), [y[j] for y in ys_at], chain, (*loc, "y", j), in_loop)[0]
                )
        self.expanded["scan"] += 1
        return carry + ys

    def _cond(self, eqn: Any, ins: list[Val], chain: tuple[int, ...], loc: tuple[Any, ...], in_loop: bool) -> list[Val]:
        branches = eqn.params["branches"]
        index = self._decider(ins[0])
        picked = operator.index(np.asarray(index.value))
        self._decided(index, "index", picked)
        b = min(max(picked, 0), len(branches) - 1)  # lax.cond clamps its index too
        self.expanded["cond"] += 1
        outer = self.conditions
        if isinstance(index.ref, Ref):
            self.conditions = (*outer, index.ref.index)
        try:
            return self.run_closed(branches[b], ins[1:], chain, (*loc, "branch", b), in_loop)
        finally:
            self.conditions = outer

    def _while(
        self, eqn: Any, ins: list[Val], chain: tuple[int, ...], loc: tuple[Any, ...], in_loop: bool
    ) -> list[Val]:
        p = eqn.params
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        cond_consts, body_consts, carry = ins[:nc], ins[nc : nc + nb], ins[nc + nb :]
        while True:
            (pred,) = self.run_closed(p["cond_jaxpr"], cond_consts + carry, chain, (*loc, "cond"), True)
            pred = self._decider(pred)
            go = bool(np.asarray(pred.value))
            self._decided(pred, "bool", go)  # every iteration's, the last (False) included: the count is baked in
            if not go:
                break
            outer = self.conditions
            if isinstance(pred.ref, Ref):
                self.conditions = (*outer, pred.ref.index)
            try:
                carry = self.run_closed(p["body_jaxpr"], body_consts + carry, chain, (*loc, "body"), True)
            finally:
                self.conditions = outer
        self.expanded["while"] += 1
        return carry

    def _decider(self, x: Val) -> Val:
        """The value that picks a cond branch or keeps a while loop going, as an op's value.

        A parameter read directly gets an identity op holding it: replay can take
        new parameters (linen's variables), and checks decisions on ops' values.
        A constant (a jaxpr literal or const) is the same on every replay.
        """
        return self.pass_through(x, None)[1] if isinstance(x.ref, ParamRef) else x

    def _decided(self, x: Val, how: str, result: bool | int) -> None:
        """The walk turned ``x`` into the Python value ``result`` (by ``how``, a key of
        ``torchlens_core.replay.inputs.CONVERSIONS``) to pick a branch or go on looping: the recorded graph
        holds only while it converts the same, which replay on new inputs (or a fork's edits) checks."""
        if isinstance(x.ref, Ref):
            self.builder.to_python(x.ref.index, x.ref.path, how, result)

    def _helper(
        self, fn: Callable[..., Any], ins: list[Val], chain: tuple[int, ...], loc: tuple[Any, ...], in_loop: bool
    ) -> list[Val]:
        """Record ``fn`` (slicing or stacking a scan's arrays) as the primitives it traces to."""
        import jax

        closed = jax.make_jaxpr(fn)(*[x.value for x in ins])
        return self.run_closed(closed, ins, chain, loc, in_loop, helper=True)


def _last_reads(jaxpr: Any) -> dict[int, list[Any]]:
    """Equation index -> the variables no later equation of ``jaxpr`` reads (its outputs are read at the end)."""
    last: dict[Any, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for var in eqn.invars:
            if not isinstance(var, Literal):
                last[var] = i
    for var in jaxpr.outvars:
        if not isinstance(var, Literal):
            last[var] = len(jaxpr.eqns)  # never let go here
    for i, eqn in enumerate(jaxpr.eqns):  # a value nothing reads goes as soon as it is recorded
        for var in eqn.outvars:
            if var not in last and not isinstance(var, DropVar):
                last[var] = i
    released: dict[int, list[Any]] = {}
    for var, i in last.items():
        released.setdefault(i, []).append(var)
    return released


def _config(params: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The equation's parameters as the op's keyword arguments, for op.config and FLOP formulas to read, and the
    jaxprs they hold. Inner jaxprs stay in ``op.call`` only: they are programs, not settings."""
    config: dict[str, Any] = {}
    inner: list[Any] = []
    for key, value in params.items():
        t = type(value)
        if t in _SETTINGS:  # most parameters: no jaxpr can be in them
            config[key] = value
            continue
        found = _jaxprs_in(value)
        if found:
            inner += found
        else:
            config[key] = value
    return config, inner


# Parameter types that hold no jaxpr (tuples and lists may: cond's branches)
_SETTINGS = frozenset({int, float, bool, str, type(None), np.dtype})


def _jaxprs_in(value: Any) -> list[Any]:
    """The jaxprs a parameter ``value`` is or holds (a tuple or list of them: cond's branches)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    return [
        item.jaxpr if isinstance(item, ClosedJaxpr) else item
        for item in items
        if isinstance(item, (ClosedJaxpr, Jaxpr))
    ]


_OWN_DIRS = tuple(os.path.join(os.path.dirname(os.path.abspath(f)), "") for f in (torchlens_core.__file__, __file__))


# What each code object in an equation's traceback is to the code context, judged once: every equation of a
# capture reads the same few dozen frames, most of them JAX's own. By id(code), the code objects held in _JUDGED,
# so that a new code object at a freed one's address is never taken for a judged one.
_JUDGED: dict[int, Any] = {}  # id(code) -> the code object
_READ: set[int] = set()  # a user's code, or TorchLens's API (where the walk ends): the frames looked at
_ENDS: set[int] = set()  # TorchLens's API: frames above it are the caller's of tl.trace
# (id(code), instruction offset) -> (the code, its CodeLocation): turning an offset into a line number is most of
# what reading a frame costs.
_LOCATIONS: dict[tuple[int, int], tuple[Any, CodeLocation]] = {}
_MAX_CODES = 1 << 16  # then the caches start over: models whose code is made anew at every call stay bounded


def _user_frames() -> tuple[Callable[[str], bool], Callable[[Any, int], Any]] | None:
    """JAX's test of a user's file and its offset-to-line lookup; None where this JAX has neither."""
    try:
        from jax._src import source_info_util  # no public API gives the user frames
        from jax._src.lib import xla_client

        return source_info_util.is_user_filename, xla_client.Traceback.code_addr2location
    except Exception:  # noqa: BLE001 - moved or gone in this JAX: no code context
        return None


_USER_FRAMES = _user_frames()  # once: an import statement per equation costs a microsecond


def _code_context(eqn: Any, limit: int = CONTEXT_FRAMES) -> tuple[CodeLocation, ...]:
    """The user's frames that made this equation, innermost first, if JAX kept them: the frames JAX's
    ``source_info_util.user_frames`` reports, up to the call into TorchLens, TorchLens's own left out."""
    if _USER_FRAMES is None:
        return ()
    try:
        traceback = eqn.source_info.traceback
        codes, offsets = traceback.raw_frames() if traceback else ((), ())
    except Exception:  # noqa: BLE001 - no source info to read: no code context
        return ()
    ids = [*map(id, codes)]
    if not all(map(_JUDGED.__contains__, ids)):
        _judge(codes)
    found: list[CodeLocation] = []
    # the frames to read, picked in C: the dozens of JAX's own between the equation and the model are skipped
    for i in compress(range(len(ids)), map(_READ.__contains__, ids)):
        key = ids[i]
        if key in _ENDS or len(found) == limit:
            break
        offset, code = offsets[i], codes[i]
        known = _LOCATIONS.get((key, offset))
        if known is None or known[0] is not code:  # (another thread may have started the caches over)
            location = CodeLocation(code.co_filename, _USER_FRAMES[1](code, offset)[0], code.co_qualname)
            known = _LOCATIONS[(key, offset)] = (code, location)
        found.append(known[1])
    return tuple(found)


def _judge(codes: Any) -> None:
    """Judge the code objects not judged yet (:data:`_JUDGED`)."""
    assert _USER_FRAMES is not None
    if len(_JUDGED) >= _MAX_CODES:
        _JUDGED.clear()
        _READ.clear()
        _ENDS.clear()
        _LOCATIONS.clear()
    is_user = _USER_FRAMES[0]
    for code in codes:
        key = id(code)
        if key in _JUDGED:
            continue
        _JUDGED[key] = code
        filename = code.co_filename
        _READ.discard(key)  # (a freed code's id, left by a thread that judged as another started over)
        _ENDS.discard(key)
        if not is_user(filename):  # JAX's own (and the interpreter's)
            continue
        if filename == api.__file__:
            _READ.add(key)
            _ENDS.add(key)
        elif not filename.startswith(_OWN_DIRS):
            _READ.add(key)
