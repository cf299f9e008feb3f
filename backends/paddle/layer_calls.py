"""Which layer calls are module passes: ``__call__`` replaced on the traced model's layer classes for one capture.

Paddle has no global layer hooks. A forward pre- and post-hook on every
sublayer cost two registrations and two removals per layer per capture, and
sent every call of those layers down ``Layer``'s slower hooked path (a
closure, a name scope, the hook loops: ~8 us a call) that an untraced call
skips. Instead, while the forward runs, the model's layer classes get a
``__call__`` that asks whether the layer is one of the model's and the caller
the capturing thread, and then hands the call to ``Recorder.call_layer``,
which runs ``Layer.__call__`` (the layer's own hooks included) inside the
module pass: the pass opens before the layer's pre-hooks and closes after its
post-hooks, as a prepended pre-hook and a last post-hook would. Any other
call, other threads' included, runs ``Layer.__call__`` untouched.

The replacement goes on each class the model's layers are instances of (a
few, with no or few subclasses: cheap to set and to take back), not on
``paddle.nn.Layer`` itself, whose ~300 subclasses make every change of it
cost ~0.2 ms. Where a layer class defines a ``__call__`` of its own (which
reaches ``Layer.__call__`` through ``super()``, or never does), ``Layer.__call__``
itself is replaced instead, so that what runs inside that method stays
outside the pass, as it was with hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Any

import paddle

from torchlens_paddle.intercept import STATE

_LAYER = paddle.nn.Layer


def _make_call(orig: Callable[..., Any]) -> Callable[..., Any]:
    state = STATE

    def __call__(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is not None and rec.thread == get_ident():
            known = rec.layers.get(id(self))
            if known is not None and known[0] is self:
                return rec.call_layer(known[1], orig, self, inputs, kwargs)
        return orig(self, *inputs, **kwargs)

    __call__.__doc__ = orig.__doc__
    __call__.__wrapped__ = orig  # type: ignore[attr-defined]
    __call__._torchlens_wrapper = True  # type: ignore[attr-defined]
    return __call__


class LayerCalls:
    """The ``__call__`` replacements of one capture, to take back with :meth:`restore` (in a ``finally``)."""

    def __init__(self) -> None:
        self.call: Callable[..., Any] | None = None  # the replacement installed
        self.given: list[type] = []  # classes given it (they had no __call__ of their own)
        self.layer_wide: Callable[..., Any] | None = None  # Layer.__call__ as it was, where Layer's was replaced

    def install(self, layers: list[tuple[str, Any]]) -> None:
        """Replace ``__call__`` where the calls of ``layers`` (``(path, layer)``) go through."""
        layer_call = _LAYER.__dict__["__call__"]  # as it is now (someone else may have replaced it: kept, wrapped)
        self.call = call = _make_call(layer_call)
        classes = list(dict.fromkeys(type(layer) for _, layer in layers))
        # a class with a __call__ of its own, or bare Layer instances (containers): Layer's own is replaced
        # (each noted before it is replaced: an interrupt in between still has it taken back)
        if any(cls is _LAYER or cls.__call__ is not layer_call for cls in classes):
            self.layer_wide = layer_call
            type.__setattr__(_LAYER, "__call__", call)
            return
        for cls in classes:  # each inherits Layer's __call__ (checked above): given its own, deleted after
            self.given.append(cls)
            type.__setattr__(cls, "__call__", call)

    def restore(self) -> None:
        """Take every replacement back (what was changed since is left alone), even if one fails."""
        given, self.given = self.given, []
        errors = []
        for cls in reversed(given):
            try:
                if cls.__dict__.get("__call__") is self.call:
                    type.__delattr__(cls, "__call__")
            except Exception as exc:  # noqa: BLE001 - keep restoring the others
                errors.append(exc)
        layer_call, self.layer_wide = self.layer_wide, None
        if layer_call is not None and _LAYER.__dict__.get("__call__") is self.call:
            type.__setattr__(_LAYER, "__call__", layer_call)
        if errors:
            raise errors[0]
