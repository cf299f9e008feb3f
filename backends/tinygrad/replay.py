"""Replaying recorded tinygrad ops.

Each op calls the recorded Tensor method (the original, unwrapped function) on
the replayed arguments and realizes its output, as capture did, so that the
replayed kernels are the captured ones. Random ops run with tinygrad's RNG
state (seed, per-device seeds and counters) as it was just before them, and
under the TRAINING flag they saw, so dropout replays exactly; the live RNG
state is put back afterwards. ``Tensor.empty`` gives back the bytes it held.
In-place ops write into the replayed values (a write through a view reaches
its base, as it did in the model), but a write aimed at a parameter, a
constant or a recorded input goes to a copy.

Under :data:`AUTOGRAD` (the replay of ``trace.log_backward``, see
:mod:`torchlens_tinygrad.grads`) nothing is realized: realizing a tensor
turns its graph into a buffer, which no gradient goes back through. The
replay builds one lazy graph, as a plain tinygrad forward does, and copies
are lazy clones the gradient passes through.
"""

from __future__ import annotations

import contextvars
from typing import Any

from tinygrad import Tensor, dtypes
from tinygrad.helpers import Context

from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord, Ref
from torchlens_core.ir.trace import Trace
from torchlens_core.replay.checked import from_file
from torchlens_core.replay.evaluator import Observe, interpret
from torchlens_tinygrad import meta_check
from torchlens_tinygrad.arrays import buffer_key, is_weak, isolate_views, realize, settle_readers, snapshot

# Replay realizes each op's output, except for the backward of trace.log_backward (grads.py).
AUTOGRAD = contextvars.ContextVar("torchlens_tinygrad_replay_autograd", default=False)


def _copy_tensors(value: Any) -> Any:
    return tree.map_leaves(lambda v: snapshot(v) if isinstance(v, Tensor) else v, value)


def _lazy_copy(t: Tensor) -> Tensor:
    """A copy in a buffer of its own once computed; the gradient flows through it to ``t``."""
    return t if is_weak(t) else t.clone()


def _tensors(value: Any) -> list[Tensor]:
    return [v for _, v in tree.leaves(value, lambda x: isinstance(x, Tensor))]


class _RngState:
    """Sets tinygrad's RNG to a recorded state for one op; puts the live one back after."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def __enter__(self) -> None:
        self.saved = Tensor._seed, Tensor._device_seeds, Tensor._device_rng_counters
        state = self.state
        Tensor._seed = state["seed"]
        Tensor._device_seeds = dict(state["device_seeds"])
        Tensor._device_rng_counters = {
            device: Tensor(c.copy(), device=device, dtype=dtypes.uint32) for device, c in state["counters"].items()
        }

    def __exit__(self, *exc: Any) -> None:
        Tensor._seed, Tensor._device_seeds, Tensor._device_rng_counters = self.saved


def run_op(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any], protected: set[int] | None = None) -> Any:
    """Run one recorded op; ``protected`` holds the ids of BUFFER nodes no replayed write may reach."""
    if "uninitialized" in op.meta:
        return snapshot(op.meta["uninitialized"])
    rng = op.meta.get("rng")
    if rng is None:
        meta_check.check_loaded(op, args, kwargs)  # a loaded file's call is first made lazily on empty tensors
    elif from_file(op):  # a random call draws in the check too: from the recorded state, in a copy of its own
        with _RngState(rng), Context(TRAINING=op.meta.get("training", 0)):
            meta_check.check(op, args, kwargs)
    lazy = AUTOGRAD.get()
    if op.in_place and args and isinstance(args[0], Tensor):
        key = buffer_key(args[0])
        if not isinstance(op.args[0], Ref) or (protected is not None and key is not None and id(key) in protected):
            args = ((_lazy_copy if lazy else snapshot)(args[0]), *args[1:])
        elif not lazy:  # nothing is realized in a lazy replay: the writes have a plain run's semantics already
            settle_readers(args[0])
            if op.meta.get("isolate"):  # as capture did: the write changes its target alone
                isolate_views(args[0])
    if rng is None:
        out = op.call(*args, **kwargs)
    else:
        with _RngState(rng), Context(TRAINING=op.meta.get("training", 0)):
            out = op.call(*args, **kwargs)
    if out is None and op.in_place:  # __setitem__ returns None
        out = args[0]
    if not lazy:
        realize(_tensors(out))
    return out


def replay_graph(trace: Trace, observe: Observe | None = None) -> list[Any]:
    # Buffers no replayed in-place op may write into: parameters, constants and
    # recorded inputs (the inputs replay starts from are copies already).
    protected: set[int] = set()

    def protect(value: Any) -> None:
        for t in _tensors(value):
            key = buffer_key(t)
            if key is not None:
                protected.add(id(key))

    for p in trace.params.values():
        protect(p.value)
    for op in trace.ops:
        if op.kind == "input":
            protect(op.out)
        elif op.kind == "op":  # constants among the arguments (Refs and ParamRefs are no tensors); read, not rebuilt
            protect((op.args, op.kwargs))

    def run(op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return run_op(op, args, kwargs, protected)

    # A lazy replay starts from the inputs as given: the backward's own copies, protected from writes above.
    copy_input = None if AUTOGRAD.get() else _copy_tensors
    with Context(TRAINING=trace.notes.get("training", 0)):
        return interpret(trace, run, observe, copy_input=copy_input)
