"""The recorder every backend's capture builds on: what recording an op means, written once.

A backend intercepts calls its own way (a function mode, an op callback,
wrappers on a class, a jaxpr walk) and describes its arrays; everything else
a capture does with what it intercepts is the same in every framework and
lives here, in :class:`Recorder`:

- **which values are which ops'**: ``producers`` maps each recorded array
  (by ``id``, with a weakref against a reused id) to the :class:`Ref` later
  ops read it by; :meth:`call_template` turns a call's arguments into Refs,
  ParamRefs and copies of arrays from outside the trace, listing the ops and
  parameters they read;
- **recording**: :meth:`record` adds the op, hands it to ``intervene=``'s
  editor, and makes what the forward gets back the op's value;
- **saved values are the values that ran**: before a write, :meth:`protect`
  copies every recorded value living in the written memory, keeps a
  parameter's value from before the forward, and marks where conversions of
  that memory stop meaning what the recorded ops computed;
- **module passes**: :meth:`enter_pass` / :meth:`exit_pass` (for frameworks
  that call hooks around a module) or :meth:`module_pass` (for wrappers that
  run the module themselves), with splices, edits of what a module returns,
  and pass-through ops for arrays a module returned without computing them
  (written once in :class:`~torchlens_core.capture.passes.ModulePasses`, the
  base this class shares with captures that find values otherwise than by
  ``id``, such as JAX's jaxpr walk);
- **the rest**: the thread a capture records and the depth of its own work
  (:meth:`recording`, :meth:`paused`), the first error a recorded call raised
  (which the model may swallow; :meth:`remember`, :meth:`raise_remembered`),
  conversions into Python values reported once (:meth:`report`), and the
  tripwire for values written in place after they were recorded without a
  copy (:meth:`check_versions`).

What a backend says about its arrays, by overriding (each documented below):
``array_types`` (or :meth:`is_array`), :meth:`describe`, :meth:`copy`, and
where it has them :meth:`memory` and :meth:`version`. Optional hooks:
:meth:`constant`, :meth:`settle`, :meth:`adopt`, :meth:`recorded`,
:meth:`own_work`, and :attr:`copied_types` (argument types copied into
templates). docs/writing-a-backend.md builds a backend on it from zero.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Hashable, Iterator
from threading import get_ident
from typing import Any

from torchlens_core.capture.builder import TraceBuilder
from torchlens_core.capture.edits import PassThroughs
from torchlens_core.capture.passes import ModulePasses, Pass
from torchlens_core.ir import tree
from torchlens_core.ir.records import OpRecord, ParamRef, Ref, raw_out

_PLAIN = frozenset({int, float, bool, str, type(None), complex, bytes, slice, type(Ellipsis)})

Path = tuple[Any, ...]

# name -> the ParamRef every template shares (several threads may add one each: equal, and frozen)
_PARAM_REFS: dict[str, ParamRef] = {}
_MAX_PARAM_REFS = 1 << 16


class Recorder(ModulePasses):
    """One capture's bookkeeping over a :class:`TraceBuilder`; subclass it once per backend.

    Args:
        builder: the capture's TraceBuilder (its options: save=, halt=, intervene=...).
        param_names: ``id(array) -> name`` of the model's parameters and buffers, declared on the builder.
    """

    #: The backend's array classes: what is recorded, templated and protected.
    array_types: tuple[type, ...] = ()
    #: Other argument types a template holds a ``.copy()`` of, not the object itself: host arrays (NumPy's)
    #: an op reads, which the model may change in place after the call.
    copied_types: tuple[type, ...] = ()

    def __init__(self, builder: TraceBuilder, param_names: dict[int, str] | None = None) -> None:
        self.builder = builder
        self.param_names: dict[int, str] = param_names if param_names is not None else {}
        self.thread = get_ident()  # the one thread this capture records
        self.depth = 0  # > 0 while a recorded call, or the recorder's own work, runs: nothing inside is an op
        # id(array) -> (weakref to it, the Ref later ops read it by). The Ref is made once and shared.
        self.producers: dict[int, tuple[weakref.ref[Any], Ref]] = {}
        self.pass_throughs = PassThroughs(self.producers, builder.ops)
        self.failure: BaseException | None = None  # the first error a recorded call raised
        # memory key -> recorded (op index, path) living there, for copy-before-write. Entries name
        # ops, not arrays: a value save= drops is then really freed (op.out is None: skipped).
        self.memories: dict[Hashable, list[tuple[int, Path]]] = {}
        self.snapshots: set[tuple[int, Path]] = set()  # values already replaced by copies before a write
        self.pre_edits: dict[Hashable, list[int]] = {}  # memory key -> ops whose op.pre_edit lives there
        self.params_before_write: dict[str, Any] = {}  # a parameter's value before the forward's first write
        self.written_at: dict[Hashable, int] = {}  # memory key -> number of ops recorded when it was last written
        self.reported: set[tuple[Any, ...]] = set()  # conversions reported: (op index, path, how)
        self.versions: list[tuple[int, Path, int, Any]] = []  # (op, path, id(array), version): the tripwire
        # The last call_template's (args, kwargs, parents, params, len(kwargs)), until record() takes it
        self.templated: tuple[Any, ...] | None = None
        # a module's returned arrays are looked up inline (as_output), unless a subclass finds them its own way
        cls = type(self)
        self._own_lookup = cls.producer is Recorder.producer and cls.computed_in is ModulePasses.computed_in

    # -- what a backend says about its arrays (override) -----------------------------------
    def is_array(self, value: Any) -> bool:
        """Is ``value`` one of the backend's arrays? (``isinstance`` of :attr:`array_types`.)"""
        return isinstance(value, self.array_types)

    def describe(self, value: Any) -> tuple[tuple[int, ...], str, str]:
        """``(shape, dtype name, device name)`` of one array, as the op records them."""
        raise NotImplementedError(f"{type(self).__name__} must say how to describe an array (Recorder.describe)")

    def copy(self, value: Any) -> Any:
        """A copy of the array that no later write reaches, made without recording an op."""
        raise NotImplementedError(f"{type(self).__name__} must say how to copy an array (Recorder.copy)")

    def memory(self, value: Any) -> Hashable | None:
        """A key of the memory ``value`` lives in, equal for every view of it; None: not known (never
        written in place, or the framework has no views)."""
        return None

    def version(self, value: Any) -> Any:
        """The framework's count of in-place writes into ``value`` (torch's ``_version``); None: none kept."""
        return None

    def constant(self, value: Any) -> Any:
        """The template of an array from outside the trace (read by a recorded op): its value as it is now."""
        return self.copy(value)

    def settle(self) -> None:
        """Make every recorded value exist now (a lazy framework computes pending values); called before
        an edit reads module outputs. Default: values exist as soon as they are recorded."""

    def adopt(self, op: OpRecord, value: Any) -> None:
        """``value``, made by ``intervene=``, is from now on what later ops read as ``op``'s (lazy frameworks
        compute it here)."""

    def recorded(self, op: OpRecord, value: Any) -> None:
        """Called with each op just recorded (pass-through ops too) and the value the forward gets: for what a
        backend adds per op (gradient hooks, say)."""

    @contextlib.contextmanager
    def own_work(self) -> Iterator[None]:
        """Framework calls made inside are the recorder's own, not the model's ops (default: :meth:`paused`)."""
        with self.paused():
            yield

    # -- the thread, and the recorder's own work --------------------------------------------
    def recording(self) -> bool:
        """Is a call made now one of the model's ops: on the capture's thread, outside any recorded call?"""
        return not self.depth and self.thread == get_ident()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Calls made inside belong to the call (or work) running now: none is recorded."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def remember(self, exc: BaseException) -> BaseException:
        """Keep the first error a recorded call raised, for :meth:`raise_remembered`; returns ``exc``."""
        if self.failure is None:
            self.failure = exc
        return exc

    def raise_remembered(self) -> None:
        """After the forward: a recorded call raised and the model caught it and went on. The trace misses that
        call, so the capture fails with that error."""
        if self.failure is not None:
            raise self.failure

    # -- which values are which ops' -------------------------------------------------------------
    def producer(self, value: Any) -> Ref | None:
        """The Ref later ops read ``value`` by, or None if no recorded op made it."""
        found = self.producers.get(id(value))
        return found[1] if found is not None and found[0]() is value else None

    def as_output(self, value: Any, inside: Pass | None) -> tuple[Ref, Any]:
        """:meth:`ModulePasses.as_output`, with :meth:`producer` and :meth:`computed_in` inline: it runs for
        every array a module call returns."""
        if not self._own_lookup:
            return super().as_output(value, inside)
        found = self.producers.get(id(value))
        if found is not None and found[0]() is value:
            ref = found[1]
            if inside is None or inside in self.builder.ops[ref.index].module_passes:
                return ref, None
            return self.pass_through(value, ref)
        return self.pass_through(value, None)

    def produced(self, value: Any, ref: Ref, alias: bool = False) -> None:
        """``value`` is op ``ref.index``'s value at ``ref.path`` from now on.

        ``alias``: ``value`` is not itself in ``op.out`` (an array an op wrote that
        returned another object): read as that op's, but not its version's record.
        """
        self.producers[id(value)] = (weakref.ref(value), ref)
        if not self.builder.ops[ref.index].saved:  # dropped by save= already: nothing to protect
            return
        key = self.memory(value)
        if key is not None:
            self.memories.setdefault(key, []).append((ref.index, ref.path))
        if not alias:
            version = self.version(value)
            if version is not None:
                self.versions.append((ref.index, ref.path, id(value), version))

    def template(self, x: Any, parents: list[int], params: list[str]) -> Any:
        """``x`` with recorded arrays as their Refs (their ops appended to ``parents``), parameters as ParamRefs
        (appended to ``params``), other arrays as :meth:`constant`, containers rebuilt, plain data as is."""
        t = type(x)
        if t is tuple or t is list:  # a call's arguments: most are recorded arrays, parameters and numbers
            if not x:
                return x
            producers, param_names = self.producers, self.param_names
            items = []
            for v in x:  # handled here without a call each
                if type(v) in _PLAIN:
                    items.append(v)
                    continue
                found = producers.get(id(v))
                if found is not None and found[0]() is v:
                    ref = found[1]
                    parents.append(ref.index)
                    items.append(ref)
                    continue
                name = param_names.get(id(v))
                if name is not None and self.is_array(v):
                    params.append(name)
                    items.append(_PARAM_REFS.get(name) or self._param_ref(name))
                else:
                    items.append(self.template(v, parents, params))
            return t(items)
        if t is dict:  # (its values templated as one tuple: in order, without a call each)
            return dict(zip(x, self.template(tuple(x.values()), parents, params))) if x else {}
        if t in _PLAIN:
            return x
        # A parameter written in place during the forward is, from then on, the output
        # of the op that wrote it: producers are looked up first.
        found = self.producers.get(id(x))
        if found is not None and found[0]() is x:
            ref = found[1]
            parents.append(ref.index)
            return ref
        if not self.is_array(x):
            return x.copy() if t in self.copied_types else x
        name = self.param_names.get(id(x))
        if name is not None:
            params.append(name)
            return self._param_ref(name)
        if self.pass_throughs.unedited:
            self.pass_throughs.check_read(x)
        return self.constant(x)

    def call_template(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], tuple[int, ...], tuple[str, ...]]:
        """The :meth:`template` of a call: its arguments and keyword arguments, and the ops and parameters they
        read, each once, in order (what :meth:`record` takes).

        Handed to :meth:`record` as they are, the schema's check that the
        arguments read exactly the ops and parameters listed is left out
        when the capture finishes: they were made that way here.
        """
        parents: list[int] = []
        params: list[str] = []
        a = self.template(args, parents, params)
        k = self.template(kwargs, parents, params) if kwargs else {}
        # each once (most ops read one or two values: unique() is left out for those)
        n = len(parents)
        p = tuple(parents) if n < 2 or (n == 2 and parents[0] != parents[1]) else unique(parents)
        q = (params[0],) if len(params) == 1 else unique(params) if params else ()
        self.templated = (a, k, p, q, len(k))
        return a, k, p, q

    def _param_ref(self, name: str) -> ParamRef:
        """The ParamRef of parameter ``name``: one object, shared by every op that reads it (it is frozen), in
        this capture and the next ones."""
        ref = _PARAM_REFS.get(name)
        if ref is None:
            if len(_PARAM_REFS) >= _MAX_PARAM_REFS:  # (names made at run time: stay bounded)
                _PARAM_REFS.clear()
            ref = _PARAM_REFS[name] = ParamRef(name)
        return ref

    # -- recording -------------------------------------------------------------------------------
    def record(
        self,
        func_name: str,
        call: Any,
        args: Any,
        kwargs: Any,
        parents: list[int] | tuple[int, ...],
        params: list[str] | tuple[str, ...],
        out: Any,
        *,
        written: tuple[Any, ...] = (),
        shape: Any = None,
        dtype: Any = None,
        device: Any = None,
        random: bool = False,
        code_context: tuple[Any, ...] = (),
        meta: dict[str, Any] | None = None,
        elapsed: float | None = None,
        conditions: tuple[int, ...] = (),
        **fields: Any,
    ) -> Any:
        """Record one call that returned ``out``; returns what the forward gets (``out``, or its edit).

        ``args``/``kwargs``: the call's :meth:`template` (taken before it ran); ``out``: one array, or a
        tuple/list holding arrays (other items are kept as they are); ``written``: the arrays the call wrote
        into (already :meth:`protect`-ed), each from now on this op's value (the first array of ``out``
        living in its memory, or ``out`` itself). ``shape``/``dtype``/``device``: given, or described from
        ``out``. ``random``, ``code_context``, ``meta``, ``elapsed``, ``conditions`` and other ``fields`` go to
        :meth:`TraceBuilder.add_op` (named here: most ops give them, and a dict of them an op costs time).
        """
        single = self.is_array(out)
        if shape is None:
            if single:
                shape, dtype, device = self.describe(out)
            else:
                arrays = [v for v in out if self.is_array(v)]
                shape = tuple(self.describe(v)[0] if self.is_array(v) else None for v in out)
                _, dtype, device = self.describe(arrays[0])
        builder = self.builder
        made, templated = self.templated, False
        if made is not None:  # call_template's, unchanged since: they read what they list (op_problem's reads)
            self.templated = None
            a, k, p, q, size = made
            templated = a is args and k is kwargs and p is parents and q is params and size == len(kwargs)
        if templated:  # (each once already)
            parent_indices, names = p, q
        else:
            parent_indices, names = unique(parents), unique(params) if params else ()
        op = builder.add_op(
            func_name,
            call,
            args,
            kwargs,
            parent_indices,
            out,
            shape=shape,
            dtype=dtype,
            device=device,
            params=names,
            in_place=bool(written),
            random=random,
            code_context=code_context,
            meta=meta,
            elapsed=elapsed,
            conditions=conditions,
            **fields,
        )
        if templated:
            builder.templated_reads.add(op.index)
        if builder.edited_values:  # intervene=: an edit of an in-place op is written into `out` itself
            seen = builder.seen_value(op, out)
            if seen is not out:
                out = seen
                single = self.is_array(out)
                self.adopt(op, out)
                self.keep_pre_edit(op)
        if single:
            self.produced(out, Ref(op.index))
        else:
            for i, v in enumerate(out):
                if self.is_array(v):
                    self.produced(v, Ref(op.index, (i,)))
        for target in written:  # the written array is, from now on, this op's value
            if target is not out:
                path = () if single else self._living_in(out, target)
                if path is not None:
                    self.produced(target, Ref(op.index, path), alias=True)
        self.recorded(op, out)
        return out

    def _living_in(self, out: Any, target: Any) -> Path | None:
        """The path of ``out``'s array that is ``target`` or lives in its memory (batch norm's running
        statistics, written by an op of several outputs), or None."""
        key = self.memory(target)
        for i, v in enumerate(out):
            if v is target or (key is not None and self.is_array(v) and self.memory(v) == key):
                return (i,)
        return None

    # -- saved values are the values that ran ---------------------------------------------------
    def protect(self, target: Any) -> None:
        """``target`` is about to be written: copy every recorded value living in its memory first.

        A parameter or buffer written for the first time keeps its value from
        before the forward in its ParamRecord, which is what replay starts
        from. A conversion of that memory read later is no longer what the
        recorded ops computed (``written_at``).
        """
        name = self.param_names.get(id(target))
        if name is not None and name not in self.params_before_write:
            with self.own_work():
                self.params_before_write[name] = self.builder.params[name].value = self.copy(target)
        key = self.memory(target)
        if key is None:
            return
        self.written_at[key] = len(self.builder.ops)
        if self.pre_edits:
            self._protect_pre_edits(key)
        entries = self.memories.pop(key, None)
        if entries:
            self.copy_recorded(entries)

    def copy_recorded(self, entries: list[tuple[int, Path]]) -> None:
        """Replace each recorded value at ``(op index, path)`` by a copy (once; values save= dropped skipped)."""
        ops, snapshots = self.builder.ops, self.snapshots
        with self.own_work():
            for index, path in entries:
                op = ops[index]
                # (save_to= wrote the value out when it was recorded: a later write cannot reach that copy)
                if op.stored is not None or op.out is None or (index, path) in snapshots:
                    continue
                op.out = _replaced(op.out, path, self.copy(tree.get(op.out, path)))
                snapshots.add((index, path))

    def unalias(self, values: list[Any]) -> None:
        """After the forward: copy recorded values sharing memory with arrays the user keeps (inputs,
        parameters), which the user may change in place after the capture (an optimizer step, a reused
        input buffer): the trace keeps the values that ran."""
        for v in values:
            key = self.memory(v)
            entries = self.memories.pop(key, None) if key is not None else None
            if entries:
                self.copy_recorded(entries)

    def written_since(self, value: Any, index: int) -> bool:
        """Was ``value``'s memory written after op ``index`` was recorded? (Then a conversion of it reads
        something no recorded op computed.)"""
        if not self.written_at:
            return False
        key = self.memory(value)
        written = self.written_at.get(key) if key is not None else None
        return written is not None and written > index

    def keep_pre_edit(self, op: OpRecord) -> None:
        """Note where ``op.pre_edit`` lives, so that a later write there (through a view the model kept of
        the edited op's memory) copies it first."""
        if op.stored is not None or op.pre_edit is None:  # (save_to=: already written out)
            return
        for _, v in tree.leaves(op.pre_edit, self.is_array):
            key = self.memory(v)
            if key is not None:
                self.pre_edits.setdefault(key, []).append(op.index)

    def _protect_pre_edits(self, key: Hashable) -> None:
        for index in self.pre_edits.pop(key, ()):
            op = self.builder.ops[index]
            if op.stored is None and op.pre_edit is not None:
                with self.own_work():
                    op.pre_edit = tree.map_leaves(
                        lambda v: self.copy(v) if self.is_array(v) and self.memory(v) == key else v, op.pre_edit
                    )

    def check_versions(self) -> None:
        """After the forward: flag each saved value written in place after it was recorded without a copy
        (``op.meta["mutated_after_recording"]``, which audit() reports)."""
        ops, snapshots, version_of = self.builder.ops, self.snapshots, self.version
        for index, path, array_id, version in self.versions:
            op = ops[index]
            if op.stored is not None:  # written out by save_to= when it was recorded
                continue
            value = raw_out(op)  # (the slot: nothing lies on disk)
            if value is None or (snapshots and (index, path) in snapshots):  # dropped by save=, or copied before
                continue
            if path:
                value = tree.get(value, path)
            if id(value) != array_id:  # intervene= replaced it by a new array, registered on its own
                continue
            if version_of(value) != version:
                op.meta["mutated_after_recording"] = True

    # -- conversions into Python values ---------------------------------------------------------
    def report(self, index: int, path: Path, how: str, result: Any) -> None:
        """The forward turned op ``index``'s value at ``path`` into ``result`` by ``how``: told to the builder
        once (a value converts alike each time), for replay on new inputs to check."""
        key = (index, path, how)
        if key not in self.reported:
            self.reported.add(key)
            self.builder.to_python(index, path, how, result)

    # -- module passes (the steps are ModulePasses'; these say what a returned leaf is here) -------
    def pass_source(self, value: Any, ref: Ref | None) -> tuple[Any, Any]:
        """A returned array no op of the pass computed: its op's Ref, else its ParamRef or a constant."""
        source = ref if ref is not None else self.template(value, [], [])
        self.adopt_value(value)
        return source, value

    def passed(self, value: Any, op: OpRecord, seen: Any) -> Any:
        """Later reads of the array read pass-through op ``op`` (or what ``intervene=`` made of it)."""
        if seen is value:  # one object with what the caller may hold: later reads of it read the op
            self.pass_throughs.take(value, op.index)
        else:
            self.adopt(op, seen)
            self.keep_pre_edit(op)
        self.produced(seen, Ref(op.index))
        self.recorded(op, seen)
        return None if seen is value else seen

    def relink(self, value: Any, ref: Ref, edited: Any) -> Any:
        """A new array from a module site's edit: later ops read it as ``ref``'s value; the array the module
        returned is given back to its own producer, or unlinked (:class:`PassThroughs`)."""
        if edited is value:
            return value
        op = self.builder.ops[ref.index]
        self.adopt(op, edited)
        self.produced(edited, ref)
        self.keep_pre_edit(op)
        self.pass_throughs.replaced(value, ref.index)
        return edited

    def adopt_value(self, value: Any) -> None:
        """``value``, returned by a module and not computed by a recorded op, is about to be recorded as a
        pass-through op's value (lazy frameworks compute it here)."""


def unique(items: list[Any] | tuple[Any, ...]) -> tuple[Any, ...]:
    """``items`` in order, each once (most ops read one or two values: skip the dict for those)."""
    if len(items) < 2 or (len(items) == 2 and items[0] != items[1]):
        return tuple(items)  # (a tuple itself)
    return tuple(dict.fromkeys(items))


def _replaced(value: Any, path: Path, new: Any) -> Any:
    """``value`` with its leaf at ``path`` replaced by ``new``."""
    if not path:
        return new
    kids = tree.children(value)
    assert kids is not None
    return tree.rebuild(value, [_replaced(v, path[1:], new) if k == path[0] else v for k, v in kids])
