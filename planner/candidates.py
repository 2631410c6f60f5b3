"""Candidate shardings per table: types x column splits x tiers x cache ratios, costed per piece.

A candidate's pieces come in groups that are placed as one: a table-wise or column-wise piece
goes to any GPU; a table-row-wise or grid column chunk goes to one host (piece j on the
host's j-th GPU); table-column-wise chunks go to distinct GPUs of one host; row-wise and
data-parallel pieces sit one per GPU of the world. Only groups need placement decisions.
"""

import functools
import itertools
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

import numpy as np

from cost_models import (
    CostBreakdown,
    MemoryFootprint,
    ShardingType,
    Tier,
    piece_memory,
    piece_traffic,
    placed_piece_buffers,
    priced_sides,
)
from planner.problem import Problem, TableInfo
from planner.spec import TableConstraints

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
    seconds the piece adds to its GPU's two sides (CostBreakdown.sides: compute, less the
    input all-to-all when the step is pipelined, and communication); hbm counts against the
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
    work: float  # sum over pieces of comp + comm (Group's sides), seconds
    comp_work: float  # ... of comp alone
    comm_work: float  # ... of comm alone
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
        split = f" {width}-col chunks" if self.kind in COLUMN_SPLIT_TYPES else ""
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


# The types that split a table by columns: each chunk at least min_column_width wide.
COLUMN_SPLIT_TYPES = frozenset(
    {ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID}
)


def min_column_width(constraints: TableConstraints) -> int:
    """The narrowest column chunk a table's constraints allow (their own or the default)."""
    return constraints.min_column_shard_width or DEFAULT_MIN_COLUMN_WIDTH


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
    """Chunk counts k >= 2 that cut `dim` into equal aligned chunks of at least `min_width`
    columns: every divisor, not only powers of two (dim 96 at 32 wide: 2 and 3 chunks), so
    the finest split the checker accepts at equal widths is in the grid."""
    top = min(max_chunks, dim // max(min_width, 1))
    return [k for k in range(2, top + 1)
            if dim % k == 0 and (dim // k) >= min_width and (dim // k) % COLUMN_ALIGNMENT == 0]


def _tier_options(t: TableInfo, slow_tiers: bool) -> list[tuple[Tier, float | None]]:
    allowed = set(t.constraints.memory_tiers or list(Tier))
    opts: list[tuple[Tier, float | None]] = []
    if Tier.HBM in allowed:
        opts.append((Tier.HBM, None))
    if slow_tiers or Tier.HBM not in allowed:
        fixed = t.constraints.cache_load_factor
        if Tier.HBM_CACHE in allowed:
            opts += [(Tier.HBM_CACHE, r) for r in ((fixed,) if fixed else HBM_CACHE_RATIOS)]
        if Tier.DDR in allowed:
            opts.append((Tier.DDR, None))
        if Tier.SSD in allowed:
            opts += [(Tier.SSD, r) for r in ((fixed,) if fixed else SSD_CACHE_RATIOS)]
    return opts


def _fitting_ratios(problem: Problem, t: TableInfo, tiers: list[tuple[Tier, float | None]]
                    ) -> list[tuple[Tier, float]]:
    """Beyond the grid: the largest cache ratio (in hundredths) whose whole-table cache still
    fits one GPU's HBM (hbm_cache) or one host's DDR (ssd), when it lies above the grid's
    largest (a layout with it can be several times faster than the grid's best), or, at two
    significant digits, below its smallest (the only cache that fits)."""
    hw, rows, dim = problem.hw, t.geom.rows, t.geom.dim
    out: list[tuple[Tier, float]] = []
    if t.constraints.cache_load_factor:  # the user's ratio, no other
        return out
    allowed = set(t.constraints.memory_tiers or list(Tier))
    for tier, grid, cap, whole in ((Tier.HBM_CACHE, HBM_CACHE_RATIOS, hw.hbm_cap, Tier.HBM),
                                   (Tier.SSD, SSD_CACHE_RATIOS, hw.ddr_cap, Tier.DDR)):
        # Only where the faster tier cannot hold the whole table (or is not allowed): else
        # that tier beats any cache in front of the slower one, and costing it is wasted.
        if (tier, grid[0]) not in tiers or (whole in allowed and t.bytes <= cap):
            continue
        full = piece_memory(t.geom, tier, 1.0, rows, dim, hw)
        per_all = full.hbm if tier is Tier.HBM_CACHE else full.ddr
        exact = cap / max(per_all, 1)
        ratio = min(1.0, math.floor(100 * exact) / 100)
        if ratio > grid[-1]:
            out.append((tier, ratio))
        elif exact < grid[0]:
            # Below the grid's smallest, where no ratio of the grid fits one GPU or host: the
            # largest that does (else a request whose tier is forced is "infeasible" though
            # a smaller cache holds it).
            small = _largest_fitting_ratio(problem, t, tier, min(grid[0], exact))
            if small is not None:
                out.append((tier, small))
    return out


def _largest_fitting_ratio(problem: Problem, t: TableInfo, tier: Tier, start: float
                           ) -> float | None:
    """The largest cache ratio at or below `start`, at two significant digits, whose
    whole-table piece (its cache, the step buffers its slots size, and for ssd the policy
    state of every row) fits one GPU's HBM and one host's DDR; None below 1e-6."""
    hw, rows, dim = problem.hw, t.geom.rows, t.geom.dim
    r = start
    while r >= 1e-6:
        scale = 10.0 ** (1 - math.floor(math.log10(r)))
        r = math.floor(r * scale) / scale
        m = piece_memory(t.geom, tier, r, rows, dim, hw)
        buf = placed_piece_buffers(t.geom, ShardingType.TABLE_WISE, tier, r, rows, dim, hw,
                                   problem.model).total
        if m.hbm + buf <= hw.hbm_cap and m.ddr <= hw.ddr_cap:
            return r
        r *= 0.9
    return None


# What the cost model reads of a piece's sharding type: whether it is a data-parallel replica
# and whether it is host-reduced (table-row-wise, grid); piece_traffic and
# placed_piece_buffers read nothing else of it (tests/test_candidates.py checks that
# table-, column-, table-column- and row-wise pieces of one shape cost the same).
_KIND_CLASS = {k: (k is ShardingType.DATA_PARALLEL,
                   k in (ShardingType.TABLE_ROW_WISE, ShardingType.GRID)) for k in ShardingType}


@dataclass(frozen=True)
class _Bytes:
    """One table's pieces' bytes by shape, without their times: step buffers by (type class,
    cache slots, rows, columns), memory by (tier, ratio, rows, columns), groups' bytes by
    (type class, tier, ratio, shapes)."""

    buffers: dict[tuple[bool, bool, float | None, int, int], int]
    memory: dict[tuple[Tier, float, int, int], MemoryFootprint]
    placed: dict[tuple[tuple[bool, bool], Tier, float, tuple[object, ...]], "_GroupBytes"]


class _Coster:
    """Costs one table's distinct piece shapes: each (type class, tier, cache ratio, rows,
    columns) once (_KIND_CLASS: a column-wise and a table-column-wise chunk of one shape are
    costed once); a shape's step buffers, the same for every tier and cache ratio, once per
    table; its memory, the same for every sharding type, once per tier and cache ratio.
    Groups with the same shapes (a column-wise candidate's chunks) share one set of
    arrays."""

    def __init__(self, problem: Problem, t: TableInfo, held: "_Bytes | None" = None) -> None:
        self.p, self.t = problem, t
        self.est = problem.estimator
        self.shapes: dict[tuple[tuple[bool, bool], Tier, float, int, int],
                          tuple[float, ...]] = {}
        self.figures: dict[tuple[tuple[bool, bool], Tier, float, int, int],
                           tuple[float, ...]] = {}
        self.costed: dict[tuple[tuple[bool, bool], Tier, float, tuple[object, ...]],
                          _Costed] = {}
        # Bytes alone (no time): what `least_bytes` found, where it ran first on this table.
        held = held if held is not None else _Bytes({}, {}, {})
        self.buffers, self.memory, self.placed = held.buffers, held.memory, held.placed
        # Estimators that price a candidate's pieces together (`price`): their prices.
        self.prices: dict[tuple[object, ...], CostBreakdown] = {}
        self.priced: set[tuple[object, ...]] = set()

    def _bytes(self, kind: ShardingType, tier: Tier, ratio: float, rows: int,
               cols: int) -> tuple[int, int, int, int]:
        """hbm (with the step buffers), ddr, ssd of one piece, and its step buffers."""
        p, t = self.p, self.t
        # Buffers differ by data-parallel, host-reduced (table-row-wise, grid) and by the
        # cache's slots (cached tiers): the key holds what they read.
        cached = tier in (Tier.HBM_CACHE, Tier.SSD)
        bkey = (*_KIND_CLASS[kind], ratio if cached else None, rows, cols)
        buf = self.buffers.get(bkey)
        if buf is None:
            buf = self.buffers[bkey] = placed_piece_buffers(
                t.geom, kind, tier, ratio, rows, cols, p.hw, p.model).total
        m = self.memory.get((tier, ratio, rows, cols))
        if m is None:
            m = self.memory[(tier, ratio, rows, cols)] = piece_memory(
                t.geom, tier, ratio, rows, cols, p.hw)
        return m.hbm + buf, m.ddr, m.ssd, buf

    def group_bytes(self, prepared: "_Prepared", kind: ShardingType, tier: Tier,
                    ratio: float | None) -> "_GroupBytes":
        """A group's bytes alone (no time costed): what fitting and the certificates read."""
        r = ratio if ratio is not None else 1.0
        key = (_KIND_CLASS[kind], tier, r, prepared.key)
        found = self.placed.get(key)
        if found is None:
            found = self.placed[key] = _GroupBytes.of(
                [self._bytes(kind, tier, r, rows, cols)[:3] for rows, cols in prepared.shapes],
                prepared)
        return found

    def price(self, kind: ShardingType, tier: Tier, ratio: float | None,
              prepared: "list[_Prepared]") -> object:
        """None where the estimator prices by shape (the caches key by type class). Else the
        candidate's pieces are priced together, once, and the returned context keys them."""
        est = self.est
        if est.per_shape:
            return None
        r = ratio if ratio is not None else 1.0
        ctx = (kind, tuple(pg.key for pg in prepared))
        if (ctx, tier, r) in self.priced:
            return ctx
        shapes = [(int(rows), int(cols)) for pg in prepared
                  for rows, cols in pg.geometry[:, [1, 3]].tolist()]
        p, t = self.p, self.t
        bytes_of = {(rows, cols): piece_traffic(t.geom, kind, tier, r, rows, cols, p.hw, p.model)
                    for rows, cols in shapes}  # a row-wise candidate repeats two shapes
        costs = est.pieces(t.index, kind, tier, r, shapes, [bytes_of[s] for s in shapes])
        for shape, c in zip(shapes, costs, strict=True):
            # Pieces of one shape in one candidate are priced alike (no estimator reads ranks).
            self.prices[(ctx, tier, r, *shape)] = c
        self.priced.add((ctx, tier, r))
        return ctx

    def _shape(self, kind: ShardingType, tier: Tier, ratio: float, rows: int,
               cols: int, ctx: object) -> tuple[float, ...]:
        """The cost's two sides (compute, comm; CostBreakdown.sides), then 3 inter-host bytes
        and 3 owner rates (the bytes are group_bytes')."""
        klass = _KIND_CLASS[kind] if ctx is None else ctx
        key = (klass, tier, ratio, rows, cols)
        found = self.shapes.get(key)
        if found is not None:
            return found
        p, t = self.p, self.t
        hbm, ddr, ssd, buf = self._bytes(kind, tier, ratio, rows, cols)
        traffic = piece_traffic(t.geom, kind, tier, ratio, rows, cols, p.hw, p.model)
        est = self.est
        c = (est.pieces(t.index, kind, tier, ratio, ((rows, cols),), (traffic,))[0]
             if ctx is None else self.prices[key])
        inter, rate = priced_sides(est, traffic)
        sides = (*inter.tolist(), *rate.tolist())
        # The two sides cost.step_time combines (pipelined: compute less the input all-to-all
        # it hides).
        found = self.shapes[key] = (
            *c.sides(p.model.pipelined, p.hw.constants.pipeline_overlap), *sides)
        self.figures[key] = (c.lookup, c.backward, c.cache_miss, c.input_a2a, c.output_a2a,
                             c.allreduce, hbm, ddr, ssd, *sides, buf)
        return found

    def group(self, prepared: "_Prepared", kind: ShardingType, tier: Tier,
              ratio: float | None, ctx: object = None) -> "_Costed":
        """`ctx`: what `price` returned for the group's candidate."""
        r = ratio if ratio is not None else 1.0
        klass = _KIND_CLASS[kind] if ctx is None else ctx
        key = (klass, tier, r, prepared.key)
        found = self.costed.get(key)
        if found is None:
            rows = [self._shape(kind, tier, r, rows, cols, ctx) for rows, cols in prepared.shapes]
            figures = tuple((shape, self.figures[(klass, tier, r, *shape)])
                            for shape in prepared.shapes)
            found = self.costed[key] = _Costed.of(
                rows, prepared, figures, self.group_bytes(prepared, kind, tier, ratio))
        return found


@dataclass(frozen=True, eq=False)
class _GroupBytes:
    """One group's bytes per piece (hbm with its step buffers, ddr, ssd; shared by every group
    with the same pieces' shapes) and what fitting and the totals read off them, taken once
    from its distinct shapes (exact: integers)."""

    hbm: np.ndarray
    ddr: np.ndarray
    ssd: np.ndarray
    hbm_max: int
    hbm_sum: int
    ddr_sum: int
    ssd_sum: int
    ddr_max: int
    ssd_max: int

    @staticmethod
    def of(values: list[tuple[int, int, int]], prepared: "_Prepared") -> "_GroupBytes":
        counts, inverse = prepared.counts, prepared.inverse
        if len(values) == 1:
            (hbm, ddr, ssd), n = values[0], counts[0]
            if inverse is None:  # one piece
                arrays = [np.array([x], dtype=np.int64) for x in (hbm, ddr, ssd)]
            else:
                arrays = [_filled(n, x, np.int64) for x in (hbm, ddr, ssd)]
            return _GroupBytes(*arrays, hbm, hbm * n, ddr * n, ssd * n, ddr, ssd)
        assert inverse is not None
        table = np.array(values, dtype=np.int64)
        hbm_l, ddr_l, ssd_l = ([v[k] for v in values] for k in range(3))
        return _GroupBytes(
            table[:, 0][inverse], table[:, 1][inverse], table[:, 2][inverse], max(hbm_l),
            sum(x * n for x, n in zip(hbm_l, counts, strict=True)),
            sum(x * n for x, n in zip(ddr_l, counts, strict=True)),
            sum(x * n for x, n in zip(ssd_l, counts, strict=True)), max(ddr_l), max(ssd_l))

    def per_host(self, scope: Scope, hosts: int) -> tuple[int, int]:
        """The most DDR and SSD bytes the group puts on one host."""
        if scope is Scope.WORLD:  # piece i on rank i: hosts in rank order
            # Bytes are never negative: a group without DDR (SSD) puts 0 on every host.
            ddr = int(self.ddr.reshape(hosts, -1).sum(axis=1).max()) if self.ddr_sum else 0
            ssd = int(self.ssd.reshape(hosts, -1).sum(axis=1).max()) if self.ssd_sum else 0
            return ddr, ssd
        if scope is Scope.GPU:  # each piece on a GPU of its own choice
            return self.ddr_max, self.ssd_max
        return self.ddr_sum, self.ssd_sum  # the whole group on one host


@dataclass(frozen=True, eq=False)
class _Costed:
    """One group's per-piece arrays (those of `Group`, shared by every group with the same
    pieces' shapes), and what `_build` reads off them, taken once from its distinct shapes:
    the same values the per-piece arrays give (maxima are exact; `comp_parts` and
    `comm_parts` sum exactly to the pieces' values, so math.fsum, correctly rounded, gives
    the same sum over them as over the pieces)."""

    arrays: tuple[np.ndarray, ...]  # comp, comm, hbm, ddr, ssd, inter, rate
    comp_parts: tuple[float, ...]
    comm_parts: tuple[float, ...]
    max_sum: float  # largest comp + comm of a piece
    max_piped: float  # largest pipelined step_time(comp, comm) of a piece (its sides)
    bytes: _GroupBytes
    figures: tuple[tuple[tuple[int, int], tuple[float, ...]], ...]

    @staticmethod
    def of(rows: list[tuple[float, ...]], prepared: "_Prepared",
           figures: tuple[tuple[tuple[int, int], tuple[float, ...]], ...],
           placed: _GroupBytes) -> "_Costed":
        counts, inverse = prepared.counts, prepared.inverse
        if len(rows) == 1:
            r, n = rows[0], counts[0]
            if inverse is None:  # one piece
                times = (np.array([r[0]]), np.array([r[1]]), np.array([r[2:5]]),
                         np.array([r[5:8]]))
            else:
                times = (_filled(n, r[0], np.float64), _filled(n, r[1], np.float64),
                         _filled((n, 3), r[2:5], np.float64),
                         _filled((n, 3), r[5:8], np.float64))
            return _Costed((times[0], times[1], placed.hbm, placed.ddr, placed.ssd, times[2],
                            times[3]), _times(r[0], n), _times(r[1], n), r[0] + r[1],
                           r[1] + max(r[0], 0.0), placed, figures)
        assert inverse is not None
        costed = np.array(rows, dtype=np.float64)
        arrays = (costed[:, 0][inverse], costed[:, 1][inverse], placed.hbm, placed.ddr,
                  placed.ssd, costed[:, 2:5][inverse], costed[:, 5:8][inverse])
        return _Costed(
            arrays,
            tuple(itertools.chain.from_iterable(
                _times(r[0], n) for r, n in zip(rows, counts, strict=True))),
            tuple(itertools.chain.from_iterable(
                _times(r[1], n) for r, n in zip(rows, counts, strict=True))),
            max(r[0] + r[1] for r in rows), max(r[1] + max(r[0], 0.0) for r in rows), placed,
            figures)


def _filled(shape: int | tuple[int, int], value: object, dtype: type) -> np.ndarray:
    """np.full, without its overhead (a row value fills every row)."""
    out = np.empty(shape, dtype=dtype)
    out[...] = value
    return out


# Dekker's splitter for doubles: 2**27 + 1.
_SPLIT = 134217729.0


def _times(x: float, n: int) -> tuple[float, ...]:
    """Floats whose exact sum is n * x: (x,) for one, else the product and its rounding
    error (Dekker's exact product; n < 2**53 is a double). Outside the range where that is
    exact (tiny or huge x), x repeated n times."""
    if n == 1:
        return (x,)
    if x == 0.0 or not 1e-200 < abs(x) < 1e200:
        return (x,) * n
    a, b = x, float(n)
    p = a * b
    c = _SPLIT * a
    a_hi = c - (c - a)
    a_lo = a - a_hi
    c = _SPLIT * b
    b_hi = c - (c - b)
    b_lo = b - b_hi
    return (p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo)


@dataclass(frozen=True, eq=False)
class _Prepared:
    """A group's geometry with its distinct (rows, cols) shapes found once for all tiers:
    `inverse` maps each piece to its shape (None: one piece), `counts` the pieces of each
    shape, `key` identifies the pieces' sequence of shapes (groups with equal keys share
    their costed arrays)."""

    geometry: np.ndarray
    shapes: tuple[tuple[int, int], ...]
    key: tuple[object, ...]
    inverse: np.ndarray | None
    counts: tuple[int, ...]


def _prepare(geometry: np.ndarray) -> _Prepared:
    n = len(geometry)
    if n == 1:  # most groups: one piece, one shape
        shape = ((int(geometry[0, 1]), int(geometry[0, 3])),)
        return _Prepared(geometry, shape, (shape, 1), None, (1,))
    # One integer key per (rows, cols) shape: cols < 2**17 always (MAX_DIM = 65536).
    keys = (geometry[:, 1] << 17) | geometry[:, 3]
    first = int(keys[0])
    if (keys == first).all():  # an even split that divides exactly, a replica per GPU
        shape = ((first >> 17, first & 0x1FFFF),)
        return _Prepared(geometry, shape, (shape, n), np.zeros(n, dtype=np.intp), (n,))
    # Even splits give at most two shapes (the first pieces one row or column larger):
    # np.unique's sorted shapes and inverse, without its sort.
    lo, hi = int(keys.min()), int(keys.max())
    upper = keys == hi
    if int(upper.sum()) + int((keys == lo).sum()) == n:
        inverse = upper.astype(np.intp)
        big = int(inverse.sum())
        pairs = ((lo >> 17, lo & 0x1FFFF), (hi >> 17, hi & 0x1FFFF))
        return _Prepared(geometry, pairs, (pairs, inverse.tobytes()), inverse, (n - big, big))
    distinct, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    pairs = tuple((int(k >> 17), int(k & 0x1FFFF)) for k in distinct.tolist())
    return _Prepared(geometry, pairs, (pairs, inverse.tobytes()), inverse,
                     tuple(counts.tolist()))


Shape = tuple[ShardingType, Scope, list[_Prepared]]


def _geo(pieces: list[tuple[int, int, int, int]]) -> np.ndarray:
    return np.array(pieces, dtype=np.int64).reshape(-1, 4)


def _one(r0: int, rn: int, c0: int, cn: int) -> _Prepared:
    """A one-piece group, prepared (as _prepare would)."""
    shape = ((rn, cn),)
    return _Prepared(np.array([[r0, rn, c0, cn]], dtype=np.int64), shape, (shape, 1), None,
                     (1,))


def _same(geometry: np.ndarray, rows: int, cols: int) -> _Prepared:
    """A group whose pieces all have `rows` x `cols`, prepared (as _prepare would)."""
    n = len(geometry)
    shape = ((rows, cols),)
    if n == 1:
        return _Prepared(geometry, shape, (shape, 1), None, (1,))
    return _Prepared(geometry, shape, (shape, n), np.zeros(n, dtype=np.intp), (n,))


def _row_bands(rows: int, parts: int, col_offset: int, cols: int) -> _Prepared:
    """_prepare(_geo([(r0, rn, col_offset, cols) for r0, rn in even_split(rows, parts)])),
    built directly (a row-wise candidate on 1,024 GPUs has 1,024 pieces): the first `rem`
    pieces have q + 1 rows, the others q."""
    q, rem = divmod(rows, parts)
    if parts <= 64:
        geo = np.array([(r0, rn, col_offset, cols) for r0, rn in even_split(rows, parts)],
                       dtype=np.int64)
    else:
        counts = np.full(parts, q, dtype=np.int64)
        counts[:rem] += 1
        geo = np.empty((parts, 4), dtype=np.int64)
        geo[:, 0] = np.cumsum(counts) - counts
        geo[:, 1] = counts
        geo[:, 2] = col_offset
        geo[:, 3] = cols
    if rem == 0:
        return _same(geo, q, cols)
    pairs = ((q, cols), (q + 1, cols))  # sorted, as np.unique sorts their keys
    inverse, key = _two_shapes(parts, rem)
    return _Prepared(geo, pairs, (pairs, key), inverse, (parts - rem, rem))


@functools.lru_cache(maxsize=1024)
def _two_shapes(parts: int, rem: int) -> tuple[np.ndarray, bytes]:
    """The inverse (1 for the first `rem` pieces, 0 after) of an uneven split, and its
    bytes; shared read-only."""
    inverse = np.zeros(parts, dtype=np.intp)
    inverse[:rem] = 1
    inverse.flags.writeable = False
    return inverse, inverse.tobytes()


def _shapes(problem: Problem, t: TableInfo) -> list[Shape]:
    """(type, scope, groups of (row_offset, rows, col_offset, cols), prepared) allowed for
    the table."""
    hw = problem.hw
    g, w, hosts = hw.gpus_per_host, hw.world_size, hw.hosts
    rows, dim = t.geom.rows, t.geom.dim
    allowed = set(t.constraints.sharding_types or list(ShardingType))
    min_w = min_column_width(t.constraints)
    out: list[Shape] = []
    if ShardingType.TABLE_WISE in allowed:
        out.append((ShardingType.TABLE_WISE, Scope.GPU, [_one(0, rows, 0, dim)]))
    if ShardingType.COLUMN_WISE in allowed:
        # Up to the finest equal split, more chunks than GPUs included (several on one GPU,
        # as the checker and TorchRec's column-wise sharding allow): with fewer, a split
        # the checker accepts could fit or beat every plan of the grid.
        for k in column_splits(dim, min_w, dim):
            chunks = even_split(dim, k)
            out.append((ShardingType.COLUMN_WISE, Scope.GPU,
                        [_one(0, rows, c0, cn) for c0, cn in chunks]))
    if ShardingType.ROW_WISE in allowed and rows >= w and w > 1:
        out.append((ShardingType.ROW_WISE, Scope.WORLD, [_row_bands(rows, w, 0, dim)]))
    if ShardingType.TABLE_ROW_WISE in allowed and rows >= g and g > 1:
        out.append((ShardingType.TABLE_ROW_WISE, Scope.HOST_FIXED,
                    [_row_bands(rows, g, 0, dim)]))
    # A table-column-wise candidate costs what the column-wise one of its split costs (one
    # type class) and fits only where that one fits (its chunks on one host, the other's
    # anywhere): the Pareto front drops it on the tie, so it is built only where column-wise
    # is not allowed (10,000 tables on 1,024 GPUs: 11,963 built, none kept).
    if (ShardingType.TABLE_COLUMN_WISE in allowed and ShardingType.COLUMN_WISE not in allowed
            and g > 1):
        for k in column_splits(dim, min_w, g):
            # column_splits' chunks are equal: dim // k columns each.
            out.append((ShardingType.TABLE_COLUMN_WISE, Scope.HOST_FREE,
                        [_same(_geo([(0, rows, c0, cn) for c0, cn in even_split(dim, k)]),
                               rows, dim // k)]))
    if ShardingType.GRID in allowed and hosts > 1 and g > 1 and rows >= g:
        for k in column_splits(dim, min_w, hosts):
            out.append((ShardingType.GRID, Scope.HOST_FIXED,
                        [_row_bands(rows, g, c0, cn) for c0, cn in even_split(dim, k)]))
    if (ShardingType.DATA_PARALLEL in allowed and w > 1
            and t.bytes <= DATA_PARALLEL_MAX_HBM_SHARE * hw.hbm_cap):
        out.append(_replicas(rows, dim, w))
    return out or _degenerate(problem, t, allowed)


def _replicas(rows: int, dim: int, w: int) -> Shape:
    """Data-parallel: the whole table on every rank."""
    return (ShardingType.DATA_PARALLEL, Scope.WORLD,
            [_same(np.tile(np.array((0, rows, 0, dim), dtype=np.int64), (w, 1)), rows, dim)])


def _degenerate(problem: Problem, t: TableInfo, allowed: set[ShardingType]) -> list[Shape]:
    """Where `_shapes`' grid leaves a table nothing, the shapes of its allowed types that the
    grid leaves out by choice, not by their definition (planner/check.py's), so that no
    request is answered "infeasible" for a plan the checker accepts: a replica larger than
    DATA_PARALLEL_MAX_HBM_SHARE; on one GPU, a replica or one row band; on hosts of one
    GPU, one band per host and grid's chunks one per GPU; on one host, grid's two column
    chunks both on it. (Column-wise and table-column-wise need two chunks
    at least as wide as the minimum width: where the dimension has none, no plan has them.)"""
    hw = problem.hw
    g, w = hw.gpus_per_host, hw.world_size
    rows, dim = t.geom.rows, t.geom.dim
    min_w = min_column_width(t.constraints)
    out: list[Shape] = []
    if ShardingType.ROW_WISE in allowed and w == 1:
        out.append((ShardingType.ROW_WISE, Scope.WORLD, [_row_bands(rows, 1, 0, dim)]))
    if ShardingType.TABLE_ROW_WISE in allowed and g == 1:
        out.append((ShardingType.TABLE_ROW_WISE, Scope.HOST_FIXED, [_row_bands(rows, 1, 0, dim)]))
    if ShardingType.GRID in allowed and rows >= g and (hw.hosts == 1 or g == 1):
        for k in column_splits(dim, min_w, 2 if hw.hosts == 1 else hw.hosts):
            out.append((ShardingType.GRID, Scope.HOST_FIXED,
                        [_row_bands(rows, g, c0, cn) for c0, cn in even_split(dim, k)]))
    if ShardingType.DATA_PARALLEL in allowed:
        out.append(_replicas(rows, dim, w))
    return out


def why_no_shape(problem: Problem, t: TableInfo) -> str:
    """Why each sharding type the table allows has no shape on this cluster (for an
    "infeasible" answer: the types, and the constraint or size that rules each out)."""
    hw = problem.hw
    g, w = hw.gpus_per_host, hw.world_size
    rows, dim = t.geom.rows, t.geom.dim
    c = t.constraints
    min_w = min_column_width(c)
    width = (f"{dim} columns have no split into 2 or more equal chunks of at least {min_w} "
             f"columns, each a multiple of {COLUMN_ALIGNMENT} (min_column_shard_width"
             f"{'' if c.min_column_shard_width else ', default'} {min_w})")
    shaped = {kind for kind, _, _ in _shapes(problem, t)}
    pinned = sorted(c.pinned_ranks) if c.pinned_ranks else None
    reasons = []
    for kind in (c.sharding_types or list(ShardingType)):
        if kind in shaped:
            tiers = [x.value for x in c.memory_tiers] if c.memory_tiers else None
            reasons.append(
                f"{kind.value}: replicas live in HBM, which memory_tiers {tiers} leaves out"
                if kind is ShardingType.DATA_PARALLEL and tiers and "hbm" not in tiers
                else f"{kind.value}: the pinned ranks {pinned} do not hold its pieces"
                if pinned is not None else f"{kind.value}: no tier of {tiers} takes it")
        elif kind in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
            reasons.append(f"{kind.value}: {width}" if g > 1 or kind is ShardingType.COLUMN_WISE
                           else f"{kind.value}: hosts of one GPU (its chunks need distinct "
                                "GPUs of one host)")
        elif kind is ShardingType.GRID and rows >= g:
            reasons.append(f"grid: {width}")
        else:
            parts = {ShardingType.ROW_WISE: w, ShardingType.TABLE_ROW_WISE: g,
                     ShardingType.GRID: g}.get(kind)
            reasons.append(f"{kind.value}: {rows} rows cannot give each of {parts} GPUs a row"
                           if parts else f"{kind.value}: no shape on this cluster")
    return "; ".join(reasons)


def _build(problem: Problem, t: TableInfo, kind: ShardingType, scope: Scope,
           shape_groups: list[np.ndarray], tier: Tier, ratio: float | None,
           coster: "_Coster | None" = None,
           prepared: "list[_Prepared] | None" = None) -> Candidate:
    coster = coster or _Coster(problem, t)
    prepared = prepared or [_prepare(geo) for geo in shape_groups]
    ctx = coster.price(kind, tier, ratio, prepared)
    costed = [coster.group(pg, kind, tier, ratio, ctx) for pg in prepared]
    groups = tuple(Group(pg.geometry, *c.arrays)
                   for pg, c in zip(prepared, costed, strict=True))
    if len(costed) == 1:
        c0 = costed[0]
        comp, comm = math.fsum(c0.comp_parts), math.fsum(c0.comm_parts)
        figures = dict(c0.figures)
    else:
        comp = math.fsum(itertools.chain.from_iterable(c.comp_parts for c in costed))
        comm = math.fsum(itertools.chain.from_iterable(c.comm_parts for c in costed))
        figures = dict(itertools.chain.from_iterable(c.figures for c in costed))
    pipelined = problem.model.pipelined
    return Candidate(
        table=t.index, kind=kind, tier=tier, cache_ratio=ratio, scope=scope, groups=groups,
        work=comp + comm, comp_work=comp, comm_work=comm,
        max_piece=max(c.max_piped if pipelined else c.max_sum for c in costed),
        max_piece_hbm=max(c.bytes.hbm_max for c in costed),
        hbm_total=sum(c.bytes.hbm_sum for c in costed),
        ddr_total=sum(c.bytes.ddr_sum for c in costed),
        ssd_total=sum(c.bytes.ssd_sum for c in costed),
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


def _fits_alone(problem: Problem, scope: Scope, groups: list[_GroupBytes]) -> bool:
    """Could a candidate with these groups be placed on an empty cluster? (Per-piece and
    per-host caps.)"""
    hw = problem.hw
    if max(g.hbm_max for g in groups) > hw.hbm_cap:
        return False
    for g in groups:
        ddr, ssd = g.per_host(scope, hw.hosts)
        if ddr > hw.ddr_cap or ssd > hw.ssd_cap:
            return False
    return True


def slow_tiers_needed(problem: Problem) -> bool:
    hbm_need = sum(t.bytes for t in problem.tables)
    return hbm_need > SLOW_TIER_PRESSURE * problem.hw.world_size * problem.hw.hbm_cap


@dataclass(frozen=True)
class LeastBytes:
    """Per axis, the fewest bytes any of a table's every-tier candidates that fit an empty
    cluster holds (each axis at its own least), and how many such candidates there are."""

    hbm: int
    ddr: int
    ssd: int
    total: int  # hbm + ddr + ssd of one candidate, the least such sum
    candidates: int


@dataclass(frozen=True)
class _Memo:
    """One live problem's enumerations by (table, slow tiers, keep unfit) and its tables'
    least bytes. (Not its costers: holding 10,000 tables' piece figures slowed the garbage
    collector's full passes by more than they saved. The bytes below are held only from a
    table's certificate to its enumeration, and dropped when a certificate ends planning.)"""

    enumerated: dict[tuple[int, bool, bool], tuple[Candidate, ...]]
    least: dict[int, LeastBytes | None]
    # The bytes `least_bytes` computed, held until the table's first enumeration reads them
    # (slow tiers: the certificates run over every table before any is costed; sharing them
    # saves a fifth of the candidates' time on synthetic_1000 x 1 host).
    held: dict[int, _Bytes]


# Planning's candidates and the infeasibility certificates (planner/infeasibility.py) read the
# same tables, which at 10,000 tables on 8 GPUs took a third of an "infeasible" answer's
# time. Dropped with the problem (weakref.finalize runs before its id can be reused).
_MEMOS: dict[int, _Memo] = {}


def _memo(problem: Problem) -> _Memo:
    memo = _MEMOS.get(id(problem))
    if memo is None:
        memo = _MEMOS[id(problem)] = _Memo({}, {}, {})
        weakref.finalize(problem, _MEMOS.pop, id(problem), None)
    return memo


def _own(problem: Problem, t: TableInfo) -> bool:
    """Whether `t` is the problem's own table object (memoized), not a copy."""
    return 0 <= t.index < len(problem.tables) and problem.tables[t.index] is t


def enumerate_candidates(problem: Problem, t: TableInfo, slow_tiers: bool,
                         keep_unfit: bool = False) -> list[Candidate]:
    """All allowed candidates of a table that fit an empty cluster, minus dominated ones.

    Pinned ranks restrict which shapes can be placed at all: row-wise and data-parallel need
    every rank, host-scoped types need enough pinned GPUs in one host. A problem's own
    tables are enumerated once per (slow_tiers, keep_unfit) while the problem lives (the
    candidates are immutable; each call gets its own list).
    """
    if _own(problem, t):
        memo = _memo(problem)
        key = (t.index, bool(slow_tiers), bool(keep_unfit))
        found = memo.enumerated.get(key)
        if found is None:
            found = memo.enumerated[key] = tuple(_enumerate(
                problem, t, slow_tiers, keep_unfit, memo.held.pop(t.index, None)))
        return list(found)
    return _enumerate(problem, t, slow_tiers, keep_unfit)


def drop_held_bytes(problem: Problem) -> None:
    """Forget the bytes `least_bytes` held for enumerations that will not come (an
    "infeasible" answer)."""
    memo = _MEMOS.get(id(problem))
    if memo is not None:
        memo.held.clear()


def least_bytes(problem: Problem, t: TableInfo) -> LeastBytes | None:
    """What min(x.hbm_total), min(x.ddr_total), ... over enumerate_candidates(problem, t,
    slow_tiers=True) give (the Pareto front keeps each axis' least: a candidate that
    dominates another has no more bytes on any axis), from the pieces' bytes alone, with no
    time costed; `candidates` counts every fitting candidate, dominated ones included.
    None: no candidate fits an empty cluster."""
    if _own(problem, t):
        memo = _memo(problem)
        if t.index not in memo.least:
            held = _Bytes({}, {}, {})
            memo.least[t.index] = _least_bytes(problem, t, held)
            # The pieces' buffers and memory, not the groups' arrays: those held for 10,000
            # tables took 0.5 GB more at the peak of an "infeasible" answer.
            memo.held[t.index] = _Bytes(held.buffers, held.memory, {})
        return memo.least[t.index]
    return _least_bytes(problem, t)


def _least_bytes(problem: Problem, t: TableInfo, held: _Bytes | None = None
                 ) -> LeastBytes | None:
    coster = _Coster(problem, t, held)
    found: list[tuple[int, int, int]] = []
    for kind, scope, prepared, tier, ratio in _options(problem, t, slow_tiers=True):
        groups = [coster.group_bytes(pg, kind, tier, ratio) for pg in prepared]
        if _fits_alone(problem, scope, groups):
            found.append((sum(g.hbm_sum for g in groups), sum(g.ddr_sum for g in groups),
                          sum(g.ssd_sum for g in groups)))
    if not found:
        return None
    return LeastBytes(min(f[0] for f in found), min(f[1] for f in found),
                      min(f[2] for f in found), min(sum(f) for f in found), len(found))


def _options(problem: Problem, t: TableInfo, slow_tiers: bool
             ) -> Iterator[tuple[ShardingType, Scope, list[_Prepared], Tier, float | None]]:
    """The table's allowed (type, scope, prepared groups, tier, cache ratio), in
    enumeration order: shapes the pins allow, crossed with the tiers (slower ones when
    `slow_tiers` or the table is huge, and the fitting cache ratios beyond the grid)."""
    hw = problem.hw
    huge = t.bytes > SLOW_TIER_PRESSURE * hw.world_size * hw.hbm_cap
    tiers = _tier_options(t, slow_tiers or huge)
    tiers += _fitting_ratios(problem, t, tiers)
    pinned = set(t.constraints.pinned_ranks) if t.constraints.pinned_ranks else None
    for kind, scope, prepared in _shapes(problem, t):
        if pinned is not None and not _pins_allow(scope, [pg.geometry for pg in prepared],
                                                  pinned, hw.gpus_per_host, hw.world_size):
            continue
        for tier, ratio in tiers:
            if kind is ShardingType.DATA_PARALLEL and tier is not Tier.HBM:
                continue
            yield kind, scope, prepared, tier, ratio


def _enumerate(problem: Problem, t: TableInfo, slow_tiers: bool,
               keep_unfit: bool, held: _Bytes | None = None) -> list[Candidate]:
    out: list[Candidate] = []
    coster = _Coster(problem, t, held)
    for kind, scope, prepared, tier, ratio in _options(problem, t, slow_tiers):
        # Fitting reads bytes alone: a candidate that cannot fit is never costed.
        if keep_unfit or _fits_alone(problem, scope, [coster.group_bytes(pg, kind, tier, ratio)
                                                      for pg in prepared]):
            out.append(_build(problem, t, kind, scope, [pg.geometry for pg in prepared],
                              tier, ratio, coster, prepared))
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
    # One pinned host holds every group: grid's chunks may share a host (each chunk on all
    # GPUs of a host, as the checker allows, and as the placement may put them), so a grid
    # pinned to one host of several has a plan, as on one host.
    return hosts_ok >= 1


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
    # The scope's placement rules read its groups' sizes (a replica or row band per GPU, a
    # band per GPU of a host): a layout that breaks them has no candidate (the checker says
    # what is wrong with it).
    g, w = problem.hw.gpus_per_host, problem.hw.world_size
    sizes = [len(grp) for grp in groups]
    if ((scope is Scope.WORLD and sizes != [w])
            or (scope is Scope.HOST_FIXED and any(n != g for n in sizes))
            or (scope is Scope.HOST_FREE and any(n > g for n in sizes))):
        raise ValueError(f"{len(pieces)} pieces do not make a {kind.value} layout on "
                         f"{problem.hw.hosts} x {g} GPUs")
    return _build(problem, t, kind, scope, groups, tier, ratio)
