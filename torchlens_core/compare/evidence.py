"""The evidence two sides share about which op is which, as matrices over every pair of points.

:func:`fingerprint_gaps` says how far apart two values' fingerprints are (inf
where the two cannot hold one value: other sizes that do not broadcast, a float
against an integer); :func:`scores` weighs the structural evidence — the same
module's output, the same module, the op class, the shape, nearly equal values;
:func:`best_pairs` is the order-preserving alignment with free gaps (a
Needleman-Wunsch alignment, one vectorized row at a time) that the aligner runs
over the ops values could not pair (:mod:`.align`).
"""

from __future__ import annotations

from typing import Any

from torchlens_core.compare.points import Point

NO_PAIR = -1e9
# Evidence weights. A structural pair needs MIN_SCORE: a class and a module agreeing, or values and a shape.
MODULE_OUTPUT, SAME_MODULE, SAME_CLASS, OTHER_CLASS, SAME_SHAPE = 4.0, 1.0, 2.0, -2.0, 1.0
VALUES_NEAR = 2.5  # fingerprints within NEAR of the value's scale
SAME_RANK = 1.0  # two ops of one class whose arrays differ in size but not in rank
MIN_SCORE = 3.0
CLOSE, NEAR = 1e-3, 3e-2  # fingerprint gaps: worth checking element for element; evidence of a counterpart
# Classes a decomposition's last primitive often has: a different class on the other side is no evidence.
PLAIN = frozenset({"add", "sub", "mul", "div", "reshape", "transpose", "sum", "mean"})


def fingerprint_gaps(a: list[Point], b: list[Point]) -> Any:
    """``gap[i, j]``: how far apart the fingerprints are, over the larger scale; inf where values cannot pair."""
    import math

    import numpy as np

    from torchlens_core.compare.layout import broadcasts

    gap = np.full((len(a), len(b)), np.inf)
    ia = [i for i, p in enumerate(a) if p.fingerprint is not None]
    ib = [j for j, p in enumerate(b) if p.fingerprint is not None]
    if not ia or not ib:
        return gap
    shapes_a = sorted({a[i].shape for i in ia if a[i].shape is not None})
    shapes_b = sorted({b[j].shape for j in ib if b[j].shape is not None})
    fits = np.array([[math.prod(sa) == math.prod(sb) or broadcasts(sa, sb) for sb in shapes_b]
                     for sa in shapes_a], dtype=bool).reshape(len(shapes_a), len(shapes_b))
    id_a, id_b = {s: k for k, s in enumerate(shapes_a)}, {s: k for k, s in enumerate(shapes_b)}
    fa = np.stack([a[i].fingerprint for i in ia])
    fb = np.stack([b[j].fingerprint for j in ib])
    scale = np.maximum(np.array([a[i].scale for i in ia])[:, None], np.array([b[j].scale for j in ib])[None, :])
    found = np.zeros((len(ia), len(ib)))
    for k in range(fa.shape[1]):  # column by column: n * m * QUANTILES at once would be large
        np.maximum(found, np.abs(fa[:, k, None] - fb[None, :, k]), out=found)
    zero = scale == 0
    found = np.where(zero, np.where(found == 0, 0.0, np.inf), found / np.where(zero, 1.0, scale))
    ka = np.array([a[i].kind for i in ia])
    kb = np.array([b[j].kind for j in ib])
    sa = np.array([id_a.get(a[i].shape, -1) for i in ia])
    sb = np.array([id_b.get(b[j].shape, -1) for j in ib])
    fit = (sa[:, None] >= 0) & (sb[None, :] >= 0)
    fit &= fits[np.ix_(np.maximum(sa, 0), np.maximum(sb, 0))] if fits.size else False
    found[~fit | (ka[:, None] != kb[None, :])] = np.inf
    gap[np.ix_(ia, ib)] = found
    return gap


def scores(a: list[Point], b: list[Point], gap: Any = None) -> Any:
    """The structural evidence matrix: ``scores[i, j]`` for pairing ``a[i]`` with ``b[j]`` (NO_PAIR: cannot).

    ``gap``: :func:`fingerprint_gaps` of the two, when already worked out.
    """
    import numpy as np

    n, m = len(a), len(b)
    score = np.zeros((n, m))
    classes = {c: k for k, c in enumerate({p.cls for p in a + b if p.cls is not None})}
    ca = np.array([classes.get(p.cls, -1) for p in a])
    cb = np.array([classes.get(p.cls, -1) for p in b])
    known = (ca[:, None] >= 0) & (cb[None, :] >= 0)
    same_class = known & (ca[:, None] == cb[None, :])
    # A decomposed op ends in arithmetic (JAX's softmax in a div): no evidence against it.
    plain = np.array([p.cls in PLAIN for p in a])[:, None] | np.array([p.cls in PLAIN for p in b])
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
    # The output of a module both sides have (``key`` on both) against another module's output: evidence against
    # the pair, as strong as a module output is for one (``query`` is not ``key``, whatever the shapes say).
    keys_a = {key for p in a for key in p.module_outputs}
    known_a = np.array([bool(p.module_outputs & set(by_key)) for p in a])
    known_b = np.array([bool(p.module_outputs & keys_a) for p in b])
    outputs_a = np.array([bool(p.module_outputs) for p in a])
    outputs_b = np.array([bool(p.module_outputs) for p in b])
    other_module = ~module_output & ((known_a[:, None] & outputs_b[None, :]) | (outputs_a[:, None] & known_b[None, :]))
    score -= MODULE_OUTPUT * other_module
    sa = np.array([-1 if p.size is None else p.size for p in a])
    sb = np.array([-2 if p.size is None else p.size for p in b])
    same_size = sa[:, None] == sb[None, :]
    shapes = {s: k for k, s in enumerate({tuple(sorted(p.shape)) for p in a + b if p.shape is not None})}
    ha = np.array([-1 if p.shape is None else shapes[tuple(sorted(p.shape))] for p in a])
    hb = np.array([-2 if p.shape is None else shapes[tuple(sorted(p.shape))] for p in b])
    score += SAME_SHAPE * (ha[:, None] == hb[None, :])
    score += VALUES_NEAR * ((fingerprint_gaps(a, b) if gap is None else gap) <= NEAR)
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
