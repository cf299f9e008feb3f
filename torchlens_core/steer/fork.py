"""``trace.fork()``: edits on a recorded graph, replayed or run live, the original left as it was.

A :class:`Fork` holds a trace read-only and a list of added interventions.
``fork.replay(*inputs)`` runs the recorded graph (on the recorded or new
inputs) with the trace's own edits and the fork's; ``fork.rerun(model,
*inputs)`` runs the model live with the same interventions and returns a new
trace. For a deterministic model the two agree, and agree with capturing the
edits live in the first place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.capture.edits import Intervention, Site, judged_on_trace, replay_refusal
from torchlens_core.capture.selectors import Selector
from torchlens_core.ir import tree
from torchlens_core.ir.errors import LabelNotFoundError, UnsupportedError, shown
from torchlens_core.ir.records import EditRecord, Ref
from torchlens_core.ir.trace import Trace


class Fork:
    """An independent set of edits on a trace; the trace itself never changes."""

    def __init__(self, trace: Trace) -> None:
        if trace.halted:
            raise UnsupportedError("a halted trace stops before the model's output: it cannot be forked and replayed")
        self.trace = trace
        self.items: list[Intervention] = []
        self._added: dict[int, list[EditRecord]] = {}  # op index -> edits this fork adds to it
        self._unreplayable: list[str] = []  # why some added edits can only run live (rerun), not replay
        self._ops = None

    def when(self, selector: Selector, *helpers: Callable[[Any, Site], Any]) -> Fork:
        """Add an edit: at every site ``selector`` picks in the trace, run ``helpers``. Returns the fork."""
        item = Intervention(selector, helpers)
        if item.splice is not None:
            raise UnsupportedError(
                "tl.splice_module replaces a module's code, which a recorded graph does not have: "
                "use it with fork.rerun(model, ...) or tl.trace(..., intervene=...)"
            )
        found = judged_on_trace(item, self.trace)
        if not found:
            raise LabelNotFoundError(
                f"{shown(selector, 120)} picks no site in this trace: nothing would be "
                f"edited{_near(self.trace, selector)}"
            )
        array_ops = backend_named(self.trace.backend, missing_ok=True).array_ops()
        if array_ops is None:
            raise UnsupportedError(f"the {self.trace.backend} backend cannot intervene (no torchlens_array_ops)")
        for op, kind, key, path, module in found:
            site = Site(
                key,
                kind,
                op.func_name,
                module,
                path,
                self.trace.backend,
                array_ops,
                in_place=op.in_place and kind == "op",
            )
            self._added.setdefault(op.index, []).append(EditRecord(key, kind, path, item.edits, site))
            refusal = replay_refusal(op, key if kind == "module" else op.label)
            if refusal is not None and refusal not in self._unreplayable:
                self._unreplayable.append(refusal)
        self.items.append(item)
        return self

    def find_sites(self, selector: Selector) -> list[str]:
        """The site keys ``selector`` picks in the trace (see :meth:`Trace.find_sites`)."""
        return self.trace.find_sites(selector)

    @property
    def interventions(self) -> list[EditRecord]:
        """The trace's own edits and the fork's, in op order."""
        return [edit for op in self._graph().ops for edit in op.edits]

    def replay(self, *args: Any, **kwargs: Any) -> Any:
        """The output of the recorded graph with every edit applied, on these inputs or the recorded ones.

        An edit can change a value the forward branched or counted on, as new
        inputs can: :class:`GraphDoesNotHold` then names the op, and
        :meth:`rerun` runs the model itself.
        """
        from torchlens_core.replay.evaluator import replay_values

        if self._unreplayable:
            raise UnsupportedError(
                f"this fork edits {self._unreplayable[0]}, so an edit replayed there could "
                f"reach reads a hook would not. fork.rerun(model, ...) runs the model with "
                f"the same edits, and tells the two apart"
            )
        graph = self._graph()
        values = replay_values(graph, new_inputs=(args, kwargs), check=bool(self._added))
        return tree.map_leaves(lambda r: values[r.index] if isinstance(r, Ref) else r, graph.output_template)

    def rerun(self, model: Any, *args: Any, **kwargs: Any) -> Trace:
        """Run ``model`` live on these inputs with the trace's interventions and the fork's; a new trace."""
        from torchlens_core.capture.api import trace as capture

        given = getattr(self.trace.call, "intervene", ())
        if self.trace.interventions and not given:
            raise UnsupportedError(
                "this trace's own edits were not made by tl.trace in this process (it was "
                "loaded, or recorded), so a live rerun cannot repeat them"
            )
        return capture(model, *args, backend=self.trace.backend, intervene=[*given, *self.items], **kwargs)

    def _graph(self) -> Trace:
        """The trace with the fork's edits added to its ops (records copied where edited, else shared)."""
        ops = [
            attrs.evolve(op, edits=(*op.edits, *self._added[op.index])) if op.index in self._added else op
            for op in self.trace.ops
        ]
        graph = Trace(
            backend=self.trace.backend,
            model_name=self.trace.model_name,
            ops=ops,
            modules=dict(self.trace.modules),
            params=dict(self.trace.params),
            output_template=self.trace.output_template,
            notes=dict(self.trace.notes),
        )
        graph.call = self.trace.call
        return graph

    def __repr__(self) -> str:
        return f"<Fork of {self.trace!r}: {sum(map(len, self._added.values()))} edits added>"


def _near(trace: Trace, selector: Selector) -> str:
    from torchlens_core.capture.selectors import near_names

    return near_names(trace, selector)


def fork(trace: Trace) -> Fork:
    return Fork(trace)
