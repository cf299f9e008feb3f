"""Which axes of an extracted layer are spatial, for the activation store's index: NCHW or NHWC as computed.

Activations are stored as the framework computed them (JAX's and Keras's
convolutions are channels-last, torch's and Paddle's channels-first); the
store records the layout so that a reader need not guess. The layout is not a
per-backend convention (a Keras layer may be ``channels_first``, a JAX conv
takes any ``dimension_numbers``): it is read from the trace. From the layer's
output op, each axis is followed back through the backend's
``torchlens_geometry`` rules (pointwise ops, permutes, bias adds...) to the
nearest windowed op (a convolution or pooling), whose rule names its spatial
axes. Where no such op is reached along unchanged axes (a dense layer, a
reshape that merges axes, a backend without geometry rules), the layout is
unknown and recorded as None, never guessed.
"""

from __future__ import annotations

from typing import Any

from torchlens_core.backend.manager import backend_named
from torchlens_core.fields.geometry import IDENTITY
from torchlens_core.ir.records import OpRecord, Ref

MAX_STEPS = 64  # ops walked back from a layer's output before giving up (the layout is then unknown)


def output_op(trace: Any, target: Any, path: tuple[Any, ...]) -> OpRecord | None:
    """The op whose value is the layer ``path`` names: an op itself, or the Ref at the leaf of a module's output."""
    if isinstance(target, OpRecord):
        return target if len(path) == 1 else None
    template: Any = getattr(target, "out_template", None)  # None: indexing it fails below, as it should
    for step in path[1:]:
        try:
            template = template[step]
        except (LookupError, TypeError):
            return None
    return trace.ops[template.index] if isinstance(template, Ref) and not template.path else None


def spatial_axes(trace: Any, op: OpRecord, backend: str, ndim: int) -> tuple[int, ...] | None:
    """The axes of ``op``'s output that a convolution or pooling computed as spatial; None if not known."""
    geometry_of = backend_named(backend, missing_ok=True).geometry
    tracked = {d: d for d in range(ndim)}  # the output's axis -> that axis in the current op's output
    for _ in range(MAX_STEPS):
        try:
            geometry = geometry_of(trace, op)
        except Exception:  # noqa: BLE001 - a rule that cannot read this op: the layout is unknown, not an error
            return None
        if geometry is None:
            return None
        if geometry.spatial:
            return tuple(d for d, current in tracked.items() if current in geometry.spatial)
        step = _follow(geometry, tracked)
        if step is None:
            return None
        ref, tracked = step
        if not isinstance(ref, Ref) or ref.path or not 0 <= ref.index < len(trace.ops):
            return None
        op = trace.ops[ref.index]
    return None


def _follow(geometry: Any, tracked: dict[int, int]) -> tuple[Ref, dict[int, int]] | None:
    """The first parent that carries every tracked axis one to one, and where each axis is there."""
    for link in geometry.links:
        moved = {}
        for axis, current in tracked.items():
            rule = link.dims.get(current)
            if rule is None or rule[1] != IDENTITY:
                break
            moved[axis] = rule[0]
        else:
            return link.parent, moved
    return None


def layout_name(ndim: int, spatial: tuple[int, ...] | None) -> str | None:
    """``"NCHW"``, ``"NHWC"``, ``"NCW"``, ``"NDHWC"``...: the batch first, one channel axis, 1 to 3 spatial axes."""
    if spatial is None or not 1 <= len(spatial) <= 3 or ndim != len(spatial) + 2 or 0 in spatial:
        return None
    letters = iter("DHW"[3 - len(spatial) :])
    return "N" + "".join(next(letters) if d in spatial else "C" for d in range(1, ndim))
