"""Trace: the recorded graph of one forward, and every way to look into it."""

from __future__ import annotations

import operator
import re
from collections.abc import Iterator
from itertools import repeat
from typing import TYPE_CHECKING, Any

from torchlens_core.ir import graph_index, tree
from torchlens_core.ir.errors import ArgumentTypeError, LabelNotFoundError, closest, shown
from torchlens_core.ir.records import (
    Distances,
    EditRecord,
    ModulePass,
    ModuleRecord,
    ModuleTable,
    OpRecord,
    ParamRecord,
    ParamRef,
    ParamTable,
    Ref,
)

# Trace.draw refuses a drawing of more nodes than this unless asked (max_nodes=None): Graphviz would take
# many minutes and gigabytes of memory on it, and the picture is unreadable anyway (docs/drawing.md).
DRAW_MAX_NODES = 10_000

if TYPE_CHECKING:
    from torchlens_core.ir.graph_index import GraphIndex
    from torchlens_core.replay.audit import AuditReport


class Trace:
    """The ops of one forward pass in execution order, with modules and parameters.

    Look ops up with ``trace[key]``: a label (``"relu_1_2"``), a short label
    (``"relu_1"``), either with a pass (``"linear_1:2"``), a module path
    (``"layer3"``, ``"layer3:2"``: the module's output) or a position
    (``trace[7]``, ``trace[-1]``). Every path of ``model.named_modules()`` that
    ran is a key: for a module called several times (``layer1.0.relu`` in a
    ResNet block), the path alone is its last call, ``trace["layer1.0.relu:2"]``,
    what a forward hook on it holds once the forward is done (``path:1`` is the
    first call; ``trace.modules[path].passes`` has them all). In a label, the
    function's name may be written without its underscores (``"maxpool2d_2_6"``
    finds ``max_pool2d_2_6``) where that names one op.
    """

    def __init__(
        self,
        backend: str,
        model_name: str,
        ops: list[OpRecord],
        modules: dict[str, ModuleRecord],
        params: dict[str, ParamRecord],
        output_template: Any,
        model_output: Any = None,
        notes: dict[str, Any] | None = None,
        halted: bool = False,
    ) -> None:
        self.backend = backend
        self.model_name = model_name
        self.ops = ops
        self.modules = ModuleTable(modules)
        self.params = ParamTable(params)
        # a module's parameter count, from the records it names (buffers and names without a record count 0)
        numels = {name: 0 if p.is_buffer else p.numel for name, p in params.items()}
        for module in self.modules.values():
            module.num_params = sum(map(numels.get, module.params, repeat(0)))
        self.output_template = output_template
        # What the forward itself returned, kept apart from the output nodes so
        # that audit() can compare the two.
        self.model_output = model_output
        self.notes = notes or {}
        # True when halt= stopped the forward early: there is no output then.
        self.halted = halted
        # How tl.trace called the model (a capture.rerun.RecordedCall, or why it could not be kept), for
        # audit(untraced=True); None for loaded traces and tl.record.
        self.call: Any = None
        self._keys: dict[str, OpRecord | ModulePass] | None = None
        self._ambiguous: dict[str, list[str]] = {}
        self._keys_by_target: dict[int, list[str]] | None = None  # id(op or pass) -> its keys (keys_of)
        self._squashed: dict[str, OpRecord | ModulePass | None] | None = None  # label aliases (see _alias)
        self._op_numbers: list[int] | None = None  # by position: the op's number among ops (print(op))
        self._distances: list[Distances] | None = None
        self._graph: GraphIndex | None = None
        self._costs: dict[Any, tuple[float | None, float | None]] = {}  # FLOP counts by call (views.flops)

    # -- the graph ------------------------------------------------------------------
    @property
    def output(self) -> Any:
        """The model's output as the forward returned it."""
        return self.resolve(self.output_template)

    @property
    def input_labels(self) -> list[str]:
        return [op.label for op in self.ops if op.kind == "input"]

    @property
    def output_labels(self) -> list[str]:
        return [op.label for op in self.ops if op.kind == "output"]

    @property
    def output_layers(self) -> list[str]:
        """The labels of the output nodes (the seed's name for :attr:`output_labels`)."""
        return self.output_labels

    @property
    def num_ops(self) -> int:
        """Operations executed, not counting input and output nodes."""
        return sum(op.kind == "op" for op in self.ops)

    @property
    def num_edges(self) -> int:
        return sum(len(op.parents) for op in self.ops)

    def distances(self) -> list[Distances]:
        """Graph distances of every op, by position (also ``op.distances``); worked out once."""
        if self._distances is None:
            from torchlens_core.views.metadata import distances

            self._distances = distances(self)
        return self._distances

    def graph_index(self) -> GraphIndex:
        """Children, ancestry and descent of every op (``op.input_ancestors``, ``op.siblings``...); built once."""
        if self._graph is None:
            self._graph = graph_index.build(self)
        return self._graph

    @property
    def num_params(self) -> int:
        """Parameter count of the model, each parameter once (buffers not counted), as ``summary()`` gives it."""
        return sum(p.numel for p in self.params.values() if not p.is_buffer)

    @property
    def num_params_trainable(self) -> int:
        """The part of :attr:`num_params` that training updates (torch: ``requires_grad``)."""
        return sum(p.numel for p in self.params.values() if not p.is_buffer and p.trainable)

    @property
    def num_params_frozen(self) -> int:
        """The part of :attr:`num_params` that is not trainable."""
        return self.num_params - self.num_params_trainable

    @property
    def flops(self) -> float:
        """Forward FLOPs: the sum over ops whose FLOPs are known (see ``unknown_flops``).

        A float that prints readably: ``str(trace.flops)`` is ``"1.4 GFLOPs"``, as the summary says.
        """
        from torchlens_core.views.summary import Count

        return Count(sum(op.flops or 0.0 for op in self.ops), "FLOPs")

    @property
    def macs(self) -> float:
        """Forward multiply-accumulates, summed over ops whose count is known; prints as ``"714.2 MMACs"``."""
        from torchlens_core.views.summary import Count

        return Count(sum(op.macs or 0.0 for op in self.ops), "MACs")

    @property
    def interventions(self) -> list[EditRecord]:
        """Every edit ``intervene=`` made, in op order (``op.edits`` has those of one op)."""
        return [edit for op in self.ops for edit in op.edits]

    @property
    def unknown_flops(self) -> list[OpRecord]:
        """Ops no FLOP formula covers; register one with ``tl.register_flops``."""
        return [op for op in self.ops if op.flops is None]

    def resolve(self, template: Any) -> Any:
        """Replace the Refs and ParamRefs inside ``template`` by the recorded values."""

        def value(leaf: Any) -> Any:
            if isinstance(leaf, Ref):
                out = self.ops[leaf.index].out  # None when save= left it out: so is every part of it
                return None if out is None else tree.get(out, leaf.path)
            if isinstance(leaf, ParamRef):
                return self.params[leaf.name].value
            return leaf

        return tree.map_leaves(value, template)

    # -- lookup ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[OpRecord]:
        return iter(self.ops)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self._index() or self._alias(key) is not None)

    def __getitem__(self, key: int | str | Any) -> Any:
        """An op by label (``"relu_1_2"``, ``"linear_1:2"``) or position, a module pass by path; with a
        selector (``trace[tl.func("conv2d")]``), the list of ops it picks (a list even when one matches)."""
        if not isinstance(key, str):
            if hasattr(key, "test") and hasattr(key, "decide"):  # a selector (capture layer: not imported here)
                return self.select(key)
            return self.ops[_position(key, len(self.ops))]
        found = self._index().get(key)
        if found is not None:
            return found
        found = self._alias(key)
        if found is not None:
            return found
        if key in self._ambiguous:
            options = ", ".join(self._ambiguous[key][:6])
            raise LabelNotFoundError(f"{shown(key)} ran several times; name the pass, e.g. {options}")
        near = closest(key, self._index())
        hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
        raise LabelNotFoundError(f"no op or module {shown(key)} in this trace{hint}")

    def select(self, selector: Any) -> list[OpRecord]:
        """The ops ``selector`` picks, in order (input and output nodes are not ops); one that picks
        none is an error naming the closest labels, as with save=."""
        picked = [op for op in self.ops if op.kind == "op" and selector.test(op, self)]
        if not picked:
            from torchlens_core.capture.selectors import near_names

            raise LabelNotFoundError(f"{shown(selector, 120)} picks no op in this trace{near_names(self, selector)}")
        return picked

    def keys_of(self, op: OpRecord) -> list[str]:
        """Every string key that finds ``op`` (the aliases of :meth:`_alias` aside)."""
        if self._keys_by_target is None:  # built once: print(op) asks for every op's keys
            by_target: dict[int, list[str]] = {}
            for key, target in self._index().items():
                by_target.setdefault(id(target), []).append(key)
            self._keys_by_target = by_target
        found = self._keys_by_target.get(id(op), [])
        return [k for k in found if self._keys[k] is op]  # type: ignore[index]

    def op_number(self, op: OpRecord) -> int:
        """``op``'s number among the trace's ops (1 for the first; input and output nodes not counted)."""
        if self._op_numbers is None:  # counted once for every op: print(op) for each op stays linear
            numbers, n = [], 0
            for o in self.ops:
                n += o.kind == "op"
                numbers.append(n)
            self._op_numbers = numbers
        return self._op_numbers[op.index]

    def _index(self) -> dict[str, OpRecord | ModulePass]:
        if self._keys is not None:
            return self._keys
        keys: dict[str, OpRecord | ModulePass] = {}
        multi: dict[str, list[str]] = {}

        def add(base: str, target: OpRecord | ModulePass, pass_num: int, num_passes: int) -> None:
            with_pass = f"{base}:{pass_num}"
            keys[with_pass] = target
            if num_passes == 1:
                keys[base] = target
            else:
                multi.setdefault(base, []).append(with_pass)

        for op in self.ops:
            add(op.layer_label, op, op.pass_num, op.num_passes)
            if op.kind == "op":
                add(op.layer_label.rsplit("_", 1)[0], op, op.pass_num, op.num_passes)
        for module in self.modules.values():
            for mp in module.passes:
                outs = mp.output_ops
                single = len(outs) == 1 and isinstance(mp.out_template, Ref) and not mp.out_template.path
                add(module.path, outs[0] if single else mp, mp.pass_num, module.num_passes)
            if module.num_passes > 1:
                # The bare path of a module called several times is its last call: what a forward hook on it
                # holds after the forward, and the call whose shape summary() shows. Every path of
                # named_modules() that ran is then a key, as the docs promise.
                keys[module.path] = keys[f"{module.path}:{module.passes[-1].pass_num}"]
                multi.pop(module.path, None)
        self._ambiguous = multi
        self._keys = keys
        return keys

    def _alias(self, key: str) -> OpRecord | ModulePass | None:
        """What a label written with the function's name squashed finds (``"maxpool2d_2_6"`` for
        ``max_pool2d_2_6``, other libraries' and older releases' spelling), or None: a key that is no
        label, or one whose squashed form two labels share (then no guess is made)."""
        squashed = _squash(key)
        if squashed is None:
            return None
        if self._squashed is None:
            aliases: dict[str, OpRecord | ModulePass | None] = {}
            for k, target in self._index().items():
                if not isinstance(target, OpRecord) or k.partition(":")[0] not in (
                    target.layer_label,
                    target.layer_label.rsplit("_", 1)[0],
                ):
                    continue  # a module path: only labels have aliases
                short = _squash(k)
                if short is not None and short != k:
                    aliases[short] = target if aliases.get(short, target) is target else None
            self._squashed = aliases
        return self._squashed.get(squashed)

    def find(self, selector: Any) -> list[OpRecord]:
        """The ops a selector (``tl.func("relu") & tl.in_module("layer2")``...) matches, in order.

        Raises a KeyError naming the closest labels and module paths if none match.
        """
        from torchlens_core.capture.selectors import find

        return find(self, selector)

    def log_backward(self, loss: Any) -> Trace:
        """Go back from ``loss`` and keep the gradients ``save_grads=`` asked for (``op.grad``, ``params[n].grad``).

        ``loss`` is a function of the output (``lambda out: out.sum()``), on every
        backend, or on torch a scalar computed from the trace's own values
        (``trace.log_backward(trace.output.sum())``). Returns the trace.
        """
        from torchlens_core.grads.backward import log_backward

        return log_backward(self, loss)

    def find_sites(self, selector: Any) -> list[str]:
        """The sites an intervention with ``selector`` edits here: ``"relu_1_2:1"`` (an op), ``"layer3:1"``."""
        from torchlens_core.capture.edits import site_keys

        return site_keys(self, selector)

    def fork(self) -> Any:
        """An independent set of edits on this trace: ``trace.fork().when(selector, *helpers).replay(x)``.

        The fork shares the recorded values read-only; nothing it does changes
        this trace. See :class:`torchlens_core.steer.fork.Fork`.
        """
        from torchlens_core.steer.fork import Fork

        return Fork(self)

    def rerun(self, model: Any, *args: Any, **kwargs: Any) -> Trace:
        """Run ``model(*args, **kwargs)`` live again with this capture's options and interventions: a new trace.

        It is what ``tl.trace(model, *args, **kwargs)`` with the options this trace was captured with
        (``save=``, ``halt=``, ``intervene=``, ``save_grads=``, ``intervention_ready=``...) gives, on the same
        backend; ``save_to=`` is not repeated. ``trace.fork().when(...).rerun(model, x)`` adds edits first.
        A loaded trace kept no options (and cannot repeat edits it holds: UnsupportedError).
        """
        from torchlens_core.capture.rerun import rerun

        return rerun(self, model, args, kwargs)

    # -- reports --------------------------------------------------------------------
    def to_pandas(self) -> Any:
        """One row per op (input and output nodes included); columns in docs/tables.md."""
        from torchlens_core.views.tables import ops_frame

        return ops_frame(self)

    def to_networkx(self) -> Any:
        """The op graph as a ``networkx.DiGraph`` (labels as nodes, with each op's metadata as attributes)."""
        from torchlens_core.views.graph import to_networkx

        return to_networkx(self)

    def summary(self, depth: int | None = 1) -> str:
        """The module table: name and type, output shape, parameters, trainable; then totals.

        ``depth`` is how many levels of modules to show (``None``: all); each parameter is counted in
        one row, the deepest shown that holds it.
        """
        from torchlens_core.views.summary import summary

        return summary(self, depth)

    def replay(self, *args: Any, **kwargs: Any) -> Any:
        """Run the recorded graph again, op by op (with its edits), and return its output.

        With arguments, run it on those inputs instead of the recorded ones:
        ``trace.replay(x2)`` takes what the model took. Where the recorded
        forward turned a value into a Python one (a branch, a loop count) and
        the new inputs would change it, :class:`GraphDoesNotHold` is raised,
        naming the op.
        """
        from torchlens_core.replay.evaluator import replay_values

        values = replay_values(self, new_inputs=(args, kwargs) if args or kwargs else None)
        return tree.map_leaves(lambda r: values[r.index] if isinstance(r, Ref) else r, self.output_template)

    def audit(self, rtol: float = 1e-5, *, untraced: bool = False) -> AuditReport:
        """Replay parity and invariant tripwires; the report is falsy if anything fails.

        ``untraced=True`` also runs the model once more, untraced, on the recorded
        inputs and compares its output with the trace's: tracing must not change
        what the model computes (see docs/concepts.md, "Audit").
        """
        from torchlens_core.replay.audit import audit

        return audit(self, rtol=rtol, untraced=untraced)

    def draw(
        self,
        path: str | None = None,
        *,
        file_format: str = "pdf",
        vis_mode: str = "unrolled",
        collapse: Any = None,
        module: str | None = None,
        max_nodes: int | None = DRAW_MAX_NODES,
        vis_nesting_depth: int | None = None,
    ) -> str:
        """Render the graph with Graphviz; returns the path written.

        ``vis_mode``: ``"unrolled"`` (every pass its own node) or ``"rolled"``
        (one node per layer, loops drawn back). ``collapse``: ``"auto"`` (modules
        as single boxes as deep as fits in 60 nodes, whatever the model's size), a depth (modules that
        deep are boxes), or a predicate on ModuleRecords. ``module``: draw only
        that module's subgraph. ``file_format``: ``"pdf"``, ``"svg"`` or ``"png"``.
        ``max_nodes``: a drawing with more nodes raises DrawingTooLargeError, saying how long it would
        take and what to draw instead (None: no limit); a slow one warns (LargeDrawingWarning).
        ``vis_nesting_depth``: ``collapse``'s other name (``vis_nesting_depth=2`` is ``collapse=2``).
        """
        from torchlens_core.views.draw import draw

        return draw(
            self,
            path,
            file_format=file_format,
            vis_mode=vis_mode,
            collapse=collapse,
            module=module,
            max_nodes=max_nodes,
            vis_nesting_depth=vis_nesting_depth,
        )

    def to_dot(
        self,
        *,
        vis_mode: str = "unrolled",
        collapse: Any = None,
        module: str | None = None,
        vis_nesting_depth: int | None = None,
    ) -> str:
        """The DOT source of :meth:`draw`'s picture; needs no Graphviz."""
        from torchlens_core.views.draw import to_dot

        return to_dot(self, vis_mode=vis_mode, collapse=collapse, module=module, vis_nesting_depth=vis_nesting_depth)

    def show(self, **options: Any) -> str | None:
        """Open the interactive viewer: inline in a notebook, else in a browser (the HTML file's path returned).

        ``tl.view(trace, "trace.html")`` writes the file; options are its (docs/viewer.md).
        """
        from torchlens_core.viewer import show

        return show(self, **options)

    def _ipython_key_completions_(self) -> list[str]:
        """What ``trace["<TAB>`` offers in IPython and Jupyter: every op label and module path that finds
        something (with and without its pass number)."""
        return sorted(self._index())

    def _repr_svg_(self) -> str | None:
        """Notebooks show a trace as its (auto-collapsed) drawing."""
        from torchlens_core.views.draw import svg

        return svg(self, collapse="auto")

    def __str__(self) -> str:
        from torchlens_core.views.summary import overview

        return overview(self)

    def __repr__(self) -> str:
        name = self.model_name or "function"
        return (
            f"<Trace of {name} ({self.backend}): {self.num_ops} ops, "
            f"{len(self.modules)} modules, {len(self.params)} params>"
        )


_LABEL_TAIL = re.compile(r"(_\d+){1,2}(:\d+)?")


def _squash(key: str) -> str | None:
    """``"max_pool2d_2_6:1"`` -> ``"maxpool2d_2_6:1"``: a label with its function name's underscores
    left out; None for a key that is not a label (a module path, a name with no ``_k`` or ``_k_n`` tail)."""
    if "." in key:
        return None
    match = _LABEL_TAIL.search(key)
    while match is not None and match.end() != len(key):
        match = _LABEL_TAIL.search(key, match.start() + 1)
    if match is None or match.start() == 0:
        return None
    return key[: match.start()].replace("_", "") + key[match.start() :]


def _position(key: object, num_ops: int) -> int:
    """An op position from ``trace[key]``: an int or any integer scalar (NumPy's, a 0-d tensor), never a bool."""
    # A bool is an int to Python (True == 1), but trace[True] is a mistake, not op 1.
    if isinstance(key, bool) or str(getattr(key, "dtype", "")).removeprefix("torch.") == "bool":
        raise ArgumentTypeError(
            f"trace[{shown(key)}]: a bool is not an op position; index with a label, a module path or an int"
        )
    try:
        position = operator.index(key)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"trace keys are labels, module paths or int positions, not {type(key).__name__} ({shown(key)})"
        ) from None
    if not -num_ops <= position < num_ops:
        raise LabelNotFoundError(
            f"op position {position} is out of range: this trace has {num_ops} ops "
            f"(0..{num_ops - 1}, or negative from the end)"
        )
    return position
