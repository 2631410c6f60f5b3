"""Expected distinct rows among a batch's lookups: what a fused backward touches.

The executor's backward (planner/executor/kernels.row_grads_bags, then the store's update)
sums each looked-up row's gradient and applies the optimizer over the *sorted unique* ids of
the batch, so it reads and writes each distinct row once, not once per lookup. With k
independent lookups under per-row probabilities p_i, row i is touched with probability
1 - (1 - p_i)^k, so the expected count is

    U = sum_i 1 - (1 - p_i)^k          (uniform: N (1 - (1 - 1/N)^k))

summed over the rate groups of cache_policy.rate_groups (zipf: its first rows one by one, the
tail as a bucketed integral), so a table of 1e12 rows costs a few thousand terms.
"""

import functools

import numpy as np

from cost_models import portable_math as pm
from cost_models.access import AccessModel
from cost_models.cache_policy import rate_groups


@functools.lru_cache(maxsize=65536)
def unique_rows(access: AccessModel, rows: int, lookups: float) -> float:
    """Expected number of distinct rows of a `rows`-row table among `lookups` independent
    lookups drawn from `access`; never more than either."""
    if rows <= 0 or lookups <= 0:
        return 0.0
    n, touched = _touched(access, rows, lookups)
    return float(min(float(rows), lookups, float(np.sum(n * touched))))


def piece_unique_rows(access: AccessModel, rows: int, table_lookups: float,
                      share: float) -> float:
    """Distinct rows a piece holding `share` of the table's rows sees in a batch whose
    lookups of the whole table number `table_lookups`: ids are spread evenly over row ranges
    (access.py), so the piece's rows are a random `share` of the table's, each touched with
    the probability it has in the whole table."""
    return share * unique_rows(access, rows, table_lookups)


@functools.lru_cache(maxsize=65536)
def unique_rows_hot(access: AccessModel, rows: int, lookups: float, hot: int) -> float:
    """Of `unique_rows(access, rows, lookups)`, those among the `hot` most-accessed rows:
    what a cache holding them (LFU's steady state) serves in the backward. rate_groups lists
    the hottest rows first (uniform: one group; zipf by rank; a curve by its segments)."""
    if rows <= 0 or lookups <= 0 or hot <= 0:
        return 0.0
    n, touched = _touched(access, rows, lookups)
    # Rows of each group inside the hot set: whole groups first, then part of the next.
    inside = np.clip(float(min(hot, rows)) - _starts(access, rows), 0.0, n)
    return float(np.sum(inside * touched))


# unique_rows and unique_rows_hot ask for one table's batch several times (a piece shape
# per cache size): the groups' touch probabilities, which do not depend on the piece or the
# cache, are made once per batch, and the groups' starts once per table.
@functools.lru_cache(maxsize=1024)
def _touched(access: AccessModel, rows: int, lookups: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """(rows of each rate group, the chance that a row of it is touched); read-only."""
    n, log_miss = _log_miss(access, rows)
    # 1 - (1-p)^k as -expm1(k log1p(-p)): exact for p near 1, no cancellation for tiny p.
    # p = 1 (a one-row table): log1p gives -inf, and the row is touched surely (lookups > 0).
    touched = -pm.expm1(lookups * log_miss)
    touched.flags.writeable = False
    return n, touched


@functools.lru_cache(maxsize=1024)
def _log_miss(access: AccessModel, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows of each rate group, log(1 - p) of its rows' probability p), per table: what
    every batch's _touched reads; read-only."""
    p, n = rate_groups(access, rows)
    log_miss = pm.log1p(-np.minimum(p, 1.0))
    log_miss.flags.writeable = False
    return n, log_miss


@functools.lru_cache(maxsize=1024)
def _starts(access: AccessModel, rows: int) -> np.ndarray:
    """Rows before each rate group (the hotter groups'); read-only."""
    before = np.concatenate([[0.0], np.cumsum(rate_groups(access, rows)[1])[:-1]])
    before.flags.writeable = False
    return before
