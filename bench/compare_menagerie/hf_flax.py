"""Side b of the HF torch/Flax pair: transformers 4.x's Flax model, from side a's config and converted weights.

Runs in a virtualenv with JAX and no torch: the weights arrive as side a's
``weights.npz`` and go through :func:`bench.compare_menagerie.convert.convert`
(not transformers' own pt->flax loader, which imports torch). The Flax model's
call is traced as its linen ``module.apply`` with the variables and arguments
the model wrapper passes it (recorded from one plain call), so that the trace
knows the module paths; the wrapper itself is a plain function to TorchLens.

Variants: ``correct``, then one per injected bug (:mod:`.bugs`); a variant
whose untraced output equals side a's is "not visible" and is not traced.
"""

from __future__ import annotations

import contextlib
import inspect
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from bench.compare_menagerie import bugs as B
from bench.compare_menagerie.common import REL_TOL, build_variants, failure, gap, read_json, write_json
from bench.compare_menagerie.convert import Conversion, convert, source_name, split
from bench.compare_menagerie.hf_archs import Arch

SEED = 0
# config keys that differ between transformers releases without changing the model
_NOISE = {
    "transformers_version",
    "architectures",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "id2label",
    "label2id",
    "output_attentions",
    "output_hidden_states",
    "use_cache",
    "return_dict",
    "tie_word_embeddings",
    "_attn_implementation_autoset",
}


def output_arrays(out: Any) -> dict[str, np.ndarray]:
    items = out.items() if hasattr(out, "items") else enumerate(out if isinstance(out, tuple) else (out,))
    found = {}
    for k, v in items:
        if hasattr(v, "shape") and hasattr(v, "dtype") and np.issubdtype(np.asarray(v).dtype, np.floating):
            found[str(k)] = np.asarray(v, dtype=np.float32)
    return found


def config_differences(side_a: dict[str, Any], config: Any) -> list[dict[str, Any]]:
    """Config values side b's transformers sets otherwise than side a's for the same kwargs."""
    mine = config.to_dict()
    found = []
    for k in sorted(set(side_a) & set(mine) - _NOISE):
        if side_a[k] != mine[k] and not (isinstance(side_a[k], list | tuple) and list(side_a[k]) == list(mine[k])):
            found.append({"key": k, "a": side_a[k], "b": mine[k]})
    for k in sorted(set(side_a) - set(mine) - _NOISE):
        found.append({"key": k, "a": side_a[k], "b": "(absent)"})
    return found


def jax_compat() -> list[str]:
    """Shims for what transformers 4.57's Flax models call and this JAX no longer has; each one is listed in the
    record. ``jnp.clip(a_min=, a_max=)``: JAX 0.10 takes only ``min``/``max`` (Flax T5's relative position
    buckets)."""
    import jax.numpy as jnp

    applied = []
    if "a_max" not in inspect.signature(jnp.clip).parameters and not getattr(jnp.clip, "_menagerie_shim", False):
        clip = jnp.clip

        def shim(
            x: Any, min: Any = None, max: Any = None, *, a_min: Any = None, a_max: Any = None, **kwargs: Any
        ) -> Any:
            return clip(x, min if a_min is None else a_min, max if a_max is None else a_max, **kwargs)

        shim._menagerie_shim = True  # type: ignore[attr-defined]
        jnp.clip = shim
        applied.append("jnp.clip(a_min=, a_max=) -> jnp.clip(min, max)")
    return applied


class FlaxSide:
    """One architecture's Flax builds: the config, the converted weights, and a traced call per variant."""

    def __init__(self, arch: Arch, folder: pathlib.Path) -> None:
        import transformers

        self.arch, self.folder = arch, folder
        self.spec = read_json(folder / "config.json")
        self.cls = getattr(transformers, arch.side_class("flax"))
        self.weights = dict(np.load(folder / "weights.npz"))
        self.reference = dict(np.load(folder / "a" / "output.npz"))
        a_meta = read_json(folder / "a" / "meta.json")
        self.modules_a = a_meta["modules"]
        self.dropout_calls = a_meta.get("dropout_calls", [])
        self.inputs = {
            k: (v.astype(np.int32) if v.dtype.kind == "i" else v) for k, v in np.load(folder / "inputs.npz").items()
        }
        self.conversion: Conversion | None = None
        self.module_map: dict[str, str] = {}

    # -- building --------------------------------------------------------------------------------------------
    def config(self, **changes: Any) -> Any:
        import transformers

        config = getattr(transformers, self.arch.config_class)(**self.arch.config)
        for k, v in changes.items():
            setattr(config, k, v)
        return config

    def model(self, config: Any) -> tuple[Any, dict[str, tuple[tuple[str, ...], tuple[int, ...]]]]:
        """The Flax model (its own random init) and its parameter leaves: dotted path -> (tree path, shape)."""
        import jax

        model = self.cls(config, seed=SEED, _do_init=True)
        leaves = {}
        for path, value in jax.tree_util.tree_flatten_with_path(model.params)[0]:
            keys = tuple(str(getattr(p, "key", p)) for p in path)
            name = ".".join(keys[1:] if keys[0] in ("params", "batch_stats") and self._collections(model) else keys)
            leaves[name] = (keys, tuple(value.shape))
        return model, leaves

    @staticmethod
    def _collections(model: Any) -> bool:
        return set(model.params) <= {"params", "batch_stats"}

    def params(self, model: Any, leaves: dict[str, Any], **bugs: Any) -> tuple[Any, Conversion]:
        conversion = convert(self.weights, {k: v[1] for k, v in leaves.items()}, **bugs)
        tree: dict[str, Any] = {}
        for name, (keys, _) in leaves.items():
            node = tree
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = conversion.values[name].astype(np.float32)
        return tree, conversion

    def call(self, model: Any, params: Any, train: bool = False) -> tuple[dict[str, np.ndarray], tuple[Any, ...]]:
        """A plain call, and what the wrapper passed to ``module.apply`` (variables, args, kwargs)."""
        import jax

        captured: dict[str, Any] = {}
        original = model.module.apply

        def record(variables: Any, *args: Any, **kwargs: Any) -> Any:
            captured.update(variables=variables, args=args, kwargs=kwargs)
            return original(variables, *args, **kwargs)

        extra: dict[str, Any] = {}
        if train:
            extra = {"train": True, "dropout_rng": jax.random.PRNGKey(SEED + 1)}
        object.__setattr__(model.module, "apply", record)
        try:
            out = model(**self.inputs, params=params, **extra)
        finally:
            object.__delattr__(model.module, "apply")
        return output_arrays(out), (captured["variables"], captured["args"], captured["kwargs"])

    def trace(self, model: Any, apply_args: tuple[Any, ...], folder: pathlib.Path) -> dict[str, Any]:
        import torchlens as tl

        variables, args, kwargs = apply_args
        started = time.perf_counter()
        trace = tl.trace(model.module.apply, variables, *args, backend="jax", **kwargs)
        seconds = round(time.perf_counter() - started, 3)
        tl.save(trace, folder / "trace")
        return {
            "ops": trace.num_ops,
            "trace_seconds": seconds,
            "traced_output": output_arrays(trace.output) if trace.output is not None else {},
        }

    # -- module paths --------------------------------------------------------------------------------------------
    def map_modules(self, conversion: Conversion) -> None:
        """Side a's module paths -> side b's, read off the converter's matches and walked up while the names agree."""
        found: dict[str, str] = {"": ""}
        for target, match in conversion.matches.items():
            a, b = source_name(match.source).split("."), target.split(".")
            a, b = a[:-1], b[:-1]
            while True:
                found.setdefault(".".join(a), ".".join(b))
                if not a or not b or split(a[-1:]) != split(b[-1:]):
                    break
                a, b = a[:-1], b[:-1]
        self.module_map = found

    def to_b(self, path: str) -> str:
        """Side b's path of side a's module ``path`` (through its nearest mapped ancestor)."""
        parts = path.split(".") if path else []
        for n in range(len(parts), -1, -1):
            head = ".".join(parts[:n])
            if head in self.module_map:
                return ".".join(p for p in (self.module_map[head], *parts[n:]) if p)
        return path

    def site(self, a_path: str, module_b_exists: bool = True, exclusive: bool = False) -> B.Site:
        """A site from side a's module: its own path on side b; or, where side b has no such module (an
        activation or a dropout called as a function), its parent's counterpart, or where the parent has none
        (transformers 5's torch ViT ``mlp`` is Flax's ``intermediate`` and ``output``) the module on side b that
        holds the counterpart of the last module with weights that side a ran before it (the Linear before its
        activation)."""
        if module_b_exists:
            return B.Site(a_path, self.to_b(a_path), exclusive=exclusive)
        if B.parent(a_path) in self.module_map:  # the parent has a counterpart: the call is there
            return B.Site(a_path, self.module_map[B.parent(a_path)], exclusive=True)
        before = None
        for m in self.modules_a:
            if m["path"] == a_path:
                break
            if m["params"] and m["path"] in self.module_map:  # not a parametrization's inner module
                before = m["path"]
        anchor = self.to_b(before) if before is not None else self.to_b(B.parent(a_path))
        return B.Site(a_path, B.parent(anchor) if before is not None else anchor, exclusive=True)


@contextlib.contextmanager
def _lost_padding(b_path: str) -> Iterator[None]:
    """flax.linen.Conv modules built at ``b_path`` get padding VALID (the port forgot it); others are untouched."""
    import flax.linen as nn

    owned = "__post_init__" in nn.Conv.__dict__
    original = nn.Conv.__dict__.get("__post_init__")
    inherited = nn.Conv.__post_init__
    target = tuple(b_path.split("."))

    def post_init(self: Any) -> None:
        parent = self.parent
        if isinstance(self.name, str) and isinstance(parent, nn.Module) and parent.scope is not None:
            if tuple(map(str, parent.scope.path)) + (self.name,) == target:
                object.__setattr__(self, "padding", "VALID")
        inherited(self)

    nn.Conv.__post_init__ = post_init
    try:
        yield
    finally:
        if owned:
            nn.Conv.__post_init__ = original
        else:
            del nn.Conv.__post_init__


def build(arch: Arch, folder: pathlib.Path) -> dict[str, Any]:
    """Every variant of side b of ``arch``: ``b/<variant>/meta.json`` (and ``trace/`` where traced)."""
    import transformers

    shims = jax_compat()
    side = FlaxSide(arch, folder)
    summary: dict[str, Any] = {
        "framework": "flax",
        "transformers": transformers.__version__,
        "class": side.cls.__name__,
        "shims": shims,
    }
    base = side.config()
    summary["config_differences"] = config_differences(side.spec["side_a_config"], base)
    model, leaves = side.model(base)
    params, conversion = side.params(model, leaves)
    side.conversion = conversion
    side.map_modules(conversion)
    summary["conversion"] = {
        "params": len(conversion.matches),
        "by": {h: sum(m.how == h for m in conversion.matches.values()) for h in ("name", "suffix", "shape")},
        "unused_source": conversion.unused,
        "by_shape": {t: m.source for t, m in conversion.matches.items() if m.how == "shape"},
    }
    out, apply_args = side.call(model, params)
    agreement = gap(side.reference, out)
    summary["correct"] = agreement
    correct_dir = folder / "b" / "correct"
    meta: dict[str, Any] = {"variant": "correct", "untraced": agreement}
    if not agreement["rel"] <= REL_TOL:
        # Not a correct port, so no bugs on top of it; traced all the same, to see where tl.compare puts the
        # disagreement (the report lists it apart).
        meta.update(
            status="disagrees",
            reason=f"the untraced outputs differ: rel {agreement['rel']:.3g} ({agreement.get('why', 'values')})",
        )
        try:
            meta.update(_traced(side, model, apply_args, correct_dir, out))
        except Exception as exc:  # noqa: BLE001
            meta["trace_error"] = failure("trace", exc)["error"]
        write_json(correct_dir / "meta.json", meta)
        summary["status"] = "disagrees"
        return summary
    meta.update(status="built", **_traced(side, model, apply_args, correct_dir, out))
    write_json(correct_dir / "meta.json", meta)
    summary["status"] = "built"
    summary.update(build_variants(folder, B.BUGS, lambda bug, bug_dir: _bug(side, bug, bug_dir)))
    return summary


def _traced(
    side: FlaxSide, model: Any, apply_args: tuple[Any, ...], folder: pathlib.Path, plain: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Trace and save one variant; the record holds how far the traced output is from the plain call's."""
    folder.mkdir(parents=True, exist_ok=True)
    done = side.trace(model, apply_args, folder)
    traced = done.pop("traced_output")
    return {**done, "trace_vs_plain": gap(plain, traced) if traced else None}


def _bug(side: FlaxSide, bug: str, folder: pathlib.Path) -> dict[str, Any]:
    """Inject ``bug``, check that it shows in the untraced output, trace it; the record holds its sites."""
    modules = side.modules_a
    base = side.config()
    record: dict[str, Any] = {"variant": bug}
    attempts: list[tuple[B.Injection, dict[str, Any], Any]] = []  # (injection, config changes, context)
    if bug == "activation":
        key, current = B.activation_key(base)
        sites = B.activation_sites(modules)
        if key is None:
            return {**record, "status": "n/a", "reason": "no activation key in the config with a known variant"}
        wrong = B.ACTIVATION_VARIANT[current]
        inj = B.Injection(
            bug, f"{key}: {current} -> {wrong} (every layer)", [side.site(p, module_b_exists=False) for p in sites]
        )
        attempts.append((inj, {key: wrong}, contextlib.nullcontext()))
    elif bug == "norm_eps":
        key = next((k for k in B.EPS_KEYS if isinstance(getattr(base, k, None), float)), None)
        if key is None:
            return {**record, "status": "n/a", "reason": "the norm epsilon is not a config field (hard-coded)"}
        eps = getattr(base, key)
        sites = [side.site(p) for p in B.eps_sites(modules, eps)]
        for wrong in B.eps_candidates(eps):
            attempts.append(
                (
                    B.Injection(bug, f"{key}: {eps:g} -> {wrong:g} (every norm)", sites),
                    {key: wrong},
                    contextlib.nullcontext(),
                )
            )
    elif bug in ("untransposed", "unpermuted_conv"):
        want = "transpose" if bug == "untransposed" else "permute"
        assert side.conversion is not None
        by_source = {m.source: m for m in side.conversion.matches.values()}
        chosen = None
        for m in modules:
            for p in m["params"]:
                match = by_source.get(f"{m['path']}.{p}")
                if match is None or not match.transform.startswith(want):
                    continue
                shape = side.weights[match.source].shape
                if bug == "untransposed" and shape[0] != shape[1]:
                    continue
                chosen = (m["path"], match)
                break
            if chosen:
                break
        if chosen is None:
            what = "square Linear weight" if want == "transpose" else "conv kernel"
            return {**record, "status": "n/a", "reason": f"no {what} is converted with a {want}"}
        a_path, match = chosen
        inj = B.Injection(
            bug,
            f"{match.source} -> {match.target} copied without its {want}",
            [B.Site(a_path, match.target.rsplit(".", 1)[0])],
        )
        attempts.append((inj, {}, contextlib.nullcontext()))
        record["converter_bug"] = {"untransposed" if want == "transpose" else "unpermuted": [match.target]}
    elif bug == "dropout_on":
        if "train" not in inspect.signature(side.cls.__call__).parameters:
            return {**record, "status": "n/a", "reason": "the Flax model's call takes no train flag"}
        if not side.dropout_calls:
            return {**record, "status": "n/a", "reason": "side a calls no dropout with a rate above 0"}
        # an nn.Dropout module is a function call inside its parent on side b; a module calling dropout itself is
        # that module on side b too
        sites = [side.site(c["path"], module_b_exists=not c["module"], exclusive=True) for c in side.dropout_calls]
        inj = B.Injection(bug, "train=True with a dropout key (every dropout)", sites)
        attempts.append((inj, {"__train__": True}, contextlib.nullcontext()))
    elif bug == "lost_padding":
        conv = next(
            (m for m in modules if m["conv"] and m["padding"] and any(m["padding"]) and len(m["padding"]) == 2), None
        )
        if conv is None:
            return {**record, "status": "n/a", "reason": "no padded 2-D convolution"}
        site = side.site(conv["path"])
        inj = B.Injection(bug, f"{site.b}: padding {conv['padding']} -> VALID", [site])
        attempts.append((inj, {}, _lost_padding(site.b)))
    else:
        raise ValueError(bug)

    tried = []
    for inj, _, _ in attempts:
        inj.known = sorted(set(side.module_map.values()) - {""})
    for inj, changes, context in attempts:
        train = bool(changes.pop("__train__", False))
        with context:
            config = side.config(**changes)
            model, leaves = side.model(config)
            params, _ = side.params(model, leaves, **record.get("converter_bug", {}))
            out, apply_args = side.call(model, params, train=train)
            seen = gap(side.reference, out)
            tried.append({"detail": inj.detail, "untraced": seen})
            if not seen["rel"] > REL_TOL:
                continue
            record.update(
                status="built",
                injection=inj.record(),
                untraced=seen,
                tried=tried,
                **_traced(side, model, apply_args, folder, out)
                if not train
                else _traced_random(side, model, apply_args, folder),
            )
            return record
    return {
        **record,
        "status": "not visible",
        "tried": tried,
        "reason": "the untraced output stays within rel "
        + f"{REL_TOL:g} of side a's: "
        + "; ".join(f"{t['detail']}: rel {t['untraced']['rel']:.2g}" for t in tried),
    }


def _traced_random(side: FlaxSide, model: Any, apply_args: tuple[Any, ...], folder: pathlib.Path) -> dict[str, Any]:
    """Dropout on: the trace draws its own masks, so its output is not held to the plain call's."""
    folder.mkdir(parents=True, exist_ok=True)
    done = side.trace(model, apply_args, folder)
    done.pop("traced_output")
    return done
