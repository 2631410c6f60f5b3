"""How many forward-only steps a run's caches need before their hit rate is measured.

A cache starts empty (store.py) and is measured from the first training step, so the warm-up
must bring every cache to its policy's steady state, the state cache_policy.py predicts:
- filled: the expected number of distinct rows looked up reaches the cache's rows plus
  min(rows, half the rows it cannot hold) (for LRU, full is steady: it then holds the
  most recent rows, whatever came before);
- LFU, on a skewed table, also ranked: the row at the cache's boundary (popularity rank C)
  expected LFU_COUNT times, so that counts order the rows near the boundary (measured on the
  store alone: the LFU shortfall falls from ~1.2 points at ~3 counts to ~0.1 at ~30).
Pieces are read as their table (ids spread evenly over row ranges, as traffic.hit_rate reads
them): a piece of r of the table's R rows with C slots is the table with C*R/r slots, each of
its lookups one of R/r of the table's. A cache with a slot for every row of its piece (the
model's hit rate 1) is steady once FULL_CACHE_SEEN of the piece's rows were looked up: it too
starts empty. Bounded by MAX_WARMUP_STEPS.
"""

import math

import numpy as np

from cost_models import AccessModel, Tier, cache_rows, piece_traffic
from cost_models.cache_policy import CachePolicy, distinct_rows, rate_groups
from planner.plan_model import Plan
from planner.problem import build_problem

LFU_COUNT = 32.0
# A cache holding every row: warm once this share of the rows was seen (the rest, unseen,
# costs at most 0.5 point of hit rate, well inside the check's 2 points).
FULL_CACHE_SEEN = 0.995
MAX_WARMUP_STEPS = 400
_CACHED = (Tier.HBM_CACHE, Tier.SSD)


def warmup_steps(plan: Plan) -> int:
    """Forward-only steps that bring every cache of `plan` to its steady state."""
    problem = build_problem(plan.request)
    by_name = {t.name: t.geom for t in problem.tables}
    need = 0
    for tp in plan.tables:
        if tp.tier not in _CACHED:
            continue
        geom = by_name[tp.name]
        ratio = tp.cache_ratio if tp.cache_ratio is not None else 1.0
        for p in tp.pieces:
            tr = piece_traffic(geom, tp.sharding_type, tp.tier, ratio, p.row_count,
                               p.col_count, problem.hw, problem.model)
            slots = cache_rows(ratio, p.row_count)
            if tr.lookups <= 0:
                continue
            scale = geom.rows / p.row_count
            if slots >= p.row_count:
                lookups = table_lookups(geom.access, geom.cache_policy, geom.rows, geom.rows,
                                        target=FULL_CACHE_SEEN * geom.rows)
            else:
                lookups = table_lookups(geom.access, geom.cache_policy, geom.rows,
                                        slots * scale)
            need = max(need, math.ceil(lookups / (tr.lookups * scale)))
    return min(need, MAX_WARMUP_STEPS)


def table_lookups(access: AccessModel, policy: CachePolicy, rows: int, slots: float,
                  target: float | None = None) -> float:
    """Lookups of the whole table after which a cache of `slots` of its rows is steady
    (`target`: the distinct rows to reach, in place of the fill rule above)."""
    p, n = rate_groups(access, rows)
    target_given = target is not None
    if target is None:
        target = slots + min(slots, (rows - slots) / 2)
    # distinct_rows rises with the lookups: double, then bisect.
    hi = 1.0
    while distinct_rows(access, rows, hi) < target and hi < 1e18:
        hi *= 2
    lo = hi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if distinct_rows(access, rows, mid) < target:
            lo = mid
        else:
            hi = mid
    fill = hi
    # A full cache holds every row whatever the counts: no ranking to wait for.
    if not target_given and policy is CachePolicy.LFU and \
            float(np.max(p)) > float(np.min(p)) * (1 + 1e-12):
        # p of the row at popularity rank `slots` (groups run hottest first).
        at = min(int(np.searchsorted(np.cumsum(n), slots)), len(p) - 1)
        fill = max(fill, LFU_COUNT / float(p[at]))
    return fill
