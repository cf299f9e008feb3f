"""What any full capture must pay before TorchLens records anything: the framework's own interception, and
keeping every value, as ratios to a plain forward.

    python bench/capture_floor.py --backend torch        # ResNet-18, GPT-2 small, ViT-tiny
    python bench/capture_floor.py --backend tf           # the TensorFlow rows of bench/backend_table.py
    python bench/capture_floor.py --backend torch --clock cpu   # this thread's CPU time: a loaded machine's jobs
                                                                 # do not count

Interleaved in one process, one thread, medians:

- ``plain``: the model's own call.
- ``bare``: the interception a capture uses, doing nothing (torch: a ``TorchFunctionMode``; TensorFlow: an op
  callback, installed with ``op_callbacks.add_op_callback`` so that every eager path calls it; Paddle and tinygrad:
  the capture's own wrappers, installed and put back by the capture's own code, reporting to a keeper that records
  nothing; JAX: ``jax.make_jaxpr`` of the model, which is how a capture sees its ops, traced afresh each time as
  a capture of a model that is not jitted must: JAX's own cache of traced functions would skip the model's Python).
- ``hold``: the same, keeping every op's output until the forward ends, as a full trace keeps its values
  (torch and Paddle also copy the tensor an in-place op is about to overwrite, as the capture does; tinygrad
  makes each op's output a realization target and realizes them in one schedule before a write, a draw or a
  conversion and at the end, as the capture does; JAX runs ``make_jaxpr`` and then one compiled executable that
  returns every top-level equation's value, what a repeat capture of a model that is not jitted runs).
- ``hold_jit`` (JAX): that executable alone, the floor of a jitted target's capture (its program is known).
- ``least`` (torch, TensorFlow, Paddle): ``hold`` plus the least any recorder of the graph does: one small slotted
  record per op (its function, its arguments with recorded tensors as their records' numbers, shape, dtype,
  device, the module calls open) and, on torch, per module pass (global module hooks, as the capture's; TensorFlow
  and Paddle: ops only, so theirs is a lower bound). No names, call sites, checks, edits or copies before writes:
  what Python's cost for the records themselves is, the floor a recorder written in Python cannot go under.
- ``trace``: ``tl.trace``.

``trace`` minus ``hold`` is TorchLens's own cost; ``us/unit`` divides it by the units a recorder handles (ops
and module passes), the recorder's own cost per op; ``hold`` is the floor a capture that keeps every value cannot
go under (on a CPU, mostly the first touch of fresh memory: a plain forward reuses its allocator's blocks). The
``faults`` columns are the minor page faults of ``hold`` and ``trace`` (medians): each is a page of fresh memory
the kernel maps and zeroes. glibc gives freed memory back to the system (large blocks at once, the top of the heap
once it passes a threshold), so a capture repeated in a loop faults its values in again every time; run with
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967295`` in the environment to see the floor when
the process keeps what it freed (docs/performance.md).
"""

from __future__ import annotations

import argparse
import functools
import resource
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from backend_table import MODELS, build_models
from capture_overhead import _block


def torch_modes(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    import torch
    from torch.overrides import TorchFunctionMode

    class Bare(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
            return func(*a, **(k or {}))

    class Hold(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.kept: list[Any] = []

        def __torch_function__(self, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
            name = getattr(func, "__name__", "")
            # F.relu(x, inplace=True) reaches the mode as `relu` with the keyword (torchvision's ResNets)
            in_place = (
                (name.endswith("_") and not name.endswith("__"))
                or name in ("__iadd__", "__imul__")
                or bool(k and k.get("inplace"))
            )
            if in_place and a and isinstance(a[0], torch.Tensor):
                with torch._C.DisableTorchFunction():
                    self.kept.append(a[0].clone())
            out = func(*a, **(k or {}))
            self.kept.append(out)
            return out

    class Least(Hold):
        """The least any recorder of the graph does past ``hold``: one small record per op and per pass."""

        def __init__(self) -> None:
            super().__init__()
            self.records = LeastRecords()
            self.stack: tuple[str, ...] = ()  # the module calls open now

        def __torch_function__(self, func: Any, types: Any, a: tuple[Any, ...] = (), k: Any = None) -> Any:
            out = super().__torch_function__(func, types, a, k)
            if isinstance(out, torch.Tensor):
                self.records.add(func, a, k, out, (out,), tuple(out.shape), out.dtype, out.device.type, self.stack)
            return out

        def pre(self, module: Any, inputs: Any) -> None:
            self.stack = (*self.stack, type(module).__name__)

        def post(self, module: Any, inputs: Any, output: Any) -> None:
            self.stack = self.stack[:-1]
            self.records.append(
                LeastRecord(
                    module, (), {}, (self.records.producers.get(id(output), -1),), output, (), None, "", self.stack
                )
            )

    def under(mode: type) -> Callable[[], Any]:
        def run() -> Any:
            with mode() as active:
                model(*args, **kwargs)
            return active

        return run

    def least() -> Any:
        from torch.nn.modules import module as modules

        with Least() as active:
            pre = modules.register_module_forward_pre_hook(active.pre)
            post = modules.register_module_forward_hook(active.post)
            try:
                model(*args, **kwargs)
            finally:
                pre.remove()
                post.remove()
        return active

    return {"bare": under(Bare), "hold": under(Hold), "least": least}


class LeastRecord:
    """What ``least`` keeps of each op and pass: fewer fields than an OpRecord, and no checks."""

    __slots__ = ("func", "args", "kwargs", "parents", "out", "shape", "dtype", "device", "modules")

    def __init__(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        parents: tuple[int, ...],
        out: Any,
        shape: tuple[int, ...],
        dtype: Any,
        device: Any,
        modules: tuple[str, ...],
    ) -> None:
        self.func, self.args, self.kwargs, self.parents, self.out = func, args, kwargs, parents, out
        self.shape, self.dtype, self.device, self.modules = shape, dtype, device, modules


class LeastRecords(list[LeastRecord]):
    """The records ``least`` keeps, and which record made each array (``producers``: by id; the values are kept)."""

    def __init__(self) -> None:
        super().__init__()
        self.producers: dict[int, int] = {}

    def add(
        self,
        func: Any,
        args: Any,
        kwargs: dict[str, Any] | None,
        out: Any,
        made: Any,
        shape: tuple[int, ...],
        dtype: Any,
        device: Any,
        modules: tuple[str, ...] = (),
    ) -> None:
        """One op's record: its arguments with recorded arrays as record numbers; ``made``: the arrays it made."""
        producers, parents = self.producers, []
        refs = tuple(_least_ref(v, producers, parents) for v in args)
        kw = {key: _least_ref(v, producers, parents) for key, v in kwargs.items()} if kwargs else {}
        for array in made:
            producers[id(array)] = len(self)
        self.append(LeastRecord(func, refs, kw, tuple(parents), out, shape, dtype, device, modules))


def _least_ref(value: Any, producers: dict[int, int], parents: list[int]) -> Any:
    """An argument as ``least`` keeps it: a recorded tensor as its record's index, a list or tuple item by item."""
    index = producers.get(id(value))
    if index is not None:
        parents.append(index)
        return index
    if type(value) in (list, tuple):
        return tuple(_least_ref(v, producers, parents) for v in value)
    return value


def tf_modes(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    from tensorflow.python.framework import op_callbacks

    def under(keep: bool, least: bool = False) -> Callable[[], Any]:
        def run() -> Any:
            kept: list[Any] = []
            records = LeastRecords()

            def callback(
                op_type: Any, inputs: Any, attrs: Any, outputs: Any, op_name: Any = None, graph: Any = None
            ) -> None:
                if keep:
                    kept.append(outputs)
                if least and outputs:
                    first = outputs[0]
                    shape, dtype = first._shape_tuple(), first._datatype_enum()
                    records.add(op_type, inputs, None, outputs, outputs, shape, dtype, first.device)

            op_callbacks.add_op_callback(callback)
            try:
                model(*args, **kwargs)
            finally:
                op_callbacks.remove_op_callback(callback)
            return kept, records

        return run

    return {"bare": under(False), "hold": under(True), "least": under(True, least=True)}


def paddle_modes(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    import paddle

    from torchlens_paddle.capture import _defining_modules
    from torchlens_paddle.intercept import STATE, Patches

    layers = [("", model), *model.named_sublayers()] if isinstance(model, paddle.nn.Layer) else []
    modules = _defining_modules(model, layers)

    class Keeper:
        """What the capture's wrappers report to (``intercept.STATE.recorder``), recording nothing."""

        def __init__(self, keep: bool, least: bool = False) -> None:
            self.depth, self.thread, self.keep, self.kept = 0, threading.get_ident(), keep, []
            self.least, self.records = least, LeastRecords()  # ``least``: one small record per op

        def run(self, info: Any, a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            self.depth += 1  # what the op calls inside is part of it, as in a capture
            try:
                if self.keep:
                    for where in info.written(a, k):  # the value an in-place op is about to overwrite
                        target = a[where] if isinstance(where, int) else k[where]
                        if isinstance(target, paddle.Tensor):
                            self.kept.append(target.clone())
                out = info.call(*a, **k)
            finally:
                self.depth -= 1
            if self.keep:
                self.kept.append(out)
            if self.least and isinstance(out, paddle.Tensor):
                self.records.add(info, a, k, out, (out,), tuple(out.shape), out.dtype, out.place)
            return out

        def alias(self, source: Any, out: Any) -> None:
            pass

        def before_share(self, dst: Any) -> None:
            pass

        def shared(self, source: Any, dst: Any) -> None:
            pass

        def decide(self, orig: Any, how: Any, exact: Any, t: Any, a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            return orig(t, *a, **k)

    def under(keep: bool, least: bool = False) -> Callable[[], Any]:
        def run() -> Any:
            keeper, patches = Keeper(keep, least), Patches()
            try:
                patches.install(modules)  # installed and put back every call, as a capture does
                STATE.recorder = keeper
                model(*args, **kwargs)
            finally:
                STATE.recorder = None
                patches.restore()
            return keeper.kept, keeper.records

        return run

    return {"bare": under(False), "hold": under(True), "least": under(True, least=True)}


def tinygrad_modes(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    from tinygrad import Tensor

    from torchlens_tinygrad import capture
    from torchlens_tinygrad.arrays import realize

    class Keeper:
        """The capture's Tensor-method wrappers (installed by the capture's own code), recording nothing."""

        install, uninstall, _wrap = capture.Recorder.install, capture.Recorder.uninstall, capture.Recorder._wrap

        def __init__(self, keep: bool) -> None:
            self.depth, self.thread, self.keep = 0, threading.get_ident(), keep
            self.cells: list[Any] = []
            self.saved: dict[str, Any] = {}
            self.kept: list[Any] = []
            self.pending: list[Any] = []

        def call(self, spec: Any, func: Any, a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            if (spec.eager or spec.random or spec.decides) and self.pending:
                self.flush()  # a write, a draw or a conversion: the values before it exist first
            self.depth += 1
            try:
                out = func(*a, **k)
            finally:
                self.depth -= 1
            if self.keep:
                tensors = (
                    [out]
                    if isinstance(out, Tensor)
                    else [t for t in out if isinstance(t, Tensor)]
                    if isinstance(out, (tuple, list))
                    else []
                )
                self.kept += tensors
                self.pending += tensors
                if spec.eager:
                    self.flush()
            return out

        def flush(self) -> None:
            todo, self.pending = self.pending, []
            self.depth += 1  # Tensor.realize is wrapped too
            try:
                realize(todo)  # each output a realization target of its own, in one schedule, as capture does
            finally:
                self.depth -= 1

    def under(keep: bool) -> Callable[[], Any]:
        def run() -> Any:
            keeper = Keeper(keep)
            keeper.install()
            try:
                out = model(*args, **kwargs)
                if keep:
                    keeper.flush()
                else:
                    keeper.depth += 1
                    realize([out] if isinstance(out, Tensor) else [])
            finally:
                keeper.uninstall()
            return keeper.kept

        return run

    return {"bare": under(False), "hold": under(True)}


def jax_modes(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    import jax
    from jax.extend.core import ClosedJaxpr, DropVar, jaxpr_as_fun

    from torchlens_jax.arrays import is_array
    from torchlens_jax.modules import view_model

    view = view_model(model, args)
    leaves, treedef = jax.tree_util.tree_flatten((args[view.param_args :], kwargs))
    array_at = [i for i, leaf in enumerate(leaves) if is_array(leaf)]
    params = [p.value for p in view.params]
    inputs = [leaves[i] for i in array_at]

    def call(param_values: list[Any], input_values: list[Any]) -> Any:
        filled = list(leaves)
        for i, v in zip(array_at, input_values):
            filled[i] = v
        a, kw = jax.tree_util.tree_unflatten(treedef, filled)
        return view.rebuild(param_values)(*a, **kw)

    def trace() -> Any:
        # A new function object each time, as every capture of a model that is not jitted traces one: JAX keeps
        # the jaxpr of a function it traced before, and answering from it would skip the model's Python, which
        # may read state that changed since (a global, a Python attribute). Only a jitted target's contract
        # lets a capture reuse a program (its floor is hold_jit).
        return jax.make_jaxpr(functools.partial(call))(params, inputs)

    closed = trace()
    jaxpr = closed.jaxpr
    every = [v for eqn in jaxpr.eqns for v in eqn.outvars if not isinstance(v, DropVar)]
    # one executable returning every top-level equation's value: what a compiled capture runs
    keeping = jax.jit(jaxpr_as_fun(ClosedJaxpr(jaxpr.replace(outvars=every), closed.consts)))
    flat = [*jax.tree_util.tree_leaves(params), *inputs]

    def hold() -> Any:  # not jitted: the model traced again (a global it reads may change), then every value
        trace()
        return jax.block_until_ready(keeping(*flat))

    def hold_jit() -> Any:  # a jitted target: its program is known, every value from one call
        return jax.block_until_ready(keeping(*flat))

    return {"bare": trace, "hold": hold, "hold_jit": hold_jit}


MODES = {"torch": torch_modes, "tf": tf_modes, "paddle": paddle_modes, "tinygrad": tinygrad_modes, "jax": jax_modes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", required=True, choices=sorted(MODES))
    parser.add_argument("--cases", nargs="*", help="models to measure instead of the backend's table rows")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: this thread's CPU time (the machine's other jobs do not count; sleeps and waits neither)",
    )
    options = parser.parse_args()
    names = options.cases or list(MODELS[options.backend])
    if options.backend == "torch":
        import torch

        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
    least = ("bare", "hold", "least", "trace")
    modes = {"jax": ("bare", "hold", "hold_jit", "trace"), "torch": least, "tf": least, "paddle": least}.get(
        options.backend, ("bare", "hold", "trace")
    )
    print(
        f"{'model':24s} {'plain ms':>9s} " + " ".join(f"{m:>8s}" for m in modes) + f" {'trace/hold':>10s} "
        f"{'units':>6s} {'us/unit':>8s} {'faults hold':>12s} {'faults trace':>12s}"
    )
    for name, build in build_models(options.backend, names).items():
        built = build()
        plain, ratios, faults = measure(options.backend, *built, options.repeats, options.clock)
        units = recorded_units(options.backend, *built)
        own = (ratios["trace"] - ratios["hold"]) * plain / units * 1e6
        print(
            f"{name:24s} {plain * 1e3:9.2f} "
            + " ".join(f"{ratios[m]:7.2f}x" for m in modes)
            + f" {ratios['trace'] / ratios['hold']:9.2f}x {units:6d} {own:8.1f}"
            + f" {faults['hold']:12.0f} {faults['trace']:12.0f}",
            flush=True,
        )


def in_turn(names: list[str], round_: int) -> list[str]:
    """The first name (the plain call), then the others rotated by ``round_``: what a run finds of the memory the
    run before it freed (glibc's blocks, pages still mapped) changes what it costs, so no mode may always come
    after the same one (a capture run straight after the plain call pays the page faults of fresh memory)."""
    rest = names[1:]
    k = round_ % len(rest) if rest else 0
    return [names[0], *rest[k:], *rest[:k]]


def recorded_units(backend: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """What the recorder handles in one capture: its ops and its module passes."""
    import torchlens as tl

    return sum(units(tl.trace(model, *args, backend=backend, **kwargs)))


def units(trace: Any) -> tuple[int, int]:
    """A trace's ops (input and output nodes left out) and module passes: what its recorder handled."""
    return sum(op.kind == "op" for op in trace.ops), sum(len(m.passes) for m in trace.modules.values())


def measure(
    backend: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], repeats: int, clock: str = "wall"
) -> tuple[float, dict[str, float], dict[str, float]]:
    """The plain call's median seconds, each mode's median over it, and each mode's median minor page faults."""
    import torchlens as tl

    runs = {
        "plain": lambda: _block(model(*args, **kwargs)),
        **MODES[backend](model, args, kwargs),
        "trace": lambda: tl.trace(model, *args, backend=backend, **kwargs),
    }
    times: dict[str, list[float]] = {mode: [] for mode in runs}
    faults: dict[str, list[int]] = {mode: [] for mode in runs}
    now = time.thread_time if clock == "cpu" else time.perf_counter
    for round_ in range(repeats + 3):  # three warm-up rounds
        for mode in in_turn(list(runs), round_):
            run = runs[mode]
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = now()
            kept = run()
            elapsed = now() - start
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            del kept
            if round_ >= 3:
                times[mode].append(elapsed)
                faults[mode].append(faulted)
    plain = statistics.median(times["plain"])
    return (
        plain,
        {mode: statistics.median(t) / plain for mode, t in times.items()},
        {mode: statistics.median(f) for mode, f in faults.items()},
    )


if __name__ == "__main__":
    main()
