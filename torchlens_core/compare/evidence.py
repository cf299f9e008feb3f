"""The evidence two sides share about which op is which, as matrices over every pair of points.

:func:`fingerprint_gaps` says how far apart two values' fingerprints are (inf
where the two cannot hold one value: other sizes that do not broadcast, a float
against an integer); :func:`scores` weighs the structural evidence — the same
module's output, the same module, the op class, the shape, nearly equal values;
:func:`best_pairs` is the order-preserving alignment with free gaps (a
Needleman-Wunsch alignment, over the live cells of a sparse matrix, :class:`Cells`) that the aligner runs
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
    shapes_a = sorted({s for i in ia if (s := a[i].shape) is not None})
    shapes_b = sorted({s for j in ib if (s := b[j].shape) is not None})
    fits = np.array(
        [[math.prod(sa) == math.prod(sb) or broadcasts(sa, sb) for sb in shapes_b] for sa in shapes_a], dtype=np.bool_
    ).reshape(len(shapes_a), len(shapes_b))
    id_a: dict[tuple[int, ...] | None, int] = {s: k for k, s in enumerate(shapes_a)}
    id_b: dict[tuple[int, ...] | None, int] = {s: k for k, s in enumerate(shapes_b)}
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
    if fits.size:
        fit &= fits[np.ix_(np.maximum(sa, 0), np.maximum(sb, 0))]
    else:  # no shape of one side fits any of the other's
        fit[...] = False
    found[~fit | (ka[:, None] != kb[None, :])] = np.inf
    gap[np.ix_(ia, ib)] = found
    return gap


class Gaps:
    """The entries of :func:`fingerprint_gaps` on demand, never the whole matrix (two traces of 50,000 ops would
    make it 20 GB): one point of ``a`` against chosen points of ``b`` (:meth:`row`), or the points of ``b``
    within a gap of it (:meth:`within`), found through sorted indexes instead of a scan of ``b``.

    Every entry is computed as :func:`fingerprint_gaps` computes it, bit for bit.
    """

    # Fingerprint columns indexed besides the scale; a query reads the narrowest window among them.
    KEYS = (4, 8, 12, 16, 20, 24, 28)

    def __init__(self, a: list[Point], b: list[Point]) -> None:
        import numpy as np

        self.a, self.b = a, b
        width = next((len(p.fingerprint) for p in a + b if p.fingerprint is not None), 0)
        self._fb = np.zeros((len(b), width))
        self._has_b = np.zeros(len(b), dtype=bool)
        for j, p in enumerate(b):
            if p.fingerprint is not None:
                self._fb[j], self._has_b[j] = p.fingerprint, True
        self._sb = np.array([p.scale for p in b], dtype=float)
        self._kind_b = np.array([p.kind for p in b], dtype=object)
        shapes = sorted({p.shape for p in b if p.shape is not None})
        ids = {shape: n for n, shape in enumerate(shapes)}
        self._shapes_b = shapes
        self._shape_b = np.array([ids[p.shape] if p.shape is not None else len(shapes) for p in b], dtype=int)
        self._fits: dict[tuple[int, ...], Any] = {}  # a shape -> which of b's shapes it can pair with (last: None)
        held = np.flatnonzero(self._has_b)
        keys = [self._sb[held]] + [self._fb[held, c] for c in self.KEYS if c < width]
        self._sorted = []  # (key values ascending, the b points in that order) for the scale and each column
        for values in keys:
            order = np.argsort(values, kind="stable")
            self._sorted.append((values[order], held[order]))

    def _fit_row(self, shape: tuple[int, ...]) -> Any:
        import math

        import numpy as np

        from torchlens_core.compare.layout import broadcasts

        found = self._fits.get(shape)
        if found is None:
            found = np.array(
                [math.prod(shape) == math.prod(s) or broadcasts(shape, s) for s in self._shapes_b] + [False], dtype=bool
            )
            self._fits[shape] = found
        return found

    def row(self, k: int, cs: Any) -> Any:
        """``fingerprint_gaps(a, b)[k, cs]``."""
        import numpy as np

        cs = np.asarray(cs, dtype=int)
        out = np.full(len(cs), np.inf)
        p = self.a[k]
        if p.fingerprint is None or p.shape is None or not len(cs):
            return out
        ok = self._has_b[cs] & (self._kind_b[cs] == p.kind) & self._fit_row(p.shape)[self._shape_b[cs]]
        sel = cs[ok]
        found = np.abs(p.fingerprint[None, :] - self._fb[sel]).max(axis=1) if len(sel) else np.zeros(0)
        scale = np.maximum(p.scale, self._sb[sel])
        zero = scale == 0
        out[ok] = np.where(zero, np.where(found == 0, 0.0, np.inf), found / np.where(zero, 1.0, scale))
        return out

    def pair(self, k: int, c: int) -> float:
        return float(self.row(k, [c])[0])

    def block(self, ks: list[int], cs: list[int]) -> Any:
        """``fingerprint_gaps(a, b)[np.ix_(ks, cs)]``."""
        import numpy as np

        return np.array([self.row(k, cs) for k in ks]).reshape(len(ks), len(cs))

    def within(self, k: int, limit: float) -> tuple[Any, Any]:
        """The points ``c`` of ``b`` (ascending) whose gap to ``a[k]`` is at most ``limit``, and those gaps.

        A gap of at most ``limit`` bounds the difference of the scales and of every fingerprint column by
        ``limit`` times the larger scale (a scale is the largest magnitude among the fingerprint's columns), so
        the candidates lie in a window of each sorted index; the narrowest is read, then checked exactly.
        """
        import numpy as np

        p = self.a[k]
        if p.fingerprint is None or not self._sorted:
            return np.zeros(0, dtype=int), np.zeros(0)
        if not limit < 0.5:  # a loose limit bounds nothing useful: every point is a candidate
            cs = np.flatnonzero(self._has_b)
        else:
            top = p.scale / (1 - limit) * (1 + 1e-9)  # the largest scale a point within the limit can have
            reach = limit * top * (1 + 1e-9)
            bounds = [(p.scale * (1 - limit) * (1 - 1e-9), top)]
            bounds += [
                (p.fingerprint[c] - reach, p.fingerprint[c] + reach) for c in self.KEYS if c < len(p.fingerprint)
            ]
            best = None
            for (lo, hi), (values, order) in zip(bounds, self._sorted):
                start, stop = np.searchsorted(values, lo, "left"), np.searchsorted(values, hi, "right")
                if best is None or stop - start < best[1] - best[0]:
                    best = (start, stop, order)
            assert best is not None
            cs = np.sort(best[2][best[0] : best[1]])
        gaps = self.row(k, cs)
        keep = gaps <= limit
        return cs[keep], gaps[keep]


def scores(a: list[Point], b: list[Point], gap: Any = None, keys: tuple[set[str], set[str]] | None = None) -> Any:
    """The structural evidence matrix: ``scores[i, j]`` for pairing ``a[i]`` with ``b[j]`` (NO_PAIR: cannot).

    ``gap``: :func:`fingerprint_gaps` of the two, when already worked out. ``keys``: the module outputs named
    anywhere on each side, when ``a`` and ``b`` are parts of the sides (a few rows and columns of the matrix of
    the whole sides, for the same entries).
    """
    import numpy as np

    n, m = len(a), len(b)
    score = np.zeros((n, m))
    classes: dict[str | None, int] = {c: k for k, c in enumerate({p.cls for p in a + b if p.cls is not None})}
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
    keys_a, keys_b = keys if keys is not None else ({key for p in a for key in p.module_outputs}, set(by_key))
    known_a = np.array([bool(p.module_outputs & keys_b) for p in a])
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


class Cells:
    """A score matrix held by its live entries: per row, the columns (ascending) scoring above NO_PAIR and those
    scores; every other entry is NO_PAIR. The structural step keeps the candidates its indexes find, where the
    dense matrix was every unpaired op of ``a`` by every one of ``b`` (two traces of 50,000 ops: 20 GB)."""

    def __init__(self, n: int, m: int) -> None:
        import numpy as np

        self.n, self.m = n, m
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
        self._rows: list[tuple[Any, Any]] = [empty] * n
        self._columns: tuple[Any, Any, Any] | None = None  # every cell by column, built when first asked for

    @classmethod
    def from_dense(cls, score: Any) -> Cells:
        import numpy as np

        found = cls(*score.shape)
        for x in range(found.n):
            ys = np.flatnonzero(score[x] > NO_PAIR)
            found.set_row(x, ys, score[x, ys])
        return found

    def __len__(self) -> int:
        return sum(len(ys) for ys, _ in self._rows)

    def set_row(self, x: int, ys: Any, values: Any) -> None:
        """Row ``x``: ``values`` at the columns ``ys`` (ascending, every value above NO_PAIR)."""
        import numpy as np

        self._rows[x] = (np.asarray(ys, dtype=np.int64), np.asarray(values, dtype=float))
        self._columns = None

    def raise_to(self, x: int, ys: Any, value: float) -> None:
        """``score[x, ys] = max(score[x, ys], value)``."""
        import numpy as np

        cols, values = self._rows[x]
        merged = np.union1d(cols, np.asarray(ys, dtype=np.int64))
        found = np.full(len(merged), NO_PAIR)
        found[np.searchsorted(merged, cols)] = values
        at = np.searchsorted(merged, ys)
        found[at] = np.maximum(found[at], value)
        live = found > NO_PAIR
        self.set_row(x, merged[live], found[live])

    def get(self, x: int, y: int) -> float:
        import numpy as np

        ys, values = self._rows[x]
        at = int(np.searchsorted(ys, y))
        return float(values[at]) if at < len(ys) and ys[at] == y else NO_PAIR

    def row(self, x: int) -> tuple[Any, Any]:
        """The live columns of row ``x`` (ascending) and their scores."""
        return self._rows[x]

    def column(self, y: int) -> tuple[Any, Any]:
        """The live rows of column ``y`` (ascending) and their scores."""
        import numpy as np

        if self._columns is None:
            xs = np.concatenate(
                [np.full(len(ys), x, dtype=np.int64) for x, (ys, _) in enumerate(self._rows)]
                + [np.zeros(0, dtype=np.int64)]
            )
            ys = np.concatenate([ys for ys, _ in self._rows] + [np.zeros(0, dtype=np.int64)])
            values = np.concatenate([v for _, v in self._rows] + [np.zeros(0)])
            order = np.argsort(ys, kind="stable")  # rows stay ascending within a column
            self._columns = (xs[order], values[order], np.searchsorted(ys[order], np.arange(self.m + 1)))
        xs, values, bounds = self._columns
        return xs[bounds[y] : bounds[y + 1]], values[bounds[y] : bounds[y + 1]]


def best_pairs(cells: Cells) -> list[tuple[int, int]]:
    """The order-preserving pairs ``(x, y)`` with the largest total score (free gaps), over the live cells only.

    The Needleman-Wunsch alignment's table ``total[i, j]`` (the best total of
    rows before ``i`` and columns before ``j``) is the largest of 0 and the
    cells' totals there, a cell's total being the best before it plus its
    score: so only cells are worked out, each from a prefix maximum over the
    columns (a Fenwick tree, one numpy step per level for a whole row), in
    O(cells log columns) instead of rows x columns. The walk back takes what
    the dense table's walk takes, tie for tie (it steps up a row, else left a
    column, while the total stays): of the cells left of and above the last
    pair that hold the current total, the first row's first. Totals are the
    same sums in the same order, so equal bit for bit.
    """
    import numpy as np

    n, m = cells.n, cells.m
    tree = np.zeros(m + 1)  # Fenwick tree, column y at q = y + 1: tree[q] is the best total of (q - (q & -q), q]
    before: list[Any] = [None] * n  # per row, each cell's best total before it
    totals: list[Any] = [None] * n
    for x in range(n):
        ys, values = cells.row(x)
        positive = values > 0  # a cell adding nothing never raises a total, and the dense walk never takes it
        ys, values = ys[positive], values[positive]
        if not len(ys):
            continue
        best, q = np.zeros(len(ys)), ys.copy()  # the columns before y: Fenwick positions 1..y
        while q.any():
            np.maximum(best, tree[q], out=best)
            q -= q & -q
        before[x], totals[x] = best, best + values
        q, total = ys + 1, totals[x]
        while len(q):  # after the row's queries: cells of one row do not follow each other
            np.maximum.at(tree, q, total)
            q = q + (q & -q)
            keep = q <= m
            q, total = q[keep], total[keep]
    rows = [x for x in range(n) if totals[x] is not None]
    if not rows:
        return []
    xs = np.concatenate([np.full(len(totals[x]), x, dtype=np.int64) for x in rows])
    ys = np.concatenate([cells.row(x)[0][cells.row(x)[1] > 0] for x in rows])
    total, start = np.concatenate([totals[x] for x in rows]), np.concatenate([before[x] for x in rows])
    order = np.argsort(total, kind="stable")  # by total, then as the cells came: row by row, column by column
    ranked = total[order]
    pairs: list[tuple[int, int]] = []
    target, i, j = float(ranked[-1]), n, m
    while target > 0:  # each step's target is below the last one's: each cell is looked at once at most
        lo, hi = np.searchsorted(ranked, target, "left"), np.searchsorted(ranked, target, "right")
        at = order[lo:hi]
        at = at[(xs[at] < i) & (ys[at] < j)][0]
        pairs.append((int(xs[at]), int(ys[at])))
        target, i, j = float(start[at]), int(xs[at]), int(ys[at])
    return pairs[::-1]
