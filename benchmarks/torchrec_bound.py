"""A lower bound on the step time any plan can reach under TorchRec's own estimators.

`torchrec_lower_bound(problem)` returns LB_T (ms): no plan, ours or TorchRec's, that
TorchRec's shard estimators can score (`planner.interop.score_with_torchrec`: per rank, the
sum of its shards' Perf.total; the plan, its slowest rank) and whose every shard fits one
GPU's HBM under TorchRec's storage estimate, scores below it. So LB_T / (TorchRec's plan's
score) is the best ratio any plan could reach against TorchRec under TorchRec's estimators.

The options. Per table, every option below, with shards and estimates from TorchRec's own
`EmbeddingEnumerator` (`enumerate`, then `populate_estimates` for the ones we add):
- everything TorchRec enumerates (all sharding types and compute kernels it proposes,
  fused_uvm_caching / fused_uvm / key_value included where it proposes them);
- for each compute kernel TorchRec enumerates for the table plus the kernels our export
  writes (fused, fused_uvm_caching, fused_uvm, key_value): table_wise; column_wise into k
  equal blocks and table_column_wise into k equal blocks (k <= GPUs per host); row_wise and
  table_row_wise with TorchRec's ceil(rows / parts) row blocks; grid_shard with k equal
  column blocks (k <= hosts), each split as table_row_wise over one host; and data_parallel
  (dense) where TorchRec did not enumerate it. k is what planner.candidates.column_splits
  gives: powers of two >= 2 with equal blocks, width a multiple of COLUMN_ALIGNMENT and >=
  the table's `min_column_shard_width` or our DEFAULT_MIN_COLUMN_WIDTH, k <= world size;
- caching kernels once with no cache params (TorchRec's default, what its plans carry) and
  once per load factor our plans carry: HBM_CACHE_RATIOS for fused_uvm_caching,
  SSD_CACHE_RATIOS for key_value, plus DEFAULT_CACHE_LOAD_FACTOR and 1.0 (what our import
  and our export write when a plan gives none). Options TorchRec enumerated are not added
  twice.
Options with a shard over one GPU's HBM cap (TorchRec's storage estimate vs its topology's
hbm_cap) are dropped: such a shard cannot be placed on any rank, so no plan that fits uses
them. (A plan that ignores the cap, which `score_with_torchrec` would still score, is not
covered; the benchmark reports each plan's TorchRec HBM use against the cap, and flags a
plan scored below the bound.)

Why it is a bound. For a table t and option o, work(o) = sum of its shards' Perf.total and
piece(o) = its largest shard's. TorchRec's estimate of a shard depends on the option
(table, sharding type, kernel, cache params, shard sizes, world and host sizes) but not on
the rank it lands on, and a plan's per-rank time is the plain sum of its shards' perf. Any
plan picks one option o_t per table and places its shards on ranks, so its slowest rank M
is >= each shard (M >= piece(o_t)) and >= the average rank (M * W >= sum_t work(o_t)).
Let f(T) = sum_t min{work(o) : o an option of t, piece(o) <= T}; f decreases in T, and for
that plan f(M) <= sum_t work(o_t) <= M * W. So M >= LB_T := the smallest T with
f(T) <= T * W, found by bisection (60 halvings of [max(work_bound, piece_bound), a
feasible T], tables summed in name order with math.fsum; the infeasible end, or
max(work_bound, piece_bound) when that is feasible, is returned, so floating point never
rounds the bound up). work_bound = sum_t min work / W and
piece_bound = max_t min piece are the two weaker bounds it combines; LB_T >= both.

Coverage of the plans compared. TorchRec's plan is built from its enumerated options (and
its storage check keeps every rank under the cap). Our plan is scored through its export
(planner/interop/export.py): table_wise, column_wise and table_column_wise keep our column
blocks, which our candidates (planner/candidates.py) cut into k equal blocks, k a power of
two with the limits above, so they are options here; row_wise, table_row_wise and each
grid column block are exported with TorchRec's ceil row split whatever our row split, and
grid needs equal column blocks on distinct hosts (else the table is inexpressible and the
plan is not scored), so those are options here too; data_parallel is exported dense. Tiers
map to fused / fused_uvm_caching / fused_uvm / key_value with our cache ratios, all
covered (column blocks use each table's own min_column_shard_width, as our candidates do).
Not covered: an imported hand-written TorchRec plan with other shapes (uneven column
blocks, other row splits or load factors); none occurs in the benchmark's plans.
`BoundResult.options` counts the options used (those that fit the HBM cap).
"""

import bisect
import copy
import math
from dataclasses import dataclass
from typing import Any

from planner.candidates import (
    DEFAULT_MIN_COLUMN_WIDTH,
    HBM_CACHE_RATIOS,
    SSD_CACHE_RATIOS,
    column_splits,
)
from planner.interop import TorchRecProblem
from planner.interop.export import ceil_row_split
from planner.interop.torchrec_format import (
    CACHED_KERNELS,
    DEFAULT_CACHE_LOAD_FACTOR,
    TORCHREC_KERNEL,
)
from planner.interop.torchrec_model import partition_by

BISECTION_STEPS = 60
# Load factors a caching kernel is estimated with, besides TorchRec's default (none given):
# those our planner's tiers use (our export writes the plan's ratio, or 1.0 if it has none).
# DEFAULT_CACHE_LOAD_FACTOR is what our import assumes when TorchRec's plan gives none.
LOAD_FACTORS = {
    "fused_uvm_caching": tuple(sorted({*HBM_CACHE_RATIOS, DEFAULT_CACHE_LOAD_FACTOR, 1.0})),
    "key_value": tuple(sorted({*SSD_CACHE_RATIOS, DEFAULT_CACHE_LOAD_FACTOR, 1.0})),
}


@dataclass(frozen=True)
class BoundResult:
    bound_ms: float  # LB_T: no plan under TorchRec's estimators has a faster slowest rank
    work_bound_ms: float  # sum over tables of the least total work, / world size
    piece_bound_ms: float  # max over tables of the least largest-shard time
    how: str
    options: int  # options used (after dropping the ones over the HBM cap)
    tables: int


def _shapes(rows: int, dim: int, min_width: int, world: int, local: int
            ) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
    """(sharding type, shards as (row offset, rows, col offset, cols)) for one table."""
    hosts = world // local
    out: list[tuple[str, list[tuple[int, int, int, int]]]] = [
        ("table_wise", [(0, rows, 0, dim)])]
    # The same block counts our candidates use, so every exported column split is covered.
    for k in column_splits(dim, min_width, world):
        w = dim // k
        out.append(("column_wise", [(0, rows, j * w, w) for j in range(k)]))
        if k <= local:
            out.append(("table_column_wise", [(0, rows, j * w, w) for j in range(k)]))
        if hosts > 1 and k <= hosts and local > 1:
            split = ceil_row_split(rows, local)
            out.append(("grid_shard", [(r0, rn, j * w, w) for j in range(k)
                                       for r0, rn in split]))
    if world > 1:
        out.append(("row_wise", [(r0, rn, 0, dim) for r0, rn in ceil_row_split(rows, world)]))
    if local > 1:
        out.append(("table_row_wise",
                    [(r0, rn, 0, dim) for r0, rn in ceil_row_split(rows, local)]))
    return out


def _key(sharding_type: str, kernel: str, sizes: list[list[int]]) -> tuple[Any, ...]:
    return sharding_type, kernel, tuple(tuple(int(x) for x in sz) for sz in sizes)


def _cache_variants(o: Any) -> list[Any]:
    from torchrec.distributed.types import CacheParams

    out = []
    for lf in LOAD_FACTORS.get(o.compute_kernel, ()):
        c = copy.deepcopy(o)
        c.cache_params = CacheParams(load_factor=lf)
        out.append(c)
    return out


def all_options(problem: TorchRecProblem) -> list[Any]:
    """Every option the bound ranges over, estimated (ShardingOption list, any HBM use)."""
    from torchrec.distributed.planner.types import Shard

    enum = problem.enumerator()
    base = enum.enumerate(problem.module, problem.sharders)
    top = problem.topology
    world, local = top.world_size, top.local_world_size
    specs = {t.name: t for t in problem.request.model.tables}
    by_table: dict[str, list[Any]] = {}
    for o in base:
        by_table.setdefault(o.name, []).append(o)
    ours_kernels = set(TORCHREC_KERNEL.values())
    extra: list[Any] = []
    for name in sorted(by_table):
        opts = by_table[name]
        # What TorchRec enumerated already (and estimated): not added twice.
        seen = {_key(o.sharding_type, o.compute_kernel, [s.size for s in o.shards])
                for o in opts if o.cache_params is None}
        template = opts[0]
        rows, dim = template.tensor.shape
        spec = specs[name]
        min_width = ((spec.constraints.min_column_shard_width if spec.constraints else None)
                     or DEFAULT_MIN_COLUMN_WIDTH)
        kernels = sorted({o.compute_kernel for o in opts if o.sharding_type != "data_parallel"}
                         | ours_kernels)
        for st, shards in _shapes(rows, dim, min_width, world, local):
            for kernel in kernels:
                if _key(st, kernel, [[rn, cn] for _, rn, _, cn in shards]) in seen:
                    continue
                o = copy.deepcopy(template)
                o.sharding_type, o.compute_kernel = st, kernel
                o.partition_by = partition_by(st)
                o.cache_params = None
                o.shards = [Shard(size=[rn, cn], offset=[r0, c0]) for r0, rn, c0, cn in shards]
                extra.append(o)
        if world > 1 and not any(o.sharding_type == "data_parallel" for o in opts):
            o = copy.deepcopy(template)
            o.sharding_type, o.compute_kernel = "data_parallel", "dense"
            o.partition_by, o.cache_params = partition_by("data_parallel"), None
            o.shards = [Shard(size=[rows, dim], offset=[0, 0]) for _ in range(world)]
            extra.append(o)
    extra += [c for o in (*base, *extra) if o.compute_kernel in CACHED_KERNELS
              for c in _cache_variants(o)]
    enum.populate_estimates(extra)
    return list(base) + extra


def torchrec_lower_bound(problem: TorchRecProblem) -> BoundResult:
    top = problem.topology
    world = top.world_size
    cap = top.devices[0].storage.hbm
    opts = all_options(problem)
    # Per table: (largest shard, total work) of every option that fits one GPU's HBM.
    per: dict[str, list[tuple[float, float]]] = {}
    for o in opts:
        per.setdefault(o.name, [])
        if all(s.storage.hbm <= cap for s in o.shards):
            per[o.name].append((max(s.perf.total for s in o.shards),
                                math.fsum(s.perf.total for s in o.shards)))
    empty = sorted(t for t, v in per.items() if not v)
    if empty:
        raise ValueError(f"no option of {empty[:3]} fits one GPU's HBM under TorchRec's "
                         "storage estimate: no plan fits")
    # Per table, options by largest shard with the running minimum of work: the least work
    # among options whose largest shard is <= T is prefix[bisect_right(pieces, T) - 1].
    tables = []
    for t in sorted(per):
        v = sorted(per[t])
        pieces = [p for p, _ in v]
        prefix, best = [], math.inf
        for _, w in v:
            best = min(best, w)
            prefix.append(best)
        tables.append((pieces, prefix))

    def least_work(T: float) -> float | None:
        parts = []
        for pieces, prefix in tables:
            i = bisect.bisect_right(pieces, T)
            if i == 0:
                return None
            parts.append(prefix[i - 1])
        return math.fsum(parts)

    def feasible(T: float) -> bool:
        w = least_work(T)
        return w is not None and w <= T * world

    work_bound = math.fsum(prefix[-1] for _, prefix in tables) / world
    piece_bound = max(pieces[0] for pieces, _ in tables)
    lo = max(work_bound, piece_bound)
    if feasible(lo):
        hi = lo
    else:
        hi = max(lo * 2, max(pieces[-1] for pieces, _ in tables))
        while not feasible(hi):
            hi *= 2
        for _ in range(BISECTION_STEPS):
            mid = (lo + hi) / 2
            if feasible(mid):
                hi = mid
            else:
                lo = mid
    which = ("the busiest single shard" if lo == piece_bound and lo >= work_bound
             else "the average rank" if lo == work_bound
             else "trading shard size against total work")
    how = (f"min over {sum(len(p) for p, _ in tables)} options (TorchRec's enumeration + "
           f"column/grid/row splits, every kernel and load factor) of max(largest shard, "
           f"work / {world}); set by {which}")
    return BoundResult(bound_ms=lo, work_bound_ms=work_bound, piece_bound_ms=piece_bound,
                       how=how, options=sum(len(p) for p, _ in tables), tables=len(tables))
