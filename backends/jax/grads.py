"""Gradients on JAX: one ``jax.grad`` over the recorded graph, a zero added at every wanted op.

A JAX array keeps no record of how it was computed, so
``trace.log_backward`` takes the loss as a function of the output
(``lambda out: out.sum()``) and replays the trace inside a function that
``jax.grad`` differentiates. Its arguments are the floating-point inputs, the
trainable parameters (an nnx or equinox model's, a linen ``variables``
tree's ``params``) and one zero per floating-point output of each wanted op,
added to that output (:func:`torchlens_core.grads.backward.perturbed`): the
gradient with respect to an op's zero is the gradient at the op, so one
backward pass gives them all. The zeros are negative (``x + -0.0`` is ``x``
bit for bit, signed zeros included). JAX is functional: the replay writes
into nothing the user holds (batch statistics, RNG counters stay as they were).

custom_jvp / custom_vjp functions (``jax.nn.relu``, a straight-through
estimator) are differentiated by their rule, as JAX does, not through the
equations the capture expanded them into (:mod:`torchlens_jax.custom_rules`):
the call is bound again as a whole on its operands, and its outputs are
``rule_output + (inner - stop_gradient(inner))``, with the operands seen by
the inner ops through ``stop_gradient``. The value is the call's; the
operands get the rule's gradient only; the ops inside get the gradient of the
call's output chained through their own equations (JAX defines none there).
A trace loaded from a file has lost the rules (Python code) and is refused a
backward where it has such calls.

JAX gives a zero, never "nothing", for a value the loss does not depend on:
that is read off the graph instead (:func:`_reached`), so that such ops get
``GRAD_NO_DEPENDENCE`` as on torch.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from torchlens_core.grads.backward import perturbed
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ReplayError, UnsupportedError
from torchlens_core.ir.records import OpRecord, ParamRef, Ref
from torchlens_core.ir.trace import Trace
from torchlens_jax.arrays import array_error, is_array
from torchlens_jax.custom_rules import CustomRule, rules_of
from torchlens_jax.replay import replay_op

Path = tuple[Any, ...]
# The gradient replay computes the recorded output again: further off than this, it is not the recorded graph.
_OUTPUT_TOLERANCE = 1e-5


def backward(trace: Trace, loss: Any, wanted: list[int]) -> dict[str, Any]:
    """Gradients of ``loss`` (a function of the trace's output) at the ``wanted`` ops and the trainable parameters."""
    if not callable(loss) or is_array(loss):
        raise UnsupportedError(
            f"on JAX, log_backward takes the loss as a function of the trace's output "
            f"(lambda out: out.sum()), not a {type(loss).__name__}: a JAX array keeps no record "
            f"of how it was computed, so the trace is replayed under jax.grad and the function "
            f"applied to the replayed output"
        )
    missing = trace.notes.get("not_replayable")
    if missing:
        raise UnsupportedError(
            f"this loaded trace cannot be replayed, so it has no gradients: {len(missing)} ops "
            f"were not rebuilt ({', '.join(list(missing)[:5])})"
        )
    regions = _regions(trace)
    inputs = {op.index: jnp.asarray(op.out) for op in trace.ops if op.kind == "input" and _is_float(op.out)}
    params = {
        name: record.value
        for name, record in trace.params.items()
        if record.trainable and not record.is_buffer and _is_float(record.value)
    }
    wanted_set = set(wanted)
    deltas = {
        (index, path): jnp.full(shape, -0.0, dtype)
        for index in sorted(wanted_set)
        if trace.ops[index].kind in ("op", "output")
        for path, shape, dtype in _float_outputs(trace.ops[index])
    }

    def run(inputs: dict[int, Any], params: dict[str, Any], deltas: dict[Path, Any]) -> tuple[Any, Any]:
        graph = perturbed(_with_leaves(trace, inputs, params), deltas)
        values = _replay(graph, regions)
        output = tree.map_leaves(
            lambda r: tree.get(values[r.index], r.path) if isinstance(r, Ref) else r, graph.output_template
        )
        target = loss(output)
        _check_loss(target)
        return target, output

    try:
        (at_inputs, at_params, at_deltas), output = jax.grad(run, argnums=(0, 1, 2), has_aux=True)(
            inputs, params, deltas
        )
    except ReplayError as exc:  # a primitive JAX cannot differentiate, or cannot run on these operands
        raise UnsupportedError(f"JAX cannot differentiate the recorded graph: {exc}") from exc
    _check_output(trace, output)
    reached_ops, reached_params = _reached(trace, loss, output)
    ops = _by_op(trace, {key: g for key, g in at_deltas.items() if key[0] in reached_ops})
    ops.update({index: g for index, g in at_inputs.items() if index in wanted_set and index in reached_ops})
    return {"ops": ops, "params": {name: g for name, g in at_params.items() if name in reached_params}}


# -- the differentiated replay ---------------------------------------------------------------
def _with_leaves(trace: Trace, inputs: dict[int, Any], params: dict[str, Any]) -> Trace:
    """``trace`` reading ``inputs`` (by input node) and ``params`` (by name), jax.grad's tracers, instead."""
    ops = [attrs.evolve(op, out=inputs[op.index]) if op.index in inputs else op for op in trace.ops]
    records = {
        name: attrs.evolve(record, value=params[name]) if name in params else record
        for name, record in trace.params.items()
    }
    graph = Trace(
        backend=trace.backend,
        model_name=trace.model_name,
        ops=ops,
        modules=dict(trace.modules),
        params=records,
        output_template=trace.output_template,
        notes=dict(trace.notes),
    )
    graph.call = trace.call
    return graph


def _replay(trace: Trace, regions: list[CustomRule]) -> list[Any]:
    """The evaluator's loop (:func:`torchlens_core.replay.evaluator.interpret`), with custom rules honoured.

    Its own loop because a custom call's outputs change once the call's last
    op has run, for the ops after it only, and an output node's edit (its
    zero) is applied too.
    """
    values: list[Any] = [None] * len(trace.ops)
    params = trace.params
    inside: dict[int, CustomRule] = {i: rule for rule in regions for i in range(rule.start, rule.end)}
    ending = {rule.end - 1: rule for rule in regions}

    def resolve(leaf: Any) -> Any:
        if isinstance(leaf, Ref):
            return tree.get(values[leaf.index], leaf.path)
        if isinstance(leaf, ParamRef):
            return params[leaf.name].value
        return leaf

    for op in trace.ops:
        if op.kind == "input":
            values[op.index] = op.out
            continue
        rule = inside.get(op.index)
        if rule is None:
            args = tree.map_leaves(resolve, op.args)
        else:  # the rule, not the inner ops, carries the gradient to the call's operands
            args = tree.map_leaves(functools.partial(_outside_stopped, resolve, start=rule.start), op.args)
        if op.kind == "output" or op.meta.get("identity"):
            value = args[0]
        else:
            try:
                value = replay_op(op, args, {})
            except Exception as exc:
                raise ReplayError(f"replaying {op.label} ({op.func_name}) under jax.grad failed: {exc}") from exc
        for edit in op.edits:
            value = edit.apply(value)
        values[op.index] = value
        if op.index in ending:
            _apply_rule(ending[op.index], values, resolve)
    return values


def _outside_stopped(resolve: Any, leaf: Any, start: int) -> Any:
    value = resolve(leaf)
    outside = isinstance(leaf, ParamRef) or (isinstance(leaf, Ref) and leaf.index < start)
    return jax.lax.stop_gradient(value) if outside and _is_float(value) else value


def _apply_rule(rule: CustomRule, values: list[Any], resolve: Any) -> None:
    """Give the ops after ``rule``'s call its outputs as JAX computes them, rule included."""
    outs = rule.bind([resolve(x) for x in rule.inputs])
    inner = [tree.get(values[ref.index], ref.path) for ref in rule.outputs]
    for ref, out, own in zip(rule.outputs, outs, inner):
        joined = out + (own - jax.lax.stop_gradient(own)) if _is_float(own) else out
        values[ref.index] = _set(values[ref.index], ref.path, joined)


def _set(value: Any, path: Path, leaf: Any) -> Any:
    if not path:
        return leaf
    items = list(value)
    items[path[0]] = _set(items[path[0]], path[1:], leaf)
    return type(value)(items)


def _regions(trace: Trace) -> list[CustomRule]:
    """The outermost custom_jvp / custom_vjp calls of ``trace``; refused where the rules are gone or can't hold."""
    found, uncovered = rules_of(trace.ops)
    if uncovered:
        names = sorted({op.meta["custom_rule"] for op in uncovered})
        raise UnsupportedError(
            f"{len(uncovered)} ops ran inside custom_jvp / custom_vjp functions ({', '.join(names)})"
            f" whose derivative rules this trace no longer has (a trace loaded from a file keeps "
            f"no Python code): JAX differentiates those by their rules, not their equations, so "
            f"the gradients would not be JAX's. Capture the model again to take its gradients"
        )
    regions: list[CustomRule] = []
    for rule in sorted(found, key=lambda r: (r.start, -r.end)):
        if rule.end <= rule.start or (regions and rule.start < regions[-1].end):
            continue  # no ops, or inside an outer call, whose rule alone JAX applies to its operands
        refs = [(ref.index, ref.path) for ref in rule.outputs]
        if len(set(refs)) != len(refs):
            raise UnsupportedError(
                f"the custom derivative function {rule.name} returns one value twice: its rule "
                f"gives each output its own gradient, which one recorded op cannot carry"
            )
        edited = [trace.ops[i].label for i in range(rule.start, rule.end) if trace.ops[i].edits]
        if edited:
            raise UnsupportedError(
                f"intervene= edited {', '.join(edited)} inside the custom derivative function "
                f"{rule.name}: its rule knows nothing of the edit, so JAX has no gradient for it"
            )
        regions.append(rule)
    return regions


# -- what gets a gradient --------------------------------------------------------------------
def _float_outputs(op: OpRecord) -> list[tuple[Path, tuple[int, ...], Any]]:
    """``(path, shape, dtype)`` of each floating-point array of ``op``'s output."""
    if op.shape is None or all(isinstance(d, int) for d in op.shape):
        if op.dtype is None or not _float_dtype(op.dtype):
            return []
        return [((), tuple(op.shape or ()), jnp.dtype(op.dtype))]
    dtypes = op.meta.get("out_dtypes")
    if dtypes is None:  # a trace saved before the walk kept each output's dtype: read the saved values
        out = op.out if isinstance(op.out, (tuple, list)) else ()
        dtypes = [str(v.dtype) if is_array(v) else None for v in out]
        if len(dtypes) != len(op.shape):
            return [(path, op.shape[path[0]], jnp.dtype(op.dtype)) for path in _first_output(op)]
    return [
        ((i,), tuple(shape), jnp.dtype(dtype))
        for i, (shape, dtype) in enumerate(zip(op.shape, dtypes))
        if isinstance(shape, tuple) and dtype is not None and _float_dtype(dtype)
    ]


def _first_output(op: OpRecord) -> list[Path]:
    """The first output only: the one whose dtype the record gives."""
    shape = op.shape
    return [(0,)] if shape and isinstance(shape[0], tuple) and op.dtype and _float_dtype(op.dtype) else []


def _by_op(trace: Trace, grads: dict[tuple[int, Path], Any]) -> dict[int, Any]:
    """The gradients by op: the array for a one-array op, the output's structure (None elsewhere) for several."""
    found: dict[int, Any] = {}
    for (index, path), grad in grads.items():
        if not path:
            found[index] = grad
            continue
        shape = trace.ops[index].shape
        assert shape is not None  # a gradient at a path: an op of several outputs, whose shapes it records
        current = list(found.get(index, (None,) * len(shape)))
        current[path[0]] = grad
        found[index] = tuple(current)
    return found


def _reached(trace: Trace, loss: Any, output: Any) -> tuple[set[int], set[str]]:
    """The ops and parameters the loss depends on through differentiable values.

    JAX hands a zero to a value the loss does not depend on, so dependence is
    read off the graph: back from the output leaves the loss reads (by its
    jaxpr), through every op's array arguments, but not through
    ``stop_gradient`` nor through a value with no gradient (integers, booleans).
    """
    used = _loss_reads(loss, output)
    stack = [
        ref
        for path, ref in tree.leaves(trace.output_template, lambda v: isinstance(v, (Ref, ParamRef)))
        if path in used
    ]
    ops: set[int] = set()
    params: set[str] = set()
    while stack:
        ref = stack.pop()
        if isinstance(ref, ParamRef):
            params.add(ref.name)
            continue
        if ref.index in ops:
            continue
        op = trace.ops[ref.index]
        if not _has_float_output(op):
            continue
        ops.add(ref.index)
        if op.func_name != "stop_gradient":
            stack.extend(leaf for _, leaf in tree.leaves(op.args, lambda v: isinstance(v, (Ref, ParamRef))))
    return ops, params


def _loss_reads(loss: Any, output: Any) -> set[Path]:
    """The paths of the output leaves ``loss`` depends on, differentiably (its jaxpr, traced on their shapes)."""
    shapes = [(path, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)) for path, leaf in tree.leaves(output, is_array)]
    paths = [path for path, _ in shapes]
    try:
        closed = jax.make_jaxpr(lambda leaves: loss(tree.replace_at(output, dict(zip(paths, leaves)))))(
            [s for _, s in shapes]
        )
    except Exception:  # noqa: BLE001 - a loss that only runs on concrete values: it may read every leaf
        return set(paths)
    jaxpr = closed.jaxpr
    live = {v for v in jaxpr.outvars if not _is_literal(v)}
    for eqn in reversed(jaxpr.eqns):
        if eqn.primitive.name == "stop_gradient" or not any(v in live for v in eqn.outvars):
            continue
        live.update(v for v in eqn.invars if not _is_literal(v))
    return {path for (path, _), var in zip(shapes, jaxpr.invars) if var in live}


def _is_literal(var: Any) -> bool:
    from jax.extend.core import Literal

    return isinstance(var, Literal)


def _has_float_output(op: OpRecord) -> bool:
    if op.kind == "input":
        return op.dtype is not None and _float_dtype(op.dtype)
    return bool(_float_outputs(op))


# -- checks ----------------------------------------------------------------------------------
def _is_float(value: Any) -> bool:
    return is_array(value) and _float_dtype(str(value.dtype))


def _float_dtype(dtype: str) -> bool:
    return str(dtype).startswith(("float", "bfloat", "complex"))


def _check_loss(target: Any) -> None:
    if not is_array(target):
        raise UnsupportedError(
            f"the loss function returned a {type(target).__name__}, not a JAX array: compute it "
            f"with jax.numpy on the output, so that jax.grad can differentiate it"
        )
    if not jnp.issubdtype(target.dtype, jnp.floating):
        raise UnsupportedError(f"the loss is a {target.dtype} array, which has no gradient: make it a real float")
    if target.shape != ():
        raise UnsupportedError(
            f"the loss must be one number, not an array of shape {tuple(target.shape)}: reduce "
            f"it (out.sum(), out.mean())"
        )


def _check_output(trace: Trace, output: Any) -> None:
    """The gradient replay must compute the recorded output: otherwise its gradients are another graph's."""
    recorded = trace.output
    for path, value in tree.leaves(output, is_array):
        try:
            expected = tree.get(recorded, path)
        except (KeyError, IndexError, TypeError, AttributeError):
            continue
        if not is_array(expected):
            continue
        error = array_error(value, np.asarray(expected) if isinstance(expected, np.ndarray) else expected)
        if error > _OUTPUT_TOLERANCE:
            raise ReplayError(
                f"the gradient replay computed output {path} {error:.3g} off the recorded one: the "
                f"gradients would not be the recorded graph's"
            )


# -- the conformance reference ---------------------------------------------------------------
def reference_grads(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Path, Any]:
    """The input gradients of the summed float outputs, by ``jax.grad`` alone (the conformance reference).

    Arguments that hold parameters (linen's ``variables``, first) are left
    out: the capture makes those parameters, not inputs. An nnx model runs
    as a copy made from its state, so the user's model does not advance.
    """
    from torchlens_jax.modules import view_model

    view = view_model(target, args)
    skip = view.param_args
    found = [
        (path, leaf)
        for path, leaf in tree.leaves((args, kwargs), is_array)
        if _is_float(leaf) and not (path[0] == 0 and path[1] < skip)
    ]
    if not found:
        return {}
    paths = [path for path, _ in found]

    def summed(leaves: list[Any]) -> Any:
        a, kw = tree.replace_at((args, kwargs), dict(zip(paths, leaves)))
        out = view.call_plain(a, kw)
        parts = [jnp.sum(leaf) for _, leaf in tree.leaves(out, is_array) if _is_float(leaf)]
        if not parts:
            raise UnsupportedError("the model returns no floating-point array to differentiate")
        return sum(parts[1:], parts[0])

    try:
        grads = jax.grad(summed)([jnp.asarray(leaf) for _, leaf in found])
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise UnsupportedError(f"jax.grad itself cannot differentiate this model: {exc}") from exc
    return dict(zip(paths, grads))
