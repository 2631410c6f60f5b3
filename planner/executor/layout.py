"""The plan as the executor walks it: tables, their column chunks and pieces, in one fixed order.

Every rank derives the same `ExecLayout` from the plan, so the order of pieces here is the
order of every message on the wire; no rank has to ask another what it will send.
No torch here: the parent process uses this to predict and to build the reference.
"""

from dataclasses import dataclass

import numpy as np

from cost_models import AccessModel, CachePolicy, ShardingType, Tier
from cost_models.types import ROW_SPLIT_TYPES, CommPrecision, DataType, Optimizer
from planner.plan_model import Plan
from planner.problem import build_problem
from planner.spec import TableSpec

# Row-split types whose partial sums are reduced inside the host before crossing hosts
# (traffic.py's _HOST_REDUCED): a reduce-scatter over NVLink, then one send per owner.
HOST_REDUCED = frozenset({ShardingType.TABLE_ROW_WISE, ShardingType.GRID})


@dataclass(frozen=True)
class Piece:
    table: int  # index into ExecLayout.tables
    index: int  # index into the table's pieces, as in the plan
    rank: int
    host: int
    row0: int
    rows: int
    col0: int
    cols: int

    @property
    def key(self) -> str:
        return f"{self.table}.{self.index}"


@dataclass(frozen=True)
class Chunk:
    """One column band of a table and the pieces that split its rows (sorted by row0)."""

    col0: int
    cols: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class TableExec:
    index: int
    name: str
    kind: ShardingType
    tier: Tier
    cache_ratio: float
    rows: int
    dim: int
    pooling: float
    access: AccessModel
    data_type: DataType
    optimizer: Optimizer
    cache_policy: CachePolicy  # of its caches (hbm_cache, ssd)
    pieces: tuple[Piece, ...]
    chunks: tuple[Chunk, ...]
    # The features reading the table, (pooling factor, samples per rank) each, in the spec's
    # order; a rank's bags of the table are laid out feature after feature. One feature of
    # the whole batch for a table without `features`.
    features: tuple[tuple[float, int], ...] = ()
    # A sequence table (pooling_mode "none"): every id its own output vector. ids_per_rank:
    # the ids a rank draws per step, round(b * pooling) (synthetic.id_batch).
    sequence: bool = False
    ids_per_rank: int = 0
    pooling_mode: str = "sum"

    @property
    def outputs(self) -> int:
        """Output vectors per rank per step: one per bag, or per id of a sequence table: the
        rows of the table's outputs and targets per rank."""
        return self.ids_per_rank if self.sequence else self.bags

    @property
    def bags(self) -> int:
        """Bags per rank per step (one per feature and sample of that feature): the rows of
        the table's pooled outputs, targets and output all-to-all blocks per rank."""
        return sum(n for _, n in self.features)

    @property
    def row_split(self) -> bool:
        return self.kind in ROW_SPLIT_TYPES

    @property
    def host_reduced(self) -> bool:
        return self.kind in HOST_REDUCED

    @property
    def data_parallel(self) -> bool:
        return self.kind is ShardingType.DATA_PARALLEL


@dataclass(frozen=True)
class ExecLayout:
    tables: tuple[TableExec, ...]
    world: int
    gpus_per_host: int
    hosts: int
    batch: int  # samples per rank
    fwd_precision: CommPrecision
    bwd_precision: CommPrecision
    id_bytes: int = 8  # width of an id on the wire (int64 or int32)
    length_bytes: int = 4  # width of a bag length on the wire
    # The next step's input all-to-all runs beside this step's work (rank.py, InputLane).
    pipelined: bool = False

    def host_of(self, rank: int) -> int:
        return rank // self.gpus_per_host

    def local_of(self, rank: int) -> int:
        return rank % self.gpus_per_host

    def sharded_pieces(self) -> list[Piece]:
        """All pieces of non-replicated tables, in wire order."""
        return [p for t in self.tables if not t.data_parallel for p in t.pieces]

    def pieces_on(self, rank: int) -> list[Piece]:
        return [p for p in self.sharded_pieces() if p.rank == rank]


def exec_layout(plan: Plan) -> ExecLayout:
    problem = build_problem(plan.request)
    hw, model = problem.hw, problem.model
    by_name = {t.name: t for t in problem.tables}
    specs = {t.name: t for t in plan.request.model.tables}
    b = model.batch_per_gpu
    tables = []
    for ti, tp in enumerate(plan.tables):
        geom = by_name[tp.name].geom
        pieces = tuple(
            Piece(ti, j, p.rank, p.host, p.row_offset, p.row_count, p.col_offset, p.col_count)
            for j, p in enumerate(tp.pieces)
        )
        bands: dict[tuple[int, int], list[Piece]] = {}
        for p in pieces:
            bands.setdefault((p.col0, p.cols), []).append(p)
        chunks = tuple(
            Chunk(c0, n, tuple(sorted(ps, key=lambda p: p.row0)))
            for (c0, n), ps in sorted(bands.items())
        )
        tables.append(TableExec(
            index=ti, name=tp.name, kind=tp.sharding_type, tier=tp.tier,
            cache_ratio=tp.cache_ratio if tp.cache_ratio is not None else 1.0,
            rows=geom.rows, dim=geom.dim, pooling=geom.pooling, access=geom.access,
            data_type=geom.data_type, optimizer=geom.optimizer, cache_policy=geom.cache_policy,
            pieces=pieces, chunks=chunks, features=_features(specs[tp.name], geom.pooling, b),
            sequence=geom.sequence, ids_per_rank=round(b * geom.pooling),
            pooling_mode=specs[tp.name].pooling_mode or "sum",
        ))
    return ExecLayout(
        tables=tuple(tables), world=hw.world_size, gpus_per_host=hw.gpus_per_host,
        hosts=hw.hosts, batch=model.batch_per_gpu, fwd_precision=model.fwd_precision,
        bwd_precision=model.bwd_precision, id_bytes=hw.constants.id_bytes,
        length_bytes=hw.constants.length_bytes, pipelined=model.pipelined,
    )


def _features(spec: TableSpec, pooling: float, batch: int) -> tuple[tuple[float, int], ...]:
    if not spec.features:
        return ((pooling, batch),)
    return tuple((f.pooling_factor, f.batch_size_per_gpu or batch) for f in spec.features)


# Integer widths the executor can put on the wire for ids and bag lengths.
WIRE_INTS = {4: np.int32, 8: np.int64}


def check_wire_widths(lay: ExecLayout) -> None:
    """The executor sends ids and lengths as int32 or int64, as the cost model counts them."""
    for name, width in (("id_bytes", lay.id_bytes), ("length_bytes", lay.length_bytes)):
        if width not in WIRE_INTS:
            raise ValueError(f"hardware.constants.{name} = {width}: the executor sends ids "
                             f"and bag lengths as 4- or 8-byte integers")
    if lay.id_bytes == 4:
        big = [t.name for t in lay.tables if t.rows > np.iinfo(np.int32).max]
        if big:
            raise ValueError(f"hardware.constants.id_bytes = 4 cannot address the rows of "
                             f"table '{big[0]}'")
