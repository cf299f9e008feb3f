"""tl.trace() and tl.backends(): the entry points users call."""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named, backends, claim_backend, resolve_backend
from torchlens_core.capture.builder import Recording
from torchlens_core.capture.edits import Intervention
from torchlens_core.capture.keywords import (
    PATCH_POLICY,
    RECORD_OPTIONS,
    check_model_keywords,
    merged_options,
    warn_once,
)
from torchlens_core.capture.misuse import foreign_input_error, refuse_class
from torchlens_core.capture.policy import SAVE_TO_OPENERS, CaptureOptions, HaltCapture
from torchlens_core.capture.rerun import remember
from torchlens_core.capture.selectors import Selector, key_selector
from torchlens_core.capture.threads import pause_gc, resume_gc
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ArgumentTypeError, CaptureError, LabelNotFoundError, UnsupportedError, shown
from torchlens_core.ir.trace import Trace

__all__ = ["backends", "pluck", "record", "trace"]


def trace(
    model: Any,
    *args: Any,
    backend: str | None = None,
    save: Selector | None = None,
    halt: Selector | None = None,
    lookback: int = 0,
    lookback_payload_policy: str = "metadata_only",
    intervene: Intervention | Sequence[Intervention] | None = None,
    intervention_ready: bool = False,
    save_grads: bool | Selector = False,
    capture: CaptureOptions | None = None,
    escape_detector: str | None = None,
    save_to: str | os.PathLike[str] | None = None,
    patch_policy: Any = None,
    **kwargs: Any,
) -> Trace:
    """Run ``model(*args, **kwargs)`` once and record every operation it executes.

    Positional and keyword inputs go to the model exactly as given (a keyword
    the model does not take that looks like one of these options is an
    error, not a surprise inside the model). ``backend`` names the framework
    (``"torch"``, ``"jax"``, ...); left out, the backend whose framework owns
    the model or its inputs is used. ``save``: keep only the values of the ops
    this selector picks (every op's structure is still recorded).
    ``halt``: stop the forward once every op it picks has run (``trace.halted``).
    ``lookback``: with ``save``, also keep the N ops before each picked op (their
    values with ``lookback_payload_policy="detached_raw"``).
    ``intervene``: ``tl.when(selector, *helpers)`` or a list of them, edits made
    as the forward runs; every later op sees the edited value (docs/intervention_api.md).
    ``intervention_ready``: the trace is for ``trace.fork()`` and replay with edits:
    refuse at once what would stop that later (a backend that cannot intervene,
    ``halt=``, an op the backend could not run again).
    ``save_grads``: ``True`` or a selector: keep the gradients of these ops (and of
    the inputs) when ``trace.log_backward(loss)`` runs (docs/backward.md).
    ``escape_detector="shadow"``: also watch the framework's kernels, and report
    compute no recorded op accounts for in ``trace.notes["escapes"]`` (torch).
    ``save_to``: a folder: each value ``save=`` keeps is written there as it is
    produced (copied to the host, off the device) and only the records stay in
    memory; the trace reads its values from the folder when they are read, and
    ``tl.load(save_to)`` opens it. The folder is complete, and put in place, only
    when the capture has finished: one that fails leaves what was there before
    (docs/saving.md, "Streaming while capturing").
    ``capture``: these options as one ``tl.options.CaptureOptions``; keywords given
    as well are added to it (an option given both ways must agree).
    ``patch_policy``: accepted for old scripts, and ignored (a DeprecationWarning).
    """
    check_model_keywords(model, kwargs)
    if patch_policy is not None:
        warn_once("patch_policy", PATCH_POLICY)
    given = CaptureOptions(
        save=save,
        halt=halt,
        lookback=lookback,
        lookback_payload_policy=lookback_payload_policy,
        intervene=intervene,
        save_grads=save_grads,
        escape_detector=escape_detector,
        save_to=save_to,
    )
    options = merged_options(given, capture)
    if options.save_to is None:
        return _trace(model, args, kwargs, backend, options, intervention_ready)
    if not SAVE_TO_OPENERS:
        raise UnsupportedError(
            "save_to= is written by torchlens_core.store.stream, which is not imported: "
            "import torchlens (or torchlens_core.store.stream) first"
        )
    stream = SAVE_TO_OPENERS[-1](options.save_to)  # the path is checked, and the folder begun, before the forward
    try:
        captured = _trace(model, args, kwargs, backend, attrs.evolve(options, stream=stream), intervention_ready)
        stream.commit(captured)
    except BaseException:
        stream.abort()
        raise
    return captured


def _trace(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    backend: str | None,
    options: CaptureOptions,
    intervention_ready: bool,
) -> Trace:
    if intervention_ready:
        if options.halt is not None:
            raise UnsupportedError("intervention_ready=True with halt=: a halted trace has no output to replay")
        info = resolve_backend(backend or claim_backend(model, args, kwargs) or "")
        if "intervene" not in info.capabilities:
            raise UnsupportedError(f"intervention_ready=True: the {info.name} backend cannot intervene")
    captured = _capture(model, args, kwargs, backend, options)
    if intervention_ready:
        unrunnable = [
            op.label
            for op in captured.ops  # type: ignore[union-attr]
            if op.kind == "op" and op.call is None and not op.meta.get("identity")
        ]
        if unrunnable:
            raise UnsupportedError(
                f"intervention_ready=True: the backend recorded no call to run again for "
                f"{', '.join(unrunnable[:5])}, so edits could not be replayed"
            )
        captured.notes["intervention_ready"] = True  # type: ignore[union-attr]
    return captured  # type: ignore[return-value]


def record(
    model: Any,
    *args: Any,
    backend: str | None = None,
    save: Selector | None = None,
    halt: Selector | None = None,
    **kwargs: Any,
) -> Recording:
    """The lightest capture, for tight loops: ``tl.record(model, x, save=tl.func("relu"))``.

    Records like :func:`trace` but defers naming and linking the ops until
    ``recording.to_trace()`` is called, so captures that are never read cost
    only the forward and the per-op recording.
    """
    check_model_keywords(model, kwargs, "tl.record", RECORD_OPTIONS)
    options = CaptureOptions(save=save, halt=halt, record=True)
    return _capture(model, args, kwargs, backend, options)  # type: ignore[return-value]


def _capture(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], backend: str | None, options: CaptureOptions
) -> Trace | Recording:
    """Resolve the backend, check it can honour the options, run its capture."""
    refuse_class(model)
    if not callable(model):
        raise UnsupportedError(f"tl.trace needs a model or function to call, got {type(model).__name__}")
    if backend is None:
        backend = claim_backend(model, args, kwargs)
        if backend is None:
            raise UnsupportedError(
                f"no installed backend recognises {type(model).__name__} or its inputs; pass backend= "
                f"(installed: {', '.join(b['name'] for b in backends() if b['available']) or 'none'})"
            )
    info = resolve_backend(backend)
    for name, value in (("save", options.save), ("halt", options.halt)):
        if value is not None and name not in info.capabilities:
            raise UnsupportedError(
                f"the {info.name} backend does not support {name}= yet; "
                f"trace without it and read the values you need from the trace"
            )
    if options.intervene and "intervene" not in info.capabilities:
        raise UnsupportedError(
            f"the {info.name} backend cannot intervene (it does not declare the 'intervene' "
            f"capability): intervene= would be ignored, so the capture is refused"
        )
    if any(item.splice is not None for item in options.intervene) and "splice" not in info.capabilities:
        raise UnsupportedError(f"the {info.name} backend cannot replace module calls (tl.splice_module)")
    if options.escape_detector is not None and "escape_detector" not in info.capabilities:
        raise UnsupportedError(
            f"the {info.name} backend has no escape detector (it does not declare the "
            f"'escape_detector' capability): trace without escape_detector="
        )
    if options.save_grads is not False and "gradients" not in info.capabilities:
        raise UnsupportedError(
            f"the {info.name} backend cannot compute gradients (it does not declare the "
            f"'gradients' capability): save_grads= would give none, so the capture is refused"
        )
    # Capture allocates many small, acyclic records; the cyclic GC walking the
    # whole heap over and over while they pile up cost more than the capture.
    # Process-wide, so counted: overlapping captures in other threads switch it back on once.
    pause_gc()
    try:
        result: Trace | Recording | None = backend_named(info.name).capture(model, args, kwargs, options)
    except HaltCapture as halt_signal:  # the backend has already taken its interception down
        # pluggy's frame holds the exception while its traceback holds that frame: a cycle that
        # would keep the model's frames, and the values they held, alive until the cyclic GC.
        halt_signal.__traceback__ = None
        result = halt_signal.builder.finish(halted=True)
    except Exception as raised:  # an input of another framework: say so, not only what the framework said
        explained = foreign_input_error(info.name, args, kwargs, raised)
        if explained is None:
            raise
        raise explained from raised
    finally:
        resume_gc()
    if result is None:
        raise CaptureError(f"backend {info.name!r} registered no capture hook")
    if isinstance(result, Trace):
        _refuse_lazy(result.model_output)
    elif result._builder is not None:  # a Recording the backend just made: it holds its builder until to_trace()
        _refuse_lazy(result._builder._model_output)
    if isinstance(result, Trace):
        # for audit(untraced=True) and fork().rerun; tl.record keeps none
        result.call = remember(model, args, kwargs, result, options.intervene, options)
    return result


def _refuse_lazy(output: Any) -> None:
    """A model that returns a generator (or another lazy iterator, or a coroutine) is refused.

    Its values are computed only when someone iterates, after the capture
    has ended: a trace of it would hold no ops and no output, silently.
    Consuming it here instead would run ops outside the capture's
    interception, and take the values away from the caller. The unstarted
    generator or coroutine is closed, so no body of it ever runs.
    """
    lazy = (Iterator, AsyncIterator)
    for path, leaf in tree.leaves(output, lambda v: isinstance(v, lazy) or inspect.isawaitable(v)):
        where = "".join(f"[{k!r}]" for k in path)
        if hasattr(leaf, "close"):
            leaf.close()
        kind = "a coroutine (an async forward)" if inspect.isawaitable(leaf) else f"a lazy {type(leaf).__name__}"
        raise UnsupportedError(
            f"the model returned {kind}{' at output' + where if where else ''}: its values would be computed "
            f"only when iterated, after the capture. Return them eagerly instead: a list or tuple "
            f"(return list(...) rather than a generator expression), or await inside a plain forward"
        )


def pluck(model: Any, *args: Any, backend: str | None = None, **kwargs: Any) -> Any:
    """The value of one op or module output: ``tl.pluck(model, x, "relu_1_2")``.

    The last positional argument is the key: an op label (``"relu_1_2"``,
    ``"conv2d_3"``, ``"linear_1:2"``) or a module path (``"layer3"``,
    ``"layer3:2"``). Only that value is kept, and the forward stops once it
    has been computed.
    """
    if not args or not isinstance(args[-1], str):
        raise ArgumentTypeError(
            f"tl.pluck(model, *inputs, key): the last positional argument names what to "
            f"pluck, a label or module path, not {shown(args[-1]) if args else 'nothing'}"
        )
    *inputs, key = args
    selector = key_selector(key)
    try:
        captured = trace(model, *inputs, backend=backend, save=selector, halt=selector, **kwargs)
    except LabelNotFoundError as exc:
        raise LabelNotFoundError(f"tl.pluck: nothing named {shown(key)} ran ({exc})") from None
    return captured[key].out
