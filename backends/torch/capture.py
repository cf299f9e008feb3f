"""Capturing a PyTorch forward.

One ``TorchFunctionMode`` sees every torch-level call the forward makes
(``torch.*``, ``torch.nn.functional.*``, Tensor methods and operators, names
bound before capture); calls made from inside a recorded call are not seen, so
``F.relu`` is one op, not two. Global module hooks give module containment and
passes. A call is an op when it returns a tensor, or when it changes a tensor
in place.

Saved values are the values that ran: before an op writes into a tensor, every
recorded value sharing that tensor's storage is copied first. Batch and
instance norm in training write their running statistics inside the kernel:
those count as writes too, so a BatchNorm's ``running_mean`` keeps, in
``trace.params``, its value from before the forward.

Threads. The function mode is thread-local, but the module hooks are
process-global: every thread's module calls reach them, and they return at once
unless the calling thread is the one capturing. Captures in several threads
(the same model or not) and plain forwards beside them do not see each other.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import warnings
from threading import get_ident
from time import perf_counter
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from torchlens_core.backend.keras_layers import is_keras_object, layer_paths
from torchlens_core.capture.branches import BranchTracker
from torchlens_core.capture.builder import Recording, TraceBuilder
from torchlens_core.capture.policy import CaptureOptions
from torchlens_core.capture.recorder import Recorder as BaseRecorder
from torchlens_core.capture.sites import CallSites, PassSites
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError, UnsupportedError
from torchlens_core.ir.records import Deferred, OpRecord, ParamRecord, Ref, refs_in
from torchlens_core.ir.trace import Trace
from torchlens_torch import autocast
from torchlens_torch.compiled import (
    WRAPPED,
    check_compiled_support,
    eager_stance,
    is_compiled_wrapper,
    public_path,
    refuse_unrunnable,
)
from torchlens_torch.escapes import ShadowMode
from torchlens_torch.fastpath import recorded_as_run
from torchlens_torch.global_hooks import GlobalHooks
from torchlens_torch.grads import hook_grads
from torchlens_torch.modules import module_config, named_modules
from torchlens_torch.replay import GENERATOR_STATE, WRITTEN_KEYWORD
from torchlens_torch.restore import function_mode
from torchlens_torch.splice import spliced
from torchlens_torch.transforms import module_in_transform, recorded_transforms, unrecorded_transform

# Random only while training: the position and default of the flag (dropout in eval mode draws nothing, and its
# generator state need not be kept). torch.* builtins have no signature to read it from.
_TRAINING_FLAG = {
    "dropout": (2, True),
    "alpha_dropout": (2, True),
    "feature_alpha_dropout": (2, True),
    "feature_dropout": (2, True),
    "dropout1d": (2, True),
    "dropout2d": (2, True),
    "dropout3d": (2, True),
    "native_dropout": (2, None),
    "rrelu": (3, False),
    "dropout_": (2, True),
    "alpha_dropout_": (2, True),
    "feature_alpha_dropout_": (2, True),
    "feature_dropout_": (2, True),
    "rrelu_": (3, False),
}
_RANDOM = frozenset(
    {
        "dropout",
        "dropout_",
        "alpha_dropout",
        "alpha_dropout_",
        "feature_alpha_dropout",
        "feature_dropout",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "native_dropout",
        "rrelu",
        "rrelu_",
        "bernoulli",
        "bernoulli_",
        "multinomial",
        "normal",
        "normal_",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "uniform_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "random_",
        "poisson",
        "gumbel_softmax",
        "fractional_max_pool2d",
        "fractional_max_pool3d",
        # torch.nn.init's drawing initializers, seen as one call when they dispatch through handle_torch_function
        "kaiming_uniform_",
        "kaiming_normal_",
        "xavier_uniform_",
        "xavier_normal_",
        "trunc_normal_",
        "orthogonal_",
        "sparse_",
    }
)
# Factories whose output is whatever the memory held: replay reuses the recorded bytes.
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
# Calls that return tensors but change nothing a forward computes with.
_IGNORED = frozenset({"requires_grad_", "retain_grad", "share_memory_", "register_hook", "detach_"})
# Calls that turn a tensor's value into a Python value, which an ``if`` or ``while`` may test.
_DECIDING = frozenset({"__bool__", "item", "__int__", "__float__", "__index__", "tolist", "__len__"})
# Gradients computed inside the forward: replay runs the recorded ops without autograd, and backward() writes
# .grad of tensors outside the trace, so neither can run again. Refused at capture (UnsupportedError).
_AUTOGRAD_CALLS = frozenset({torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward})
_INPLACE_DUNDERS = frozenset(
    {
        "iadd",
        "isub",
        "imul",
        "itruediv",
        "ifloordiv",
        "imod",
        "ipow",
        "imatmul",
        "iand",
        "ior",
        "ixor",
        "ilshift",
        "irshift",
    }
)
_RENAMED = {"radd": "add", "rmul": "mul", "rand": "and", "ror": "or", "rxor": "xor", "truediv": "div"}
_DTYPE_NAMES: dict[Any, str] = {}
UNRECORDED_COLLECTIVES = "unrecorded_collectives"  # trace.notes key: torch.distributed calls seen while unarmed
# the innermost torch.func transform (vmap, grad...) running now, or None: ops inside one are refused
_transform_running = torch._C._functorch.peek_interpreter_stack
_SCALARS = frozenset({int, float, bool, str, type(None)})  # arguments that are never templated
_SIZE = torch.Size


class FuncInfo:
    """What capture needs to know about one torch callable, worked out once."""

    __slots__ = (
        "name",
        "ignored",
        "in_place",
        "inplace_pos",
        "random",
        "training_flag",
        "uninitialized",
        "decides",
        "stats",
        "collective",
        "autograd",
        "target_names",
        "plain",
    )

    def __init__(self, func: Any) -> None:
        raw = getattr(func, "__name__", None) or type(func).__name__
        if isinstance(func, torch._ops.OpOverload):  # aten.conv2d.default (an exported graph's ops): "conv2d"
            raw = func.overloadpacket.__name__
        if raw == "__get__":  # property access such as Tensor.T
            raw = getattr(getattr(func, "__self__", None), "__name__", raw)
        if raw.startswith("__") and raw.endswith("__"):
            base = raw[2:-2]
            self.in_place = base in _INPLACE_DUNDERS or base == "setitem"
            self.name = base[1:] + "_" if base in _INPLACE_DUNDERS else _RENAMED.get(base, base)
        else:
            self.in_place = raw.endswith("_") and not raw.startswith("_")
            self.name = raw.lstrip("_") or "op"
        self.ignored = raw in _IGNORED
        self.decides = raw in _DECIDING
        self.random = self.name in _RANDOM
        self.training_flag = _training_flag(func, self.name) if self.random else None
        self.uninitialized = self.name in _UNINITIALIZED
        self.inplace_pos = _inplace_position(func)
        # the keywords the written tensor may come by, when it is not passed first by position
        self.target_names = _target_names(func) if self.in_place or self.inplace_pos is not None else ()
        self.autograd = func in _AUTOGRAD_CALLS
        self.stats = _RUNNING_STATS.get(func)
        # torch.distributed's collectives reach the mode too (they write in place, or into lists): recorded
        # only by tl.distributed.arm()'s wrappers, which call them with the mode off
        self.collective = getattr(func, "__module__", None) == "torch.distributed.distributed_c10d"
        # Most calls need none of the special handling below: one flag for the hot path.
        self.plain = not (
            self.ignored
            or self.decides
            or self.in_place
            or self.random
            or self.uninitialized
            or self.inplace_pos is not None
            or self.stats is not None
            or self.collective
            or self.autograd
        )


def _training_flag(func: Any, name: str) -> tuple[int, str, Any] | None:
    """(position, name, default) of the flag that makes a dropout-like call random, if it has one."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        params = []
    for pos, param in enumerate(params):
        if param.name in ("training", "train"):
            return pos, param.name, param.default
    if not params and name in _TRAINING_FLAG:
        pos, default = _TRAINING_FLAG[name]
        return pos, "training" if name.startswith("rrelu") else "train", default
    return None


def _draws(info: FuncInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Does this call of a random function draw? Dropout and rrelu only while training."""
    flag = info.training_flag
    if flag is None:
        return True
    pos, name, default = flag
    value = args[pos] if len(args) > pos else kwargs.get(name, default)
    return value is not False  # native_dropout's train=None means "train" as well


def _target_names(func: Any) -> tuple[str, ...]:
    """The keyword(s) an in-place call's first parameter, the tensor it writes, may be passed by.

    A Python function's signature names it (``torch.nn.init.kaiming_uniform_(tensor=w)``, ``F.relu(input=x,
    inplace=True)``); a torch builtin has no signature, and takes it as ``input`` (``torch.relu_(input=x)``).
    """
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return ("input", "self")
    return (names[0],) if names else ()


def _written(info: FuncInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, str | None]:
    """The tensor an in-place call writes into (None: it writes none), and the keyword it came by (None: ``out=``
    or by position)."""
    target = kwargs.get("out")
    if target is not None:
        return target, None
    if info.inplace_pos is not None and not info.in_place:
        pos = info.inplace_pos
        if not (kwargs.get("inplace") or (len(args) > pos and args[pos] is True)):
            return None, None
    elif not info.in_place:
        return None, None
    if args:
        return args[0], None
    for name in info.target_names:
        if name in kwargs:
            return kwargs[name], name
    return None, None


def _inplace_position(func: Any) -> int | None:
    """Position of an ``inplace`` parameter (F.relu, F.dropout...), if the signature has one."""
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("inplace") if "inplace" in names else None


# Norms that, in training, update the running statistics passed to them inside the kernel:
# function -> (position of running_mean, running_var just after it; position and name of the
# flag that turns the update on, and its default).
RunningStats = tuple[int, int, str, bool]


def _running_stats_table() -> dict[Any, RunningStats]:
    functional = torch.nn.functional
    table: dict[Any, RunningStats] = {
        functional.batch_norm: (1, 5, "training", False),
        functional.instance_norm: (1, 5, "use_input_stats", True),
    }
    # torch.* and the kernels F.* reach: (input, weight, bias, running_mean, running_var, training, ...)
    for name, flag in (
        ("batch_norm", "training"),
        ("instance_norm", "use_input_stats"),
        ("native_batch_norm", "training"),
        ("_native_batch_norm_legit", "training"),
        ("_batch_norm_impl_index", "training"),
        ("cudnn_batch_norm", "training"),
        ("miopen_batch_norm", "training"),
    ):
        fn = getattr(torch, name, None)
        if fn is not None:
            table[fn] = (3, 5, flag, False)
    return table


_RUNNING_STATS = _running_stats_table()  # whole before any capture reads it, whatever thread reads first


def _running_stats_written(spec: RunningStats, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The running statistics this norm call will update (none in eval mode, or without running stats)."""
    mean_pos, flag_pos, flag, default = spec
    if not (args[flag_pos] if len(args) > flag_pos else kwargs.get(flag, default)):
        return []
    found = []
    for pos, key in ((mean_pos, "running_mean"), (mean_pos + 1, "running_var")):
        t = args[pos] if len(args) > pos else kwargs.get(key)
        if isinstance(t, Tensor):  # a bool here: the overload without running statistics
            found.append(t)
    return found


_FUNC_INFO: dict[Any, FuncInfo] = {}


def _info(func: Any) -> FuncInfo:
    info = _FUNC_INFO.get(func)
    if info is None:
        info = _FUNC_INFO[func] = FuncInfo(func)
    return info


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


# torch and this backend are never the user's code site (capture() below calls the model: the walk stops there).
_SITES = CallSites(torch.__file__, __file__)


def _rng_states() -> dict[str, Any]:
    """Generator states before a random op, so that replay draws the same numbers."""
    states: dict[str, Any] = {"rng_state": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda_rng_states"] = torch.cuda.get_rng_state_all()
    return states


class _Recorder(BaseRecorder, TorchFunctionMode):
    """Records every torch call of one forward into a TraceBuilder.

    What is torch's own here: the function mode and the module hooks, and how a
    call is described (its name, what it writes, autocast, random state); the
    bookkeeping is :class:`torchlens_core.capture.recorder.Recorder`'s.
    """

    array_types = (Tensor,)

    def __init__(self, builder: TraceBuilder, param_names: dict[int, str]) -> None:
        TorchFunctionMode.__init__(self)
        BaseRecorder.__init__(self, builder, param_names)
        self.branches = BranchTracker(_SITES.internal)
        self.sites = PassSites(_SITES)  # each op's call-site walk ends at its module call
        self.grads = builder.options.save_grads is not False  # save_grads=: hook each wanted output's gradient
        # self.depth: recorded calls (and module hooks) running now: escape_detector's "inside" (escapes.py)
        self.transform: str | None = None  # the torch.func transform being recorded as one op now (transforms.py)
        self.last_autocast: Any = None  # the last autocast state recorded (shared by the ops it is the same for)

    # -- torch's tensors ------------------------------------------------------------------
    def describe(self, value: Tensor) -> tuple[tuple[int, ...], str, str]:
        return tuple(value.shape), _dtype_name(value.dtype), value.device.type

    def copy(self, value: Tensor) -> Tensor:
        with torch.no_grad(), torch._C.DisableTorchFunction():
            return value.detach().clone()

    def memory(self, value: Tensor) -> int | None:
        try:
            return value.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # tensors without storage (meta, sparse...)
            return None

    def version(self, value: Tensor) -> int:
        return value._version

    @contextlib.contextmanager
    def own_work(self) -> Any:
        with torch._C.DisableTorchFunction():  # the mode is off for the recorder's own tensor calls
            yield

    def recorded(self, op: OpRecord, value: Any) -> None:
        if type(value) is Tensor and value.grad_fn is not None and not op.meta.get("identity"):
            op.meta["grad_fn"] = value.grad_fn.name()  # what autograd will run backward for this op
        if self.grads and self.builder.grad_wanted(op):
            hook_grads(op, value)

    # -- the hot path ------------------------------------------------------------------
    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        try:
            info = _FUNC_INFO.get(func) or _info(func)
            if info.plain and (not kwargs or "out" not in kwargs):  # the hot path: most calls
                start = perf_counter()
                out = func(*args, **kwargs) if kwargs else func(*args)
                elapsed = perf_counter() - start
                if isinstance(out, Tensor) or (
                    isinstance(out, (tuple, list))
                    and type(out) is not _SIZE  # (size(): ints)
                    and any(isinstance(o, Tensor) for o in out)
                ):
                    return self._record(func, info, args, kwargs or {}, out, None, None, elapsed)
                return out
            if kwargs is None:
                kwargs = {}
            if info.autograd:
                raise self._autograd_refused(info)
            if info.ignored:
                return func(*args, **kwargs)
            if info.collective:
                self._unrecorded_collective(info.name)
                return func(*args, **kwargs)
            if info.decides:  # a tensor's value turned into a Python value: maybe a branch
                result = func(*args, **kwargs)
                found = self.producers.get(id(args[0])) if args else None
                if found is not None and found[0]() is args[0]:
                    self.branches.condition(found[1].index)
                    self.builder.to_python(found[1].index, found[1].path, info.name, result)
                return result
            target, keyword = _written(info, args, kwargs)
            if target is not None and isinstance(target, Tensor):
                self.protect(target)
            else:
                target = keyword = None
            if info.stats is not None:  # batch norm in training: the kernel updates the running statistics
                for stat in _running_stats_written(info.stats, args, kwargs):
                    self.protect(stat)
            random = info.random and _draws(info, args, kwargs)
            meta = _rng_states() if random else None
            drawn_from = kwargs.get("generator") if random else None
            if meta is not None and isinstance(
                drawn_from, torch.Generator
            ):  # its own generator, not the global one: keep its state
                meta[GENERATOR_STATE] = {"device": drawn_from.device.type, "state": drawn_from.get_state()}
            start = perf_counter()
            out = func(*args, **kwargs)
            elapsed = perf_counter() - start
            if isinstance(drawn_from, torch.Generator):
                # replay makes one from the state: a Generator is no value a trace can save, and the user's has
                # moved on
                kwargs = {**kwargs, "generator": None}
            if info.uninitialized and isinstance(out, Tensor):
                with torch.no_grad(), torch._C.DisableTorchFunction():
                    meta = {"uninitialized": out.detach().clone()}
            if keyword is not None:  # replay copies what it writes into, when that is not a recorded value
                meta = {**meta, WRITTEN_KEYWORD: keyword} if meta else {WRITTEN_KEYWORD: keyword}
            if isinstance(out, Tensor):
                return self._record(func, info, args, kwargs, out, target, meta, elapsed, random)
            if target is not None:  # __setitem__ and friends return None but wrote into target
                self._record(func, info, args, kwargs, target, target, meta, elapsed, random)
            elif isinstance(out, (tuple, list)) and any(isinstance(o, Tensor) for o in out):
                return self._record(func, info, args, kwargs, out, None, meta, elapsed, random)
            return out
        except TorchLensError as exc:  # torch turns a TypeError in an operator into NotImplemented: capture()
            raise self.remember(exc) from None  # raises it, also if the model caught it

    def _record(
        self,
        func: Any,
        info: FuncInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        target: Tensor | None,
        meta: dict[str, Any] | None,
        elapsed: float,
        random: bool = False,
    ) -> Any:
        """Record one call; returns what the forward gets back (``out``, or what intervene= made of it)."""
        if _transform_running() is not None:  # one the recorder is not recording whole (transforms.py)
            raise unrecorded_transform(info.name)
        a, k, parents, params = self.call_template(args, kwargs)
        if isinstance(out, Tensor):
            shape, dtype = tuple(out.shape), _DTYPE_NAMES.get(out.dtype) or _dtype_name(out.dtype)
            device = "cpu" if out.is_cpu else out.device.type
        else:
            leaves = [t for t in out if isinstance(t, Tensor)]
            shape = tuple(tuple(t.shape) if isinstance(t, Tensor) else None for t in out)
            dtype, device = (_dtype_name(leaves[0].dtype), leaves[0].device.type)
        if autocast.any_enabled():  # what the op computed depends on it: replay runs under the same
            meta = self._with_autocast(meta)
        return self.record(
            info.name,
            func,
            a,
            k,
            parents,
            params,
            out,
            written=() if target is None else (target,),
            shape=shape,
            dtype=dtype,
            device=device,
            random=random,
            code_context=self.sites.stack(skip=2),
            meta=meta,
            elapsed=elapsed,
            conditions=self.branches.current() if self.branches.open else (),
        )

    def _with_autocast(self, meta: dict[str, Any] | None) -> dict[str, Any] | None:
        """``meta`` with the autocast state on now (autocast.py); the ops of one autocast region share one entry."""
        state = autocast.recorded_state()
        if not state:
            return meta
        if state == self.last_autocast:
            state = self.last_autocast
        self.last_autocast = state
        return {**meta, autocast.META_KEY: state} if meta else {autocast.META_KEY: state}

    def _autograd_refused(self, info: FuncInfo) -> UnsupportedError:
        """The error for a gradient computed inside the forward, naming the call, its module and its line."""
        where = self.sites.stack(skip=2)
        stack = self.builder.module_stack
        inside = f" in module '{stack[-1][0]}'" if stack else ""
        at = f" at {where[0]}" if where else ""
        call = "torch.autograd.grad" if info.name == "grad" else f"{info.name}()"
        return UnsupportedError(
            f"{call} ran inside the traced forward{inside}{at}: a trace replays its ops without autograd (and "
            f"backward() writes .grad of tensors outside the trace), so this gradient could not be computed "
            f"again, and replay and audit() would fail. Compute the gradient outside tl.trace and pass what it "
            f"gives in (a meta-learning inner step: trace the outer forward with the adapted weights, e.g. "
            f"through torch.func.functional_call), or trace the forward without the gradient step"
        )

    def _unrecorded_collective(self, name: str) -> None:
        """A torch.distributed call the capture cannot record (tl.distributed is not armed): say so, once."""
        unrecorded = self.builder.notes.setdefault(UNRECORDED_COLLECTIVES, [])
        if not unrecorded:
            warnings.warn(
                f"torch.distributed.{name} ran in the forward, and tl.distributed is not armed: what it "
                f"writes is not recorded, so replay will not reproduce it. Call tl.distributed.arm() "
                f"before capturing (docs/distributed.md)",
                RuntimeWarning,
                stacklevel=4,
            )
        unrecorded.append(name)

    # -- for calls the function mode does not see (tl.distributed's collectives) ---------
    # These run with the mode on, in the model's code: each turns torch functions off, so that its own
    # tensor work (copies before a write, constants) is not recorded as the model's.
    def record_call(
        self, func: Any, args: tuple[Any, ...], out: Any, written: Tensor | None, meta: dict[str, Any], elapsed: float
    ) -> Any:
        """Record ``func(*args)``, which returned ``out`` (and wrote into ``written``), as the next op.

        Call :meth:`protect` on ``written`` before the call runs. Returns what
        the forward gets back (``out``, or what intervene= made of it).
        """
        with torch._C.DisableTorchFunction():
            return self._record(func, _info(func), args, {}, out, written, meta, elapsed)

    # -- module hooks -------------------------------------------------------------------
    def module_pre_hook(self, paths: dict[int, str]) -> Any:
        thread = self.thread

        def pre(module: Any, args: Any) -> None:
            if get_ident() != thread:
                return
            try:
                path = paths.get(id(module))
                if path:
                    if self.transform is not None:  # its pass would return the transform's wrappers
                        raise module_in_transform(path, self.transform)
                    inputs = self.module_inputs(args)  # now: a write inside the module must not move the Refs
                    self.enter_pass(path, None if inputs is None else (inputs, {}))
                    self.sites.enter(path, sys._getframe(1))  # torch's frame that runs the hooks calls the forward
            except TorchLensError as exc:  # capture() raises it, also if the model caught it
                raise self.remember(exc) from None

        return pre

    def module_post_hook(self, paths: dict[int, str]) -> Any:
        builder, thread = self.builder, self.thread

        # `output=None`: a module call in another thread that read the hook just before __exit__ took it and its
        # with_kwargs flag out calls it without kwargs (torch checks the flag when it calls); it returns at once
        def counted(module: Any, args: Any, kwargs: Any, output: Any = None) -> Any:  # escape_detector
            self.depth += 1
            try:
                return post(module, args, kwargs, output)
            finally:
                self.depth -= 1

        def post(module: Any, args: Any, kwargs: Any, output: Any = None) -> Any:
            if get_ident() != thread:
                return None
            path = paths.get(id(module))
            if not path:
                return None
            stack = builder.module_stack
            current = stack[-1] if stack else None
            if kwargs and current is not None and current[0] == path:
                self._add_keyword_inputs(current, kwargs)
            try:
                edited = self.exit_pass(path, output)  # intervene= may edit it, as a hook would
            finally:
                self.sites.exit(path)
            return None if edited is output else edited

        return counted if builder.options.escape_detector else post

    def module_inputs(self, value: Any) -> Any:
        """A module call's arguments with recorded tensors as Refs and parameters as ParamRefs; None if a
        leaf is neither one nor plain data (a tensor from outside the trace, an object)."""
        t = type(value)
        if t in _SCALARS:
            return value
        if isinstance(value, Tensor):
            found = self.producers.get(id(value))
            if found is not None and found[0]() is value:
                return found[1]
            name = self.param_names.get(id(value))
            return None if name is None else self._param_ref(name)
        if t is tuple or t is list:  # the positional arguments: recorded tensors handled without a call each
            producers = self.producers
            items = []
            for v in value:
                found = producers.get(id(v))
                if found is not None and found[0]() is v:
                    items.append(found[1])
                    continue
                m = self.module_inputs(v)
                if m is None and v is not None:
                    return None
                items.append(m)
            return t(items)
        if t is dict:
            mapped = {}
            for key, v in value.items():
                m = mapped[key] = self.module_inputs(v)
                if m is None and v is not None:
                    return None
            return mapped
        return None

    def _add_keyword_inputs(self, current: tuple[str, int], kwargs: dict[str, Any]) -> None:
        """Keyword arguments join a pass's recorded inputs (torch shows them to the post hook only);
        one written inside the module no longer holds what the module received: the inputs are unknown."""
        module_pass = self.builder.modules[current[0]].passes[current[1] - 1]
        if module_pass.in_template is None:
            return
        mapped = self.module_inputs(kwargs)
        ops = self.builder.ops
        if mapped is None or any(current in ops[ref.index].module_passes for ref in refs_in(mapped)):
            module_pass.in_template = None
        else:
            module_pass.in_template = (module_pass.in_template[0], mapped)


class _ShadowedRecorder(_Recorder):
    """The recorder with escape_detector="shadow": it counts the calls it is inside (escapes.py)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.depth += 1
        try:
            return super().__torch_function__(func, types, args, kwargs)
        finally:
            self.depth -= 1


def capture(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions | None = None
) -> Trace | Recording:
    """Run ``model(*args, **kwargs)`` once under the recorder and return its Trace."""
    is_module = isinstance(model, torch.nn.Module)
    refuse_unrunnable(model)
    check_compiled_support(model)
    named = getattr(model, WRAPPED) if is_compiled_wrapper(model) else model  # torch.compile(m) is traced as m
    builder = TraceBuilder(
        "torch", type(named).__name__ if is_module else getattr(model, "__name__", "function"), options
    )
    param_names: dict[int, str] = {}
    paths: dict[int, str] = {}
    walked = named_modules(model) if is_module else None  # one walk for declaring, and fastpath's
    if walked is not None:
        _declare(builder, model, walked, param_names, paths)
    shadow = builder.options.escape_detector == "shadow"
    recorder = (_ShadowedRecorder if shadow else _Recorder)(builder, param_names)
    watching = ShadowMode(recorder) if shadow else contextlib.nullcontext()
    for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor)):
        if id(leaf) not in recorder.producers and id(leaf) not in param_names:
            op = builder.add_input(
                leaf, shape=tuple(leaf.shape), dtype=_dtype_name(leaf.dtype), device=leaf.device.type
            )
            recorder.produced(leaf, Ref(op.index))
    # the global module hooks go out of torch's registries last, and surely (global_hooks.py, restore.py)
    hooks = GlobalHooks(recorder.module_pre_hook(paths), recorder.module_post_hook(paths))
    try:
        # tl.splice_module first: a spliced module is left alone by the fused-path rewriting
        # compiled regions run their Python (torchlens_torch.compiled); fused paths run as untraced
        with (
            hooks,
            eager_stance.held(),
            spliced(model, builder),
            recorded_as_run(model, recorder, walked),
            recorded_transforms(recorder),
            function_mode(recorder),
            watching,
        ):
            output = named(*args, **kwargs)  # under force_eager the wrapper would only call what it wraps
    except TypeError:
        if recorder.failure is not None:  # ours, made "unsupported operand type(s)" by a tensor operator
            raise recorder.failure from None
        raise
    finally:
        recorder.branches.close()
    recorder.raise_remembered()  # the model caught an error of a recorded call and went on
    with torch._C.DisableTorchFunction():  # intervene='s helpers' own tensor calls are not the model's ops
        template, output = recorder.returned(output, None)
    builder.add_outputs(template, output)
    recorder.check_versions()
    kept = [leaf for _, leaf in tree.leaves((args, kwargs), lambda v: isinstance(v, Tensor))]
    if is_module:  # as they are now: the forward may have set new ones (keras-on-torch builds its weights)
        kept += _member_values(model)
    recorder.unalias(kept)
    trace = builder.finish()
    if isinstance(watching, ShadowMode):
        watching.report(trace)
    return trace


_SITES.stop_at(capture)


def _declare(
    builder: TraceBuilder,
    model: torch.nn.Module,
    walked: list[tuple[str, torch.nn.Module]],
    param_names: dict[int, str],
    paths: dict[int, str],
) -> None:
    """Declare the model's modules (``walked``: its ``named_modules()``), parameters and buffers before
    the forward."""
    # A compile wrapper is not a module of the model: the module it wraps takes its path (compiled.py).
    modules = [(public_path(path), module) for path, module in walked if not is_compiled_wrapper(module)]
    params, buffers = _members(model, modules)
    for name, p in params:
        owner = name.rpartition(".")[0]
        builder.add_param(
            ParamRecord(
                name=name,
                shape=tuple(p.shape),
                dtype=_DTYPE_NAMES.get(p.dtype) or _dtype_name(p.dtype),
                numel=p.numel(),
                trainable=p.requires_grad,
                module=owner,
                value=p,
            )
        )
        param_names[id(p)] = name
    for name, b in buffers:
        if id(b) in param_names:
            continue
        builder.add_param(
            ParamRecord(
                name=name,
                shape=tuple(b.shape),
                dtype=_dtype_name(b.dtype),
                numel=b.numel(),
                trainable=False,
                module=name.rpartition(".")[0],
                is_buffer=True,
                value=b,
            )
        )
        param_names[id(b)] = name
    for path, module in modules:
        paths[id(module)] = path
        if path:
            builder.add_module(path, type(module).__name__)  # its parameters: listed by the builder at the end
            # print(op)'s Config, read when first asked for: reading it costs microseconds a module every capture
            # would pay. The record holds the module until then, as ParamRecords hold its parameters.
            deferred = Deferred(functools.partial(module_config, module))
            builder.modules[path].config = deferred  # type: ignore[assignment]  # the slot's property computes it
    for path, layer in _keras_layers(model, {id(module) for _, module in modules}):
        paths[id(layer)] = path
        builder.add_module(path, type(layer).__name__)


def _keras_layers(model: torch.nn.Module, known: set[int]) -> list[tuple[str, torch.nn.Module]]:
    """Keras 3 layers run on torch, named as every backend names them
    (:mod:`torchlens_core.backend.keras_layers`).

    Keras keeps a model's layers in its own lists, not as torch submodules, so
    ``named_modules()`` sees the model alone; each layer is still a torch module
    whose calls the module hooks see.
    """
    if not is_keras_object(model):
        return []
    return [
        (path, layer)
        for path, layer in layer_paths(model, seen={id(model)})
        if isinstance(layer, torch.nn.Module) and id(layer) not in known
    ]


def _member_values(model: torch.nn.Module) -> list[Tensor]:
    """The model's parameters and buffers (some maybe twice), without the names :func:`_members` makes."""
    cls, base = type(model), torch.nn.Module
    if cls.named_parameters is not base.named_parameters or cls.named_buffers is not base.named_buffers:
        return [value for members in _members(model, []) for _, value in members]
    values: list[Tensor] = []
    for _, module in named_modules(model):
        values += module._parameters.values()
        values += module._buffers.values()
    return [value for value in values if value is not None]


def _members(
    model: torch.nn.Module, modules: list[tuple[str, torch.nn.Module]]
) -> tuple[list[tuple[str, Tensor]], list[tuple[str, Tensor]]]:
    """``named_parameters()`` and ``named_buffers()``, read off one walk of the modules.

    Each of those walks ``named_modules()`` again through nested generators,
    which costs more than the rest of declaring a large model. A model that
    overrides them gets its own.
    """
    cls, base = type(model), torch.nn.Module
    if cls.named_parameters is not base.named_parameters or cls.named_buffers is not base.named_buffers:
        return (
            [(public_path(name), p) for name, p in model.named_parameters()],
            [(public_path(name), b) for name, b in model.named_buffers()],
        )
    found: tuple[list[tuple[str, Tensor]], list[tuple[str, Tensor]]] = ([], [])
    for kind, members in zip(("_parameters", "_buffers"), found):
        seen: set[int] = set()  # each tensor once, under the first name reaching it, as torch does
        for prefix, module in modules:
            for key, value in getattr(module, kind).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                members.append((f"{prefix}.{key}" if prefix else key, value))
    return found
