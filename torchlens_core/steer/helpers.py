"""The built-in intervention helpers: ``tl.when(selector, tl.zero_ablate())`` and the rest.

A helper is any callable ``helper(value, site) -> value``; these are the
built-in ones. Each works on every backend: arithmetic uses the framework's
operators, everything else the backend's ArrayOps (``site.ops``), and random
numbers and directions are made with NumPy, so a seed gives the same numbers
in every framework. What each does is in docs/intervention_api.md; the table
in the docstring of :func:`when` is the short form.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchlens_core.backend.manager import backend_named
from torchlens_core.capture.edits import Intervention, ModuleSplice, Site
from torchlens_core.capture.selectors import Selector
from torchlens_core.ir.errors import ArgumentTypeError, InterventionError, shown


def when(selector: Selector, *helpers: Callable[[Any, Site], Any]) -> Intervention:
    """At every site ``selector`` picks, run ``helpers`` in order; pass it (or a list) as ``intervene=``.

    | helper | value becomes |
    |---|---|
    | ``zero_ablate()`` | zeros of the same shape and dtype |
    | ``mean_ablate(reference=None, dims=(0,))`` | its mean over ``dims``, broadcast back (or the reference's) |
    | ``resample_ablate(reference, seed=0)`` | the reference's value at the site, batch rows permuted |
    | ``steer(vector, scale=1.0)`` | ``value + scale * vector`` |
    | ``scale(factor)`` | ``value * factor`` |
    | ``clamp(min=None, max=None)`` | clamped |
    | ``noise(std, seed=0)`` | ``value + std * N(0, 1)`` |
    | ``project_onto(direction, dim=-1)`` / ``project_off(...)`` | the component along ``direction`` / the rest |
    | ``swap_with(other_trace)`` | the value at the same site in ``other_trace`` |
    | ``splice_module(replacement)`` | a module call replaced by ``replacement(*args, **kwargs)`` |
    """
    return Intervention(selector, helpers)


def _shape(site: Site, value: Any) -> tuple[int, ...]:
    info = backend_named(site.backend, missing_ok=True).array_info(value)
    if info is None:
        raise InterventionError(f"the value at {site.key} is not a {site.backend} array")
    return tuple(info[0])


def _as_array(site: Site, data: Any, like: Any) -> Any:
    """``data`` as an array of the site's framework: used as it is if it is one, else converted from NumPy."""
    if backend_named(site.backend, missing_ok=True).array_info(data) is not None:
        return data
    import numpy as np

    return site.ops.from_numpy(np.asarray(data), like)


def _numpy(site: Site, data: Any) -> Any:
    import numpy as np

    if backend_named(site.backend, missing_ok=True).array_info(data) is not None:
        return np.asarray(backend_named(site.backend, missing_ok=True).to_numpy(data), dtype=np.float64)
    return np.asarray(data, dtype=np.float64)


def _check_real(what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{what} is a number, not {type(value).__name__} ({shown(value)})")


def _check_broadcasts(site: Site, what: str, array: Any, value: Any) -> None:
    """``array`` must broadcast to ``value``'s shape, which the edit keeps; else say so, with both shapes."""
    import numpy as np

    have, want = _shape(site, array), _shape(site, value)
    try:
        fits = np.broadcast_shapes(have, want) == want
    except ValueError:
        fits = False
    if not fits:
        raise InterventionError(
            f"{what}, shape {list(have)}, does not broadcast to the value at {site.key}, shape {list(want)}"
        )


def _axis(axis: int, ndim: int, site: Site) -> int:
    if not -ndim <= axis < ndim:
        raise InterventionError(f"axis {axis} does not exist in the value at {site.key}, which has {ndim} axes")
    return axis % ndim


class _Helper:
    """Shared printing: helpers print as the call that made them (``scale(0.5)``)."""

    def __repr__(self) -> str:
        shown_args = []
        for a in attrs.fields(type(self)):  # type: ignore[arg-type]  # every helper subclass is an attrs class
            value = getattr(self, a.name)
            if a.default is attrs.NOTHING:  # required: as written positionally
                shown_args.append(_short(value))
            elif value != a.default if not hasattr(value, "shape") else True:
                shown_args.append(f"{a.name}={_short(value)}")
        return f"{_NAMES[type(self)]}({', '.join(shown_args)})"


def _short(value: Any) -> str:
    if hasattr(value, "ops") and hasattr(value, "backend"):  # a trace
        return f"<trace of {getattr(value, 'model_name', '?')}>"
    if hasattr(value, "shape") and not isinstance(value, (int, float)):
        return f"<array {list(value.shape)}>"
    return shown(value, 40)


@attrs.frozen(repr=False)
class ZeroAblate(_Helper):
    def __call__(self, value: Any, site: Site) -> Any:
        return site.ops.zeros_like(value)


@attrs.frozen(repr=False)
class MeanAblate(_Helper):
    reference: Any = None
    dims: tuple[int, ...] = (0,)

    def __call__(self, value: Any, site: Site) -> Any:
        source = value if self.reference is None else site.value_in(self.reference)
        ndim = len(_shape(site, source))
        axes = tuple(sorted({_axis(d, ndim, site) for d in self.dims}))
        return site.ops.zeros_like(value) + site.ops.mean(source, axes)


@attrs.frozen(repr=False)
class ResampleAblate(_Helper):
    reference: Any
    seed: int = 0

    def __call__(self, value: Any, site: Site) -> Any:
        import numpy as np

        source = site.value_in(self.reference)
        shape, source_shape = _shape(site, value), _shape(site, source)
        if not shape or not source_shape:
            raise InterventionError(f"resample_ablate draws batch rows, and the value at {site.key} has no axes")
        rows, have = shape[0], source_shape[0]
        rng = np.random.default_rng(self.seed)
        picks = rng.permutation(have)[:rows] if have >= rows else rng.choice(have, size=rows, replace=True)
        return site.ops.take(source, [int(i) for i in picks], 0)


@attrs.frozen(repr=False)
class Steer(_Helper):
    vector: Any
    scale: float = 1.0

    def __call__(self, value: Any, site: Site) -> Any:
        vector = _as_array(site, self.vector, value)
        _check_broadcasts(site, "tl.steer's vector", vector, value)
        return value + self.scale * vector


@attrs.frozen(repr=False)
class Scale(_Helper):
    factor: float

    def __attrs_post_init__(self) -> None:
        if not (hasattr(self.factor, "shape") and hasattr(self.factor, "dtype")):  # an array multiplies as it is
            _check_real("tl.scale's factor", self.factor)

    def __call__(self, value: Any, site: Site) -> Any:
        return value * self.factor


@attrs.frozen(repr=False)
class Clamp(_Helper):
    min: float | None = None
    max: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.min is None and self.max is None:
            raise ArgumentTypeError("tl.clamp needs min=, max= or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ArgumentTypeError(f"tl.clamp(min={self.min}, max={self.max}): min is above max")

    def __call__(self, value: Any, site: Site) -> Any:
        return site.ops.clip(value, self.min, self.max)


@attrs.frozen(repr=False)
class Noise(_Helper):
    std: float
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        _check_real("tl.noise's std", self.std)
        if self.std < 0:
            raise ArgumentTypeError(f"tl.noise's std is a standard deviation, at least 0, not {self.std}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ArgumentTypeError(
                f"tl.noise's seed is an integer, not {type(self.seed).__name__} ({shown(self.seed)})"
            )

    def __call__(self, value: Any, site: Site) -> Any:
        import numpy as np

        draws = np.random.default_rng(self.seed).standard_normal(_shape(site, value)) * self.std
        return value + site.ops.from_numpy(draws, value)


@attrs.frozen(repr=False)
class _Projection(_Helper):
    direction: Any
    dim: int = -1

    def component(self, value: Any, site: Site) -> Any:
        """The part of ``value`` along the normalized direction, on axis ``dim``."""
        import numpy as np

        shape = _shape(site, value)
        axis = _axis(self.dim, len(shape), site)
        d = _numpy(site, self.direction).reshape(-1)
        if d.size != shape[axis]:
            raise InterventionError(
                f"the direction has {d.size} entries, the value at {site.key} has {shape[axis]} along axis {self.dim}"
            )
        norm = float(np.linalg.norm(d))
        if not norm > 0 or not np.isfinite(norm):
            raise InterventionError(f"the direction at {site.key} has norm {norm}: it must be finite and non-zero")
        unit = site.ops.from_numpy((d / norm).reshape([-1 if i == axis else 1 for i in range(len(shape))]), value)
        return site.ops.sum(value * unit, axis) * unit


@attrs.frozen(repr=False)
class ProjectOnto(_Projection):
    def __call__(self, value: Any, site: Site) -> Any:
        return self.component(value, site)


@attrs.frozen(repr=False)
class ProjectOff(_Projection):
    def __call__(self, value: Any, site: Site) -> Any:
        return value - self.component(value, site)


@attrs.frozen(repr=False)
class SwapWith(_Helper):
    other: Any

    def __call__(self, value: Any, site: Site) -> Any:
        # A copy: the model may write into what it is given, and the other trace must keep its values.
        return site.ops.copy(site.value_in(self.other))


@attrs.frozen(repr=False)
class SpliceModule(_Helper, ModuleSplice):
    replacement: Callable[..., Any]

    def __attrs_post_init__(self) -> None:
        if not callable(self.replacement):
            raise ArgumentTypeError(
                f"tl.splice_module takes a callable to run instead of the module, not {type(self.replacement).__name__}"
            )

    def __call__(self, value: Any, site: Site) -> Any:
        raise InterventionError("tl.splice_module replaces a module's call; it does not edit a value")


_NAMES: dict[type, str] = {
    ZeroAblate: "zero_ablate",
    MeanAblate: "mean_ablate",
    ResampleAblate: "resample_ablate",
    Steer: "steer",
    Scale: "scale",
    Clamp: "clamp",
    Noise: "noise",
    ProjectOnto: "project_onto",
    ProjectOff: "project_off",
    SwapWith: "swap_with",
    SpliceModule: "splice_module",
}


def zero_ablate() -> ZeroAblate:
    """The value becomes zeros of its shape and dtype."""
    return ZeroAblate()


def mean_ablate(reference: Any = None, dims: Sequence[int] = (0,)) -> MeanAblate:
    """The value becomes its mean over ``dims`` (the batch), broadcast back; with ``reference``, that trace's."""
    return MeanAblate(reference, tuple(int(d) for d in dims))


def resample_ablate(reference: Any, seed: int = 0) -> ResampleAblate:
    """The value becomes the same site's value in ``reference``, its batch rows drawn by a seeded permutation."""
    return ResampleAblate(reference, int(seed))


def steer(vector: Any, scale: float = 1.0) -> Steer:
    """``value + scale * vector``, with the framework's broadcasting."""
    _check_real("tl.steer's scale", scale)
    return Steer(vector, float(scale))


def scale(factor: float) -> Scale:
    """``value * factor``."""
    real = isinstance(factor, numbers.Real) and not isinstance(factor, bool)
    return Scale(float(factor) if real else factor)  # a NumPy scalar as the number it is


def clamp(min: float | None = None, max: float | None = None) -> Clamp:
    """The value clamped to ``[min, max]`` (either may be left out)."""
    return Clamp(min, max)


def noise(std: float, seed: int = 0) -> Noise:
    """``value + std * N(0, 1)``, the same numbers for the same seed and shape, in every framework."""
    _check_real("tl.noise's std", std)
    return Noise(float(std), int(seed) if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) else seed)


def project_onto(direction: Any, dim: int = -1) -> ProjectOnto:
    """Only the component along ``direction`` (normalized) on axis ``dim``."""
    return ProjectOnto(direction, int(dim))


def project_off(direction: Any, dim: int = -1) -> ProjectOff:
    """All but the component along ``direction`` (normalized) on axis ``dim``."""
    return ProjectOff(direction, int(dim))


def swap_with(other_trace: Any) -> SwapWith:
    """The value at the same site in ``other_trace`` (activation patching: run B with A's value here)."""
    return SwapWith(other_trace)


def splice_module(replacement: Callable[..., Any]) -> SpliceModule:
    """At a module site: ``replacement(*args, **kwargs)`` runs instead of the module's own forward."""
    return SpliceModule(replacement)


# -- saved with a trace (tl.save): the built-in helpers whose arguments are data ----------------
def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _maybe_number(value: Any) -> float | None:
    return None if value is None else _number(value)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _array(value: Any) -> Any:
    if not hasattr(value, "shape"):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return value


# name -> (argument names, how each is checked), for helpers that hold no trace and no code
_SAVED: dict[str, tuple[Callable[..., Any], dict[str, Callable[[Any], Any]]]] = {
    "zero_ablate": (ZeroAblate, {}),
    "mean_ablate": (MeanAblate, {"dims": lambda v: tuple(_int(d) for d in v)}),
    "steer": (Steer, {"vector": _array, "scale": _number}),
    "scale": (Scale, {"factor": _number}),
    "clamp": (Clamp, {"min": _maybe_number, "max": _maybe_number}),
    "noise": (Noise, {"std": _number, "seed": _int}),
    "project_onto": (ProjectOnto, {"direction": _array, "dim": _int}),
    "project_off": (ProjectOff, {"direction": _array, "dim": _int}),
}


def saved_form(helper: Any) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` of a built-in helper that can be saved; None for one that holds a trace or code."""
    name = _NAMES.get(type(helper))
    if name not in _SAVED or (isinstance(helper, MeanAblate) and helper.reference is not None):
        return None
    return name, {field: getattr(helper, field) for field in _SAVED[name][1]}


def from_saved(name: str, arguments: dict[str, Any]) -> Any:
    """The helper :func:`saved_form` described; ValueError or TypeError for anything else."""
    if name not in _SAVED:
        raise ValueError(f"{name!r} is not a built-in helper that a trace file can hold")
    make, checks = _SAVED[name]
    if set(arguments) != set(checks):
        raise ValueError(f"{name} takes the arguments {sorted(checks)}, not {sorted(arguments)}")
    return make(**{field: check(arguments[field]) for field, check in checks.items()})
