"""TraceBuilder: the framework-neutral half of capture.

A backend's capture calls ``add_input``, ``add_op``, ``enter_module`` /
``exit_module`` and ``add_outputs`` as the model runs, then ``finish()``, which
checks every op against the schema, names it (labels, passes, parents,
children) and returns the Trace. Everything here is cheap per op; checking and
naming happen once at the end, unless records are read as the forward runs.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from torchlens_core.capture.edits import Editor
from torchlens_core.capture.policy import CaptureOptions, Policy
from torchlens_core.ir import tree
from torchlens_core.ir.errors import CaptureError, PluginContractWarning
from torchlens_core.ir.progress import Progress
from torchlens_core.ir.records import (
    GRAD_NOT_SELECTED,
    GRAD_WAITING,
    CodeLocation,
    DType,
    ModulePass,
    ModuleRecord,
    OpRecord,
    ParamRecord,
    ParamRef,
    Ref,
    new_op,
    raw_dtype,
    refs_in,
    shape_at,
)
from torchlens_core.ir.schema import UNSAVEABLE, module_problem, op_problem, param_problem
from torchlens_core.ir.trace import Trace

_WARNED: set[str] = set()  # backends already warned about a record the schema refuses
# (parameter names in declaration order, the modules declared without their lists) -> each one's list, for the
# last few models captured (TraceBuilder._list_params)
_PARAM_LISTS: dict[tuple[tuple[str, ...], frozenset[str]], dict[str, tuple[str, ...]]] = {}
_MAX_PARAM_LISTS = 8


def _param_lists(names: tuple[str, ...], paths: set[str]) -> dict[str, tuple[str, ...]]:
    """Module path -> the parameter ``names`` below it (dotted prefixes), in order, for each of ``paths``.

    A name is appended to the lists of the modules above its owner, found once per owner (from its parent's):
    linear in the names and modules, whatever their depth.
    """
    lists: dict[str, list[str]] = {path: [] for path in paths}
    above_of: dict[str, list[list[str]]] = {"": []}  # dotted path -> the lists of the given modules above it
    for name in names:
        owner = name.rpartition(".")[0]
        above = above_of.get(owner)
        if above is None:
            missing = [owner]  # the owner and its ancestors not yet seen, innermost first
            parent = owner.rpartition(".")[0]
            while parent not in above_of:
                missing.append(parent)
                parent = parent.rpartition(".")[0]
            above = above_of[parent]
            for path in reversed(missing):
                if path in lists:
                    above = [*above, lists[path]]
                above_of[path] = above
        for found in above:
            found.append(name)
    return {path: tuple(found) for path, found in lists.items()}


class TraceBuilder:
    def __init__(self, backend: str, model_name: str = "", options: CaptureOptions | None = None) -> None:
        self.backend = backend
        self.model_name = model_name
        self.options = options or CaptureOptions()
        self.policy = Policy(self.options, self)
        self.namer = LayerNamer()
        self.ops: list[OpRecord] = []
        self.modules: dict[str, ModuleRecord] = {}
        self.params: dict[str, ParamRecord] = {}
        # The stack of (module path, pass) the next op runs inside. A tuple, so
        # that every op recorded in the same context shares one object.
        self.module_stack: tuple[tuple[str, int], ...] = ()
        self.closed_passes: set[tuple[str, int]] = set()
        self.notes: dict[str, Any] = {}
        # intervene=: edits as ops are recorded; what the model must see instead, by op index
        self.editor = Editor(self.options.intervene, self) if self.options.intervene else None
        self.edited_values: dict[int, Any] = {}
        self._output_template: Any = None
        self._model_output: Any = None
        # save_to=: values are written out as soon as save= has decided on them; these ops still wait
        self.stream = self.options.stream
        # a bar for captures that run longer than a few seconds (torchlens_core/ir/progress.py); silent otherwise
        self.progress = Progress("tl.trace", unit="op")
        self._unwritten: list[OpRecord] = []
        # Records are named and checked against the schema at the end, in one loop over the ops each, unless
        # something reads them while the forward runs: intervene=, save=/halt= and a save_grads= selector pick
        # ops by label, and save_to= writes records out as it goes. Neither needs anything the forward has, and a
        # loop run once the forward is over costs less than the same work between its kernels
        # (docs/performance.md, "What the per-op cost consists of").
        self.live_records = bool(
            self.editor is not None
            or self.policy.active
            or self.stream is not None
            or not isinstance(self.options.save_grads, bool)
            or _names_as_added(backend)
        )
        self._named = 0  # ops[:_named] have their labels
        self._checked = 0  # ops[:_checked] are checked against the schema
        self._sound_sites: dict[int, Any] = {}  # call sites (and tuples of them) the schema check passed (op_problem)
        # ops whose arguments the core's recorder templated itself (Recorder.call_template): the check that they
        # read exactly the ops and parameters listed is left out for them, as they are made that way
        self.templated_reads: set[int] = set()
        self._unlisted: set[str] = set()  # modules declared without their parameters: listed at the end
        if self.stream is not None:
            self.stream.begin(backend)

    # -- declared once, before the forward -------------------------------------------
    def add_module(self, path: str, type_name: str, params: list[str] | None = None) -> None:
        """Declare module ``path`` (dotted, ``"encoder.layer1"``) of class ``type_name``.

        ``params``: the names of every parameter and buffer below it. Left out, the builder lists them when the
        capture finishes: every declared parameter whose name starts with ``path + "."``, in declaration order
        (the names every backend gives, so no backend works the lists out itself).
        """
        problem = module_problem(path, type_name, [] if params is None else params, None)
        if problem is not None:
            self._refuse(
                f"the {self.backend} backend declared module {path!r} with {problem} "
                "(TraceBuilder.add_module(path: str, type_name: str, params: list[str] | None))"
            )
        self.modules[path] = ModuleRecord(path=path, type_name=type_name, params=[] if params is None else params)
        if params is None:
            self._unlisted.add(path)
        else:  # declared again, with its list this time
            self._unlisted.discard(path)

    def add_param(self, record: ParamRecord) -> None:
        problem = param_problem(record)
        if problem is not None:
            self._refuse(
                f"the {self.backend} backend declared parameter {record.name!r} with a record tl.load "
                f"would refuse: {problem}"
            )
        self.params[record.name] = record

    # -- while the forward runs ------------------------------------------------------
    def add_input(self, value: Any, shape: Any = None, dtype: Any = None, device: Any = None) -> OpRecord:
        op = OpRecord(
            index=len(self.ops), kind="input", func_name="input", out=value, shape=shape, dtype=dtype, device=device
        )
        if self.live_records:
            self._check(op)
            self.ops.append(op)
            self.name_ops()
        else:
            self.ops.append(op)
        return op

    def add_op(
        self,
        func_name: str,
        call: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        parent_indices: tuple[int, ...],
        out: Any,
        *,
        shape: Any = None,
        dtype: Any = None,
        device: Any = None,
        params: tuple[str, ...] = (),
        random: bool = False,
        in_place: bool = False,
        code_context: tuple[Any, ...] = (),
        layer_key: Any = None,
        meta: dict[str, Any] | None = None,
        elapsed: float | None = None,
        conditions: tuple[int, ...] = (),
    ) -> OpRecord:
        """Record one call; the fields are checked against :mod:`torchlens_core.ir.schema` (CaptureError if off)
        when the capture finishes, or here where records are read as the forward runs (``live_records``).

        ``args``/``kwargs``: a tuple and a dict with str keys, every recorded array replaced by its
        :class:`Ref` and every parameter by its :class:`ParamRef`; ``parent_indices`` and ``params``: the
        indices and names those name, no others. ``shape``: None, a tuple of ints for one array, or for
        several outputs a tuple with one such entry per output (``((2, 3), (2,))``, never a list, never
        NumPy integers). ``dtype``/``device``: names as str. ``in_place``: a bool. ``elapsed``: a float
        of seconds. ``code_context``: :class:`CodeLocation` entries. ``meta``: a dict with str keys.
        """
        source = None
        if not parent_indices:
            source = "random" if random else "parameter" if params else "constant"
        if type(dtype) is DType:  # (as OpRecord's dtype property keeps it: the plain str)
            dtype = str.__str__(dtype)
        op = new_op(
            len(self.ops),
            "op",
            func_name,
            call,
            args,
            kwargs,
            out,
            shape,
            dtype,
            device,
            self.module_stack,
            params,
            source,
            in_place,
            code_context,
            layer_key,
            parent_indices,
            meta if meta is not None else {},
            elapsed,
            conditions,
        )
        if self.live_records:
            self._check(op)
            self.ops.append(op)
            self.name_ops()
        else:
            self.ops.append(op)
        if op.index >= self.progress.due:  # (the bar counts the ops itself only now and then)
            self.progress.reached(op.index + 1)
        if self.editor is not None:
            edited = self.editor.edit_op(op, out)
            if edited is not out:
                self.edited_values[op.index] = edited
        if self.policy.active:
            self.policy.recorded(op)  # may drop op.out, or raise HaltCapture
        if self.stream is not None:
            self._write_out(op)
        return op

    def _write_out(self, op: OpRecord | None = None) -> None:
        """save_to=: write the values save= has decided to keep (``op``: just recorded; None: any waiting)."""
        policy = self.policy
        if op is not None:
            if self._unwritten and policy.lookback:  # held lookback windows move on as ops arrive
                self._write_out()
            if op.index in policy.held or (policy.pending and policy.pending[-1] is op):
                self._unwritten.append(op)
            elif op.saved:
                self.stream.store(op)
            return
        waiting = {id(p) for p in policy.pending}
        still = []
        for earlier in self._unwritten:
            if earlier.index in policy.held or id(earlier) in waiting:
                still.append(earlier)
            elif earlier.saved:
                self.stream.store(earlier)
        self._unwritten = still

    def name_ops(self) -> None:
        """Give every op recorded so far that has none its label (in index order: a label depends on the
        parents' labels)."""
        ops, name = self.ops, self.namer.name
        for i in range(self._named, len(ops)):
            name(ops[i])
        self._named = len(ops)

    def _list_params(self) -> None:
        """Each module declared without its parameters gets every parameter and buffer below it, in declaration
        order. The lists depend on the parameters' names and the modules' paths alone, so a model captured again
        finds them worked out (:func:`_param_lists`)."""
        unlisted, modules = self._unlisted, self.modules
        if not unlisted:
            return
        key = (tuple(self.params), frozenset(unlisted))
        lists = _PARAM_LISTS.get(key)
        if lists is None:
            lists = _param_lists(key[0], unlisted)
            if len(_PARAM_LISTS) >= _MAX_PARAM_LISTS:  # many models in one process: start over (as another
                _PARAM_LISTS.clear()  # thread may, which taking the oldest out would race with)
            _PARAM_LISTS[key] = lists
        for path in unlisted:
            modules[path].params.extend(lists[path])
        self._unlisted = set()

    def check_ops(self) -> None:
        """Check every op recorded so far against the schema, if it was not checked as it was added (in one
        loop, once the forward has run: see ``live_records``)."""
        if self.live_records:
            return
        ops, check, templated = self.ops, self._check, self.templated_reads
        for i in range(self._checked, len(ops)):
            check(ops[i], i not in templated)
        self._checked = len(ops)

    def _check(self, op: OpRecord, reads: bool = True) -> None:
        """Refuse a record ``tl.load`` would refuse, naming the op, its call site, the field and what to pass
        instead (``reads``: see :func:`op_problem`)."""
        problem = op_problem(op, self.params, self._sound_sites, reads)
        if problem is not None:
            context = op.code_context  # (maybe the malformed field itself)
            first = context[0] if isinstance(context, (tuple, list)) and context else None
            site = first if isinstance(first, CodeLocation) else None
            at = f", called at {site.file}:{site.line_number}" if site is not None else ""
            self._refuse(
                f"the {self.backend} backend recorded {op.kind} {op.index} ({op.func_name!r}{at}) with a field "
                f"tl.load would refuse: {problem}. See TraceBuilder.add_op for what each field takes."
            )

    def _refuse(self, problem: str) -> None:
        """A record the schema refuses: CaptureError for a backend written for contract 2 or later. One written
        for contract 1 hears it as a PluginContractWarning (once per backend and process); its record is
        kept, and tl.save refuses the trace (:data:`UNSAVEABLE`), so that a trace that saves always loads."""
        from torchlens_core.backend.manager import contract_of  # the plugin layer: asked only on a problem

        if contract_of(self.backend) >= 2:
            raise CaptureError(problem)
        self.notes.setdefault(UNSAVEABLE, problem)
        if self.backend not in _WARNED:
            _WARNED.add(self.backend)
            warnings.warn(
                f"{problem} With contract 1 the record is kept and tl.save refuses the trace; a backend "
                f"declaring contract 2 (BackendInfo(contract=2)) gets a CaptureError, as every backend "
                f"will in the next release (CHANGELOG.md, 'For plugin authors').",
                PluginContractWarning,
                stacklevel=4,
            )

    def to_python(self, op_index: int, path: tuple[Any, ...], how: str, result: Any) -> None:
        """The forward turned op ``op_index``'s value (the leaf at ``path``) into a Python value.

        ``how`` names the conversion (``"bool"``, ``"int"``, ``"float"``,
        ``"index"``, ``"len"``, ``"item"``, ``"tolist"``: see
        :data:`torchlens_core.replay.inputs.CONVERSIONS`) and ``result`` is what
        it gave. The graph has that value baked in (as a branch taken, a loop
        count, a constant), so replay on new inputs checks that the value
        converts the same (``op.meta["to_python"]``). A backend declaring the
        ``new_inputs`` capability reports every such conversion.
        """
        op = self.ops[op_index]
        small = _small_python(result)
        op.meta.setdefault("to_python", []).append((path, how, result if small else None))

    def grad_wanted(self, op: OpRecord) -> bool:
        """Does ``save_grads=`` want this op's gradient? Ask after :meth:`add_op`, to hook the backward.

        Input nodes are always wanted when gradients are: the gradient at the
        inputs is what a user checks first. A selector that cannot judge the
        op yet says yes here; :meth:`finish` settles it on the finished trace.
        """
        wanted = self.options.save_grads
        if isinstance(wanted, bool) or op.kind == "input":
            return wanted is not False
        return wanted.decide(op, self) is not False

    def seen_value(self, op: OpRecord, out: Any) -> Any:
        """What later ops see of ``op``, just recorded with ``out``: ``out``, or what intervene= made of it.

        A backend that honours ``intervene=`` hands this to the model instead
        of ``out`` (for an op that wrote in place, the edit is already
        written into ``out``, which is returned).
        """
        return self.edited_values.pop(op.index, out) if self.edited_values else out

    def splice_for(self, path: str) -> Any:
        """The callable that replaces this call of module ``path`` (``tl.splice_module``), or None.

        Ask after :meth:`enter_module`, before running the module; when one
        comes back, call it with the module call's arguments instead of the
        module's forward (its ops are recorded inside the module's pass).
        """
        if self.editor is None:
            return None
        passes = [n for p, n in self.module_stack if p == path]
        if not passes:
            raise CaptureError(f"ask splice_for({path!r}) inside the module's call, after enter_module")
        splice = self.editor.splice_for(path, passes[-1])
        if splice is None:
            return None
        self.notes.setdefault("spliced", {})[f"{path}:{passes[-1]}"] = repr(splice)  # what replaced the call
        return splice.replacement

    def edit_module_output(self, path: str, out_template: Any, value: Any) -> tuple[Any, Any]:
        """What the innermost call of ``path`` returns to the model after intervene=, and its template.

        Call it just before :meth:`exit_module`, with the template of Refs
        to the returned arrays and the returned value itself; hand the model
        the value that comes back and pass the template that comes back to
        ``exit_module`` (an edited leaf may be the output of a new op).
        """
        if self.editor is None:
            return value, out_template
        passes = [n for p, n in self.module_stack if p == path]
        if not passes:
            raise CaptureError(f"module {path!r} finished without having started")
        return self.editor.edit_module_output(path, passes[-1], out_template, value)

    def enter_module(self, path: str, inputs: Any = None) -> int:
        """Open a new pass of module ``path``; returns its pass number.

        ``inputs``, optional: ``(args, kwargs)`` of the call with every recorded
        array as its Ref and parameters as ParamRefs, other leaves plain data
        (numbers, strings, None). It lets the conformance suite run the module
        alone on what it received, where the framework has no module hooks.
        """
        module = self.modules[path]
        n = len(module.passes) + 1
        module.passes.append(ModulePass(path=path, pass_num=n, in_template=inputs))
        self.module_stack = (*self.module_stack, (path, n))
        return n

    def exit_module(self, path: str, out_template: Any) -> None:
        """Close the innermost pass of ``path``; ``out_template`` holds Refs to what it returned."""
        stack = self.module_stack
        while stack and stack[-1][0] != path:  # a module that raised never closed its pass
            stack = stack[:-1]
        if not stack:
            raise CaptureError(f"module {path!r} finished without having started")
        closed = stack[-1]
        n = closed[1]
        self.modules[path].passes[n - 1].out_template = out_template
        for ref in (out_template,) if type(out_template) is Ref else refs_in(out_template):
            self.ops[ref.index].module_outputs.append(f"{path}:{n}")
        self.module_stack = stack[:-1]
        self.closed_passes.add(closed)
        if self.policy.active:
            try:
                self.policy.closed(path, n)  # may settle pending saves, or raise HaltCapture
            finally:
                if self._unwritten:
                    self._write_out()

    def identity_op(
        self, source: Any, value: Any, *, shape: Any = None, dtype: Any = None, device: Any = None
    ) -> OpRecord:
        """An explicit pass-through op returning ``value``.

        For a module (or model) that returns something it did not compute:
        ``source`` is the Ref of an earlier op's output, a ParamRef, or the
        constant itself. Replay passes ``source`` straight through.
        """
        parents: tuple[int, ...] = ()
        if isinstance(source, Ref):
            src = self.ops[source.index]
            shape, dtype, device = shape_at(src.shape, source.path), raw_dtype(src), src.device
            parents = (source.index,)
        params = (source.name,) if isinstance(source, ParamRef) else ()
        return self.add_op(
            "identity",
            None,
            (source,),
            {},
            parents,
            value,
            shape=shape,
            dtype=dtype,
            device=device,
            params=params,
            meta={"identity": True},
        )

    def add_outputs(self, template: Any, model_output: Any) -> None:
        """One output node per Ref leaf of the model's output, keeping its structure.

        ``template`` is ``model_output`` with every recorded array replaced by
        its Ref. Output nodes hold the returned values themselves: a value
        changed in place after its op ran is returned as it was at the end.
        """
        self.check_ops()  # before the output nodes read the shapes of the ops they return
        self._model_output = model_output
        nodes: dict[tuple[Any, ...], Ref] = {}
        for path, leaf in tree.leaves(template, lambda x: isinstance(x, Ref)):
            src = self.ops[leaf.index]
            out = OpRecord(
                index=len(self.ops),
                kind="output",
                func_name="output",
                args=(leaf,),
                out=tree.get(model_output, path),
                shape=shape_at(src.shape, leaf.path),
                dtype=raw_dtype(src),  # (the name, not the DType the property makes)
                device=src.device,
                parent_indices=(leaf.index,),
            )
            self.ops.append(out)
            nodes[path] = Ref(out.index)
        self._output_template = _replace_at(template, nodes)
        self._checked = len(self.ops)  # output nodes are the builder's own
        if self.live_records:
            self.name_ops()

    # -- once, at the end --------------------------------------------------------------
    def finish(self, halted: bool = False) -> Trace | Recording:
        """The finished Trace; for ``tl.record``, a Recording that finishes it on demand."""
        self.progress.done = len(self.ops)
        self.progress.close()
        self.check_ops()
        if self.options.record:
            return Recording(self, halted)
        return self.finish_trace(halted)

    def finish_trace(self, halted: bool = False) -> Trace:
        ops = self.ops
        self.name_ops()
        self._list_params()
        self.namer.finish()
        if halted:
            self.notes["halted"] = "the forward was stopped once every op selected by halt= had run"
        trace = Trace(  # (its constructor reads no links: they are made below)
            backend=self.backend,
            model_name=self.model_name,
            ops=ops,
            modules=self.modules,
            params=self.params,
            output_template=self._output_template,
            model_output=self._model_output,
            notes=self.notes,
            halted=halted,
        )
        ref = weakref.ref(trace)
        modules = self.modules
        # id(op.module_passes) -> the op lists of those passes: ops recorded under the same open passes share
        # one tuple (builder.module_stack), which they keep alive
        pass_lists: dict[int, list[list[str]]] = {}
        for op in ops:  # one loop: labels of parents and conditions, children, the passes' op lists, the trace
            label = op.label
            op.trace_ref = ref
            labels = op.parents = []
            for i in op.parent_indices:
                parent = ops[i]
                labels.append(parent.label)
                parent.children.append(label)
            if op.condition_indices:
                op.conditions = [ops[i].label for i in op.condition_indices]
            stack = op.module_passes
            if stack:
                lists = pass_lists.get(id(stack))
                if lists is None:
                    lists = pass_lists[id(stack)] = [modules[path].passes[n - 1].ops for path, n in stack]
                for names in lists:
                    names.append(label)
        for module in modules.values():
            for mp in module.passes:
                mp.trace_ref = ref
        if self.policy.active:
            self.policy.finish(trace)
        if self.options.save_grads is not False:
            wanted = self.options.save_grads
            for op in ops:
                if op.kind == "input" or (op.kind == "op" and (wanted is True or wanted.test(op, trace))):
                    op.grad_status = GRAD_WAITING
                elif op.kind == "op":
                    op.grad_status = GRAD_NOT_SELECTED
        if self.editor is not None:
            self.editor.check(trace)
        return trace


class Recording:
    """What ``tl.record`` returns: the raw capture, named and linked only when asked.

    ``to_trace()`` builds the full Trace (labels with passes, parents and
    children, module op lists, pending save decisions) once, on first call.
    """

    def __init__(self, builder: TraceBuilder, halted: bool) -> None:
        self._builder: TraceBuilder | None = builder
        self._halted = halted
        self._trace: Trace | None = None

    @property
    def num_ops(self) -> int:
        held = self._trace if self._trace is not None else self._builder  # to_trace() swaps one for the other
        assert held is not None
        return sum(op.kind == "op" for op in held.ops)

    def to_trace(self) -> Trace:
        if self._trace is None:
            assert self._builder is not None
            self._trace = self._builder.finish_trace(self._halted)
            self._builder = None
        return self._trace

    def __repr__(self) -> str:
        return f"<Recording of {self.num_ops} ops{' (halted)' if self._halted else ''}: .to_trace() to read it>"


def returned(
    output: Any, is_array: Callable[[Any], bool], as_output: Callable[[Any], tuple[Ref, Any]]
) -> tuple[Any, Any]:
    """Refs to what a module pass (or the model) returned, and what the forward gets back instead.

    ``as_output(array)`` gives the array's Ref and what intervene= made of it
    (None: nothing; the backend may have recorded an identity op for it, which
    an intervention can edit). An array returned twice is asked about once.
    The value handed back differs from ``output`` only where an edit was made.
    """
    made: dict[int, tuple[Ref, Any]] = {}

    def ref_of(value: Any) -> Any:
        if not is_array(value):
            return value
        found = made.get(id(value))
        if found is None:
            found = made[id(value)] = as_output(value)
        return found[0]

    template = tree.map_leaves(ref_of, output)
    if any(edited is not None for _, edited in made.values()):

        def edited_or(value: Any) -> Any:
            edited = made[id(value)][1] if is_array(value) else None
            return value if edited is None else edited

        output = tree.map_leaves(edited_or, output)
    return template, output


def _small_python(value: Any, budget: int = 4096) -> bool:
    """A plain number, bool, None or a (nested) list of them with at most ``budget`` items: kept as data."""
    if type(value) is list and len(value) < budget and set(map(type, value)) <= _NUMBERS:
        return True  # (most: a shape read, a list of ints, tested in C)
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(item, list):
            stack.extend(item)
        elif not (item is None or isinstance(item, (bool, int, float))):
            return False
    return True


_NUMBERS = frozenset({int, float, bool})


def _replace_at(template: Any, new: dict[tuple[Any, ...], Any], path: tuple[Any, ...] = ()) -> Any:
    """``template`` with the leaves at the given paths replaced."""
    if path in new:
        return new[path]
    kids = tree.children(template)
    if kids is None:
        return template
    return tree.rebuild(template, [_replace_at(v, new, (*path, k)) for k, v in kids])


def _names_as_added(backend: str) -> bool:
    """Does ``backend`` get each op's label (and schema check) at ``add_op``? Those written for a contract before 4
    do, as they were written for; :func:`forced_naming` overrides it."""
    forced = getattr(_FORCED, "as_added", None)
    if forced is not None:
        return bool(forced)
    from torchlens_core.backend.manager import contract_of  # the plugin layer, above this one

    return contract_of(backend) < 4


_FORCED = threading.local()


@contextlib.contextmanager
def forced_naming(as_added: bool) -> Iterator[None]:
    """Captures started in this thread inside the block name (and check) their ops as they are added (True) or
    when they finish (False), whatever contract their backend declares: the conformance suite's check of
    contract 4 compares the two. Something that reads labels while the forward runs (``intervene=``,
    ``save=``...) still has each op named as it is added."""
    before = getattr(_FORCED, "as_added", None)
    _FORCED.as_added = as_added
    try:
        yield
    finally:
        _FORCED.as_added = before


class LayerNamer:
    """Gives every op its layer, pass and label, in the order the ops were recorded.

    Repeated calls of one module are passes of the same layers: the k-th call
    of function f inside a pass of module m is the same layer in every pass of
    m. Outside modules, ops of one function at the same code site whose
    inputs come from the same layers are passes of one layer (a loop in the
    forward, ``for _ in range(4): x = fc(x) + 1``); an input from that very
    code site counts as the layer itself, so ``x = x * 2`` in a loop is one
    layer from its second iteration on (its first read something else). A
    backend may name the layer itself (``layer_key``), e.g. for the
    iterations of a scan. Labels read ``{func}_{per-function ordinal}_{index of
    the first pass}``, with ``:{pass}`` appended (at the end, when the number
    of passes is known) for layers of several passes.
    """

    def __init__(self) -> None:
        self.layers: dict[Any, list[OpRecord]] = {}
        self.per_pass_counts: dict[tuple[Any, ...], int] = {}
        self.func_layers: dict[str, int] = {}
        self.io_counts = {"input": 0, "output": 0}
        # op index -> (its layer label, its code site and function: how later ops outside modules see it)
        self.seen: dict[int, tuple[str, Any]] = {}

    def name(self, op: OpRecord) -> None:
        if op.kind != "op":
            self.io_counts[op.kind] += 1
            op.layer_label = op.label = f"{op.kind}_{self.io_counts[op.kind]}"
            self.seen[op.index] = (op.layer_label, None)
            return
        key = op.layer_key
        site = None
        if key is None and op.module_passes:
            inner = op.module_passes[-1]
            slot = (inner, op.func_name)
            k = self.per_pass_counts.get(slot, 0)
            self.per_pass_counts[slot] = k + 1
            key = (inner[0], op.func_name, k)
        elif key is None and op.code_context:
            site = (op.code_context[0], op.func_name)
            seen = self.seen
            key = ("", site, tuple("self" if seen[i][1] == site else seen[i][0] for i in op.parent_indices))
        elif key is None:
            key = ("", op.index)
        passes = self.layers.get(key)
        if passes is None:
            self.func_layers[op.func_name] = ordinal = self.func_layers.get(op.func_name, 0) + 1
            op.func_ordinal = ordinal
            op.layer_label = op.label = f"{op.func_name}_{ordinal}_{op.index}"
            self.layers[key] = [op]
        else:
            first = passes[0]
            op.func_ordinal, op.layer_label = first.func_ordinal, first.layer_label
            passes.append(op)
            op.pass_num = len(passes)
            op.label = f"{op.layer_label}:{op.pass_num}"
        self.seen[op.index] = (op.layer_label, site)

    def finish(self) -> None:
        for passes in self.layers.values():
            n = len(passes)
            for op in passes:
                op.num_passes = n
                op.label = f"{op.layer_label}:{op.pass_num}" if n > 1 else op.layer_label
