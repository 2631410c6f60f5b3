"""Cache hit rates from a table's access-frequency curve.

`hit_rate(cached_rows, rows)` takes whole row counts, so the rows a cache holds in memory and
the rows its hit rate assumes are the same integer. A cache that holds the hottest fraction
`c` of a table's rows (an ideal LFU cache in steady
state) serves the fraction of accesses that those rows receive: the access CDF at `c`.
Row-wise pieces see the same curve: ids are assumed randomly permuted over rows (as HugeCTR's
and TorchRec's generators do), so every row range holds a proportional share of hot rows.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np

from cost_models import portable_math as pm

# Terms summed exactly; beyond them the Euler-Maclaurin tail takes over (relative error
# under 1e-12). Exact sums up to 100,000 terms took k**-alpha over 100,000 terms for every
# table of its own alpha: a fifth of candidate costing at 10,000 tables.
_EM_HEAD = 1_000


# zipf_powers' length: what generalized_harmonic's exact head and the cache policy's
# row-by-row head (cache_policy._ZIPF_HEAD) read.
ZIPF_POWERS = 4096


@functools.lru_cache(maxsize=512)
def zipf_powers(alpha: float) -> np.ndarray:
    """k ** -alpha for k = 1 .. ZIPF_POWERS, read-only, per alpha: tables of one alpha share
    it (10,000 synthetic tables have 501 alphas; 512 arrays are 16 MiB)."""
    powers = pm.power(np.arange(1, ZIPF_POWERS + 1, dtype=np.float64), -alpha)
    powers.flags.writeable = False
    return powers


@functools.lru_cache(maxsize=65536)
def generalized_harmonic(n: int, alpha: float) -> float:
    """H(n, alpha) = sum_{k=1..n} k^-alpha; exact up to _EM_HEAD terms, Euler-Maclaurin
    beyond.

    The tail from m to n is integral(m..n) x^-a dx + (f(m)+f(n))/2 + (f'(n)-f'(m))/12, whose
    error is below 1e-12 relative for m = 1000.
    """
    if n <= 0:
        return 0.0
    if n <= _EM_HEAD:
        # A prefix of one array per alpha, summed pairwise (as np.sum does).
        return float(np.sum(zipf_powers(alpha)[:n]))
    m = _EM_HEAD
    head, m_1a, m_a, m_a1 = _head_terms(alpha)
    if math.isclose(alpha, 1.0):
        integral = pm.flog(n / m)
    else:
        integral = (pm.fpow(n, 1.0 - alpha) - m_1a) / (1.0 - alpha)
    ends = (m_a + pm.fpow(n, -alpha)) / 2.0
    derivs = alpha * (m_a1 - pm.fpow(n, -alpha - 1.0)) / 12.0
    return head + integral + ends + derivs


@functools.lru_cache(maxsize=512)
def _head_terms(alpha: float) -> tuple[float, float, float, float]:
    """generalized_harmonic's terms that depend on alpha alone (tables of one alpha share
    them): the exact head's sum, then m**(1 - alpha), m**-alpha and m**(-alpha - 1) at
    m = _EM_HEAD."""
    m = _EM_HEAD
    return (float(np.sum(zipf_powers(alpha)[:m - 1])), pm.fpow(m, 1.0 - alpha),
            pm.fpow(m, -alpha), pm.fpow(m, -alpha - 1.0))


@dataclass(frozen=True)
class UniformAccess:
    """Every row equally likely: a cache of fraction c serves fraction c."""

    def hit_rate(self, cached_rows: int, rows: int) -> float:
        return _clamp(cached_rows / rows) if rows > 0 else 0.0


@dataclass(frozen=True)
class ZipfAccess:
    """Row of popularity rank k is accessed with probability k^-alpha / H(N, alpha)."""

    alpha: float

    def hit_rate(self, cached_rows: int, rows: int) -> float:
        if rows <= 0:
            return 0.0
        cached = min(max(cached_rows, 0), rows)
        total = generalized_harmonic(rows, self.alpha)
        return _clamp(generalized_harmonic(cached, self.alpha) / total)


@dataclass(frozen=True)
class CurveAccess:
    """Explicit cumulative curve: (fraction of hottest rows, fraction of accesses) points,
    increasing, joined linearly, with (0, 0) and (1, 1) implied."""

    points: tuple[tuple[float, float], ...]

    def hit_rate(self, cached_rows: int, rows: int) -> float:
        if rows <= 0:
            return 0.0
        xs = [0.0, *(p[0] for p in self.points), 1.0]
        ys = [0.0, *(p[1] for p in self.points), 1.0]
        return _clamp(float(np.interp(_clamp(cached_rows / rows), xs, ys)))


AccessModel = UniformAccess | ZipfAccess | CurveAccess


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))
