"""Candidate shardings per table: types x column splits x tiers x cache ratios, costed per piece.

A candidate's pieces come in groups that are placed as one: a table-wise or column-wise piece
goes to any GPU; a table-row-wise or grid column chunk goes to one host (piece j on the
host's j-th GPU); table-column-wise chunks go to distinct GPUs of one host; row-wise and
data-parallel pieces sit one per GPU of the world. Only groups need placement decisions.
"""

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from cost_models import (
    MemoryFootprint,
    ShardingType,
    Tier,
    piece_memory,
    piece_sides,
    piece_traffic,
    placed_piece_buffers,
    traffic_cost,
)
from planner.problem import Problem, TableInfo

# hbm_cache: fractions of a table's rows cached in HBM; ssd: fractions cached in DDR.
HBM_CACHE_RATIOS = (0.01, 0.05, 0.2, 0.5)
SSD_CACHE_RATIOS = (0.01, 0.1, 0.3)
# Column chunks narrower than this make lookups inefficient (TorchRec's default minimum).
DEFAULT_MIN_COLUMN_WIDTH = 32
# FBGEMM's kernels need column counts that are multiples of 4.
COLUMN_ALIGNMENT = 4
# Replicate only tables whose weights and state take at most this share of a GPU's free HBM:
# a replica costs that HBM on every GPU and an all-reduce of the whole table every step.
DATA_PARALLEL_MAX_HBM_SHARE = 1 / 32
# Enumerate slower tiers for every table once the tables' HBM need passes this share of the
# cluster's HBM. Below it, a slow-tier candidate is never faster than its HBM twin and HBM
# has room, so it would only slow the search; tables too large for the HBM get them always.
SLOW_TIER_PRESSURE = 0.5


class Scope(Enum):
    GPU = "gpu"  # each group is one piece, on any allowed GPU
    HOST_FIXED = "host_fixed"  # a group is one piece per GPU of one host, in local order
    HOST_FREE = "host_free"  # a group's pieces go to distinct GPUs of one host
    WORLD = "world"  # one group: piece i on rank i


@dataclass(frozen=True, eq=False)
class Group:
    """Pieces placed as one, as parallel arrays (one entry per piece).

    geometry rows are (row_offset, row_count, col_offset, col_count); comp and comm are the
    seconds of compute and communication the piece adds to its GPU; hbm counts against the
    GPU, ddr and ssd against its host. inter (k, 3) are the piece-side inter-host bytes and
    rate (k, 3) the owner bytes per sample, per all-to-all phase (cost_models/placement.py).
    """

    geometry: np.ndarray
    comp: np.ndarray
    comm: np.ndarray
    hbm: np.ndarray
    ddr: np.ndarray
    ssd: np.ndarray
    inter: np.ndarray
    rate: np.ndarray

    def __len__(self) -> int:
        return len(self.comp)


@dataclass(frozen=True, eq=False)
class Candidate:
    table: int
    kind: ShardingType
    tier: Tier
    cache_ratio: float | None
    scope: Scope
    groups: tuple[Group, ...]
    work: float  # sum over pieces of compute + communication, seconds
    comp_work: float
    comm_work: float
    max_piece: float  # largest single-GPU cost this candidate puts on one GPU
    max_piece_hbm: int
    hbm_total: int
    ddr_total: int
    ssd_total: int
    # Per (rows, cols) piece shape, the 16 per-GPU figures planner.plan_build sums: the six
    # cost terms, hbm (with step buffers), ddr, ssd, 3 inter-host bytes, 3 owner rates, the
    # step buffers. Costed here once, so the plan's per-GPU totals need no second costing.
    figures: dict[tuple[int, int], tuple[float, ...]] | None = None

    @property
    def total_bytes(self) -> int:
        """HBM, DDR and SSD bytes together."""
        return self.hbm_total + self.ddr_total + self.ssd_total

    @property
    def label(self) -> str:
        width = int(self.groups[0].geometry[0, 3])
        split = f" {width}-col chunks" if self.kind in _COLUMN_SPLIT else ""
        ratio = f" cache {self.cache_ratio:g}" if self.cache_ratio is not None else ""
        return f"{self.kind.value}{split} {self.tier.value}{ratio}"

    def dominance_key(self) -> tuple[float, ...]:
        # A world-scope candidate (data-parallel, row-wise) puts bytes on every GPU, even a
        # full one; a one-GPU candidate with more bytes in total is not worse for fitting
        # (a tiny table whose replica is leaner than its table-wise piece with its step
        # buffers must keep both), hence the bytes forced onto every GPU as an axis.
        every = min(int(g.hbm.min()) for g in self.groups) if self.scope is Scope.WORLD else 0
        return (self.work, self.max_piece, float(self.hbm_total), float(self.ddr_total),
                float(self.ssd_total), float(self.max_piece_hbm), float(every))


_COLUMN_SPLIT = frozenset(
    {ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID}
)


def even_split(total: int, parts: int) -> list[tuple[int, int]]:
    """(offset, count) of `parts` contiguous ranges over `total`, sizes differing by at most 1."""
    q, rem = divmod(total, parts)
    out, off = [], 0
    for i in range(parts):
        n = q + (1 if i < rem else 0)
        out.append((off, n))
        off += n
    return out


def column_splits(dim: int, min_width: int, max_chunks: int) -> list[int]:
    """Chunk counts k >= 2 (powers of two) that cut `dim` into equal aligned chunks."""
    ks, k = [], 2
    while k <= max_chunks:
        width = dim // k
        if dim % k == 0 and width >= min_width and width % COLUMN_ALIGNMENT == 0:
            ks.append(k)
        k *= 2
    return ks


def _tier_options(t: TableInfo, slow_tiers: bool) -> list[tuple[Tier, float | None]]:
    allowed = set(t.constraints.memory_tiers or list(Tier))
    opts: list[tuple[Tier, float | None]] = []
    if Tier.HBM in allowed:
        opts.append((Tier.HBM, None))
    if slow_tiers or Tier.HBM not in allowed:
        if Tier.HBM_CACHE in allowed:
            opts += [(Tier.HBM_CACHE, r) for r in HBM_CACHE_RATIOS]
        if Tier.DDR in allowed:
            opts.append((Tier.DDR, None))
        if Tier.SSD in allowed:
            opts += [(Tier.SSD, r) for r in SSD_CACHE_RATIOS]
    return opts


def _fitting_ratios(problem: Problem, t: TableInfo, tiers: list[tuple[Tier, float | None]]
                    ) -> list[tuple[Tier, float]]:
    """Beyond the grid: the largest cache ratio (in hundredths) whose whole-table cache still
    fits one GPU's HBM (hbm_cache) or one host's DDR (ssd), when it lies above the grid's
    largest; a layout with it can be several times faster than the grid's best."""
    hw, rows, dim = problem.hw, t.geom.rows, t.geom.dim
    out: list[tuple[Tier, float]] = []
    allowed = set(t.constraints.memory_tiers or list(Tier))
    for tier, grid, cap, whole in ((Tier.HBM_CACHE, HBM_CACHE_RATIOS, hw.hbm_cap, Tier.HBM),
                                   (Tier.SSD, SSD_CACHE_RATIOS, hw.ddr_cap, Tier.DDR)):
        # Only where the faster tier cannot hold the whole table (or is not allowed): else
        # that tier beats any cache in front of the slower one, and costing it is wasted.
        if (tier, grid[0]) not in tiers or (whole in allowed and t.bytes <= cap):
            continue
        full = piece_memory(t.geom, tier, 1.0, rows, dim, hw)
        per_all = full.hbm if tier is Tier.HBM_CACHE else full.ddr
        ratio = min(1.0, math.floor(100 * cap / max(per_all, 1)) / 100)
        if ratio > grid[-1]:
            out.append((tier, ratio))
    return out


class _Coster:
    """Costs one table's distinct piece shapes: each (type, tier, cache ratio, rows, columns)
    once; a shape's step buffers, the same for every tier and cache ratio, once per table;
    its memory, the same for every sharding type, once per tier and cache ratio. Groups
    with the same shapes (a column-wise candidate's chunks) share one set of arrays."""

    def __init__(self, problem: Problem, t: TableInfo) -> None:
        self.p, self.t = problem, t
        self.shapes: dict[tuple[ShardingType, Tier, float, int, int], tuple[float, ...]] = {}
        self.figures: dict[tuple[ShardingType, Tier, float, int, int], tuple[float, ...]] = {}
        self.buffers: dict[tuple[bool, bool, float | None, int, int], int] = {}
        self.memory: dict[tuple[Tier, float, int, int], MemoryFootprint] = {}
        self.arrays: dict[tuple[ShardingType, Tier, float, tuple[int, ...]],
                          tuple[np.ndarray, ...]] = {}

    def _shape(self, kind: ShardingType, tier: Tier, ratio: float, rows: int,
               cols: int) -> tuple[float, ...]:
        """compute, comm, hbm, ddr, ssd, then 3 inter-host bytes and 3 owner rates."""
        key = (kind, tier, ratio, rows, cols)
        found = self.shapes.get(key)
        if found is not None:
            return found
        p, t = self.p, self.t
        # Buffers differ by data-parallel, host-reduced (table-row-wise, grid) and by the
        # cache's slots (cached tiers): the key holds what they read.
        cached = tier in (Tier.HBM_CACHE, Tier.SSD)
        bkey = (kind is ShardingType.DATA_PARALLEL,
                kind in (ShardingType.TABLE_ROW_WISE, ShardingType.GRID),
                ratio if cached else None, rows, cols)
        buf = self.buffers.get(bkey)
        if buf is None:
            buf = self.buffers[bkey] = placed_piece_buffers(
                t.geom, kind, tier, ratio, rows, cols, p.hw, p.model).total
        m = self.memory.get((tier, ratio, rows, cols))
        if m is None:
            m = self.memory[(tier, ratio, rows, cols)] = piece_memory(
                t.geom, tier, ratio, rows, cols, p.hw)
        traffic = piece_traffic(t.geom, kind, tier, ratio, rows, cols, p.hw, p.model)
        c = traffic_cost(traffic, p.hw)
        inter, rate = piece_sides(traffic)
        sides = (*inter.tolist(), *rate.tolist())
        found = self.shapes[key] = (c.compute, c.comm, m.hbm + buf, m.ddr, m.ssd, *sides)
        self.figures[key] = (c.lookup, c.backward, c.cache_miss, c.input_a2a, c.output_a2a,
                             c.allreduce, m.hbm + buf, m.ddr, m.ssd, *sides, buf)
        return found

    def group(self, prepared: "_Prepared", kind: ShardingType, tier: Tier,
              ratio: float | None) -> Group:
        r = ratio if ratio is not None else 1.0
        key = (kind, tier, r, prepared.keys)
        arrays = self.arrays.get(key)
        if arrays is None:
            costed = np.array([self._shape(kind, tier, r, rows, cols)
                               for rows, cols in prepared.shapes], dtype=np.float64)
            values = costed if prepared.inverse is None else costed[prepared.inverse]
            # Byte counts are exact integers (< 2**53), so the float round trip is lossless.
            as_int = values[:, 2:5].astype(np.int64)
            arrays = self.arrays[key] = (
                values[:, 0].copy(), values[:, 1].copy(), as_int[:, 0].copy(),
                as_int[:, 1].copy(), as_int[:, 2].copy(), values[:, 5:8].copy(),
                values[:, 8:11].copy())
        comp, comm, hbm, ddr, ssd, inter, rate = arrays
        return Group(geometry=prepared.geometry, comp=comp, comm=comm, hbm=hbm, ddr=ddr,
                     ssd=ssd, inter=inter, rate=rate)


@dataclass(frozen=True, eq=False)
class _Prepared:
    """A group's geometry with its distinct (rows, cols) shapes found once for all tiers:
    `inverse` maps each piece to its shape (None: one piece)."""

    geometry: np.ndarray
    shapes: tuple[tuple[int, int], ...]
    keys: tuple[int, ...]
    inverse: np.ndarray | None


def _prepare(geometry: np.ndarray) -> _Prepared:
    if len(geometry) == 1:  # most groups: one piece, one shape
        rows, cols = int(geometry[0, 1]), int(geometry[0, 3])
        return _Prepared(geometry, ((rows, cols),), ((rows << 17) | cols,), None)
    # One integer key per (rows, cols) shape: cols < 2**17 always (MAX_DIM = 65536).
    keys = (geometry[:, 1] << 17) | geometry[:, 3]
    shapes, inverse = np.unique(keys, return_inverse=True)
    pairs = tuple((int(k >> 17), int(k & 0x1FFFF)) for k in shapes.tolist())
    return _Prepared(geometry, pairs, (*keys.tolist(),), inverse.reshape(-1))


Shape = tuple[ShardingType, Scope, list[np.ndarray]]


def _geo(pieces: list[tuple[int, int, int, int]]) -> np.ndarray:
    return np.array(pieces, dtype=np.int64).reshape(-1, 4)


def _row_bands(rows: int, parts: int, col_offset: int, cols: int) -> np.ndarray:
    """_geo([(r0, rn, col_offset, cols) for r0, rn in even_split(rows, parts)]), as arrays
    (a row-wise candidate on 1,024 GPUs has 1,024 pieces)."""
    q, rem = divmod(rows, parts)
    counts = np.full(parts, q, dtype=np.int64)
    counts[:rem] += 1
    geo = np.empty((parts, 4), dtype=np.int64)
    geo[:, 0] = np.cumsum(counts) - counts
    geo[:, 1] = counts
    geo[:, 2] = col_offset
    geo[:, 3] = cols
    return geo


def _shapes(problem: Problem, t: TableInfo) -> list[Shape]:
    """(type, scope, groups of (row_offset, rows, col_offset, cols)) allowed for the table."""
    hw = problem.hw
    g, w, hosts = hw.gpus_per_host, hw.world_size, hw.hosts
    rows, dim = t.geom.rows, t.geom.dim
    allowed = set(t.constraints.sharding_types or list(ShardingType))
    min_w = t.constraints.min_column_shard_width or DEFAULT_MIN_COLUMN_WIDTH
    full = (0, rows, 0, dim)
    out: list[Shape] = []
    if ShardingType.TABLE_WISE in allowed:
        out.append((ShardingType.TABLE_WISE, Scope.GPU, [_geo([full])]))
    if ShardingType.COLUMN_WISE in allowed:
        for k in column_splits(dim, min_w, w):
            chunks = even_split(dim, k)
            out.append((ShardingType.COLUMN_WISE, Scope.GPU,
                        [_geo([(0, rows, c0, cn)]) for c0, cn in chunks]))
    if ShardingType.ROW_WISE in allowed and rows >= w and w > 1:
        out.append((ShardingType.ROW_WISE, Scope.WORLD, [_row_bands(rows, w, 0, dim)]))
    if ShardingType.TABLE_ROW_WISE in allowed and rows >= g and g > 1:
        out.append((ShardingType.TABLE_ROW_WISE, Scope.HOST_FIXED,
                    [_geo([(r0, rn, 0, dim) for r0, rn in even_split(rows, g)])]))
    if ShardingType.TABLE_COLUMN_WISE in allowed and g > 1:
        for k in column_splits(dim, min_w, g):
            out.append((ShardingType.TABLE_COLUMN_WISE, Scope.HOST_FREE,
                        [_geo([(0, rows, c0, cn) for c0, cn in even_split(dim, k)])]))
    if ShardingType.GRID in allowed and hosts > 1 and g > 1 and rows >= g:
        for k in column_splits(dim, min_w, hosts):
            row_parts = even_split(rows, g)
            out.append((ShardingType.GRID, Scope.HOST_FIXED,
                        [_geo([(r0, rn, c0, cn) for r0, rn in row_parts])
                         for c0, cn in even_split(dim, k)]))
    if (ShardingType.DATA_PARALLEL in allowed and w > 1
            and t.bytes <= DATA_PARALLEL_MAX_HBM_SHARE * hw.hbm_cap):
        out.append((ShardingType.DATA_PARALLEL, Scope.WORLD,
                    [np.tile(np.array(full, dtype=np.int64), (w, 1))]))
    return out


def _build(problem: Problem, t: TableInfo, kind: ShardingType, scope: Scope,
           shape_groups: list[np.ndarray], tier: Tier, ratio: float | None,
           coster: "_Coster | None" = None,
           prepared: "list[_Prepared] | None" = None) -> Candidate:
    coster = coster or _Coster(problem, t)
    prepared = prepared or [_prepare(geo) for geo in shape_groups]
    groups = tuple(coster.group(pg, kind, tier, ratio) for pg in prepared)
    if len(groups) == 1:
        comp_all, comm_all = groups[0].comp, groups[0].comm
    else:
        comp_all = np.concatenate([g.comp for g in groups])
        comm_all = np.concatenate([g.comm for g in groups])
    per_piece = np.maximum(comp_all, comm_all) if problem.model.pipelined else comp_all + comm_all
    comp, comm = math.fsum(comp_all.tolist()), math.fsum(comm_all.tolist())
    r = ratio if ratio is not None else 1.0
    figures = {shape: coster.figures[(kind, tier, r, *shape)]
               for pg in prepared for shape in pg.shapes}
    return Candidate(
        table=t.index, kind=kind, tier=tier, cache_ratio=ratio, scope=scope, groups=groups,
        work=comp + comm, comp_work=comp, comm_work=comm, max_piece=float(per_piece.max()),
        max_piece_hbm=int(max(int(g.hbm.max()) for g in groups)),
        hbm_total=sum(int(g.hbm.sum()) for g in groups),
        ddr_total=sum(int(g.ddr.sum()) for g in groups),
        ssd_total=sum(int(g.ssd.sum()) for g in groups),
        figures=figures,
    )


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Drop candidates another one beats or ties on every axis (time, largest piece, memory).

    Exact ties keep the first in enumeration order, so the result is deterministic.
    """
    if len(cands) < 2:
        return cands
    keys = np.array([c.dominance_key() for c in cands])
    le = (keys[:, None, :] <= keys[None, :, :]).all(axis=2)
    lt = (keys[:, None, :] < keys[None, :, :]).any(axis=2)
    n = len(cands)
    earlier = np.tri(n, k=-1, dtype=bool).T  # earlier[o, c]: o comes before c
    dominated = (le & (lt | earlier)).any(axis=0)
    return [c for c, d in zip(cands, dominated, strict=True) if not d]


def _fits_alone(problem: Problem, c: Candidate) -> bool:
    """Could this candidate be placed on an empty cluster? (Per-piece and per-host caps.)"""
    hw = problem.hw
    if c.max_piece_hbm > hw.hbm_cap:
        return False
    for grp in c.groups:
        if c.scope is Scope.WORLD:
            per_host_ddr = grp.ddr.reshape(hw.hosts, -1).sum(axis=1).max()
            per_host_ssd = grp.ssd.reshape(hw.hosts, -1).sum(axis=1).max()
        elif c.scope is Scope.GPU:
            per_host_ddr, per_host_ssd = grp.ddr.max(), grp.ssd.max()
        else:
            per_host_ddr, per_host_ssd = grp.ddr.sum(), grp.ssd.sum()
        if per_host_ddr > hw.ddr_cap or per_host_ssd > hw.ssd_cap:
            return False
    return True


def slow_tiers_needed(problem: Problem) -> bool:
    hbm_need = sum(t.bytes for t in problem.tables)
    return hbm_need > SLOW_TIER_PRESSURE * problem.hw.world_size * problem.hw.hbm_cap


def enumerate_candidates(problem: Problem, t: TableInfo, slow_tiers: bool,
                         keep_unfit: bool = False) -> list[Candidate]:
    """All allowed candidates of a table that fit an empty cluster, minus dominated ones.

    Pinned ranks restrict which shapes can be placed at all: row-wise and data-parallel need
    every rank, host-scoped types need enough pinned GPUs in one host.
    """
    hw = problem.hw
    huge = t.bytes > SLOW_TIER_PRESSURE * hw.world_size * hw.hbm_cap
    tiers = _tier_options(t, slow_tiers or huge)
    tiers += _fitting_ratios(problem, t, tiers)
    pinned = set(t.constraints.pinned_ranks) if t.constraints.pinned_ranks else None
    out: list[Candidate] = []
    coster = _Coster(problem, t)
    for kind, scope, shape in _shapes(problem, t):
        if pinned is not None and not _pins_allow(scope, shape, pinned, hw.gpus_per_host,
                                                  hw.world_size):
            continue
        prepared = [_prepare(geo) for geo in shape]
        for tier, ratio in tiers:
            if kind is ShardingType.DATA_PARALLEL and tier is not Tier.HBM:
                continue
            cand = _build(problem, t, kind, scope, shape, tier, ratio, coster, prepared)
            if keep_unfit or _fits_alone(problem, cand):
                out.append(cand)
    return pareto_front(out)


def _pins_allow(scope: Scope, shape: list[np.ndarray], pinned: set[int],
                g: int, w: int) -> bool:
    if scope is Scope.WORLD:
        return len(pinned) == w
    if scope is Scope.GPU:
        return True
    need = len(shape[0])
    hosts_ok = 0
    for h in range(w // g):
        local = [r for r in range(h * g, (h + 1) * g) if r in pinned]
        if (scope is Scope.HOST_FIXED and len(local) == g) or (
                scope is Scope.HOST_FREE and len(local) >= need):
            hosts_ok += 1
    return hosts_ok >= (len(shape) if scope is Scope.HOST_FIXED else 1)


# How a layout's pieces of each sharding type group for placement (see the module docstring).
_SCOPE_OF = {
    ShardingType.TABLE_WISE: Scope.GPU, ShardingType.COLUMN_WISE: Scope.GPU,
    ShardingType.ROW_WISE: Scope.WORLD, ShardingType.DATA_PARALLEL: Scope.WORLD,
    ShardingType.TABLE_ROW_WISE: Scope.HOST_FIXED, ShardingType.GRID: Scope.HOST_FIXED,
    ShardingType.TABLE_COLUMN_WISE: Scope.HOST_FREE,
}


def candidate_of_pieces(problem: Problem, t: TableInfo, kind: ShardingType, tier: Tier,
                        ratio: float | None,
                        pieces: list[tuple[int, int, int, int]]) -> Candidate:
    """The candidate a given layout's table stands for (its own shape, tier and cache ratio,
    which may lie outside the enumerated grid), costed like every other candidate; pieces are
    (row_offset, rows, col_offset, cols). Used so a bound covers a foreign layout too."""
    scope = _SCOPE_OF[kind]
    if scope is Scope.GPU:
        groups = [_geo([p]) for p in pieces]
    elif kind is ShardingType.GRID:
        bands = sorted({p[2] for p in pieces})
        groups = [_geo([p for p in pieces if p[2] == c0]) for c0 in bands]
    else:
        groups = [_geo(pieces)]
    return _build(problem, t, kind, scope, groups, tier, ratio)
