"""Seeded synthetic data: id batches drawn from each table's access_frequency, targets, and
initial weights. numpy only, so the parent's reference model draws exactly the same numbers.

Ids: a bag per sample (and per feature, for a table read by several) whose sizes add up to
round(b * pooling) per rank; the popularity rank
of each id is drawn from the table's curve (uniform, zipf, or the explicit CDF), then mapped
to a row by a fixed bijection k -> (a*k + c) mod rows with a near rows/golden-ratio, so the
hot rows spread evenly over row ranges (the cost model's assumption for row-wise pieces).
Weights: a counter-based hash of (seed, table, row, column), so any piece can initialise its
own rows without drawing the whole table.
"""

import functools
import math

import numpy as np

from cost_models import AccessModel, CurveAccess, UniformAccess, ZipfAccess

# Up to this many rows, zipf ranks are drawn by inverting the exact discrete CDF (the same
# probabilities access.py sums); beyond, by inverting the continuous power law.
_EXACT_ZIPF_ROWS = 1 << 22
_INIT_SCALE = 0.1
_MASK64 = (1 << 64) - 1


def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *[k & 0xFFFFFFFF for k in keys]]))


@functools.lru_cache(maxsize=64)
def _zipf_cdf(rows: int, alpha: float) -> np.ndarray:
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    c = np.cumsum(p)
    return c / c[-1]


def popularity_ranks(access: AccessModel, rows: int, n: int,
                     rng: np.random.Generator) -> np.ndarray:
    """n popularity ranks in [0, rows): rank 0 is the hottest row."""
    u = rng.random(n)
    if isinstance(access, UniformAccess):
        k = np.floor(u * rows)
    elif isinstance(access, ZipfAccess):
        if rows <= _EXACT_ZIPF_ROWS:
            return np.minimum(np.searchsorted(_zipf_cdf(rows, access.alpha), u, side="right"),
                              rows - 1).astype(np.int64)
        a = access.alpha
        if math.isclose(a, 1.0):
            k = np.power(float(rows), u) - 1.0
        else:
            top = float(rows) ** (1.0 - a)
            k = np.power(u * (top - 1.0) + 1.0, 1.0 / (1.0 - a)) - 1.0
    elif isinstance(access, CurveAccess):
        xs = [0.0, *(p[0] for p in access.points), 1.0]
        ys = [0.0, *(p[1] for p in access.points), 1.0]
        k = np.floor(np.interp(u, ys, xs) * rows)
    else:
        raise TypeError(f"unknown access model {access!r}")
    return np.clip(k, 0, rows - 1).astype(np.int64)


def _multiplier(rows: int) -> int:
    a = max(1, int(rows * 0.6180339887498949))
    while math.gcd(a, rows) != 1:
        a += 1
    return a


def _mulmod(x: np.ndarray, a: int, m: int) -> np.ndarray:
    """(x * a) mod m in uint64 without overflow for m < 2**44: Horner over 16-bit limbs."""
    x = x.astype(np.uint64)
    res = np.zeros_like(x)
    mm = np.uint64(m)
    for shift in (48, 32, 16, 0):
        limb = np.uint64((a >> shift) & 0xFFFF)
        res = (res * np.uint64(1 << 16) + x * limb) % mm
    return res


def rank_to_row(k: np.ndarray, rows: int, table: int) -> np.ndarray:
    a = _multiplier(rows)
    c = (table * 7919) % rows
    return ((_mulmod(k, a, rows) + np.uint64(c)) % np.uint64(rows)).astype(np.int64)


def id_batch(seed: int, table: int, access: AccessModel, rows: int, pooling: float,
             step: int, rank: int, batch: int,
             features: tuple[tuple[float, int], ...] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(lengths[bags], ids[sum(lengths)]) of one rank's samples for one table and step.

    One feature (`features` None or of one entry): a bag per sample, round(batch * pooling)
    ids. Several, (pooling factor, samples per rank) each: the same round(batch * pooling)
    ids in all (`pooling` is per sample of `batch`, summed over features, as the cost model
    counts them), shared out in proportion to each feature's pooling x samples, then each
    feature's bags (one per sample of it) laid out feature after feature."""
    rng = _rng(seed, 1, table, step, rank)
    total = round(batch * pooling)
    if features is None or len(features) == 1:
        sizes, counts = [batch], [total]
    else:
        sizes = [n for _, n in features]
        weight = np.cumsum([p * n for p, n in features])
        cum = np.rint(total * weight / weight[-1]).astype(np.int64)
        cum[-1] = total
        counts = np.diff(cum, prepend=0).tolist()
    parts = []
    for n, k in zip(sizes, counts, strict=True):
        base, extra = divmod(k, n)
        lengths = np.full(n, base, dtype=np.int64)
        lengths[rng.permutation(n)[:extra]] += 1
        parts.append(lengths)
    ranks = popularity_ranks(access, rows, total, rng)
    return np.concatenate(parts), rank_to_row(ranks, rows, table)


def targets(seed: int, table: int, step: int, rank: int, batch: int, dim: int) -> np.ndarray:
    """The regression target of each sample's pooled vector (loss 0.5*|pooled - target|^2)."""
    return _rng(seed, 2, table, step, rank).standard_normal((batch, dim), dtype=np.float32)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def init_weights(seed: int, table: int, dim: int, row0: int, rows: int, col0: int,
                 cols: int) -> np.ndarray:
    """Initial weights of rows [row0, row0+rows) x cols [col0, col0+cols), float32, uniform in
    +-_INIT_SCALE/2; the same numbers whichever piece asks."""
    r = np.arange(row0, row0 + rows, dtype=np.uint64)[:, None]
    c = np.arange(col0, col0 + cols, dtype=np.uint64)[None, :]
    salt = np.uint64(((seed * 1_000_003 + table) * 0x2545F4914F6CDD1D) & _MASK64)
    with np.errstate(over="ignore"):
        z = _splitmix64(r * np.uint64(dim) + c + salt)
    u = (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return ((u - 0.5) * _INIT_SCALE).astype(np.float32)
