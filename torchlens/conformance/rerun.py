"""Module outputs without module hooks: each module run alone on the inputs its pass recorded.

The module-outputs check compares a trace with the framework's own module hooks
(the ``torchlens_observe_module_outputs`` hook). A framework without such hooks
cannot give that independent view; where the backend records each pass's inputs
(``TraceBuilder.enter_module(path, inputs=...)``), the suite instead finds the
module by its path in the model and calls it on copies of what it received. The
copies matter: a module that writes its input in place (an in-place ReLU) would
otherwise write into the trace's recorded values.

A rerun is a second call of the module: a module whose call changes state (a
batch norm in training mode updating its running statistics, a stateful RNG)
gives another answer, and training-mode state changes. Backends whose models
hold such state should implement the observer hook.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.ir import tree
from torchlens_core.ir.trace import Trace


@attrs.frozen
class Rerun:
    """What running each module alone gave: ``{"path:pass": output}``, and why a pass was not run."""

    outputs: dict[str, Any]
    not_run: dict[str, str]


def module_at(model: Any, path: str) -> Any:
    """The callable at dotted ``path`` inside ``model`` (attributes, then sequence indices, then keys); None."""
    found = model
    for part in path.split("."):
        if isinstance(found, Mapping) and part in found:
            found = found[part]
            continue
        try:
            found = getattr(found, part)
            continue
        except AttributeError:
            pass
        if part.isdigit() and isinstance(found, Sequence) and int(part) < len(found):
            found = found[int(part)]
        else:
            return None
    return found if callable(found) else None


def rerun_module_outputs(backend: str, model: Any, trace: Trace, reset: Any = None) -> Rerun:
    """Run every module pass whose inputs were recorded alone, on copies of them (``reset()`` before each)."""
    copy = _copier(backend)
    outputs: dict[str, Any] = {}
    not_run: dict[str, str] = {}
    for module in trace.modules.values():
        for mp in module.passes:
            if mp.in_template is None:
                not_run[mp.label] = "its inputs were not recorded"
                continue
            call = module_at(model, mp.path)
            if call is None:
                not_run[mp.label] = f"no callable at {mp.path!r} in the model"
                continue
            args, kwargs = tree.map_leaves(copy, mp.inputs)
            if reset is not None:
                reset()
            outputs[mp.label] = call(*args, **kwargs)
    return Rerun(outputs, not_run)


def _copier(backend: str) -> Any:
    """A copy of an array leaf (other leaves as they are), so that a rerun cannot write into the trace."""
    h = backend_named(backend)
    ops = h.array_ops()

    def copy(leaf: Any) -> Any:
        info = h.array_info(leaf)
        if info is None:
            return leaf
        if ops is not None:
            return ops.copy(leaf)
        import numpy as np

        array = np.array(h.to_numpy(leaf), copy=True)
        converted = h.from_numpy(array, info[1], info[2])
        return array if converted is None else converted

    return copy
