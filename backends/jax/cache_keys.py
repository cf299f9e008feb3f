"""The capture cache's keys: what a repeat capture of a jitted target must match to reuse the first one's records.

``jax.jit`` traces a function once per *signature* and reuses that trace for
every later call with the same one; whatever else the function reads
(globals, closures, a closed-over model's weights) is baked in. A user who
passes a jitted target (:mod:`torchlens_jax.jitted`) has accepted that
contract, so the capture of that target may be reused on the same terms. The
key holds everything jit's own key holds, and the capture options that change
what is recorded:

- the arguments' pytree structure (for flax.nnx modules, their static
  attributes and submodule layout: nnx modules are pytrees), each array
  leaf's shape, dtype, weak type, sharding and whether it is committed, and
  every other leaf by type and value (hash and equality; a float by its bits,
  since ``0.0 == -0.0`` would trace alike and compute apart), and which leaves
  are one same array (nnx's graph definition knows shared variables, a
  pytree does not);
- a model the wrapper holds (``nnx.jit(model)``: its graph definition, as
  nnx.jit keys it; ``eqx.filter_jit(model)``: its pytree structure and static
  leaves), and the shapes and dtypes of its parameters;
- the arguments a ``functools.partial`` binds, by identity (they are
  constants of the trace);
- JAX's tracing configuration (``jax_enable_x64``, the default matmul
  precision...: jit's own ``trace_context``);
- ``save=``, ``halt=`` and ``lookback=``, when their selectors judge records
  only (``tl.where`` may read values: never cached).

A capture the cache cannot key (an unhashable static argument, a NumPy array
bound by a partial, which may change in place) is never cached. Captures
with ``intervene=``, ``save_grads=``, ``tl.record`` or lookback values take
the ordinary path.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
import weakref
from typing import Any

import attrs
import numpy as np

from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.capture.selectors import AllOf, AnyOf, FollowedBy, Func, InModule, Label, Module, Not, PrecededBy
from torchlens_jax.arrays import is_array
from torchlens_jax.jitted import is_frozen_wrapper, is_jitted, jit_inner, unjitted
from torchlens_jax.modules import framework_of

# Selectors that judge an op by its record alone (name, module, label, neighbours), never by its value.
_STRUCTURAL = (Func, Module, InModule, Label)
_COMBINED = (AllOf, AnyOf)
_WRAPPED = (Not, FollowedBy, PrecededBy)


@attrs.define(slots=True, eq=False)
class Probe:
    """A capture of a jitted target that the cache may answer: who owns its entries, its key, and the arrays
    a compiled call reads, found as a repeat capture finds them (parameters in the order the model view
    names them, inputs in the order the capture makes input nodes)."""

    owner: Any  # the jitted target (or the partial of one) the user passed: entries live as long as it does
    key: Any
    params: list[Any]
    inputs: list[Any]


def probe(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions) -> Probe | None:
    """The probe of this capture; None when the cache must not answer it (not a jitted target, an option
    that edits or reads values, something that cannot be a key)."""
    owner = target
    bound: list[Any] = []
    while isinstance(target, functools.partial):  # a partial of a jitted function: its bound arguments
        bound.append((target.args, target.keywords))
        target = target.func
    if not is_jitted(target):
        return None
    options_key = _options_key(options)
    if options_key is None:
        return None
    import jax

    try:
        model = _frozen_model_part(target) if is_frozen_wrapper(target) else None
        if model is None:
            model = _model_part(unjitted(jit_inner(target)), args)
        if model is None:
            return None
        kind, model_key, params, param_args = model
        leaves, treedef = jax.tree_util.tree_flatten((args[param_args:], kwargs))
        inputs = [leaf for leaf in leaves if is_array(leaf)]
        key = (
            kind,
            model_key,
            treedef,
            tuple(map(leaf_key, leaves)),
            _sharing(inputs),
            _bound_key(bound),
            trace_context(),
            options_key,
        )
        hash(key)
    except Exception:  # noqa: BLE001 - an unhashable static argument, a NumPy array a partial binds, a leaf
        # of a type this cannot read: the ordinary path, which keys nothing (a model it cannot split fails there)
        return None
    return Probe(owner, key, params, inputs)


def _model_part(inner: Any, args: tuple[Any, ...]) -> tuple[str, Any, list[Any], int] | None:
    """What a model the wrapper runs adds to the key, its parameter arrays, and how many leading arguments
    hold parameters (linen's variables); as :func:`torchlens_jax.modules.view_model` splits it."""
    import jax

    root, method = inner, None
    if inspect.ismethod(inner) and framework_of(inner.__self__) is not None:
        root, method = inner.__self__, inner.__func__.__name__
    kind = framework_of(root)
    if kind == "nnx":
        from flax import nnx

        graphdef, state = nnx.split(root)  # what nnx.jit keys its own cache on
        params = jax.tree_util.tree_leaves(state)
        return kind, (graphdef, method, tuple(map(leaf_key, params))), params, 0
    if kind == "equinox":
        import equinox as eqx

        leaves, treedef = jax.tree_util.tree_flatten(root)
        params = [leaf for leaf in leaves if eqx.is_array(leaf)]
        return kind, (treedef, method, tuple(map(leaf_key, leaves))), params, 0
    if kind == "linen":
        if method != "apply" or not args:
            return None  # view_model refuses it, on the ordinary path
        params, treedef = jax.tree_util.tree_flatten(args[0])
        return kind, (treedef, tuple(map(leaf_key, params))), params, 1
    return "function", None, [], 0


# equinox.filter_jit's wrapper rebuilds the module it runs at every read of ``__wrapped__``, and flattening that
# module again costs more than the rest of the key; but the wrapper is immutable (an equinox Module of arrays and
# static parts), so what its model adds to the key is found once per wrapper: id -> (the wrapper, weakly; part).
_FROZEN_PARTS: dict[int, tuple[weakref.ref[Any], tuple[str, Any, list[Any], int] | None]] = {}
_FROZEN_LOCK = threading.Lock()
_FROZEN_SIZE = 256


def _frozen_model_part(wrapper: Any) -> tuple[str, Any, list[Any], int] | None:
    """:func:`_model_part` of an immutable jit wrapper, worked out at its first capture; None where the part
    depends on more than the wrapper (an nnx module it runs may change; a linen apply reads its variables from
    the arguments), which the caller works out at every capture."""
    found = _FROZEN_PARTS.get(id(wrapper))
    if found is not None and found[0]() is wrapper:
        return found[1]
    part = _model_part(unjitted(jit_inner(wrapper)), ())
    if part is not None and part[0] not in ("equinox", "function"):
        part = None
    wrapper_id = id(wrapper)

    # (the table bound as a default: at interpreter exit the module's globals may be gone before the wrapper)
    def forget(_: Any, at: int = wrapper_id, parts: dict[int, Any] = _FROZEN_PARTS) -> None:
        parts.pop(at, None)

    try:
        ref = weakref.ref(wrapper, forget)
    except TypeError:
        return part
    with _FROZEN_LOCK:
        if len(_FROZEN_PARTS) >= _FROZEN_SIZE:
            _FROZEN_PARTS.clear()
        _FROZEN_PARTS[wrapper_id] = (ref, part)
    return part


def leaf_key(leaf: Any) -> Any:
    """One leaf of the arguments as jit tells signatures apart: an array by its abstract value and placement,
    anything else by type and value."""
    if is_array(leaf):
        if isinstance(leaf, np.ndarray):
            return ("numpy", leaf.shape, leaf.dtype.str)
        # (a typed PRNG key array has no weak type, and may have no commitment to tell)
        return (
            leaf.shape,
            leaf.dtype,
            getattr(leaf, "weak_type", False),
            leaf.sharding,
            getattr(leaf, "committed", None),
        )
    if isinstance(leaf, (float, np.floating)):
        value = float(leaf)
        return (type(leaf), value.hex() if math.isfinite(value) else repr(value))
    if isinstance(leaf, (complex, np.complexfloating)):  # repr tells -0.0 from 0.0 in either part
        return (type(leaf), repr(complex(leaf)))
    return (type(leaf), leaf)


def _sharing(arrays: list[Any]) -> tuple[int, ...] | None:
    """Which array leaves are one same object (None: all distinct), as nnx's graph definition tells shared
    variables apart from equal ones."""
    first: dict[int, int] = {}
    pattern = tuple(first.setdefault(id(a), j) for j, a in enumerate(arrays))
    return None if len(first) == len(arrays) else pattern


def _bound_key(bound: list[Any]) -> Any:
    """A partial's bound arguments, constants of the trace: arrays by identity (JAX arrays cannot change;
    NumPy arrays can, so they are refused), anything else by type and value."""
    if not bound:
        return None
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(bound)
    keys = []
    for leaf in leaves:
        if isinstance(leaf, np.ndarray):
            raise TypeError("a NumPy array bound by a partial may change in place")
        keys.append(_Same(leaf) if is_array(leaf) else leaf_key(leaf))
    return treedef, tuple(keys)


@attrs.frozen(eq=False)
class _Same:
    """Equal only to a holder of the very same object (held, so that its id cannot be taken by another)."""

    obj: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def trace_context() -> Any:
    """JAX's configuration that changes what tracing makes: jit's own cache key has it."""
    try:
        from jax._src.config import trace_context as context  # no public API gives the whole of it

        return context()
    except (ImportError, AttributeError):  # a JAX without it: the flags that change a trace the most
        import jax

        return tuple(
            getattr(jax.config, name, None)
            for name in (
                "jax_enable_x64",
                "jax_default_matmul_precision",
                "jax_numpy_rank_promotion",
                "jax_numpy_dtype_promotion",
                "jax_default_prng_impl",
            )
        )


def _options_key(options: CaptureOptions) -> Any:
    """The capture options that change the records, as a key; None when the capture takes the ordinary path."""
    if options.intervene or options.save_grads is not False or options.record or options.escape_detector:
        return None
    if options.lookback and options.lookback_payload_policy != "metadata_only":
        return None
    if not all(selector is None or _structural(selector) for selector in (options.save, options.halt)):
        return None
    key = (options.save, options.halt, options.lookback, options.lookback_payload_policy)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _structural(selector: Any) -> bool:
    """A selector whose verdicts depend on records alone; ``tl.where`` (any predicate) is not one."""
    if isinstance(selector, _STRUCTURAL):
        return True
    if isinstance(selector, _COMBINED):
        return all(_structural(part) for part in selector.parts)
    if isinstance(selector, _WRAPPED):
        return _structural(selector.inner)
    return False
