"""Recorded calls: named for ``tl.save`` from allow-lists, and run again by replay.

A backend's ``encode_call`` hook turns ``op.call`` into JSON data and its
``decode_call`` turns that data back into a call, from a file that may be
hostile. :class:`CallNames` does the part every framework does alike: a
function is named by an allow-listed namespace and its attribute
(``{"function": "numpy.linalg:norm"}``), never a name that touches the file
system (``refused``); an array method by its name (``{"method": "sum"}``,
the call being a :class:`MethodCall`); an operator
(``{"operator": "getitem"}``); an array returned without being computed
(``{"constant": 0}``, the call :func:`constant`); a function that answered
with a Python number (``{"python_value": <its name>}``). Anything else in a
file raises TraceFileError. A backend subclasses it for calls of its own
(NumPy's ufuncs, its global RNG's draws) and calls ``super()`` for the rest.

:func:`replay_written` runs a recorded call again as an in-place op must be:
writing into the replayed value the op wrote into, or into a private copy of
a constant, never into the trace's records.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from torchlens_core.capture.conversions import PythonValue
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TraceFileError
from torchlens_core.ir.records import OpRecord, Ref


class MethodCall:
    """``value.<name>(...)`` as a function of the value: the call a recorded method replays.

    Looked up on the value, not on the array class, because a framework's
    scalar may have the same methods.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, value: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(value, self.name)(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return type(other) is MethodCall and other.name == self.name

    def __hash__(self) -> int:
        return hash((MethodCall, self.name))

    def __repr__(self) -> str:
        return f"MethodCall({self.name!r})"


def constant(value: Any) -> Any:
    """The call of a ``constant`` op: an array the model returned that no recorded op computed (``value.copy()``)."""
    return value.copy()


class CallNames:
    """What :mod:`this module <torchlens_core.capture.calls>` describes: calls to and from JSON data.

    Args:
        namespaces: name -> module whose functions are saved as ``"name:attribute"`` (in this order).
        methods: the method names a :class:`MethodCall` may have.
        operators: name -> function (``{"getitem": operator.getitem}``).
        refused: parts of a function's name that are never loaded (file readers and writers).
        accept: which function found in a namespace may be loaded (default: any callable).
    """

    def __init__(
        self,
        namespaces: dict[str, Any],
        methods: Collection[str] = (),
        operators: dict[str, Callable[..., Any]] | None = None,
        refused: tuple[str, ...] = ("save", "load"),
        accept: Callable[[Any], bool] = callable,
    ) -> None:
        self.namespaces, self.methods, self.refused, self.accept = namespaces, frozenset(methods), refused, accept
        self.operators = operators or {}

    def encode(self, call: Any) -> Any:
        """JSON data naming ``call``, or None where it cannot be named (the trace then does not replay loaded)."""
        if isinstance(call, PythonValue):
            inner = self.encode(call.function)
            return None if inner is None else {"python_value": inner}
        if call is constant:
            return {"constant": 0}
        for name, fn in self.operators.items():
            if call is fn:
                return {"operator": name}
        if isinstance(call, MethodCall) and call.name in self.methods:
            return {"method": call.name}
        fn_name = getattr(call, "__name__", None)
        for ns, module in self.namespaces.items():
            if isinstance(fn_name, str) and getattr(module, fn_name, None) is call:
                return {"function": f"{ns}:{fn_name}"}
        return None

    def decode(self, data: Any) -> Any:
        """The call ``data`` names, found only among the allow-lists; TraceFileError for anything else."""
        if not isinstance(data, dict) or len(data) != 1:
            raise TraceFileError(f"not a call this backend saves: {data!r}")
        ((kind, value),) = data.items()
        if kind == "python_value":
            if isinstance(value, dict) and "python_value" in value:
                raise TraceFileError(f"a Python value of a Python value: {data!r}")
            return PythonValue(self.decode(value))
        if kind == "method" and value in self.methods:
            return MethodCall(value)
        if kind == "operator" and value in self.operators:
            return self.operators[value]
        if kind == "constant":
            return constant
        if kind == "function" and isinstance(value, str) and value.count(":") == 1:
            ns, name = value.split(":")
            module = self.namespaces.get(ns)
            fn = getattr(module, identifier(name), None) if module is not None else None
            if fn is not None and self.accept(fn) and not any(part in name.lower() for part in self.refused):
                return fn
        raise TraceFileError(
            f"{data!r} names nothing a trace of this backend can replay; the file was not "
            "written by tl.save or was changed"
        )


def identifier(name: Any) -> str:
    """``name`` if it is a public Python identifier (never a dunder a hostile file could reach), else TraceFileError."""
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise TraceFileError(f"{name!r} is not a public name")
    return name


def replay_written(
    op: OpRecord,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    copy: Callable[[Any], Any],
    call: Callable[..., Any] | None = None,
) -> Any:
    """Run ``op`` again (by ``call``, default ``op.call``) on its resolved arguments, as an in-place op must be.

    The argument an in-place op writes (``out=``, else the first) is the
    replayed value the op wrote into, so a write through a view reaches its
    base as it did; where it is a constant of the op, it is a private
    ``copy`` of it, so the trace keeps the constant as recorded. A call that
    returns None (``x[i] = v``, ``a.sort()``) gives what it wrote.
    """
    if op.in_place:
        if "out" in kwargs:
            kwargs = {**kwargs, "out": _copy_unless_ref(op.kwargs["out"], kwargs["out"], copy)}
        elif args:
            args = (_copy_unless_ref(op.args[0], args[0], copy), *args[1:])
    out = (call or op.call)(*args, **kwargs)
    if out is None and op.in_place:
        out = kwargs["out"] if "out" in kwargs else args[0]
    return out


def _copy_unless_ref(template: Any, value: Any, copy: Callable[[Any], Any]) -> Any:
    """``value`` with the arrays that are not recorded values (constants: no Ref in ``template``) copied."""
    if isinstance(template, Ref):
        return value
    kids = tree.children(template)
    if kids is None:
        return copy(value)
    value_kids = tree.children(value)
    assert value_kids is not None  # the arguments are the recorded template with its Refs resolved: same containers
    values = [v for _, v in value_kids]
    return tree.rebuild(value, [_copy_unless_ref(t, v, copy) for (_, t), v in zip(kids, values, strict=True)])
