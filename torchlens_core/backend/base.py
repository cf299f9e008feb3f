"""Backend: a base class that turns plain methods into the per-backend hooks.

A backend may implement the hooks of :mod:`torchlens_core.backend.hookspecs` as plain
functions, or subclass :class:`Backend`, implement its methods, and point its
entry point at an instance::

    [project.entry-points."torchlens.backends"]
    mybackend = "my_package.plugin:backend"

Methods whose code imports the framework are best declared with :func:`lazy`.
An entry point may name the plugin module instead (``"my_package.plugin"``),
which then exports the instance's hooks: :func:`hooks_of`.

How the core calls a backend: the hooks that ask every plugin (``info``,
``claim``, ``batched_loader``) go through pluggy; for everything else the core
looks the chosen backend up by name
(:func:`torchlens_core.backend.manager.backend_named`) and calls its methods
directly, so a backend's methods never see another backend's requests. A
plugin written as raw pluggy hooks is called through an adapter with the same
methods (:class:`torchlens_core.backend.adapter.HookBackend`). The per-backend
hooks below, which answer for this backend's name only, stay for code that
calls the pluggy hook itself (``hook().torchlens_to_numpy(backend=...)``).
Import the framework inside the methods, never at module level.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from torchlens_core.backend.hookspecs import hookimpl
from torchlens_core.ir.errors import UnsupportedError

if TYPE_CHECKING:
    from torchlens_core.backend.array_ops import ArrayOps
    from torchlens_core.backend.cases import Case
    from torchlens_core.backend.manager import BackendInfo
    from torchlens_core.capture.builder import Recording
    from torchlens_core.capture.policy import CaptureOptions
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace
    from torchlens_core.replay.evaluator import Observe


def lazy(target: str) -> Any:
    """A Backend method that runs ``"package.module:name"``, imported on first use.

    A backend's plugin module must not import its framework, so each method's
    code lives in a module that does, loaded only when the hook is first
    called: ``capture = lazy("my_backend.capture:capture")``. The method passes
    its arguments through; a ``name`` that is not callable (a table of FLOP
    formulas, say) is returned as it is.
    """
    module_name, _, attr = target.partition(":")
    found: list[Any] = []

    def resolve() -> Any:
        if not found:
            found.append(getattr(importlib.import_module(module_name), attr))
        return found[0]

    def method(self: Backend, *args: Any, **kwargs: Any) -> Any:
        value = found[0] if found else resolve()
        return value(*args, **kwargs) if callable(value) else value

    method.__name__ = method.__qualname__ = attr
    method.__doc__ = f"``{target}``, imported on first use."
    method._lazy_target = resolve  # type: ignore[attr-defined]  # for direct()
    return method


def direct(method: Any) -> Any:
    """A backend's bound method as the function it runs, for calls over every value of a trace: a
    :func:`lazy` method's target imported now (one call, not two, per value); any other method as it is."""
    resolve = getattr(getattr(method, "__func__", None), "_lazy_target", None)
    if resolve is None:
        return method
    try:
        value = resolve()
    except ImportError:
        return method  # its framework is not installed (a loaded trace's NumPy values never need it): a call says so
    return value if callable(value) else method


class Backend:
    """A backend's typed interface: what the core calls on the backend it works with.

    Subclass it and implement the methods (docs/writing-a-backend.md lists them);
    a method returning None means what a hook answering None means (see
    :mod:`torchlens_core.backend.hookspecs`).
    """

    name: str = ""

    # -- what a backend implements ------------------------------------------------------
    def info(self) -> BackendInfo:
        """Name, framework, install command, aliases, capabilities."""
        raise NotImplementedError

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Does this framework own ``target`` or its inputs? Decide from ``sys.modules`` and types."""
        return False

    def capture(
        self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions
    ) -> Trace | Recording | None:
        """Run the target once, recording every op; the finished trace, or a Recording under ``tl.record``."""
        raise NotImplementedError

    def replay_graph(self, trace: Trace, observe: Observe | None) -> list[Any] | None:
        """Replay everything; None (the default) replays op by op with :meth:`replay_op`."""
        return None

    def replay_op(self, op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One recorded op run on resolved arguments; its output."""
        raise NotImplementedError

    def array_info(self, value: Any) -> tuple[tuple[int, ...], str, str] | None:
        """``(shape, dtype name, device name)`` of this backend's array; None for anything else."""
        raise NotImplementedError

    def to_numpy(self, value: Any) -> Any:
        """A NumPy copy of one of this backend's arrays."""
        raise NotImplementedError

    def to_numpy_stacked(self, values: list[Any]) -> Any:
        """One NumPy array, ``(len(values), *shape)``, of arrays of one shape, dtype and device, each row what
        :meth:`to_numpy` gives; None (the default): they are converted one by one."""
        return None

    def array_error(self, actual: Any, expected: Any) -> float | None:
        """``max |a - e| / (1 + |e|)`` of two of this backend's arrays (inf if they differ in form)."""
        raise NotImplementedError

    def stack(self, samples: list[Any]) -> Any:
        """One array of shape ``(len(samples), *shape)`` from same-shaped arrays (for ``tl.extract_dataset``)."""
        raise UnsupportedError(
            f"the {self.name} backend cannot batch samples yet (Backend.stack), so tl.extract_dataset cannot run on it"
        )

    def batched_loader(self, dataset: Any) -> str | None:
        """What to pass instead, if ``dataset`` is this framework's loader yielding batches (else None)."""
        return None

    def detach(self, value: Any) -> Any:
        """``value`` cut from any autograd graph (frameworks without one: as it is)."""
        return value

    def encode_array(self, value: Any) -> tuple[Any, str] | None:
        """``(numpy_array, dtype_name)`` for ``tl.save``; dtypes NumPy lacks as raw unsigned-int bits."""
        info = self.array_info(value)
        return self.to_numpy(value), info[1] if info else str(getattr(value, "dtype", ""))

    def from_numpy(self, array: Any, dtype: str, device: str) -> Any:
        """This backend's array from a NumPy one, for ``tl.load``; None keeps it NumPy (no replay then)."""
        return None

    def encode_value(self, value: Any) -> Any:
        """JSON data for a framework constant in a call's arguments (a dtype, a device...); None if unknown."""
        return None

    def decode_value(self, data: Any) -> Any:
        """The constant :meth:`encode_value` encoded; raise TraceFileError for data it never writes."""
        return None

    def encode_call(self, op: OpRecord) -> Any:
        """JSON data naming ``op.call`` for ``tl.save``; None: the loaded op cannot be replayed."""
        return None

    def decode_call(self, data: Any) -> Any:
        """The call :meth:`encode_call` encoded, from allow-listed namespaces only (TraceFileError otherwise)."""
        return None

    def array_ops(self) -> ArrayOps | None:
        """The :class:`~torchlens_core.backend.array_ops.ArrayOps` interventions use; None: cannot intervene."""
        return None

    def backward(self, trace: Trace, loss: Any, wanted: list[int]) -> Any:
        """Gradients for ``trace.log_backward`` (see the ``torchlens_backward`` hook); None: not supported."""
        return None

    def reference_grads(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The framework's own input gradients of the summed float outputs (conformance)."""
        return None

    def flop_formulas(self) -> dict[str, Any] | None:
        """``{func_name: formula}`` for this backend's ops (see :mod:`torchlens_core.views.flops`)."""
        return {}

    def geometry(self, trace: Trace, op: OpRecord) -> Any:
        """The op's :class:`~torchlens_core.fields.geometry.Geometry` (see ``torchlens_geometry``); None: no rule."""
        return None

    def op_classes(self) -> dict[str, list[str]] | None:
        """``{class: [func_name, ...]}`` for tl.compare's equivalence table (see ``torchlens_op_classes``)."""
        return {}

    def facets(self, trace: Trace, module_pass: Any) -> Any:
        """A :class:`~torchlens_core.views.facets.FacetPlan` for one module pass (see ``torchlens_facets``); None."""
        return None

    def compat(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
        """Rows for tl.compat.report (see ``torchlens_compat``); None: no checks of this backend's own."""
        return None

    def conformance_cases(self) -> list[Case] | None:
        """The model zoo the conformance suite runs."""
        return []

    def observe_module_outputs(
        self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """``{"path:pass": output}`` from the framework's own module hooks; None: it has none."""
        return {}

    # -- the pluggy hooks: the broadcast ones, and the per-backend ones (answering for this backend's name
    # only) for code that calls the pluggy hook itself; the core calls the methods above directly -------
    def _answers(self, backend: str, method: str) -> bool:
        """A per-backend hook called through pluggy: deprecated (CHANGELOG.md), answered for this name only."""
        if backend != self.name:
            return False
        warnings.warn(
            f"asking backend {backend!r} through the pluggy hook torchlens_{method} is deprecated and stops "
            f"working in TorchLens 0.2: call torchlens.backend.backend_named({backend!r}).{method}(...)",
            DeprecationWarning,
            stacklevel=4,  # past pluggy's caller frames, to the code that called the hook
        )
        return True

    @hookimpl
    def torchlens_backend_info(self) -> BackendInfo:
        return self.info()

    @hookimpl
    def torchlens_claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return self.name if self.claim(target, args, kwargs) else None

    @hookimpl
    def torchlens_capture(
        self, backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any
    ) -> Any:
        return self.capture(target, args, kwargs, options) if self._answers(backend, "capture") else None

    @hookimpl
    def torchlens_replay_graph(self, backend: str, trace: Any, observe: Any) -> list[Any] | None:
        return self.replay_graph(trace, observe) if self._answers(backend, "replay_graph") else None

    @hookimpl
    def torchlens_replay_op(self, backend: str, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.replay_op(op, args, kwargs) if self._answers(backend, "replay_op") else None

    @hookimpl
    def torchlens_array_info(self, backend: str, value: Any) -> Any:
        return self.array_info(value) if self._answers(backend, "array_info") else None

    @hookimpl
    def torchlens_to_numpy(self, backend: str, value: Any) -> Any:
        return self.to_numpy(value) if self._answers(backend, "to_numpy") else None

    @hookimpl
    def torchlens_stack(self, backend: str, samples: list[Any]) -> Any:
        return self.stack(samples) if self._answers(backend, "stack") else None

    @hookimpl
    def torchlens_batched_loader(self, dataset: Any) -> str | None:
        return self.batched_loader(dataset)

    @hookimpl
    def torchlens_detach(self, backend: str, value: Any) -> Any:
        return self.detach(value) if self._answers(backend, "detach") else None

    @hookimpl
    def torchlens_array_error(self, backend: str, actual: Any, expected: Any) -> float | None:
        return self.array_error(actual, expected) if self._answers(backend, "array_error") else None

    @hookimpl
    def torchlens_encode_array(self, backend: str, value: Any) -> Any:
        return self.encode_array(value) if self._answers(backend, "encode_array") else None

    @hookimpl
    def torchlens_from_numpy(self, backend: str, array: Any, dtype: str, device: str) -> Any:
        return self.from_numpy(array, dtype, device) if self._answers(backend, "from_numpy") else None

    @hookimpl
    def torchlens_encode_value(self, backend: str, value: Any) -> Any:
        return self.encode_value(value) if self._answers(backend, "encode_value") else None

    @hookimpl
    def torchlens_decode_value(self, backend: str, data: Any) -> Any:
        return self.decode_value(data) if self._answers(backend, "decode_value") else None

    @hookimpl
    def torchlens_encode_call(self, backend: str, op: Any) -> Any:
        return self.encode_call(op) if self._answers(backend, "encode_call") else None

    @hookimpl
    def torchlens_decode_call(self, backend: str, data: Any) -> Any:
        return self.decode_call(data) if self._answers(backend, "decode_call") else None

    @hookimpl
    def torchlens_array_ops(self, backend: str) -> Any:
        return self.array_ops() if self._answers(backend, "array_ops") else None

    @hookimpl
    def torchlens_backward(self, backend: str, trace: Any, loss: Any, wanted: list[int]) -> Any:
        return self.backward(trace, loss, wanted) if self._answers(backend, "backward") else None

    @hookimpl
    def torchlens_reference_grads(
        self, backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self.reference_grads(target, args, kwargs) if self._answers(backend, "reference_grads") else None

    @hookimpl
    def torchlens_flop_formulas(self, backend: str) -> dict[str, Any] | None:
        return self.flop_formulas() if self._answers(backend, "flop_formulas") else None

    @hookimpl
    def torchlens_geometry(self, backend: str, trace: Any, op: Any) -> Any:
        return self.geometry(trace, op) if self._answers(backend, "geometry") else None

    @hookimpl
    def torchlens_op_classes(self, backend: str) -> dict[str, list[str]] | None:
        return self.op_classes() if self._answers(backend, "op_classes") else None

    @hookimpl
    def torchlens_facets(self, backend: str, trace: Any, module_pass: Any) -> Any:
        return self.facets(trace, module_pass) if self._answers(backend, "facets") else None

    @hookimpl
    def torchlens_compat(self, backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.compat(target, args, kwargs) if self._answers(backend, "compat") else None

    @hookimpl
    def torchlens_conformance_cases(self, backend: str) -> list[Any] | None:
        return self.conformance_cases() if self._answers(backend, "conformance_cases") else None

    @hookimpl
    def torchlens_observe_module_outputs(
        self, backend: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        return (
            self.observe_module_outputs(target, args, kwargs)
            if self._answers(backend, "observe_module_outputs")
            else None
        )


def hooks_of(backend: Backend) -> dict[str, Any]:
    """``backend``'s hooks by name, for a plugin module that an entry point names instead of the instance.

    pluggy registers the hook functions of a module it is given, so such a
    module exports the instance's: ``globals().update(hooks_of(backend))``.
    """
    return {name: getattr(backend, name) for name in dir(type(backend)) if name.startswith("torchlens_")}
