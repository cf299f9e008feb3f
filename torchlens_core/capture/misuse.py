"""Typed errors for the two commonest wrong calls of ``tl.trace``, in place of a framework's error from deep inside.

- **A model class instead of a model**: ``tl.trace(ResNet, x)`` would call the
  class, building a model with ``x`` as its first constructor argument.
  Refused before anything runs.
- **An input of another framework**: a NumPy array given to a torch model
  fails in its first layer, 20 frames down, with an error about argument
  types. Inputs are not checked up front (a model may convert what it is
  given itself, ``torch.as_tensor(x)``); only when the forward raises is
  each input looked at, and an array-like one that is not the backend's
  array named in a typed error raised from the framework's.
"""

from __future__ import annotations

import inspect
from typing import Any

from torchlens_core.backend.arrays import is_array_of
from torchlens_core.ir import tree
from torchlens_core.ir.errors import ArgumentTypeError, TorchLensError


def refuse_class(model: Any, call: str = "tl.trace") -> None:
    """Raise ArgumentTypeError if ``model`` is a class rather than a model or function."""
    if inspect.isclass(model):
        name = model.__qualname__
        raise ArgumentTypeError(
            f"{call} got the class {model.__module__}.{name}, not a model: build the model first and pass it, "
            f"{call}({name}(...), x) (a class would be called with the inputs as its constructor's arguments)"
        )


def foreign_input_error(
    backend: str, args: tuple[Any, ...], kwargs: dict[str, Any], raised: BaseException
) -> TorchLensError | None:
    """The typed error for a forward that raised ``raised`` while an input was an array of another kind than
    ``backend``'s; None if every array-like input is the backend's (the error is then the model's own)."""
    if isinstance(raised, TorchLensError) or not isinstance(raised, Exception):
        return None
    is_ours = is_array_of(backend)
    foreign = [(path, leaf) for path, leaf in tree.leaves((args, kwargs), _array_like) if not is_ours(leaf)]
    if not foreign:
        return None
    path, leaf = foreign[0]
    where = _where(path)
    kind = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
    shape = getattr(leaf, "shape", None)
    first_line = (str(raised).strip().splitlines() or [""])[0][:200]
    return ArgumentTypeError(
        f"the model raised {type(raised).__name__} ({first_line}) with {where} a {kind}"
        f"{f' of shape {tuple(shape)}' if shape is not None else ''}, which is not a {backend} array: the "
        f"{backend} backend traces a model on its own framework's arrays. Convert the input first (for a NumPy "
        f"array given to a torch model: torch.as_tensor(x)), or trace with the backend of the framework the model "
        f"is written in (tl.trace(model, x, backend=...); tl.backends() lists them)"
    )


def _array_like(value: Any) -> bool:
    """An array of some framework: has a shape and a dtype (NumPy, torch, JAX, TensorFlow, Paddle, tinygrad)."""
    return not isinstance(value, (str, bytes, type)) and hasattr(value, "shape") and hasattr(value, "dtype")


def _where(path: tuple[Any, ...]) -> str:
    """``(0, 1, 'x')`` in ``(args, kwargs)`` -> ``"input 1, ['x']"``, as the user wrote the call."""
    if not path:
        return "an input"
    head, *rest = path
    if head == 0 and rest:
        first, *rest = rest
        return f"input {first}" + "".join(f"[{k!r}]" for k in rest)
    if head == 1 and rest:
        first, *rest = rest
        return f"keyword input {first!r}" + "".join(f"[{k!r}]" for k in rest)
    return "an input"
