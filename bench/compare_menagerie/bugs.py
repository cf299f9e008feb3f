"""The porting bugs injected on side b, and where each one is (ground truth from the injection, never TorchLens).

Framework-neutral: the names, what each bug does, the wrong values it uses,
and how a site is found from side a's module call order (recorded with
forward hooks in a plain call) and the weight converter's name map. A side
module implements the injection itself (a config change, a converter option,
a layer built differently).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# bug -> what it does, as the report says it
BUGS = {
    "activation": "the activation swapped for its variant (hidden_act gelu <-> gelu_new, tanh approximation)",
    "norm_eps": "the norm epsilon changed (1e-12 -> 1e-5, 1e-5 -> 1e-6; else 1e-3 where that is not visible)",
    "untransposed": "one square Linear weight copied without its transpose",
    "unpermuted_conv": "one conv kernel poured into the channels-last shape without its permutation",
    "dropout_on": "dropout left on (train mode / deterministic=False)",
    "lost_padding": "one convolution built without its padding",
}

# Config keys naming the activation, and each activation's wrong twin.
ACTIVATION_KEYS = ("hidden_act", "activation_function", "hidden_activation", "dense_act_fn", "activation")
ACTIVATION_VARIANT = {
    "gelu": "gelu_new",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu",
    "quick_gelu": "gelu",
    "relu": "gelu",
    "silu": "gelu",
    "swish": "gelu",
    "gelu_10": "gelu",
}
EPS_KEYS = ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "norm_eps")


def activation_key(config: Any) -> tuple[str | None, str | None]:
    """The config key the model reads its activation from, and its value. Gemma reads ``hidden_activation`` and
    replaces an unset one by gelu_pytorch_tanh whatever ``hidden_act`` says, so a change must go there."""
    if "hidden_activation" in vars(config):
        current = config.hidden_activation or getattr(config, "hidden_act", None)
        if current in ACTIVATION_VARIANT:
            return "hidden_activation", current
    for k in ACTIVATION_KEYS:
        value = getattr(config, k, None)
        if isinstance(value, str) and value in ACTIVATION_VARIANT:
            return k, value
    return None, None


def eps_candidates(eps: float) -> list[float]:
    """Wrong epsilons to try, most plausible first: the other framework's usual default, then 1e-3."""
    first = 1e-6 if abs(eps - 1e-5) < 1e-12 else 1e-5
    return [first, 1e-3]


@dataclass
class Site:
    """Where a bug acts: side a's module path and the side b module path it corresponds to.

    ``exclusive``: the bug is code of module ``b`` itself (an activation or a dropout called as a function inside
    it), so an op counts as there only if no submodule with a side a counterpart holds it (the q projection of an
    encoder layer is not where that layer's activation is)."""

    a: str
    b: str
    exclusive: bool = False


@dataclass
class Injection:
    """One injected bug: what was done, every site in call order (the first is where it must be found)."""

    bug: str
    detail: str
    sites: list[Site] = field(default_factory=list)
    known: list[str] = field(default_factory=list)  # side b modules with a side a counterpart (exclusive sites)

    def record(self) -> dict[str, Any]:
        return {
            "bug": self.bug,
            "detail": self.detail,
            "sites": [asdict(s) for s in self.sites],
            "b_modules": self.known if any(s.exclusive for s in self.sites) else [],
        }


def parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def eps_sites(modules: list[dict[str, Any]], eps: float) -> list[str]:
    """Side a's modules (call order) whose epsilon is the config's: where a config-wide epsilon change acts."""
    return [m["path"] for m in modules if m["eps"] is not None and abs(m["eps"] - eps) <= 1e-3 * eps]


def activation_sites(modules: list[dict[str, Any]]) -> list[str]:
    return [m["path"] for m in modules if m["activation"]]
