"""Which ops of one trace correspond to which ops of another: the alignment behind ``tl.compare``.

Each op that carries an activation becomes a :class:`Point` with the evidence
the two sides can share: the module pass it returns from (module paths
normalized across naming conventions: ``features.0``, ``features_0`` and
flax's ``features.layers.0`` are one path), its class in the equivalence
table (:mod:`.classes`), its shape up to a permutation of axes, and a value
fingerprint — evenly spaced order statistics of its value, which a layout
change (NCHW vs NHWC, a flatten in another order) leaves unchanged and a small
numerical difference changes only a little.

Every pair of points gets a score from that evidence (:func:`scores`, one
vectorized matrix), and the alignment is the order-preserving set of pairs
with the highest total (a Needleman-Wunsch alignment with free gaps, one
vectorized row at a time): both traces run the model's layers in the same
order, and a pair that would cross another is a coincidence of values, not a
correspondence. Structure carries the alignment where values stop agreeing
(past a porting bug), values where structure differs (a decomposed op, a
Keras layer named ``conv2d_3``).

A pair's *group* on each side is its op and the ops before it that feed
only into it (:func:`groups`): one torch ``layer_norm`` pairs with the ten
primitives of JAX's ``LayerNorm``, compared at the group's output.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from torchlens_core.compare.classes import module_class, op_class
from torchlens_core.compare.metrics import as_numpy
from torchlens_core.ir.records import OpRecord
from torchlens_core.ir.trace import Trace

QUANTILES = 33  # order statistics per fingerprint
NO_PAIR = -1e9
# Evidence weights. A pair needs MIN_SCORE: a class and a module agreeing, or values and a shape.
MODULE_OUTPUT, SAME_MODULE, SAME_CLASS, OTHER_CLASS, SAME_SHAPE = 4.0, 1.0, 2.0, -2.0, 1.0
VALUES_CLOSE, VALUES_NEAR = 4.0, 2.5  # fingerprints within 1e-5, within 3e-2 of the value's scale
SAME_RANK = 1.0  # two ops of one class whose arrays differ in size but not in rank
MIN_SCORE = 3.0
# Classes a decomposition's last primitive often has: a different class on the other side is no evidence.
PLAIN = frozenset({"add", "sub", "mul", "div", "reshape", "transpose", "sum", "mean"})
# Container names that wrap a sequence of layers without naming a layer of the model.
CONTAINERS = frozenset({"layers", "_layers", "modules", "_modules", "submodules", "module", "children"})


@attrs.define(slots=True)
class Point:
    """One op of one side, with the evidence the aligner reads."""

    index: int
    cls: str | None
    module: str  # normalized path of the innermost module pass it ran in ("" outside every module)
    module_outputs: frozenset[str]  # normalized "path:pass" of each module pass that returned it
    shape: tuple[int, ...] | None
    size: int | None
    fingerprint: Any = None  # QUANTILES order statistics of the value, or None when it was not saved
    scale: float = 0.0  # the largest magnitude in the value


def normalized_path(path: str, match: dict[str, str] | None = None) -> str:
    """A module path as both sides can spell it: ``match`` prefixes applied, separators unified, containers out."""
    for old, new in (match or {}).items():
        if path == old or path.startswith(old + "."):
            path = new + path[len(old):]
            break
    parts = [p for p in re.split(r"[./_\-]+", path.lower()) if p and p not in CONTAINERS]
    return ".".join(parts)


def points(trace: Trace, match: dict[str, str] | None = None) -> list[Point]:
    """The points of ``trace``: every op but those that depend on no input (parameter reshapes, constants)."""
    import numpy as np

    found = []
    for op in trace.ops:
        if op.kind not in ("input", "output") and op.source in ("parameter", "constant"):
            continue
        outputs = frozenset(_module_key(key, match) for key in op.module_outputs)
        cls = op_class(op)
        for key in reversed(op.module_outputs):  # the innermost module's type names what it returns
            module = trace.modules.get(key.rpartition(":")[0])
            if module is not None and module_class(module.type_name) is not None:
                cls = module_class(module.type_name)
                break
        shape = tuple(int(d) for d in op.shape) if _is_shape(op.shape) else None
        point = Point(op.index, cls, normalized_path(op.module_passes[-1][0], match) if op.module_passes else "",
                      outputs, shape, int(np.prod(shape)) if shape is not None else None)
        value = array_value(trace, op)
        if value is not None and value.size:
            flat = np.sort(value.ravel())
            finite = flat[np.isfinite(flat)]
            if finite.size:
                picks = np.linspace(0, finite.size - 1, QUANTILES).round().astype(int)
                point.fingerprint = finite[picks]
                point.scale = float(np.max(np.abs(finite)))
        found.append(point)
    return found


def array_value(trace: Trace, op: OpRecord) -> Any:
    """``op``'s value as a float64 NumPy array; None when it was not saved or is not one array."""
    if not op.saved or op.out is None or not _is_shape(op.shape):
        return None
    try:
        value = as_numpy(op.out, trace.backend)
    except Exception:  # a tuple, a string, an object the backend does not count as an array
        return None
    return value if value.shape == tuple(op.shape) and value.dtype.kind == "f" else None


def scores(a: list[Point], b: list[Point]) -> Any:
    """The evidence matrix: ``scores[i, j]`` for pairing ``a[i]`` with ``b[j]`` (NO_PAIR where they cannot)."""
    import numpy as np

    n, m = len(a), len(b)
    score = np.zeros((n, m))
    classes = {c: k for k, c in enumerate({p.cls for p in a + b if p.cls is not None})}
    ca = np.array([classes.get(p.cls, -1) for p in a])
    cb = np.array([classes.get(p.cls, -1) for p in b])
    known = (ca[:, None] >= 0) & (cb[None, :] >= 0)
    same_class = known & (ca[:, None] == cb[None, :])
    # A decomposed op ends in arithmetic (JAX's softmax in a div): no evidence against it.
    plain = np.array([c in PLAIN for c in _classes(a)])[:, None] | np.array([c in PLAIN for c in _classes(b)])
    score += SAME_CLASS * same_class + OTHER_CLASS * (known & ~same_class & ~plain)
    modules = {p: k for k, p in enumerate({p.module for p in a + b})}
    ma = np.array([modules[p.module] for p in a])
    mb = np.array([modules[p.module] for p in b])
    same_module = (ma[:, None] == mb[None, :]) & (ma[:, None] != modules.get("", -1))
    score += SAME_MODULE * same_module
    module_output = np.zeros((n, m), dtype=bool)
    by_key: dict[str, list[int]] = {}
    for j, p in enumerate(b):
        for key in p.module_outputs:
            by_key.setdefault(key, []).append(j)
    for i, p in enumerate(a):
        for key in p.module_outputs:
            module_output[i, by_key.get(key, [])] = True
    score += MODULE_OUTPUT * module_output
    sa = np.array([-1 if p.size is None else p.size for p in a])
    sb = np.array([-2 if p.size is None else p.size for p in b])
    same_size = sa[:, None] == sb[None, :]
    shapes = {s: k for k, s in enumerate({tuple(sorted(p.shape)) for p in a + b if p.shape is not None})}
    ha = np.array([-1 if p.shape is None else shapes[tuple(sorted(p.shape))] for p in a])
    hb = np.array([-2 if p.shape is None else shapes[tuple(sorted(p.shape))] for p in b])
    score += SAME_SHAPE * (ha[:, None] == hb[None, :])
    score += _value_evidence(a, b, same_size)
    # Arrays of different sizes pair only as one layer seen on both sides (a shape divergence): the same
    # module, or the same class at the same rank.
    ra = np.array([-1 if p.shape is None else len(p.shape) for p in a])
    rb = np.array([-2 if p.shape is None else len(p.shape) for p in b])
    same_rank = ~same_size & same_class & (ra[:, None] == rb[None, :])
    score += SAME_RANK * same_rank
    pairable = same_size | (same_class & (module_output | same_module)) | same_rank
    score[~pairable] = NO_PAIR
    score[score < MIN_SCORE] = NO_PAIR
    return score


def _value_evidence(a: list[Point], b: list[Point], same_size: Any) -> Any:
    import numpy as np

    evidence = np.zeros(same_size.shape)
    ia = [i for i, p in enumerate(a) if p.fingerprint is not None]
    ib = [j for j, p in enumerate(b) if p.fingerprint is not None]
    if not ia or not ib:
        return evidence
    fa = np.stack([a[i].fingerprint for i in ia])
    fb = np.stack([b[j].fingerprint for j in ib])
    scale = np.maximum(np.array([a[i].scale for i in ia])[:, None], np.array([b[j].scale for j in ib])[None, :])
    gap = np.zeros((len(ia), len(ib)))
    for k in range(fa.shape[1]):  # column by column: n * m * QUANTILES at once would be large
        np.maximum(gap, np.abs(fa[:, k, None] - fb[None, :, k]), out=gap)
    gap /= np.maximum(scale, 1e-30)
    sub = np.where(gap <= 1e-5, VALUES_CLOSE, np.where(gap <= 3e-2, VALUES_NEAR, 0.0))
    sub *= same_size[np.ix_(ia, ib)]
    evidence[np.ix_(ia, ib)] = sub
    return evidence


def best_pairs(score: Any) -> list[tuple[int, int]]:
    """The order-preserving pairs ``(i, j)`` with the largest total score (free gaps)."""
    import numpy as np

    n, m = score.shape
    total = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        prev = total[i - 1]
        reach = np.maximum(prev[1:], prev[:-1] + score[i - 1])
        total[i, 1:] = np.maximum.accumulate(reach)
    pairs = []
    i, j = n, m
    while i > 0 and j > 0:
        if total[i, j] == total[i - 1, j]:
            i -= 1
        elif total[i, j] == total[i, j - 1]:
            j -= 1
        else:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    return pairs[::-1]


def groups(trace: Trace, anchors: list[int]) -> list[list[int]]:
    """For each anchor op (in order), the ops it covers: itself and its not yet covered ancestors.

    Input nodes belong to no group but their own; an ancestor already covered
    by an earlier anchor stops the walk (its pair accounts for it).
    """
    covered: set[int] = set()
    found = []
    for anchor in anchors:
        group, stack = [], [anchor]
        while stack:
            index = stack.pop()
            if index in covered:
                continue
            op = trace.ops[index]
            if op.kind == "input" and index != anchor:
                continue
            covered.add(index)
            group.append(index)
            stack.extend(op.parent_indices)
        found.append(sorted(group))
    return found


def _classes(side: list[Point]) -> list[str | None]:
    return [p.cls for p in side]


def _module_key(key: str, match: dict[str, str] | None) -> str:
    path, _, pass_num = key.rpartition(":")
    return f"{normalized_path(path, match)}:{pass_num}"


def _is_shape(shape: Any) -> bool:
    return isinstance(shape, (tuple, list)) and all(isinstance(d, int) and d >= 0 for d in shape)
