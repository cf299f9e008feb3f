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
from torchlens_core.ir.records import CodeLocation, OpRecord, ParamRecord, ParamRef, Ref, raw_dtype

MAX_DIM = 1 << 62  # no real axis is longer; bigger numbers only make NumPy and the tables overflow
MAX_AXES = 64
MAX_NESTING = 8  # outputs inside outputs, for an op's shape
MAX_ELEMENTS = 1 << 56  # elements of one op's output(s): times 16 bytes still fits an int64
MAX_LINE = 1 << 31
MAX_WALK = 1 << 20  # values in one op's arguments
_SCALARS = frozenset({int, float, complex, bool, str, bytes, type(None)})

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
        if all(type(d) is int for d in s):
            if not _sizes(s):
                raise ValueError
            return math.prod(s)
        if depth < MAX_NESTING:
            return sum(_elements(x, depth + 1) for x in s)
    raise ValueError


def op_problem(
    op: OpRecord, params: dict[str, ParamRecord], sound_sites: dict[int, CodeLocation] | None = None
) -> str | None:
    """What is wrong with the fields of ``op`` (``params``: the trace's parameters by name), or None.

    Checks what ``tl.save`` writes as given and ``tl.load`` reads back only in
    its plain form: the shape, names and flags, positions of earlier ops, the
    call's containers, and that the call's arguments read exactly the ops and
    parameters the record lists. ``sound_sites``: ``id -> CodeLocation`` of
    call sites checked already, added to as this op's pass (a capture's ops
    share the same few objects; a CodeLocation is a tuple, so it stays sound).
    """
    problem = shape_problem(op.shape)
    if problem is not None:
        return problem
    if not isinstance(op.func_name, str) or not op.func_name:
        return f"func_name should be a non-empty str, not {_show(op.func_name)}"
    dtype, device = raw_dtype(op), op.device  # (the slot: the property would make a DType of the str)
    if not (dtype is None or isinstance(dtype, str)) or not (device is None or isinstance(device, str)):
        return (
            f"dtype and device should be None or the names as str (such as 'float32', 'cpu'), not "
            f"{_show(dtype)} and {_show(device)}"
        )
    if type(op.in_place) is not bool:
        return f"in_place should be a bool, not {_show(op.in_place)}"
    # Loops, not all() over generators, and the common cases first: this runs for every op of a capture.
    for what, positions in (("parent_indices", op.parent_indices), ("conditions", op.condition_indices)):
        if not _positions(positions, op.index):
            return (
                f"{what} should be a tuple of int positions of earlier ops (below {op.index}), not {_show(positions)}"
            )
    if type(op.params) is not tuple:
        return f"params should be a tuple of names of parameters declared with add_param, not {_show(op.params)}"
    for name in op.params:
        if not (isinstance(name, str) and name in params):
            return f"params should name parameters declared with add_param; {_show(name)} names none"
    elapsed = op.elapsed
    if not (elapsed is None or type(elapsed) in (int, float) and 0 <= elapsed < math.inf):
        return f"elapsed should be None or a finite float of seconds, at least 0, not {_show(elapsed)}"
    if not isinstance(op.code_context, (tuple, list)):  # (a list saves and loads as well: never refused)
        return f"code_context should be a tuple of CodeLocation entries, not {_show(op.code_context)}"
    for c in op.code_context:
        if sound_sites is not None and sound_sites.get(id(c)) is c:  # (the object itself: its id is not reused)
            continue
        if not (
            isinstance(c, CodeLocation)
            and isinstance(c.file, str)
            and type(c.line_number) is int
            and 0 <= c.line_number < MAX_LINE
            and isinstance(c.func_name, str)
        ):
            return f"code_context should hold CodeLocation(file: str, line_number: int, func_name: str), not {_show(c)}"
        if sound_sites is not None:
            sound_sites[id(c)] = c
    if not isinstance(op.args, tuple):
        return f"args should be a tuple, not {_show(op.args)}"
    for what, d in (("kwargs", op.kwargs), ("meta", op.meta)):
        if not isinstance(d, dict):
            return f"{what} should be a dict with str keys, not {_show(d)}"
        for k in d:
            if not isinstance(k, str):
                return f"{what} should be a dict with str keys, not {_show(d)}"
    return _reads_problem(op)


def _positions(positions: Any, below: int) -> bool:
    if type(positions) is not tuple:
        return False
    for i in positions:
        if type(i) is not int or i < 0 or i >= below:
            return False
    return True


def _reads_problem(op: OpRecord) -> str | None:
    """Do the call's Refs and ParamRefs name exactly the record's parents and parameters?

    The walk is :func:`tree.leaves`' (the one ``tl.load`` makes with ``refs_in``), inlined with the common
    exact types first: it runs once per op during capture.
    """
    parents: set[int] = set()
    read: set[str] = set()
    stack: list[Any] = [*op.args, *op.kwargs.values()]
    budget = MAX_WALK  # a container holding itself would otherwise be walked forever
    while stack:
        x = stack.pop()
        t = type(x)
        if t in _SCALARS:
            continue
        if t is Ref:
            if type(x.index) is not int or not 0 <= x.index < op.index:
                return f"its arguments refer to op {_show(x.index)}, which does not run before it"
            if x.path and not (type(x.path) is tuple and all(type(k) in (int, str) for k in x.path)):
                return f"a Ref's path should be a tuple of int positions and str keys, not {_show(x.path)}"
            parents.add(x.index)
            continue
        if t is ParamRef:
            if not isinstance(x.name, str):
                return f"a ParamRef should name a parameter by str, not {_show(x.name)}"
            read.add(x.name)
            continue
        budget -= 1
        if not budget:
            return f"its arguments hold more than {MAX_WALK} containers, or a container that holds itself"
        if t is tuple or t is list:
            stack.extend(x)
        elif t is dict:
            stack.extend(x.values())
        else:
            kids = tree.children(x)  # namedtuples, dict subclasses, dataclasses
            if kids:
                stack.extend(v for _, v in kids)
    if parents != set(op.parent_indices):
        return (
            f"its arguments read ops {sorted(parents)}, but parent_indices lists {sorted(set(op.parent_indices))}:"
            " pass the index of every op whose output (a Ref) is in the arguments, and no other"
        )
    if read != set(op.params):
        return (
            f"its arguments read parameters {sorted(read)}, but params lists {sorted(set(op.params))}: pass "
            "the name of every parameter (a ParamRef) in the arguments, and no other"
        )
    return None


def param_problem(record: ParamRecord) -> str | None:
    """What is wrong with the fields of a parameter's record, or None."""
    if not isinstance(record.name, str) or not record.name:
        return f"name should be a non-empty str, not {_show(record.name)}"
    problem = sizes_problem(record.shape)
    if problem is not None:
        return problem
    if not isinstance(record.dtype, str) or not isinstance(record.module, str):
        return (
            f"dtype and module should be str (such as 'float32', 'encoder.layer1'), not {_show(record.dtype)} "
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
    if not (isinstance(names, list) and all(isinstance(n, str) and (params is None or n in params) for n in names)):
        return f"params should be a list of the names of parameters below it, not {_show(names)}"
    return None
