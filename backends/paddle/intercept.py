"""Where Paddle's operations can be seen, and putting wrappers there for one capture.

Paddle has no ``__torch_function__``. Its Python API reaches the kernels
through ``paddle._C_ops``, a module of about 1,300 C functions looked up by
attribute (``_C_ops.relu(x)``), so having that lookup give a wrapper
intercepts ``paddle.*``, ``paddle.nn.functional.*`` and the Tensor methods
written in Python (for the capture the module's class is one whose lookups do:
:func:`_looking_up`); ``paddle._legacy_C_ops`` (about 800, still used in
places) is intercepted the same way. A few Paddle modules also bind some of those C functions under their
own names (``paddle.tensor.matmul``, ``F.gelu``): every such alias found in a
loaded ``paddle.*`` module, or in the module that defines the traced model, is
replaced by the same wrapper. Tensor operators (``__add__``, ``__mul__``...)
and a few Tensor methods (``clone``, ``detach``...) are C methods that bypass
``_C_ops``; they are replaced on ``paddle.Tensor`` itself, and so are the methods
that turn a value into a Python one (``__bool__``, ``item``, ``numpy``...), which
are no ops but tell the branch tracker and are reported for replay on new inputs,
and ``_use_gpudnn``, which gives the same data back as a new object (no op
either: linked to the op whose value it is).
``StaticFunction.__call__`` is replaced by a guard that refuses
``paddle.jit.to_static`` code run inside a captured forward. (Layer calls,
the module passes, are seen by :mod:`torchlens_paddle.layer_calls`.)

A wrapper records a call only when no other recorded call is running (the
recorder keeps a depth counter), so a Python method built from several C ops,
``x[1:3]`` say, is one op, and nothing is counted twice.

:class:`Patches` installs the wrappers and puts every original back; callers
restore in a ``finally``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from operator import is_
from types import ModuleType
from typing import Any

import paddle

# -- what each intercepted callable is --------------------------------------------------

# Ops that draw random numbers: their RNG state is recorded so replay draws the same.
RANDOM = frozenset(
    {
        "bernoulli",
        "binomial",
        "class_center_sample",
        "dirichlet",
        "dropout",
        "dropout_",
        "exponential_",
        "fused_bias_dropout_residual_layer_norm",
        "fused_dropout_add",
        "gaussian",
        "gaussian_inplace",
        "gaussian_inplace_",
        "graph_khop_sampler",
        "graph_sample_neighbors",
        "gumbel_softmax",
        "multinomial",
        "poisson",
        "randint",
        "random",
        "random_",
        "randperm",
        "rnn",
        "rrelu",
        "shuffle_batch",
        "standard_gamma",
        "tdm_sampler",
        "top_p_sampling",
        "truncated_gaussian_random",
        "uniform",
        "uniform_inplace",
        "uniform_inplace_",
        "uniform_random_batch_size_like",
        "weighted_sample_neighbors",
    }
)

# Compiled programs (``paddle.jit.to_static``) run as one opaque op: refused.
COMPILED = frozenset({"run_program", "pir_run_program"})

# In-place ops that do not (only) write their first argument.
_WRITES: dict[str, tuple[int | str, ...]] = {
    "assign_out_": (1,),
    "batch_norm_": (1, 2),
    "sync_batch_norm_": (1, 2),
}

# Outputs kept only for the backward pass, left uninitialized in inference (batch norm's
# saved statistics and reserve space in eval mode hold whatever memory they got), and the
# RNN layers' dropout state (never initialized on CPU, discarded by their Python code): not
# recorded, and dropped from the replayed value too.
SCRATCH: dict[str, tuple[int, ...]] = {
    "batch_norm": (3, 4, 5),
    "batch_norm_": (3, 4, 5),
    "sync_batch_norm_": (3, 4, 5),
    "rnn": (1,),
}

# Ops whose output holds whatever memory it got (``paddle.empty``): replay gives back the
# recorded value, the value that ran.
UNDEFINED = frozenset({"empty", "empty_like"})

# Tensor operators and the op names they are recorded under.
TENSOR_DUNDERS = {
    "__add__": "add",
    "__radd__": "add",
    "__sub__": "sub",
    "__rsub__": "rsub",
    "__mul__": "mul",
    "__rmul__": "mul",
    "__div__": "div",
    "__truediv__": "div",
    "__rdiv__": "rdiv",
    "__rtruediv__": "rdiv",
    "__floordiv__": "floordiv",
    "__rfloordiv__": "rfloordiv",
    "__mod__": "mod",
    "__rmod__": "rmod",
    "__pow__": "pow",
    "__rpow__": "rpow",
    "__matmul__": "matmul",
    "__rmatmul__": "rmatmul",
    "__eq__": "eq",
    "__ne__": "ne",
    "__lt__": "lt",
    "__le__": "le",
    "__gt__": "gt",
    "__ge__": "ge",
    "__neg__": "neg",
    "__pos__": "pos",
    "__abs__": "abs",
    "__invert__": "invert",
    "__and__": "and",
    "__rand__": "and",
    "__or__": "or",
    "__ror__": "or",
    "__xor__": "xor",
    "__rxor__": "xor",
    "__lshift__": "lshift",
    "__rlshift__": "rlshift",
    "__rshift__": "rshift",
    "__rrshift__": "rrshift",
    "__getitem__": "getitem",
    "__setitem__": "setitem",
}
# Tensor methods that do not go through _C_ops (C methods, or Python ones that copy
# between devices): name, and the arguments they write.
TENSOR_METHODS: dict[str, tuple[str, tuple[int | str, ...]]] = {
    "clone": ("clone", ()),
    "detach": ("detach", ()),
    "contiguous": ("contiguous", ()),
    "copy_": ("copy_", (0,)),
    "set_value": ("set_value", (0,)),
    "_copy_to": ("copy_to", ()),
    "cpu": ("cpu", ()),
    "cuda": ("cuda", ()),
    "to": ("to", ()),
    "_getitem_dygraph": ("getitem", ()),
    "_setitem_dygraph": ("setitem", (0,)),
}
# Tensor methods that turn a tensor's value into a Python value (or a NumPy array), which an
# ``if`` or ``while`` may test and the recorded graph then holds as fixed: never ops, but they tell
# the branch tracker, and are reported to replay (``TraceBuilder.to_python``) as the conversion of
# ``torchlens_core.replay.inputs.CONVERSIONS`` that checks them: attribute -> (kind, whether the
# method's own result is what that kind gives; if not, capture converts the tensor that way too).
# ``__len__`` is data-dependent after ops such as nonzero, whose output shape depends on values. A
# NumPy array holds every value: checked as ``tolist``; ``complex(t)`` as ``item``, which equals it.
DECIDING: dict[str, tuple[str, bool]] = {
    "__bool__": ("bool", True),
    "__nonzero__": ("bool", True),
    "item": ("item", True),
    "__int__": ("int", True),
    "__long__": ("int", True),
    "__float__": ("float", True),
    "__index__": ("index", True),
    "__complex__": ("item", False),
    "__len__": ("len", True),
    "tolist": ("tolist", True),
    "numpy": ("tolist", False),
    "__array__": ("tolist", False),
}


# Tensor methods that return the same data under another Tensor object (``x._use_gpudnn(False)``,
# which adaptive pooling applies to its input): no op, but the new object is linked to the op whose
# value it is, or the op reading it would see a constant (a lost edge). Replay passes the value on.
ALIASING = ("_use_gpudnn",)
# Tensor methods that make their argument hold the data of the tensor they are called on, under the
# argument's own Tensor object (``out._share_underline_tensor_to(var)``): how paddle.nn.initializer's
# initializers, and conv and norm layers reshaping a parameter, write a tensor or parameter. No op, but
# from then on the argument is the value of the op that made ``out``.
SHARING = ("_share_underline_tensor_to",)


class OpInfo:
    """What capture needs to know about one intercepted callable, worked out once."""

    __slots__ = ("name", "call", "random", "writes", "compiled", "statistics", "scratch", "undefined")

    def __init__(self, name: str, call: Callable[..., Any], writes: tuple[int | str, ...] = ()) -> None:
        self.name = name
        self.call = call
        self.random = name in RANDOM
        self.writes = writes
        self.compiled = name in COMPILED
        self.scratch = SCRATCH.get(name, ())
        self.undefined = name in UNDEFINED
        # batch norm in training updates its running statistics (arguments 1 and 2) in place
        self.statistics = name in ("batch_norm", "batch_norm_", "sync_batch_norm_")

    def written(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | str, ...]:
        """The arguments this call writes into (positions or keyword names)."""
        if not (self.writes or kwargs or self.statistics):
            return ()
        found: list[int | str] = [w for w in self.writes if (w < len(args) if isinstance(w, int) else w in kwargs)]
        if kwargs.get("out") is not None:
            found.append("out")
        if self.statistics and len(args) > 5 and not args[5]:  # args[5]: is_test
            found += [i for i in (1, 2) if i not in found]
        return tuple(found)


# C ops whose names are a variant of what was called.
_RENAMED = {"split_with_num": "split"}


def _c_op_info(fn: Any) -> OpInfo:
    name = getattr(fn, "__name__", "op")
    if name in _WRITES:
        writes = _WRITES[name]
    elif name.endswith("_") and not name.startswith("_"):
        writes = (0,)
    else:
        writes = ()
    return OpInfo(_RENAMED.get(name, name), fn, writes)


# -- the recorder the wrappers report to -------------------------------------------------


class _State:
    """The capture in progress (at most one per process): the wrappers read it on every call."""

    __slots__ = ("recorder",)

    def __init__(self) -> None:
        self.recorder: Any = None


STATE = _State()
_get_ident = threading.get_ident


def _make_wrapper(info: OpInfo) -> Callable[..., Any]:
    orig = info.call
    state = STATE

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is None or rec.depth or rec.thread != _get_ident():
            return orig(*args, **kwargs)
        return rec.run(info, args, kwargs)

    wrapper.__name__ = getattr(orig, "__name__", info.name)
    wrapper.__qualname__ = wrapper.__name__
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper._torchlens_wrapper = True  # type: ignore[attr-defined]
    return wrapper


def _make_alias(orig: Callable[..., Any]) -> Callable[..., Any]:
    state = STATE

    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        rec = state.recorder
        if rec is not None and not rec.depth and rec.thread == _get_ident():
            rec.alias(self, out)
        return out

    alias.__name__ = getattr(orig, "__name__", "alias")
    alias.__qualname__ = alias.__name__
    alias.__doc__ = getattr(orig, "__doc__", None)
    alias.__wrapped__ = orig  # type: ignore[attr-defined]
    alias._torchlens_wrapper = True  # type: ignore[attr-defined]
    return alias


def _make_share(orig: Callable[..., Any]) -> Callable[..., Any]:
    state = STATE

    def share(self: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is None or rec.depth or rec.thread != _get_ident():
            return orig(self, dst, *args, **kwargs)
        rec.before_share(dst)
        out = orig(self, dst, *args, **kwargs)
        rec.shared(self, dst)
        return out

    share.__name__ = getattr(orig, "__name__", "share")
    share.__qualname__ = share.__name__
    share.__doc__ = getattr(orig, "__doc__", None)
    share.__wrapped__ = orig  # type: ignore[attr-defined]
    share._torchlens_wrapper = True  # type: ignore[attr-defined]
    return share


def _make_decider(orig: Callable[..., Any], attr: str) -> Callable[..., Any]:
    state = STATE
    how, exact = DECIDING[attr]

    def decider(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is None or rec.depth or rec.thread != _get_ident():
            return orig(self, *args, **kwargs)
        return rec.decide(orig, how, exact, self, args, kwargs)

    decider.__name__ = getattr(orig, "__name__", "decider")
    decider.__qualname__ = decider.__name__
    decider.__doc__ = getattr(orig, "__doc__", None)
    decider.__wrapped__ = orig  # type: ignore[attr-defined]
    decider._torchlens_wrapper = True  # type: ignore[attr-defined]
    return decider


# -- the patch table ---------------------------------------------------------------------

Site = tuple[Any, str, Any, Callable[..., Any]]  # (owner, attribute, original, replacement)

_WRAPPERS: dict[int, tuple[Any, Callable[..., Any]]] = {}  # id(original C op) -> (original, wrapper)
_SITES: list[Site] = []  # every place to patch, found so far
_SCANNED: dict[str, Any] = {}  # loaded paddle modules already searched for aliases: name -> module
_SCANNED_COUNT = [0]  # len(sys.modules) at the last search

# Paddle modules not searched for aliases: the C extension modules the ops come from, and
# modules used only to build static graphs (their code never runs in dynamic-graph mode).
_STATIC_ONLY = (
    "paddle._pir_ops",
    "paddle.pir",
    "paddle.static",
    "paddle.jit",
    "paddle.decomposition",
    "paddle.incubate.autograd",
    "paddle.base.libpaddle",
)


def _op_modules() -> list[Any]:
    """The modules of C ops: ``paddle._C_ops``, and ``paddle._legacy_C_ops`` (still used, e.g. by
    ``BatchNorm(act=...)`` for its activation)."""
    return [paddle._C_ops, paddle._legacy_C_ops]


def _prepare() -> None:
    """Build the wrappers and the fixed sites once (cached for the process)."""
    if _WRAPPERS:
        return
    for module in _op_modules():
        for name in dir(module):
            if name.startswith("_"):
                continue
            fn = getattr(module, name)
            if not callable(fn) or getattr(fn, "_torchlens_wrapper", False):
                continue
            entry = _WRAPPERS.get(id(fn))
            if entry is None:
                entry = _WRAPPERS[id(fn)] = (fn, _make_wrapper(_c_op_info(fn)))
            _SITES.append((module, name, fn, entry[1]))
    tensor = paddle.Tensor
    for attr, name in TENSOR_DUNDERS.items():
        orig = tensor.__dict__.get(attr)
        if orig is not None:
            writes: tuple[int | str, ...] = (0,) if name == "setitem" else ()
            _SITES.append((tensor, attr, orig, _make_wrapper(OpInfo(name, orig, writes))))
    for attr, (name, writes) in TENSOR_METHODS.items():
        orig = tensor.__dict__.get(attr)
        if orig is not None:
            _SITES.append((tensor, attr, orig, _make_wrapper(OpInfo(name, orig, writes))))
    for attr in DECIDING:
        orig = tensor.__dict__.get(attr)
        if orig is not None:
            _SITES.append((tensor, attr, orig, _make_decider(orig, attr)))
    for attr in ALIASING:
        orig = tensor.__dict__.get(attr)
        if orig is not None:
            _SITES.append((tensor, attr, orig, _make_alias(orig)))
    for attr in SHARING:
        orig = tensor.__dict__.get(attr)
        if orig is not None:
            _SITES.append((tensor, attr, orig, _make_share(orig)))
    cls, orig, guard = _static_function_guard()
    _SITES.append((cls, "__call__", orig, guard))
    _SITES.extend(_amp_guard_sites())


def _alias_sites(module: Any) -> list[Site]:
    """The attributes of ``module`` holding one of the original C ops."""
    found = []
    wrappers = _WRAPPERS
    for key, value in list(getattr(module, "__dict__", {}).items()):
        entry = wrappers.get(id(value))
        if entry is not None and entry[0] is value:
            found.append((module, key, value, entry[1]))
    return found


Table = tuple[Any, dict[str, tuple[Any, Callable[..., Any]]]]  # (owner, {attribute: (original, replacement)})


class _Prepared:
    """One owner's table with what installing it needs worked out once: the attribute names, the
    originals in the same order, and the two dicts ``install``/``restore`` swap in whole; for the
    modules of C ops, the module class that looks them up as their wrappers (:func:`_looking_up`)."""

    __slots__ = ("owner", "table", "keys", "originals", "saved", "replacements", "looking_up")

    def __init__(self, owner: Any, table: dict[str, tuple[Any, Callable[..., Any]]]) -> None:
        self.owner = owner
        self.table = table
        self.keys = tuple(table)
        self.originals = tuple(entry[0] for entry in table.values())
        self.saved = {attr: entry[0] for attr, entry in table.items()}  # never mutated: restore only reads it
        self.replacements = {attr: entry[1] for attr, entry in table.items()}
        is_op_module = type(owner) is ModuleType and any(owner is m for m in _op_modules())
        self.looking_up = _looking_up(table) if is_op_module else None


def _looking_up(table: dict[str, tuple[Any, Callable[..., Any]]]) -> type:
    """A module class whose attribute lookup gives a C op's wrapper where the module holds that original op.

    ``paddle._C_ops`` and ``paddle._legacy_C_ops`` hold ~2,100 C ops. Swapping each entry of their
    namespaces in and out costs ~0.4 ms a capture, most of it cache misses once the model has run;
    setting the module's ``__class__`` to this subclass of ModuleType (allowed for modules) and back
    costs nothing, and each lookup during the capture ~0.15 us more. An entry someone else replaced
    is left alone, at every lookup.
    """
    get = ModuleType.__getattribute__
    find = table.get

    def __getattribute__(self: Any, name: str) -> Any:
        value = get(self, name)
        entry = find(name)
        return entry[1] if entry is not None and entry[0] is value else value

    return type("module", (ModuleType,), {"__getattribute__": __getattribute__, "__slots__": ()})


_TABLES: list[_Prepared] = []
_TABLES_FOR = [-1]  # len(_SITES) the tables were built from


def _group(sites: list[Site]) -> list[Table]:
    by_owner: dict[int, Table] = {}
    for owner, attr, orig, replacement in sites:
        by_owner.setdefault(id(owner), (owner, {}))[1][attr] = (orig, replacement)
    return list(by_owner.values())


def _paddle_tables() -> list[_Prepared]:
    """:func:`_paddle_sites`, grouped by owner (rebuilt only when new sites were found)."""
    sites = _paddle_sites()
    if _TABLES_FOR[0] != len(sites):
        _TABLES[:] = [_Prepared(owner, table) for owner, table in _group(sites)]
        _TABLES_FOR[0] = len(sites)
    return _TABLES


def _paddle_sites() -> list[Site]:
    """Every site in Paddle: the C op modules, Tensor, and aliases in the loaded paddle modules."""
    _prepare()
    if len(sys.modules) != _SCANNED_COUNT[0]:  # new modules since the last search
        op_modules = _op_modules()
        for name, module in list(sys.modules.items()):
            if (
                module is None
                or not name.startswith("paddle")
                or _SCANNED.get(name) is module
                or name.startswith(_STATIC_ONLY)
                or any(module is m for m in op_modules)
            ):
                continue
            _SCANNED[name] = module
            if str(getattr(module, "__file__", None) or "").endswith(".py"):
                _SITES.extend(_alias_sites(module))
        _SCANNED_COUNT[0] = len(sys.modules)
    return _SITES


def to_static_enabled(fn: Any) -> bool:
    """Does this ``paddle.jit.to_static`` function run as a compiled program (not as its Python)?"""
    translator = getattr(fn, "_program_trans", None)
    return bool(getattr(translator, "enable_to_static", True)) and not getattr(fn, "_property", False)


def _static_function_guard() -> tuple[Any, Any, Callable[..., Any]]:
    """``StaticFunction.__call__`` and a replacement refusing compiled calls during a capture.

    A ``to_static`` function called inside the forward would run as a compiled
    program (or, under SOT, re-run the Python symbolically): neither shows its
    ops one by one. With ``paddle.jit.enable_to_static(False)`` it runs its
    Python eagerly and is recorded like any other code.
    """
    from paddle.jit.dy2static.program_translator import StaticFunction

    from torchlens_core.ir.errors import UnsupportedError

    orig = StaticFunction.__dict__["__call__"]
    state = STATE

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is not None and rec.thread == _get_ident() and not rec.depth and to_static_enabled(self):
            name = getattr(getattr(self, "dygraph_function", None), "__qualname__", "a function")
            raise UnsupportedError(
                f"the forward called {name}, converted with paddle.jit.to_static: it runs as a compiled program "
                "whose ops cannot be seen one by one. Trace without to_static, or call "
                "paddle.jit.enable_to_static(False) so that it runs as plain Python."
            )
        return orig(self, *args, **kwargs)

    __call__._torchlens_wrapper = True  # type: ignore[attr-defined]
    return StaticFunction, orig, __call__


def amp_casting() -> bool:
    """Is ``paddle.amp.auto_cast`` in effect now? On CPU it never is: Paddle enables it only on CUDA, XPU and
    custom places, and otherwise warns that it "makes no effect"."""
    from paddle.base import core, framework

    tracer = framework._dygraph_tracer()
    return tracer is not None and tracer._amp_level != core.AmpLevel.O0


def amp_refusal(where: str) -> Exception:
    from torchlens_core.ir.errors import UnsupportedError

    return UnsupportedError(
        f"paddle.amp.auto_cast is in effect {where}: Paddle casts inside each C op (to float16 or bfloat16, by its "
        f"own op lists), which a trace does not record, so replay and audit() would compute in float32. Trace "
        f"without auto_cast, or cast the inputs and the model (paddle.amp.decorate(level='O2'), layer.to(dtype=...))"
        f" so that every op's dtype is in the recorded arguments"
    )


def _amp_guard_sites() -> list[Site]:
    """``amp_guard`` (what ``paddle.amp.auto_cast`` enters) replaced by one refusing a cast that takes effect
    inside a captured forward."""
    import contextlib

    module = sys.modules.get("paddle.amp.auto_cast")
    orig = getattr(module, "amp_guard", None) if module is not None else None
    if orig is None:  # another Paddle: no guard to watch
        return []
    state = STATE

    @contextlib.contextmanager
    def amp_guard(*args: Any, **kwargs: Any) -> Any:
        with orig(*args, **kwargs):
            rec = state.recorder
            if rec is not None and rec.thread == _get_ident() and not rec.depth and amp_casting():
                raise rec.remember(amp_refusal("inside the traced forward"))  # _capture raises it, also if caught
            yield

    amp_guard._torchlens_wrapper = True  # type: ignore[attr-defined]
    owners = [module, sys.modules.get("paddle.amp")]
    return [
        (owner, "amp_guard", orig, amp_guard)
        for owner in owners
        if owner is not None and vars(owner).get("amp_guard") is orig
    ]


class Patches:
    """Every replaced attribute, to put back with :meth:`restore`.

    The modules of C ops get a class whose lookups give the wrappers
    (:func:`_looking_up`); other module namespaces are plain dicts, their
    entries swapped with one ``dict.update`` each way.
    """

    def __init__(self) -> None:
        # (owner, {attribute: original}), or (module, None) for a module whose class was swapped
        self.saved: list[tuple[Any, dict[str, Any] | None]] = []

    def install(self, extra_modules: Sequence[Any] = ()) -> None:
        """Replace the C ops in ``paddle._C_ops`` and their aliases, and the Tensor methods.

        ``extra_modules`` (the modules defining the traced model) are searched
        for aliases too, so that ``from paddle.tensor import matmul`` there is seen.
        """
        tables = _paddle_tables()
        extra = [site for module in dict.fromkeys(extra_modules) for site in _alias_sites(module)]
        for prepared in (*tables, *(_Prepared(owner, table) for owner, table in _group(extra))):
            owner, namespace = prepared.owner, prepared.owner.__dict__
            if prepared.looking_up is not None and type(owner) is ModuleType:
                self.saved.append((owner, None))  # first: an interrupt between the two still restores it
                owner.__class__ = prepared.looking_up
                continue
            # Only what still holds the original is replaced: anything changed since is left alone. The
            # sites all hold theirs in the usual case, checked in one pass at C speed (identity, not ==).
            if all(map(is_, map(namespace.get, prepared.keys), prepared.originals)):
                originals, replacements = prepared.saved, prepared.replacements
            else:
                current = {attr: entry for attr, entry in prepared.table.items() if namespace.get(attr) is entry[0]}
                if not current:
                    continue
                originals = {attr: entry[0] for attr, entry in current.items()}
                replacements = {attr: entry[1] for attr, entry in current.items()}
            self.saved.append((owner, originals))
            if isinstance(owner, type):
                for attr, replacement in replacements.items():
                    setattr(owner, attr, replacement)
            else:
                namespace.update(replacements)

    def restore(self) -> None:
        """Put every original back (in reverse order), even if some fail."""
        errors = []
        saved, self.saved = self.saved, []
        for owner, originals in reversed(saved):
            try:
                if originals is None:  # a module of C ops given a looking-up class
                    owner.__class__ = ModuleType
                elif isinstance(owner, type):
                    for attr, orig in originals.items():
                        setattr(owner, attr, orig)
                else:
                    owner.__dict__.update(originals)
            except Exception as exc:  # noqa: BLE001 - keep restoring the others
                errors.append(exc)
        if errors:
            raise errors[0]
