"""Hit rates of a cache of a given eviction policy, from a table's access curve.

The executor's caches (planner/executor/store.py) are FBGEMM's two policies, fully
associative, their content updated once per batch:
- LFU: a count per row over all time; the cache holds the rows counted most. Once counts
  have converged it holds the hottest rows: the hit rate is the top rows' share of accesses
  (`AccessModel.hit_rate`, access.py).
- LRU: the cache holds the rows used most recently. Under independent requests its hit rate
  is Che's approximation: a row is cached iff it was requested within the characteristic time
  T (in lookups) that solves sum_i (1 - exp(-p_i T)) = C, so
  hit = sum_i p_i (1 - exp(-p_i T)).

Both are per lookup: the fraction of ids looked up (repeats in a batch counted each time)
whose row the cache held when the batch started. That is what the executor counts and what
traffic.py multiplies bytes by.

Che's sums run over "rate groups" (p, n): n rows each requested with probability p. Uniform
and piecewise-linear curves are exact as a few groups; zipf sums its first rows one by one
and the rest as an integral of the power law over log-spaced buckets (Gauss-Legendre), so a
table of 10^12 rows costs a few thousand terms.
"""

import functools
import math
from enum import StrEnum

import numpy as np

from cost_models import portable_math as pm
from cost_models.access import (
    ZIPF_POWERS,
    AccessModel,
    CurveAccess,
    UniformAccess,
    ZipfAccess,
    generalized_harmonic,
    zipf_powers,
)


class CachePolicy(StrEnum):
    LFU = "lfu"
    LRU = "lru"


# LFU: the executor's behaviour before policies were named, and the model's before that.
DEFAULT_POLICY = CachePolicy.LFU

# Zipf rows summed one by one before the bucketed integral takes over.
_ZIPF_HEAD = ZIPF_POWERS  # the k**-alpha that zipf_powers holds
# Tail buckets grow by this factor; each is integrated with 4 Gauss-Legendre nodes (_GL).
_BUCKET_RATIO = 1.01
# Bisection on log T: 200 halvings of [1e-12, 1e30] x C reach double precision.
_ITERS = 200
# The 4-point Gauss-Legendre nodes and weights in closed form, from square roots (exact IEEE
# operations: numpy's leggauss solves an eigenproblem through LAPACK, whose kernel depends on
# the CPU; cost_models/portable_math.py).
_R65 = 2.0 / 7.0 * math.sqrt(6.0 / 5.0)
_N_IN, _N_OUT = math.sqrt(3.0 / 7.0 - _R65), math.sqrt(3.0 / 7.0 + _R65)
_W_IN, _W_OUT = (18.0 + math.sqrt(30.0)) / 36.0, (18.0 - math.sqrt(30.0)) / 36.0
_GL = (np.array([-_N_OUT, -_N_IN, _N_IN, _N_OUT]), np.array([_W_OUT, _W_IN, _W_IN, _W_OUT]))


def rate_groups(access: AccessModel, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(p, n): n[j] rows (a real number where the groups stand for an integral) each looked
    up with probability p[j] per lookup; sum(p * n) = 1, sum(n) = rows."""
    if isinstance(access, UniformAccess):
        return np.array([1.0 / rows]), np.array([float(rows)])
    if isinstance(access, CurveAccess):
        xs = [0.0, *(p[0] for p in access.points), 1.0]
        ys = [0.0, *(p[1] for p in access.points), 1.0]
        p, n = [], []
        for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:], strict=False):
            if x1 > x0 and y1 > y0:
                # Linear CDF between the points: every row of the segment equally likely.
                n.append((x1 - x0) * rows)
                p.append((y1 - y0) / n[-1])
        return np.array(p), np.array(n)
    if isinstance(access, ZipfAccess):
        return _zipf_groups(rows, access.alpha)
    raise TypeError(f"unknown access model {access!r}")


@functools.lru_cache(maxsize=256)
def _zipf_groups(rows: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    total = generalized_harmonic(rows, alpha)
    head = min(rows, _ZIPF_HEAD)
    p, n = [zipf_powers(alpha)[:head] / total], [np.ones(head)]
    if rows > head:
        # Row k stands for x in [k - 1/2, k + 1/2]: the sum over k > head is the integral of
        # x^-alpha from head + 1/2 to rows + 1/2 (midpoint rule; its error ~ f''/24 per row,
        # below 1e-12 of the tail's mass for k > 4096).
        lo, hi = pm.flog(head + 0.5), pm.flog(rows + 0.5)
        buckets = max(1, math.ceil((hi - lo) / pm.flog(_BUCKET_RATIO)))
        edges = pm.exp(np.linspace(lo, hi, buckets + 1))
        t, wt = _GL
        a, b = edges[:-1, None], edges[1:, None]
        x = (a + b) / 2 + (b - a) / 2 * t[None, :]
        w = (b - a) / 2 * wt[None, :]
        p.append((pm.power(x, -alpha) / total).ravel())
        n.append(w.ravel())
    return np.concatenate(p), np.concatenate(n)


def che_time(p: np.ndarray, n: np.ndarray, cached: float) -> float:
    """Che's characteristic time T (lookups): sum n (1 - exp(-p T)) = cached, for
    0 < cached < sum(n). The left side rises with T, so bisection on log T."""
    lo, hi = pm.flog(1e-12 * cached), pm.flog(1e30 * cached)
    for _ in range(_ITERS):
        mid = (lo + hi) / 2
        if float(np.sum(n * -pm.expm1(-p * pm.fexp(mid)))) < cached:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13:
            break
    return pm.fexp((lo + hi) / 2)


def che_hit_rate(p: np.ndarray, n: np.ndarray, cached: float) -> float:
    """LRU hit rate per lookup under Che's approximation."""
    rows = float(np.sum(n))
    if cached <= 0:
        return 0.0
    if cached >= rows:
        return 1.0
    t = che_time(p, n, cached)
    return float(np.sum(n * p * -pm.expm1(-p * t)))


@functools.lru_cache(maxsize=65536)
def lru_hit_rate(access: AccessModel, cached_rows: int, rows: int) -> float:
    if rows <= 0:
        return 0.0
    p, n = rate_groups(access, rows)
    return min(1.0, max(0.0, che_hit_rate(p, n, float(min(max(cached_rows, 0), rows)))))


def policy_hit_rate(access: AccessModel, policy: CachePolicy, cached_rows: int,
                    rows: int) -> float:
    """Steady-state fraction of lookups a cache of `cached_rows` of `rows` serves."""
    if policy is CachePolicy.LRU:
        return lru_hit_rate(access, cached_rows, rows)
    return access.hit_rate(cached_rows, rows)


def distinct_rows(access: AccessModel, rows: int, lookups: float) -> float:
    """Expected number of distinct rows among `lookups` independent lookups."""
    if rows <= 0 or lookups <= 0:
        return 0.0
    p, n = rate_groups(access, rows)
    return float(np.sum(n * -pm.expm1(-p * lookups)))
