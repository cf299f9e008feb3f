"""What the fields of a record may hold: one schema, checked where a record is made and where a file is read.

``TraceBuilder`` checks every op, parameter and module a backend hands it
(``add_op``, ``add_input``, ``add_param``, ``add_module``) and ``tl.load``
checks what it read from a file with the same functions, so a record the
builder takes is one ``tl.save`` writes and ``tl.load`` reads back: a list
where a tuple goes, a NumPy integer where an ``int`` goes, or a dtype object
where its name goes would be written by the save (as a list, an array, a
framework value) and refused by the load.

Each check returns None, or what is wrong as a phrase; the caller wraps it
in its own error (:class:`CaptureError` naming the backend and op at
capture, :class:`TraceFileError` naming the record at load). The checks run
once per op during capture, so they look at types and ranges only (about a
microsecond an op), never at array values.
"""

from __future__ import annotations

import math
from typing import Any

from torchlens_core.ir import tree
from torchlens_core.ir.records import CodeLocation, OpRecord, ParamRecord, ParamRef, Ref, raw_dtype, raw_param_dtype

MAX_DIM = 1 << 62  # no real axis is longer; bigger numbers only make NumPy and the tables overflow
MAX_AXES = 64
MAX_NESTING = 8  # outputs inside outputs, for an op's shape
MAX_ELEMENTS = 1 << 56  # elements of one op's output(s): times 16 bytes still fits an int64
MAX_LINE = 1 << 31
MAX_WALK = 1 << 20  # values in one op's arguments
_SCALARS = frozenset({int, float, complex, bool, str, bytes, type(None)})
_NOT_FOUND = object()
_INF = math.inf
# Types of argument values that hold no others (arrays, dtypes, functions): tree.children gives a value none by
# its type alone, so the check of an op's reads asks it once a type. Strong references, bounded (classes made at
# run time) and cleared whole when full.
_LEAVES: set[type] = set()
_MAX_LEAVES = 1024

SHAPE_FORM = (
    "None (no array), a tuple of ints for one array (``(2, 3)``), or for several outputs a tuple with "
    "one entry per output, each one of these (``((2, 3), (2,))``)"
)

# trace.notes key: the first record of the trace that tl.load would refuse (kept from a backend written for
# plugin contract 1, which TraceBuilder only warns), or absent. tl.save refuses a trace that has it.
UNSAVEABLE = "unsaveable"


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def _sizes(shape: tuple[Any, ...]) -> bool:
    """Is the tuple ``shape`` one array's sizes? (A loop, not all() over a generator: it runs for every op.)"""
    if len(shape) > MAX_AXES:
        return False
    for d in shape:
        if type(d) is not int or d < 0 or d >= MAX_DIM:
            return False
    return True


def sizes_problem(shape: Any) -> str | None:
    """What is wrong with ``shape`` as one array's shape (a tuple of ``int`` sizes), or None."""
    if type(shape) is tuple and _sizes(shape):
        return None
    return f"a shape should be a tuple of int sizes (such as (2, 3)), not {_show(shape)}"


def shape_problem(shape: Any) -> str | None:
    """What is wrong with ``shape`` as an op's shape (see :data:`SHAPE_FORM`), or None."""
    if shape is None:
        return None
    if type(shape) is tuple and _sizes(shape) and math.prod(shape) <= MAX_ELEMENTS:  # one array, as most ops
        return None
    try:
        elements = _elements(shape, 0)
    except ValueError:
        return f"shape should be {SHAPE_FORM}; found {_show(shape)}"
    if elements > MAX_ELEMENTS:
        return f"shape {_show(shape)} has more elements than any array"
    return None


def _elements(s: Any, depth: int) -> int:
    """The elements an op's shape (or one output's entry in it) describes; ValueError if it is malformed."""
    if s is None and depth:
        return 0
    if type(s) is tuple:
        for d in s:  # (loops, not generators: ops of several outputs check one entry each)
            if type(d) is not int:
                break
        else:
            if not _sizes(s):
                raise ValueError
            return math.prod(s)
        if depth < MAX_NESTING:
            total = 0
            for x in s:
                total += _elements(x, depth + 1)
            return total
    raise ValueError


def op_problem(
    op: OpRecord,
    params: dict[str, ParamRecord],
    sound_sites: dict[int, Any] | None = None,
    reads: bool = True,
) -> str | None:
    """What is wrong with the fields of ``op`` (``params``: the trace's parameters by name), or None.

    Checks what ``tl.save`` writes as given and ``tl.load`` reads back only in
    its plain form: the shape, names and flags, positions of earlier ops, the
    call's containers, and that the call's arguments read exactly the ops and
    parameters the record lists. ``sound_sites``: ``id -> CodeLocation`` of
    call sites checked already (and of tuples of them), added to as this op's
    pass (a capture's ops share the same few objects; tuples stay sound).
    ``reads=False`` leaves out the last check, for arguments the core's
    recorder templated itself, which list their ops and parameters as they
    are made (:meth:`~torchlens_core.capture.recorder.Recorder.call_template`).
    """
    # Straight-line, with locals and the common cases first: this runs for every op of a capture.
    shape, name, index = op.shape, op.func_name, op.index
    if not (shape is None or (type(shape) is tuple and _sizes(shape) and math.prod(shape) <= MAX_ELEMENTS)):
        problem = shape_problem(shape)  # several outputs' shapes, or what is wrong
        if problem is not None:
            return problem
    if not isinstance(name, str) or not name:
        return f"func_name should be a non-empty str, not {_show(name)}"
    dtype, device = raw_dtype(op), op.device  # (the slot: the property would make a DType of the str)
    if not (dtype is None or isinstance(dtype, str)) or not (device is None or isinstance(device, str)):
        return (
            f"dtype and device should be None or the names as str (such as 'float32', 'cpu'), not "
            f"{_show(dtype)} and {_show(device)}"
        )
    if type(op.in_place) is not bool:
        return f"in_place should be a bool, not {_show(op.in_place)}"
    parents, conditions = op.parent_indices, op.condition_indices
    if type(parents) is not tuple:
        return _positions_problem("parent_indices", parents, index)
    for i in parents:
        if type(i) is not int or i < 0 or i >= index:
            return _positions_problem("parent_indices", parents, index)
    if type(conditions) is not tuple or conditions:  # (most ops are under no branch taken on a traced value)
        problem = _positions_problem("conditions", conditions, index)
        if problem is not None:
            return problem
    names = op.params
    if type(names) is not tuple:
        return f"params should be a tuple of names of parameters declared with add_param, not {_show(names)}"
    for param in names:
        if not (isinstance(param, str) and param in params):
            return f"params should name parameters declared with add_param; {_show(param)} names none"
    elapsed = op.elapsed
    if not (elapsed is None or (type(elapsed) is float or type(elapsed) is int) and 0 <= elapsed < _INF):
        return f"elapsed should be None or a finite float of seconds, at least 0, not {_show(elapsed)}"
    context = op.code_context
    if not isinstance(context, (tuple, list)):  # (a list saves and loads as well: never refused)
        return f"code_context should be a tuple of CodeLocation entries, not {_show(context)}"
    sound = {} if sound_sites is None else sound_sites
    # ops share call-site tuples (the ops of a framework's layer call, PassSites.stack): each is passed once
    for c in () if sound.get(id(context), _NOT_FOUND) is context else context:
        if sound.get(id(c), _NOT_FOUND) is c:  # (the object itself, held there: its id is not reused)
            continue
        if not (
            isinstance(c, CodeLocation)
            and isinstance(c.file, str)
            and type(c.line_number) is int
            and 0 <= c.line_number < MAX_LINE
            and isinstance(c.func_name, str)
        ):
            return f"code_context should hold CodeLocation(file: str, line_number: int, func_name: str), not {_show(c)}"
        sound[id(c)] = c
    if type(context) is tuple:  # (a list may change: passed each time)
        sound[id(context)] = context
    args, kwargs, meta = op.args, op.kwargs, op.meta
    if not isinstance(args, tuple):
        return f"args should be a tuple, not {_show(args)}"
    if type(kwargs) is not dict or kwargs:  # (many are empty)
        problem = _keys_problem("kwargs", kwargs)
        if problem is not None:
            return problem
    if type(meta) is not dict or meta:
        problem = _keys_problem("meta", meta)
        if problem is not None:
            return problem
    return _reads_problem(args, kwargs, index, parents, names) if reads else None


def _keys_problem(what: str, d: Any) -> str | None:
    """What is wrong with ``d`` as field ``what``: a dict with str keys (a subclass too)."""
    if isinstance(d, dict):
        for k in d:
            if not isinstance(k, str):
                break
        else:
            return None
    return f"{what} should be a dict with str keys, not {_show(d)}"


def _positions_problem(what: str, positions: Any, below: int) -> str | None:
    """What is wrong with ``positions`` as field ``what``: a tuple of the int positions of ops before ``below``."""
    if type(positions) is tuple and all(type(i) is int and 0 <= i < below for i in positions):
        return None
    return f"{what} should be a tuple of int positions of earlier ops (below {below}), not {_show(positions)}"


def _reads_problem(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    index: int,
    parent_indices: tuple[int, ...],
    names: tuple[str, ...],
) -> str | None:
    """Do the Refs and ParamRefs in an op's ``args`` and ``kwargs`` name exactly its ``parent_indices`` (each
    before ``index``, its own position) and parameter ``names``?

    The walk is :func:`tree.leaves`' (the one ``tl.load`` makes with ``refs_in``), inlined with the common
    exact types first: it runs once per op during capture.
    """
    parents: set[int] = set()
    read: set[str] = set()
    pending: list[Any] = [args, kwargs.values()] if kwargs else [args]  # containers still to walk
    budget = MAX_WALK  # a container holding itself would otherwise be walked forever
    while pending:
        for x in pending.pop():
            t = type(x)
            if t is Ref:
                at, path = x.index, x.path
                if type(at) is not int or not 0 <= at < index:
                    return f"its arguments refer to op {_show(at)}, which does not run before it"
                if path and not (type(path) is tuple and all(type(k) in (int, str) for k in path)):
                    return f"a Ref's path should be a tuple of int positions and str keys, not {_show(path)}"
                parents.add(at)
            elif t is ParamRef:
                if not isinstance(x.name, str):
                    return f"a ParamRef should name a parameter by str, not {_show(x.name)}"
                read.add(x.name)
            elif t not in _SCALARS and t not in _LEAVES:
                budget -= 1
                if not budget:
                    return f"its arguments hold more than {MAX_WALK} containers, or a container that holds itself"
                if t is tuple or t is list:
                    pending.append(x)
                elif t is dict:
                    pending.append(x.values())
                else:
                    kids = tree.children(x)  # namedtuples, dict subclasses, dataclasses
                    if kids:
                        pending.append([v for _, v in kids])
                    elif kids is None and x.__class__ is t:  # a leaf (a constant array): so is every value of
                        # its type (unless it passes for another class, as a proxy may, which isinstance believes)
                        if len(_LEAVES) >= _MAX_LEAVES:
                            _LEAVES.clear()
                        _LEAVES.add(t)
    if parents != set(parent_indices):
        return (
            f"its arguments read ops {sorted(parents)}, but parent_indices lists {sorted(set(parent_indices))}:"
            " pass the index of every op whose output (a Ref) is in the arguments, and no other"
        )
    if read != set(names):
        return (
            f"its arguments read parameters {sorted(read)}, but params lists {sorted(set(names))}: pass "
            "the name of every parameter (a ParamRef) in the arguments, and no other"
        )
    return None


def param_problem(record: ParamRecord) -> str | None:
    """What is wrong with the fields of a parameter's record, or None."""
    if not isinstance(record.name, str) or not record.name:
        return f"name should be a non-empty str, not {_show(record.name)}"
    shape = record.shape
    if not (type(shape) is tuple and _sizes(shape)):
        return sizes_problem(shape)
    dtype = raw_param_dtype(record)  # (the slot: the property would make a DType of the str)
    if not isinstance(dtype, str) or not isinstance(record.module, str):
        return (
            f"dtype and module should be str (such as 'float32', 'encoder.layer1'), not {_show(dtype)} "
            f"and {_show(record.module)}"
        )
    if type(record.numel) is not int or not 0 <= record.numel < MAX_DIM:
        return f"numel should be an int count, not {_show(record.numel)}"
    if type(record.trainable) is not bool or type(record.is_buffer) is not bool:
        return f"trainable and is_buffer should be bools, not {_show(record.trainable)} and {_show(record.is_buffer)}"
    return None


def module_problem(path: Any, type_name: Any, names: Any, params: dict[str, ParamRecord] | None) -> str | None:
    """What is wrong with a module's path, type name and parameter names, or None.

    ``params`` is None where the module is declared before its parameters
    (the builder), and the trace's parameters where they are all known (a file).
    """
    if not isinstance(path, str) or not isinstance(type_name, str):
        return f"path and type_name should be str, not {_show(path)} and {_show(type_name)}"
    if not isinstance(names, list) or (
        names and not all(isinstance(n, str) and (params is None or n in params) for n in names)
    ):
        return f"params should be a list of the names of parameters below it, not {_show(names)}"
    return None
