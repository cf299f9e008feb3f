"""A :class:`~torchlens_core.backend.base.Backend` over a plugin written as raw pluggy hook implementations.

The core calls the backend it works with through the typed ``Backend`` methods
(:func:`torchlens_core.backend.manager.backend_named`), not through pluggy. A
plugin registered as a ``Backend`` instance is that instance; a plugin written
as module-level ``torchlens_*`` functions taking ``backend=`` (as the hook specs
allow) is wrapped in a :class:`HookBackend`, whose methods call that plugin's
own implementations, and no other plugin's, with the arguments each declares.
A hook the plugin does not implement answers None, as the pluggy hook did when
no plugin answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from torchlens_core.backend.base import Backend

if TYPE_CHECKING:
    from torchlens_core.backend.array_ops import ArrayOps
    from torchlens_core.backend.cases import Case
    from torchlens_core.backend.manager import BackendInfo
    from torchlens_core.capture.builder import Recording
    from torchlens_core.capture.policy import CaptureOptions
    from torchlens_core.ir.records import OpRecord
    from torchlens_core.ir.trace import Trace
    from torchlens_core.replay.evaluator import Observe


class HookBackend(Backend):
    """Backend ``name`` answered by one plugin's hook implementations, called directly.

    ``impls`` maps hook names to that plugin's implementation (a pluggy ``HookImpl``).
    ``fallback``: the ``Backend`` instance whose methods answer the hooks the plugin
    does not implement (a subclass that overrides some of the base's hooks), else None.
    An implementation registered as a hook wrapper is called through the pluggy hook,
    the only way to run a wrapper.
    """

    def __init__(
        self,
        name: str,
        impls: dict[str, pluggy.HookImpl],
        hooks: pluggy.HookRelay | None = None,
        fallback: Backend | None = None,
    ) -> None:
        self.name = name
        self._impls = impls
        self._hooks = hooks
        self._fallback = fallback

    def __repr__(self) -> str:
        return f"HookBackend({self.name!r}, hooks={sorted(self._impls)})"

    def _call(self, hook_name: str, method: str, **kwargs: Any) -> Any:
        impl = self._impls.get(hook_name)
        if impl is None:
            if self._fallback is not None:
                # the method's parameters, by position (a lazy() method passes them on to a function of its own)
                return getattr(self._fallback, method)(*[v for k, v in kwargs.items() if k != "backend"])
            return None
        if (impl.hookwrapper or impl.wrapper) and self._hooks is not None:
            return getattr(self._hooks, hook_name)(**kwargs)
        # pluggy passes an implementation the spec's arguments it declares, by position, in its order
        return impl.function(*[kwargs[arg] for arg in impl.argnames])

    # -- the broadcast hooks, asked of this plugin alone ---------------------------------
    def info(self) -> BackendInfo:
        return self._call("torchlens_backend_info", "info")

    def claim(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return bool(self._call("torchlens_claim", "claim", target=target, args=args, kwargs=kwargs))

    def batched_loader(self, dataset: Any) -> str | None:
        return self._call("torchlens_batched_loader", "batched_loader", dataset=dataset)

    # -- the per-backend hooks ----------------------------------------------------------------
    def capture(
        self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: CaptureOptions
    ) -> Trace | Recording | None:
        return self._call(
            "torchlens_capture", "capture", backend=self.name, target=target, args=args, kwargs=kwargs, options=options
        )

    def replay_graph(self, trace: Trace, observe: Observe | None) -> list[Any] | None:
        return self._call("torchlens_replay_graph", "replay_graph", backend=self.name, trace=trace, observe=observe)

    def replay_op(self, op: OpRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._call("torchlens_replay_op", "replay_op", backend=self.name, op=op, args=args, kwargs=kwargs)

    def array_info(self, value: Any) -> tuple[tuple[int, ...], str, str] | None:
        return self._call("torchlens_array_info", "array_info", backend=self.name, value=value)

    def to_numpy(self, value: Any) -> Any:
        return self._call("torchlens_to_numpy", "to_numpy", backend=self.name, value=value)

    def to_numpy_stacked(self, values: list[Any]) -> Any:
        return self._call("torchlens_to_numpy_stacked", "to_numpy_stacked", backend=self.name, values=values)

    def array_error(self, actual: Any, expected: Any) -> float | None:
        return self._call("torchlens_array_error", "array_error", backend=self.name, actual=actual, expected=expected)

    def stack(self, samples: list[Any]) -> Any:
        return self._call("torchlens_stack", "stack", backend=self.name, samples=samples)

    def detach(self, value: Any) -> Any:
        return self._call("torchlens_detach", "detach", backend=self.name, value=value)

    def encode_array(self, value: Any) -> tuple[Any, str] | None:
        return self._call("torchlens_encode_array", "encode_array", backend=self.name, value=value)

    def from_numpy(self, array: Any, dtype: str, device: str) -> Any:
        return self._call(
            "torchlens_from_numpy", "from_numpy", backend=self.name, array=array, dtype=dtype, device=device
        )

    def encode_value(self, value: Any) -> Any:
        return self._call("torchlens_encode_value", "encode_value", backend=self.name, value=value)

    def decode_value(self, data: Any) -> Any:
        return self._call("torchlens_decode_value", "decode_value", backend=self.name, data=data)

    def encode_call(self, op: OpRecord) -> Any:
        return self._call("torchlens_encode_call", "encode_call", backend=self.name, op=op)

    def decode_call(self, data: Any) -> Any:
        return self._call("torchlens_decode_call", "decode_call", backend=self.name, data=data)

    def array_ops(self) -> ArrayOps | None:
        return self._call("torchlens_array_ops", "array_ops", backend=self.name)

    def backward(self, trace: Trace, loss: Any, wanted: list[int]) -> Any:
        return self._call("torchlens_backward", "backward", backend=self.name, trace=trace, loss=loss, wanted=wanted)

    def reference_grads(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._call(
            "torchlens_reference_grads", "reference_grads", backend=self.name, target=target, args=args, kwargs=kwargs
        )

    def flop_formulas(self) -> dict[str, Any] | None:
        return self._call("torchlens_flop_formulas", "flop_formulas", backend=self.name)

    def geometry(self, trace: Trace, op: OpRecord) -> Any:
        return self._call("torchlens_geometry", "geometry", backend=self.name, trace=trace, op=op)

    def op_classes(self) -> dict[str, list[str]] | None:
        return self._call("torchlens_op_classes", "op_classes", backend=self.name)

    def facets(self, trace: Trace, module_pass: Any) -> Any:
        return self._call("torchlens_facets", "facets", backend=self.name, trace=trace, module_pass=module_pass)

    def compat(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
        return self._call("torchlens_compat", "compat", backend=self.name, target=target, args=args, kwargs=kwargs)

    def conformance_cases(self) -> list[Case] | None:
        return self._call("torchlens_conformance_cases", "conformance_cases", backend=self.name)

    def observe_module_outputs(
        self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        return self._call(
            "torchlens_observe_module_outputs",
            "observe_module_outputs",
            backend=self.name,
            target=target,
            args=args,
            kwargs=kwargs,
        )
