"""The hooks a TorchLens backend implements, in the order a trace uses them.

Every backend, built-in or third-party, is a pluggy plugin registered under the
entry-point group ``torchlens.backends``. Hooks that act on one backend take
its ``backend`` name and are ``firstresult``: an implementation returns None
for any name that is not its own. An implementation may accept fewer
arguments than its spec declares.

Importing a backend's plugin module must not import its framework: detect
frameworks through ``sys.modules`` and import them inside the hooks.

docs/writing-a-backend.md is the author's guide: the template plugin
(``plugins/torchlens-numpy``), the ``TraceBuilder`` reference, a complete
example backend, and the conformance suite, installed with TorchLens as a
pytest plugin (``pytest --torchlens-backend NAME``).
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "torchlens"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- identity --------------------------------------------------------------------------
@hookspec
def torchlens_backend_info() -> Any:
    """Describe this plugin's backend.

    Called on every plugin when backends are listed or resolved. Return a
    :class:`torchlens_core.backend.manager.BackendInfo`: ``name``, ``framework``
    (the distribution whose installed version makes the backend available),
    ``install`` (the command that installs backend and framework, shown when
    it is missing; there is no ``extra`` field), ``aliases`` and
    ``capabilities`` (names from ``manager.CAPABILITIES``: ``tl.trace`` refuses
    an option, such as ``save=`` or ``intervene=``, whose capability the
    backend does not declare). See docs/writing-a-backend.md.
    """


@hookspec(firstresult=True)
def torchlens_claim(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Claim a model or function traced with ``backend=None``.

    Return the backend name if ``target`` (or its inputs) belongs to this
    framework, else None; the first claim wins. Decide from ``sys.modules`` and
    types only: a framework that is not yet imported cannot own the target.
    """


# -- capture ---------------------------------------------------------------------------
@hookspec(firstresult=True)
def torchlens_capture(backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Any:
    """Run ``target(*args, **kwargs)`` once and record every op.

    Build the trace with ``TraceBuilder(backend, name, options)`` and return the
    finished :class:`Trace`. ``options`` (a
    :class:`torchlens_core.capture.policy.CaptureOptions`) carries ``save=`` and
    ``halt=``: the builder applies them, dropping unselected values and raising
    :class:`~torchlens_core.capture.policy.HaltCapture` to stop the forward (let it
    propagate; tl.trace finishes the trace). Hold no other reference to a value
    the builder dropped (``op.saved`` is False). Raise
    :class:`~torchlens_core.ir.errors.UnsupportedError` for targets or options the
    backend cannot honour. Whatever happens, including an exception inside the
    model or a KeyboardInterrupt, leave nothing patched or hooked.
    """


# -- replay ----------------------------------------------------------------------------
@hookspec(firstresult=True)
def torchlens_replay_graph(backend: str, trace: Any, observe: Any) -> list[Any] | None:
    """Re-execute the whole recorded graph; return the value of every op, by index.

    Implementations normally set up the framework (no autograd, RNG handling)
    and call :func:`torchlens_core.replay.interpret` with their op runner,
    passing ``observe`` (None, or a callable ``observe(op, value)`` to call with
    each op's value as soon as it is computed) through.
    """


@hookspec(firstresult=True)
def torchlens_replay_op(backend: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one recorded op on the given (already resolved) arguments; return its output.

    An in-place op may write into a replayed value (so that writes through
    views reach their base, as they did in the model), but never into a
    parameter, buffer, constant or recorded input.
    """


# -- arrays ----------------------------------------------------------------------------
@hookspec(firstresult=True)
def torchlens_array_info(backend: str, value: Any) -> tuple[tuple[int, ...], str, str] | None:
    """``(shape, dtype name, device name)`` of an array of this backend, or None for a non-array."""


@hookspec(firstresult=True)
def torchlens_to_numpy(backend: str, value: Any) -> Any:
    """A NumPy copy of one array of this backend.

    A dtype NumPy lacks comes back as a NumPy dtype that holds every value
    exactly (bfloat16 and the float8 types as float32), so that comparisons
    and metrics read the values that ran; ``torchlens_encode_array`` is what
    keeps the raw bits for ``tl.save``.
    """


@hookspec(firstresult=True)
def torchlens_stack(backend: str, samples: list[Any]) -> Any:
    """One batch made of unbatched samples: the arrays stacked along a new leading axis.

    Called by ``tl.extract_dataset`` for each batch it captures, with
    ``samples`` a non-empty list of arrays of this backend that all have one
    shape and dtype (the core has checked; NumPy samples that
    ``torchlens_array_info`` does not claim were first converted with
    ``torchlens_from_numpy``, on the CPU). Return a single array of shape
    ``(len(samples), *shape)`` on the samples' device (torch: ``torch.stack``,
    JAX: ``jnp.stack``). A backend that cannot batch raises
    :class:`~torchlens_core.ir.errors.UnsupportedError`.
    """


@hookspec(firstresult=True)
def torchlens_batched_loader(dataset: Any) -> str | None:
    """Refuse, for ``tl.extract_dataset``, a loader of this framework that yields batches.

    Asked of every plugin, whatever the backend traced, since a torch
    DataLoader may feed any model. Return None unless ``dataset`` is this
    framework's loader and yields batches; then return the sentence that
    says what to pass instead (its unbatched dataset and ``batch_size=``, or
    ``.unbatch()``), which the core raises as an ``UnsupportedError``.
    extract_dataset batches samples itself: splitting a loader's batches back
    into samples would take the labels it collates alongside for inputs.
    Decide from ``sys.modules`` and types: a framework not imported cannot
    have made the loader.
    """


@hookspec(firstresult=True)
def torchlens_detach(backend: str, value: Any) -> Any:
    """``value`` (an array or a structure of them) cut from any autograd graph; as it is if there is none."""


@hookspec(firstresult=True)
def torchlens_to_numpy_stacked(backend: str, values: list[Any]) -> Any:
    """Optional: one NumPy array of shape ``(len(values), *shape)`` from arrays of this backend of one shape,
    dtype and device (as ``torchlens_array_info`` gives them), each row what ``torchlens_to_numpy`` gives
    that array. None: they are converted one by one. The viewer converts every op's value: for a framework
    that stacks in one call, the one conversion for many small values is most of what is saved.
    """


@hookspec(firstresult=True)
def torchlens_array_error(backend: str, actual: Any, expected: Any) -> float | None:
    """How far ``actual`` is from ``expected``: ``max |a - e| / (1 + |e|)`` elementwise.

    0.0 means equal; ``inf`` for different shapes or dtypes, or NaNs in
    different places. Both are arrays of this backend.
    """


# -- interventions (tl.trace(..., intervene=...); see docs/intervention_api.md) -------------
@hookspec(firstresult=True)
def torchlens_array_ops(backend: str) -> Any:
    """The array operations interventions need on this backend's arrays.

    Return a :class:`torchlens_core.backend.array_ops.ArrayOps` (zeros, means,
    sums, clipping, taking slices, conversion from NumPy, copies, writing
    into an array). Called once per capture or replay that edits values. The
    built-in helpers (``tl.zero_ablate()``, ``tl.steer(v)``...) use it and
    the framework's own operators, and nothing else, so a backend that
    answers this hook, declares the ``intervene`` capability and lets its
    capture swap the values :meth:`TraceBuilder.add_op` edits (see
    docs/backends.md, "Interventions") supports every helper.
    """


# -- gradients (save_grads=, trace.log_backward; see docs/backward.md) -----------------------
@hookspec(firstresult=True)
def torchlens_backward(backend: str, trace: Any, loss: Any, wanted: list[int]) -> Any:
    """The gradients of ``loss`` for ``trace.log_backward(loss)``.

    ``loss`` is a function of the trace's output (``lambda out: out.sum()``),
    which every backend must accept, or a scalar array the backend may accept
    (torch: computed from the trace's own values). ``wanted`` holds the
    indices of the ops (and input nodes) whose gradients to return. Return
    ``{"ops": {index: gradient}, "params": {name: gradient}}``: the gradient
    of the loss with respect to each wanted op's output (the output's
    structure for several outputs) and to each parameter; leave out an op or
    parameter the loss does not depend on. A backend that records the
    backward live (torch's tensor hooks) may compute them so; the others
    replay the recorded graph under their framework's autodiff (see
    :func:`torchlens_core.replay.evaluator.interpret`). Declare the
    ``gradients`` capability.
    """


@hookspec(firstresult=True)
def torchlens_reference_grads(backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The conformance suite's reference: gradients computed by the framework alone, without TorchLens.

    The loss is the sum of every element of every floating-point array in
    ``target(*args, **kwargs)``'s output; return ``{path: gradient}`` for
    each floating-point array among the arguments, ``path`` locating it in
    ``(args, kwargs)`` as :func:`torchlens_core.ir.tree.leaves` does.
    """


# -- influence geometry (op.receptive_field, op.projective_field; see docs/fields.md) ------
@hookspec(firstresult=True)
def torchlens_geometry(backend: str, trace: Any, op: Any) -> Any:
    """How each position of ``op``'s output relates to positions of its parents, for receptive fields.

    Return a :class:`torchlens_core.fields.geometry.Geometry` built with that
    module's builders (``windowed`` for a convolution or pooling, with its
    kernel, stride, padding and dilation per spatial dim and the layout's
    spatial dims; ``transposed`` windows; ``pointwise``; ``reshape``;
    ``permute``; ``concat``; ``reduce``...), reading the parents' shapes
    from ``trace.ops[ref.index].shape``. Return None for an op the backend
    has no rule for: every parent is then read whole and a field through it
    is ``not_windowed``, never a wrong box. A rule must be exact or say it is
    not (``Link.exact=False``).
    """


# -- facets (module.facets['q'], lstm.facets['h_n']; see docs/facets.md) ------------------
@hookspec(firstresult=True)
def torchlens_facets(backend: str, trace: Any, module_pass: Any) -> Any:
    """The named views of one module pass's values: attention ``q``/``k``/``v``/``pattern``, LSTM ``h_n``...

    Called when ``module_pass.facets`` is read. Recognise the module from
    what the trace recorded (the ops of ``module_pass.ops``, their function
    names and arguments, the module's type name and submodules) and return a
    :class:`torchlens_core.views.facets.FacetPlan`: for each facet a
    ``FacetSpec`` naming the recorded value it is (a ``Ref``), or the recorded
    values and parameters it is recomputed from with a function that uses
    the framework's own array operations (an attention pattern a fused
    kernel never returned). Never run the model. Return None for a module
    with no facets; a plan may carry ``notes`` saying why a facet is missing.
    """


# -- compatibility (tl.compat.report; see LIMITATIONS.md) ---------------------------------
@hookspec(firstresult=True)
def torchlens_compat(backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What this backend knows about tracing ``target(*args, **kwargs)``, before anything runs.

    Return a list of :class:`torchlens_core.views.compat.CompatRow` (area,
    check, status ``"pass"``, ``"known_broken"``, ``"scope"`` or
    ``"not_tested"``, and the reason), found by inspecting the model's wrapper,
    modules, parameters and inputs with the same checks the capture makes.
    Never run the model.
    """


# -- comparison (tl.compare; see docs/compare.md) ------------------------------------------
@hookspec(firstresult=True)
def torchlens_op_classes(backend: str) -> dict[str, list[str]] | None:
    """This backend's op names for the comparison's equivalence table: ``{class: [func_name, ...]}``.

    ``tl.compare`` reads an op's class as evidence that two ops of different
    frameworks compute the same thing (``torchlens_core/compare/classes.py``
    ships the table for the built-in backends: ``matmul``, ``conv``,
    ``layer_norm``, ``relu``...). Name the classes of your framework's ops
    that the table does not know; a new class name starts a class. Asked
    once per comparison for each compared trace's backend, also when the
    trace was loaded without the framework (so answer without importing it).
    """


# -- saving and loading (tl.save / tl.load; see docs/saving.md) ---------------------------
@hookspec(firstresult=True)
def torchlens_encode_array(backend: str, value: Any) -> tuple[Any, str] | None:
    """The bytes of one array of this backend, for ``tl.save``: ``(numpy_array, dtype_name)``.

    Called for every array a saved trace holds. ``numpy_array`` is a NumPy
    copy; for a dtype NumPy lacks (``bfloat16``, float8...) give its raw bits as
    an unsigned-int array of the same item size and name the real dtype in
    ``dtype_name``. Not implemented: ``torchlens_to_numpy`` and the dtype of
    ``torchlens_array_info`` are used.
    """


@hookspec(firstresult=True)
def torchlens_from_numpy(backend: str, array: Any, dtype: str, device: str) -> Any:
    """An array of this backend made from a NumPy ``array``, for ``tl.load``.

    ``dtype`` and ``device`` are what ``torchlens_encode_array`` and
    ``torchlens_array_info`` gave at save time (a raw unsigned-int ``array`` for
    dtypes NumPy lacks: reinterpret its bits). Put the array on ``device`` when
    it exists here, else on the CPU. Raise ImportError (by importing the
    framework) when the framework is missing: the trace then loads with NumPy
    arrays. Not implemented: arrays stay NumPy and the trace cannot be replayed.
    """


@hookspec(firstresult=True)
def torchlens_encode_value(backend: str, value: Any) -> Any:
    """JSON data for one framework constant found in a call's arguments (``torch.float32``...), or None.

    Called by ``tl.save`` for argument leaves that are neither Python
    primitives, containers nor arrays. Return plain JSON (dicts, lists,
    strings, numbers) that ``torchlens_decode_value`` turns back into the value.
    None: the value is saved as unsaved, and its op loads as not replayable.
    """


@hookspec(firstresult=True)
def torchlens_decode_value(backend: str, data: Any) -> Any:
    """The framework constant that ``torchlens_encode_value`` encoded as ``data``, for ``tl.load``.

    ``data`` comes from a file that may be hostile: resolve names only inside
    the framework's own namespaces, never import or evaluate anything else, and
    raise :class:`~torchlens_core.ir.errors.TraceFileError` for data you did not
    write. Return None if the value cannot be rebuilt here.
    """


@hookspec(firstresult=True)
def torchlens_encode_call(backend: str, op: Any) -> Any:
    """JSON data naming ``op.call`` (the function, primitive or op type that replay runs), or None.

    Called by ``tl.save`` for every op but inputs, outputs and identity ops.
    Return plain JSON from which ``torchlens_decode_call`` rebuilds the call;
    None when it cannot be named (the op then loads as not replayable, and
    ``replay()`` of the loaded trace raises UnsupportedError naming it).
    """


@hookspec(firstresult=True)
def torchlens_decode_call(backend: str, data: Any) -> Any:
    """The call that ``torchlens_encode_call`` encoded as ``data``, for ``tl.load``.

    ``data`` comes from a file that may be hostile: look names up only among
    the framework's allow-listed namespaces (never ``importlib`` a name from
    the file) and raise :class:`~torchlens_core.ir.errors.TraceFileError` for
    anything else, e.g. a call naming ``os.system``. Return None when the call
    cannot be rebuilt here; raise ImportError when the framework is missing.
    """


# -- metadata ------------------------------------------------------------------------
@hookspec(firstresult=True)
def torchlens_flop_formulas(backend: str) -> dict[str, Any] | None:
    """FLOP formulas for this backend's ops: ``{func_name: formula}``.

    A formula takes a :class:`torchlens_core.views.flops.OpCall` and returns
    ``(flops, macs)``, or None when it cannot tell for that call; ops without
    one count as unknown. Called once per backend, the first time a trace's
    FLOPs are read. Formulas work on shapes and constants only: never import
    the framework in them. :mod:`torchlens_core.views.flops` has building blocks.
    """


# -- conformance -----------------------------------------------------------------------
@hookspec(firstresult=True)
def torchlens_conformance_cases(backend: str) -> list[Any] | None:
    """The backend's model zoo for the shared conformance suite.

    Return a list of :class:`torchlens_core.backend.cases.Case`. Cases build their
    models lazily, with random weights and nothing downloaded.
    """


@hookspec(firstresult=True)
def torchlens_observe_module_outputs(
    backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """Run the model with the framework's own module hooks; return ``{"path:pass": output}``.

    The conformance suite compares these with the trace's module outputs, so
    the observer must be independent of the capture: the framework's own
    module hooks (or module calls wrapped for the purpose), on a run without
    TorchLens, never a trace or the capture's code path (the check would
    compare the capture with itself). Outputs must be copies, safe from later
    in-place changes. A call that ran
    but whose output the framework cannot show concretely (inside a
    vectorizing transform, say) maps to None: it counts as seen, uncompared.
    Return None (or leave the hook out) for a framework without module hooks:
    the suite then runs each module alone on the inputs its pass recorded
    (``TraceBuilder.enter_module(path, inputs=...)``).
    """
