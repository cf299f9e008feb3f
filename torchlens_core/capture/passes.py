"""Module passes, written once for every capture, whatever holds its values.

Every capture sees a module call begin and return (hooks around the module, a
wrapper that runs it, a scope of a traced program) and does the same with it:

- open a pass on the builder, and ask whether ``tl.splice_module`` runs
  something else in the module's place;
- make every array the call returned an op's output computed inside the call:
  an array it returned without computing it (an input, a parameter, a
  constant, an array computed outside the call) becomes an explicit
  pass-through op, which ``intervene=`` may pick like any op;
- hand what the call returned to ``intervene=``'s module sites, and link what
  the edits made to the ops it stands for;
- close the pass with the template of Refs to what it returned; the model's
  own output is declared by the same rule (:meth:`ModulePasses.returned` with
  no pass).

:class:`ModulePasses` does all of it once. What differs between captures is
only where a value's op is found, so a subclass says what a *leaf* of a
returned value is to it: an array object, whose op the
:class:`~torchlens_core.capture.recorder.Recorder` finds by ``id``, or a value
of a walk's environment (JAX's jaxpr walk), which carries its Ref, found by
program variable rather than by object. The hooks are :meth:`is_array`,
:meth:`producer`, :meth:`pass_source`, :meth:`passed`, :meth:`values_of`,
:meth:`relink` and :meth:`describe`; :meth:`settle`, :meth:`own_work` and
:meth:`remember` are optional.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from torchlens_core.capture.builder import returned
from torchlens_core.ir import tree
from torchlens_core.ir.errors import TorchLensError
from torchlens_core.ir.records import OpRecord, Ref

if TYPE_CHECKING:
    from torchlens_core.capture.builder import TraceBuilder

Pass = tuple[str, int]  # (module path, pass number), as on TraceBuilder.module_stack


def _is_ref(value: Any) -> bool:
    return type(value) is Ref


class ModulePasses:
    """Opening and closing module passes over ``self.builder`` (a :class:`TraceBuilder`, set by the subclass)."""

    builder: TraceBuilder

    # -- what a leaf is (override) ---------------------------------------------------------------
    def is_array(self, value: Any) -> bool:
        """Is ``value``, a leaf of what a module returned, one that stands for an array?"""
        raise NotImplementedError(f"{type(self).__name__} must say which returned leaves are arrays")

    def producer(self, value: Any) -> Ref | None:
        """The Ref of the recorded op whose value the leaf ``value`` is, or None (no recorded op made it)."""
        raise NotImplementedError(f"{type(self).__name__} must say which op made a returned leaf")

    def pass_source(self, value: Any, ref: Ref | None) -> tuple[Any, Any]:
        """``(source, array)`` of a pass-through op for the leaf ``value`` (``ref``: its :meth:`producer`):
        the source replay reads (``ref``, a ParamRef, or the array itself as a constant) and the array the op
        returns."""
        raise NotImplementedError(f"{type(self).__name__} must say what a pass-through op of a leaf reads")

    def passed(self, value: Any, op: OpRecord, seen: Any) -> Any:
        """Pass-through op ``op`` was recorded for the leaf ``value``; ``seen`` is the array it returns after
        ``intervene=``. Link it; returns what the caller gets in place of ``value`` (None: ``value`` itself)."""
        raise NotImplementedError(f"{type(self).__name__} must link a pass-through op")

    def values_of(self, output: Any) -> Any:
        """``output`` (a returned value, made of leaves) as ``intervene=``'s helpers see it: made of arrays."""
        return output

    def relink(self, value: Any, ref: Ref, edited: Any) -> Any:
        """A module site's edit made ``edited`` of the leaf ``value``, returned as ``ref``'s value (a new Ref
        when the editor moved the edit onto an identity op of its own): link it; returns the leaf the caller
        gets. Called for every returned array of an edited call (``edited`` may be ``value``'s array)."""
        raise NotImplementedError(f"{type(self).__name__} must link what a module site's edit made")

    def describe(self, value: Any) -> tuple[tuple[int, ...], str, str]:
        """``(shape, dtype name, device name)`` of an array."""
        raise NotImplementedError(f"{type(self).__name__} must say how to describe an array")

    def settle(self) -> None:
        """Make every recorded value exist now; called before an edit reads module outputs."""

    @contextlib.contextmanager
    def own_work(self) -> Iterator[None]:
        """Framework calls made inside are the capture's own work, not the model's ops."""
        yield

    def remember(self, exc: BaseException) -> BaseException:
        """An error the capture raised at a module's exit, which the model may catch; returns ``exc``."""
        return exc

    # -- the passes ------------------------------------------------------------------------------
    def enter_pass(self, path: str, inputs: Any = None) -> int:
        """A call of module ``path`` starts (``inputs``: see :meth:`TraceBuilder.enter_module`)."""
        return self.builder.enter_module(path, inputs)

    def splice(self, path: str) -> Callable[..., Any] | None:
        """What ``tl.splice_module`` runs instead of the call of ``path`` just entered, or None."""
        builder = self.builder
        return None if builder.editor is None else builder.splice_for(path)

    def exit_pass(self, path: str, output: Any) -> Any:
        """The call of ``path`` returned ``output``: close its pass; returns what the caller gets instead
        (``output``, or what ``intervene=`` made of it). Errors are remembered (:meth:`remember`)."""
        builder = self.builder
        stack = builder.module_stack
        if stack and stack[-1][0] == path:  # the innermost pass, as nearly always
            current: Pass | None = stack[-1]
        else:  # a module called by a pass of its own that raised, say
            current = next((p for p in reversed(stack) if p[0] == path), None)
        try:
            template, edited = self.returned(output, current)
            if builder.editor is not None and current is not None:
                edited, template = self._edit_output(path, template, edited)
            builder.exit_module(path, template)
        except TorchLensError as exc:  # raised by the capture, also if the model catches it
            raise self.remember(exc) from None
        return edited

    def module_pass(self, path: str, run: Any, inputs: Any = None) -> Any:
        """Run one call of module ``path`` as its pass: ``run(replacement)`` calls the module (``replacement``:
        None, or what ``tl.splice_module`` runs instead on the same arguments); returns what the caller gets."""
        self.enter_pass(path, inputs)
        return self.exit_pass(path, run(self.splice(path)))

    # -- what a pass returned ----------------------------------------------------------------------
    def returned(self, output: Any, inside: Pass | None) -> tuple[Any, Any]:
        """Refs to what module pass ``inside`` (None: the model) returned, and what the forward gets back."""
        if self.is_array(output):  # most passes return one array
            ref, edited = self.as_output(output, inside)
            return ref, (output if edited is None else edited)
        return returned(output, self.is_array, lambda v: self.as_output(v, inside))

    def as_output(self, value: Any, inside: Pass | None) -> tuple[Ref, Any]:
        """A Ref to the leaf ``value`` as returned by module pass ``inside`` (None: by the model), and what
        the caller gets instead (None: ``value`` itself).

        A leaf that pass computed is its op's value. Any other (an identity
        module's input, a parameter, a constant) becomes an explicit
        pass-through op (:meth:`pass_through`), so that every returned array is
        an op's output and a module's outputs are computed inside it.
        """
        source = self.producer(value)
        if source is not None and self.computed_in(source, inside):
            return source, None
        return self.pass_through(value, source)

    def computed_in(self, ref: Ref, inside: Pass | None) -> bool:
        """Was ``ref``'s value computed inside module pass ``inside`` (None: anywhere in the model)?"""
        return inside is None or inside in self.builder.ops[ref.index].module_passes

    def pass_through(self, value: Any, ref: Ref | None) -> tuple[Ref, Any]:
        """An explicit pass-through (identity) op returning the leaf ``value`` (``ref``: its :meth:`producer`),
        which ``intervene=`` may pick; its Ref, and what the caller gets instead (None: ``value`` itself)."""
        builder = self.builder
        with self.own_work():  # intervene='s helpers may run on the new op: their calls are not the model's
            source, array = self.pass_source(value, ref)
            if type(source) is Ref:  # described as the op it reads
                op = builder.identity_op(source, array)
            else:
                shape, dtype, device = self.describe(array)
                op = builder.identity_op(source, array, shape=shape, dtype=dtype, device=device)
            seen = array if builder.editor is None else builder.seen_value(op, array)
            return Ref(op.index), self.passed(value, op, seen)

    def _edit_output(self, path: str, template: Any, output: Any) -> tuple[Any, Any]:
        """What the innermost call of ``path`` returns after ``intervene=``, and its template."""
        builder = self.builder
        editor = builder.editor
        if editor is not None and editor.wants_module(*builder.module_stack[-1]):
            self.settle()  # the helpers edit the values that ran
        with self.own_work():  # the helpers' own framework calls are not the model's ops
            values = self.values_of(output)
            edited, template = builder.edit_module_output(path, template, values)
            if edited is values:
                return output, template
            relinked = {
                leaf_path: self.relink(tree.get(output, leaf_path), ref, tree.get(edited, leaf_path))
                for leaf_path, ref in tree.leaves(template, _is_ref)
            }
        return tree.replace_at(output, relinked), template
