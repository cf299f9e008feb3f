"""Both sides of the Keras 3 pairs: one Keras model, built on whichever backend this process runs.

Keras picks its backend once, from ``KERAS_BACKEND``, when it is first
imported; so each side is a small module (:mod:`.keras_tf`,
:mod:`.keras_torch`, :mod:`.keras_jax`) that sets the variable on import,
before anything imports Keras, and takes its ``build`` from
:func:`backend_build`. Nothing here imports Keras at module level.

Side a (TensorFlow): builds the row, sets the weights to unit scale (keras_hub
initializes with std 0.02, which hides a tanh GELU or an untransposed query
under 1e-4), writes ``model.weights.h5`` (``model.save_weights``), the inputs
and the untraced output, records the layers in call order, traces and saves.

Side b (PyTorch or JAX): builds the same row, ``load_weights``, checks its
untraced output against side a's, traces the correct model, then one variant
per porting bug, each on a freshly built model with the weights loaded:

- ``norm_eps``: the first normalization layer in call order gets another
  ``epsilon`` (the other framework's usual default, else 1e-1);
- ``activation``: the first layer in call order whose ``activation`` attribute
  is a known function gets its variant (gelu <-> tanh-approximated gelu, relu
  -> gelu, silu -> gelu...);
- ``untransposed``: the first square kernel in call order (a Dense's, or an
  EinsumDense's whose input and output sizes agree) is overwritten by its
  transpose after ``load_weights``;
- ``dropout_on``: every Dropout layer with a rate above 0 drops as in training
  (on torch its own call with ``training=True``; on JAX ``keras.random.dropout``
  with a fixed integer seed per layer: see :func:`_dropout_on`); the model's
  other layers, batch norms included, stay in inference;
- ``lost_padding``: the first convolution with ``padding="same"`` and a kernel
  above 1 whose model still runs with ``"valid"``;
- ``unpermuted_conv``: n/a (one Keras source: no kernel layout to convert).

The ground truth of each site is the layer the bug was injected into, named
by its Keras layer path (layer names from the model down, as TorchLens's tf
backend names modules). TorchLens's torch and jax backends name Keras layers
the same way; ``KERAS_MENAGERIE_TORCH_MODULES=1`` (an experiment, torch only)
registers the layers as torch submodules before tracing instead, and the
sites' side b paths are then their torch paths.
"""

from __future__ import annotations

import functools
import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.compare_menagerie import bugs as B
from bench.compare_menagerie.common import REL_TOL, build_variants, failure, gap, write_json
from bench.compare_menagerie.keras_archs import FRAMES, IMAGE, SEQ, VOCAB, KerasArch

SEED = 0
TL_BACKEND = {"tensorflow": "tf", "torch": "torch", "jax": "jax"}
WEIGHTS = "model.weights.h5"


def backend_build(backend: str) -> Callable[[KerasArch, pathlib.Path], dict[str, Any]]:
    """Select Keras's ``backend`` for this process (before Keras is imported) and return the side's ``build``."""
    current = os.environ.get("KERAS_BACKEND")
    if "keras" in sys.modules and current != backend:
        raise RuntimeError(f"keras is already imported with backend {current!r}; this side needs {backend!r}")
    os.environ["KERAS_BACKEND"] = backend

    def build(arch: KerasArch, folder: pathlib.Path) -> dict[str, Any]:
        import keras

        if keras.backend.backend() != backend:
            raise RuntimeError(f"Keras runs on {keras.backend.backend()!r}, not {backend!r}")
        return build_a(arch, folder) if backend == "tensorflow" else build_b(arch, folder)

    return build


# -- the model ------------------------------------------------------------------------------------------------
def small_cnn() -> Any:
    import keras
    from keras import layers

    x = keras.Input((IMAGE, IMAGE, 3), name="image")
    h = layers.Conv2D(8, 3, padding="same", name="conv1")(x)
    h = layers.BatchNormalization(name="bn1")(h)
    h = layers.ReLU(name="relu1")(h)
    h = layers.Conv2D(16, 3, strides=2, padding="same", name="conv2")(h)
    h = layers.BatchNormalization(name="bn2")(h)
    h = layers.Activation("relu", name="relu2")(h)
    h = layers.Conv2D(16, 3, padding="same", name="conv3")(h)
    h = layers.GlobalAveragePooling2D(name="pool")(h)
    h = layers.Dropout(0.2, name="dropout")(h)
    h = layers.Dense(16, activation="gelu", name="fc")(h)
    h = layers.LayerNormalization(epsilon=1e-5, name="norm")(h)
    out = layers.Dense(10, name="head")(h)
    return keras.Model(x, out, name="small_cnn")


def make_model(arch: KerasArch) -> Any:
    """The row's model, built afresh in a cleared session (so that generated layer names repeat)."""
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    if arch.source == "hub":
        import keras_hub

        return getattr(keras_hub.models, arch.cls)(**arch.kwargs)
    if arch.source == "app":
        return getattr(keras.applications, arch.cls)(weights=None, **arch.kwargs)
    if arch.source == "custom":
        return globals()[arch.cls]()
    raise ValueError(f"unknown source {arch.source!r}")


def draw_inputs(arch: KerasArch, model: Any) -> dict[str, np.ndarray]:
    """Inputs from the model's own input specs: token ids within the vocabulary, masks of ones, segment ids of
    zeros, normal floats; a free dimension is 8 tokens, a 32-pixel side or 32 frames (``arch.shapes`` wins)."""
    import keras

    rng = np.random.default_rng(SEED)
    specs = model.input
    named = specs if isinstance(specs, dict) else {"x": specs}
    out = {}
    for name, spec in named.items():
        dtype = keras.backend.standardize_dtype(spec.dtype)
        dims = list(spec.shape[1:])
        free = IMAGE if len(dims) == 3 else FRAMES if "features" in name else SEQ
        shape = tuple(arch.shapes.get(name) or [1] + [free if d is None else int(d) for d in dims])
        if dtype == "bool" or "mask" in name:
            value = np.ones(shape, dtype=dtype)
        elif "int" in dtype and "segment" in name:
            value = np.zeros(shape, dtype=dtype)
        elif "int" in dtype:
            value = rng.integers(4, VOCAB, shape).astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(dtype)
        out[name] = value
    return out


def as_inputs(model: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Backend tensors, as the model takes them: a dict, or the one tensor."""
    import keras

    tensors = {k: keras.ops.convert_to_tensor(v) for k, v in arrays.items()}
    return tensors if isinstance(model.input, dict) else tensors["x"]


def to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu()
    return np.asarray(value, dtype=np.float32)


def output_arrays(out: Any) -> dict[str, np.ndarray]:
    """Every float field of the output, the main one first (``sequence_output`` of a backbone that has it)."""
    if isinstance(out, dict):
        keys = sorted(out, key=lambda k: (k != "sequence_output", list(out).index(k)))
        return {
            str(k): to_numpy(out[k]) for k in keys if np.issubdtype(np.asarray(to_numpy(out[k])).dtype, np.floating)
        }
    if isinstance(out, list | tuple):
        return {str(i): to_numpy(v) for i, v in enumerate(out)}
    return {"output": to_numpy(out)}


def unit_scale(model: Any) -> None:
    """Weights at unit scale: each kernel std 1/sqrt(fan-in), each embedding table std 1, each norm scale
    1 + 0.1 N(0, 1), each bias or shift 0.1 N(0, 1), batch norms' running statistics away from the identity."""
    rng = np.random.default_rng(SEED + 1)
    for v in model.weights:
        dtype = str(v.dtype)
        if "float" not in dtype:
            continue
        path = v.path.lower()
        shape = tuple(v.shape)
        current = np.asarray(v.numpy() if hasattr(v, "numpy") else v.value)
        noise = rng.standard_normal(shape).astype(np.float32)
        if path.endswith("moving_mean"):
            value = 0.1 * noise
        elif path.endswith("moving_variance"):
            value = (0.5 + rng.random(shape)).astype(np.float32)
        elif not v.trainable:
            continue  # fixed tables and counters are part of the architecture
        elif len(shape) >= 2:
            if "embedding" in path or "embeddings" in path:
                fan = 1
            elif len(shape) == 3 and "output" not in path:  # query/key/value (hidden, heads, head_dim)
                fan = shape[0]
            else:
                fan = int(np.prod(shape[:-1]))
            value = noise / np.sqrt(max(fan, 1))
        elif current.size and np.all(current == 1):
            value = 1 + 0.1 * noise
        elif current.size and np.all(current == 0):
            value = 0.1 * noise
        else:
            continue
        v.assign(value.astype(dtype))


# -- layers: paths and call order -----------------------------------------------------------------------------------
def layer_paths(model: Any) -> dict[int, str]:
    """Each layer's path, as TorchLens's backends name it (:mod:`torchlens_core.backend.keras_layers`); the model
    itself is the root, ``""``."""
    from torchlens_core.backend import keras_layers

    return {id(model): "", **{id(layer): path for path, layer in keras_layers.layer_paths(model)}}


def call_order(model: Any, inputs: Any) -> list[Any]:
    """The layers in the order a plain call first calls them (``Layer.__call__`` wrapped for one call)."""
    import keras

    order: dict[int, Any] = {}
    original = keras.layers.Layer.__call__

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        order.setdefault(id(self), self)
        return original(self, *args, **kwargs)

    keras.layers.Layer.__call__ = wrapped
    try:
        model(inputs, training=False)
    finally:
        keras.layers.Layer.__call__ = original
    return [layer for key, layer in order.items() if key != id(model)]


def _activation_name(fn: Any) -> str | None:
    if isinstance(fn, functools.partial):
        base = getattr(fn.func, "__name__", None)
        return f"{base}_approximate" if base == "gelu" and fn.keywords.get("approximate") else base
    return getattr(fn, "__name__", None) if callable(fn) else None


def activation_variants(name: str) -> list[tuple[str, Callable[..., Any]]]:
    """The wrong twins of activation ``name``, most plausible first: (name, function). A GELU whose two forms stay
    within tolerance (small activations) falls back to ReLU."""
    import keras

    gelu = keras.activations.gelu
    variants = {
        "gelu": ("gelu_approximate", functools.partial(gelu, approximate=True)),
        "gelu_approximate": ("gelu", functools.partial(gelu, approximate=False)),
        "relu": ("gelu", gelu),
        "silu": ("gelu", gelu),
        "swish": ("gelu", gelu),
        "relu6": ("relu", keras.activations.relu),
        "leaky_relu": ("relu", keras.activations.relu),
        "hard_swish": ("swish", keras.activations.silu),
        "hard_silu": ("swish", keras.activations.silu),
        "tanh": ("gelu", gelu),
        "sigmoid": ("hard_sigmoid", keras.activations.hard_sigmoid),
    }
    found = [variants[name]] if name in variants else []
    if name in ("gelu", "gelu_approximate"):
        found.append(("relu", keras.activations.relu))
    return found


def describe(layers: list[Any], paths: dict[int, str]) -> list[dict[str, Any]]:
    """What the bug sites need to know of each layer, in call order."""
    found = []
    for layer in layers:
        eps = getattr(layer, "epsilon", None)
        found.append(
            {
                "path": paths.get(id(layer), layer.name),
                "type": type(layer).__name__,
                "eps": float(eps) if isinstance(eps, float) else None,
                "activation": _activation_name(getattr(layer, "activation", None)),
                "dropout": float(layer.rate) if type(layer).__name__ == "Dropout" else None,
                "padding": getattr(layer, "padding", None) if hasattr(layer, "kernel_size") else None,
                "params": len(layer.trainable_weights),
            }
        )
    return found


# -- side a ---------------------------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    import keras

    found = {"keras": keras.__version__, "backend": keras.backend.backend()}
    try:
        import keras_hub

        found["keras_hub"] = keras_hub.__version__
    except ImportError:
        pass
    framework = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}[keras.backend.backend()]
    found[framework] = __import__(framework).__version__
    return found


# Opt-in (default off): on the torch backend, make Keras's layers torch submodules of their parents before tracing.
# A Keras functional model keeps its layers in a list, not as torch children, so `named_modules()` is the model alone
# and TorchLens puts every op at the top level; with this set, the trace knows the layers (for an experiment on
# whether the comparison then lands in the injected layer: the default run traces the model as Keras builds it).
TORCH_MODULES = "KERAS_MENAGERIE_TORCH_MODULES"


def torch_modules(model: Any) -> dict[int, str]:
    """Register every Keras layer as a torch child of its parent (under its Keras name where its parent holds it in
    no attribute) and return each layer's torch path, as TorchLens's torch backend names it."""
    seen: set[int] = set()

    def walk(layer: Any) -> None:
        if id(layer) in seen:
            return
        seen.add(id(layer))
        held = {id(m) for m in layer._modules.values()}
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if id(child) not in held:
                name = child.name if child.name not in layer._modules else f"{child.name}_2"
                layer._modules[name] = child
                held.add(id(child))
            walk(child)

    walk(model)
    return {id(m): name for name, m in model.named_modules()}


def b_paths(model: Any) -> dict[int, str]:
    """Side b's layer paths as its trace will name them: the Keras paths, or the torch ones (:data:`TORCH_MODULES`)."""
    import keras

    if keras.backend.backend() == "torch" and os.environ.get(TORCH_MODULES) == "1":
        return torch_modules(model)
    return layer_paths(model)


def _trace(model: Any, inputs: Any, folder: pathlib.Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    import keras

    import torchlens as tl

    b_paths(model)  # registers the torch modules where asked to
    started = time.perf_counter()
    trace = tl.trace(model, inputs, backend=TL_BACKEND[keras.backend.backend()])
    seconds = round(time.perf_counter() - started, 3)
    tl.save(trace, folder / "trace")
    traced = output_arrays(trace.output) if trace.output is not None else {}
    return {"ops": trace.num_ops, "trace_seconds": seconds}, traced


def build_a(arch: KerasArch, folder: pathlib.Path) -> dict[str, Any]:
    """Side a: build on TensorFlow, unit-scale weights, write weights, inputs and output, trace."""
    model = make_model(arch)
    unit_scale(model)
    arrays = draw_inputs(arch, model)
    np.savez(folder / "inputs.npz", **arrays)
    model.save_weights(folder / WEIGHTS)
    inputs = as_inputs(model, arrays)
    write_json(
        folder / "config.json",
        {
            "arch": arch.name,
            "source": arch.source,
            "cls": arch.cls,
            "kwargs": arch.kwargs,
            "side_a": _versions(),
            "model_config": _safe_config(model),
        },
    )
    plain = output_arrays(model(inputs, training=False))
    (folder / "a").mkdir(exist_ok=True)
    np.savez(folder / "a" / "output.npz", **plain)
    paths = layer_paths(model)
    meta: dict[str, Any] = {
        "status": "built",
        "framework": "keras-tf",
        "class": type(model).__name__,
        **_versions(),
        "output_fields": list(plain),
        "params": len(model.weights),
        "modules": describe(call_order(model, inputs), paths),
    }
    done, traced = _trace(model, inputs, folder / "a")
    meta.update(done)
    meta["trace_vs_plain"] = gap(plain, traced) if traced else {"rel": None, "why": "no output recorded"}
    if traced and not meta["trace_vs_plain"]["rel"] <= REL_TOL:
        meta["note"] = "the traced output differs from the plain call's"
    return meta


def _safe_config(model: Any) -> Any:
    try:
        return model.get_config() if hasattr(model, "get_config") and type(model).__name__ != "Functional" else None
    except Exception:  # noqa: BLE001 - the config is a record, not needed
        return None


# -- side b ---------------------------------------------------------------------------------------------------
class KerasSide:
    """Side b of one architecture: side a's inputs and output, and models built with side a's weights."""

    def __init__(self, arch: KerasArch, folder: pathlib.Path) -> None:
        self.arch, self.folder = arch, folder
        self.arrays = dict(np.load(folder / "inputs.npz"))
        self.reference = dict(np.load(folder / "a" / "output.npz"))

    def model(self) -> tuple[Any, Any]:
        model = make_model(self.arch)
        model.load_weights(self.folder / WEIGHTS)
        return model, as_inputs(model, self.arrays)


def build_b(arch: KerasArch, folder: pathlib.Path) -> dict[str, Any]:
    """Every variant of side b: ``b/<variant>/meta.json`` (and ``trace/`` where traced)."""
    import keras

    side = KerasSide(arch, folder)
    summary: dict[str, Any] = {"framework": f"keras-{TL_BACKEND[keras.backend.backend()]}", **_versions()}
    model, inputs = side.model()
    out = output_arrays(model(inputs, training=False))
    agreement = gap(side.reference, out)
    summary["correct"] = agreement
    correct_dir = folder / "b" / "correct"
    correct_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"variant": "correct", "untraced": agreement}
    if not agreement["rel"] <= REL_TOL:
        meta.update(
            status="disagrees",
            reason=f"the untraced outputs differ: rel {agreement['rel']:.3g} ({agreement.get('why', 'values')})",
        )
        try:
            done, _ = _trace(model, inputs, correct_dir)
            meta.update(done)
        except Exception as exc:  # noqa: BLE001
            meta["trace_error"] = failure("trace", exc)["error"]
        write_json(correct_dir / "meta.json", meta)
        summary["status"] = "disagrees"
        return summary
    done, traced = _trace(model, inputs, correct_dir)
    meta.update(status="built", **done, trace_vs_plain=gap(out, traced) if traced else None)
    write_json(correct_dir / "meta.json", meta)
    summary["status"] = "built"
    summary.update(build_variants(folder, B.BUGS, lambda bug, bug_dir: _bug(side, bug, bug_dir)))
    return summary


def _find(model: Any, inputs: Any, path: str) -> Any:
    """The layer at ``path`` of a freshly built model (paths repeat: the session is cleared before each build)."""
    paths = layer_paths(model)
    for layer in call_order(model, inputs):
        if paths.get(id(layer)) == path:
            return layer
    raise LookupError(f"no layer at {path!r}")


def _square(layer: Any) -> bool:
    if type(layer).__name__ not in ("Dense", "EinsumDense") or getattr(layer, "_kernel", None) is None:
        return False
    kernel = layer._kernel
    shape = tuple(kernel.shape)
    return (len(shape) == 2 and shape[0] == shape[1]) or (
        len(shape) == 3 and (shape[0] == shape[1] * shape[2] or shape[0] * shape[1] == shape[2])
    )


def _transpose_kernel(layer: Any) -> str:
    import keras

    kernel = layer._kernel
    value = np.asarray(keras.ops.convert_to_numpy(kernel.value))
    shape = value.shape
    n = int(np.sqrt(value.size))
    kernel.assign(value.reshape(n, n).T.reshape(shape))
    return f"kernel {shape} viewed as ({n}, {n}) and transposed"


def _dropout_on(layer: Any, seed: int | None) -> None:
    """``layer`` (a Dropout) drops as in training: its own call with ``training=True`` (``seed`` None), or
    ``keras.random.dropout`` with a fixed integer ``seed``. The JAX side uses the latter, so that the plain call
    and the traced one draw one mask: the layer's own seed generator is a variable each plain call advances."""
    import keras

    original = layer.call

    def call(inputs: Any, training: Any = None, **kwargs: Any) -> Any:
        if seed is None:
            return original(inputs, training=True, **kwargs)
        shape = layer._get_noise_shape(inputs) if hasattr(layer, "_get_noise_shape") else None
        return keras.random.dropout(inputs, layer.rate, noise_shape=shape, seed=seed)

    layer.call = call


def _has_sublayers(layer: Any) -> bool:
    return any(True for _ in layer._flatten_layers(include_self=False, recursive=False))


def _candidates(bug: str, model: Any, inputs: Any) -> list[tuple[str, Any, str]]:
    """(layer path, injector(layer) -> detail, what) for each layer the bug can act in, in call order."""
    import keras

    paths = layer_paths(model)
    found: list[tuple[str, Any, str]] = []
    for layer in call_order(model, inputs):
        path = paths.get(id(layer), layer.name)
        if bug == "norm_eps" and isinstance(getattr(layer, "epsilon", None), float) and not _has_sublayers(layer):
            eps = layer.epsilon
            for wrong in (1e-5 if eps >= 1e-4 else 1e-3, 1e-1):
                found.append((path, functools.partial(_set_attr, "epsilon", wrong), f"epsilon {eps:g} -> {wrong:g}"))
        elif bug == "activation":
            name = _activation_name(getattr(layer, "activation", None))
            for wrong, fn in activation_variants(name) if name else []:
                found.append((path, functools.partial(_set_attr, "activation", fn), f"activation {name} -> {wrong}"))
        elif bug == "untransposed" and _square(layer):
            found.append((path, _transpose_kernel, "square kernel copied without its transpose"))
        elif bug == "dropout_on" and isinstance(layer, keras.layers.Dropout) and layer.rate > 0:
            found.append((path, _dropout_on, f"dropout (rate {layer.rate:g}) in training mode"))
        elif (
            bug == "lost_padding"
            and getattr(layer, "padding", None) == "same"
            and max(getattr(layer, "kernel_size", (1,))) > 1
        ):
            found.append((path, functools.partial(_set_attr, "padding", "valid"), "padding same -> valid"))
    return found


def _set_attr(name: str, value: Any, layer: Any) -> str:
    setattr(layer, name, value)
    return f"{name} = {getattr(value, '__name__', value)!s}"


def _bug(side: KerasSide, bug: str, folder: pathlib.Path) -> dict[str, Any]:
    """Inject ``bug`` on a fresh model, check that it shows in the untraced output, trace it."""
    import keras

    record: dict[str, Any] = {"variant": bug}
    if bug == "unpermuted_conv":
        return {**record, "status": "n/a", "reason": "one Keras source on both sides: no kernel layout to convert"}
    model, inputs = side.model()
    candidates = _candidates(bug, model, inputs)
    if not candidates:
        return {**record, "status": "n/a", "reason": f"no layer this bug acts in ({bug})"}
    if bug == "dropout_on":  # every dropout at once: the first in call order is where it must be found
        candidates = [("*", None, candidates[0][2])]
    tried: list[dict[str, Any]] = []
    stateless = False
    for path, inject, what in candidates[:8]:
        model, inputs = side.model()
        if bug == "dropout_on":
            sites = [p for p, *_ in _candidates(bug, model, inputs)]
            stateless = keras.backend.backend() == "jax"
            for k, p in enumerate(sites):
                _dropout_on(_find(model, inputs, p), SEED + 10 + k if stateless else None)
            detail = f"{what} (every dropout: {len(sites)}; " + (
                "keras.random.dropout with an integer seed per layer)" if stateless else "the layer's own call)"
            )
        else:
            sites = [path]
            detail = f"{path}: {what}"
            inject(_find(model, inputs, path))
        try:
            out = output_arrays(model(inputs, training=False))
        except Exception as exc:  # noqa: BLE001 - the model no longer runs (a padding its shapes need): next one
            tried.append({"detail": detail, "error": failure("call", exc)["error"]})
            continue
        seen = gap(side.reference, out)
        tried.append({"detail": detail, "untraced": seen})
        if not seen["rel"] > REL_TOL:
            continue
        composite = _has_sublayers(_find(model, inputs, sites[0]))
        on_b = b_paths(model)
        keras_paths = layer_paths(model)
        by_path = {keras_paths.get(id(layer)): layer for layer in call_order(model, inputs)}
        injection = B.Injection(
            bug,
            detail,
            [B.Site(p, on_b.get(id(by_path[p]), p), exclusive=composite) for p in sites],
            sorted(set(on_b.values()) - {""}),
        )
        folder.mkdir(parents=True, exist_ok=True)
        done, traced = _trace(model, inputs, folder)
        record.update(status="built", injection=injection.record(), untraced=seen, tried=tried, **done)
        if bug != "dropout_on" or stateless:  # the layer's own dropout draws new masks in the traced call
            record["trace_vs_plain"] = gap(out, traced) if traced else None
        return record
    return {
        **record,
        "status": "not visible",
        "tried": tried,
        "reason": f"the untraced output stays within rel {REL_TOL:g} of side a's (or the model stops running): "
        + "; ".join(
            f"{t['detail']}: " + (f"rel {t['untraced']['rel']:.2g}" if "untraced" in t else t["error"]) for t in tried
        )[:600],
    }
