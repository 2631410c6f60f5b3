"""Our plan -> TorchRec's per-table ParameterSharding, table by table, saying where TorchRec
cannot run exactly what we planned.

What TorchRec 1.8 expects, per type (torchrec/distributed/sharding_plan.py and sharding/):
- row_wise: shard i on rank i; ids are routed by blocks of ceil(rows / W) rows
  (RwSparseFeaturesDist), so the shard sizes must be [c, c, ..., rest, 0...] with c = ceil.
- table_row_wise: the same inside one host: shard i on local GPU i of the host, blocks of
  ceil(rows / local_world_size).
- grid_shard: per column block, the rows split as table_row_wise over one host.
- column_wise / table_column_wise: shards ordered by column offset, any ranks
  (table_column_wise: ranks of one host).
- data_parallel: every rank, no sharding spec, the dense kernel.
"""

import math

from cost_models import ShardingType, Tier
from planner.interop.torchrec_format import (
    CACHED_KERNELS,
    TORCHREC_KERNEL,
    TORCHREC_TYPE,
    TorchRecCacheParams,
    TorchRecExport,
    TorchRecParameterSharding,
    TorchRecShard,
    TorchRecTable,
)
from planner.plan_model import PlanLayout, PlanPiece, TablePlan
from planner.spec import TableSpec


def ceil_row_split(rows: int, parts: int) -> list[tuple[int, int]]:
    """TorchRec's row split: (offset, count) of blocks of ceil(rows/parts), the rest, zeros."""
    block = math.ceil(rows / parts)
    out, off = [], 0
    for _ in range(parts):
        n = max(0, min(block, rows - off))
        out.append((off, n))
        off += n
    return out


def placement(device: str, rank: int, local_world_size: int) -> str:
    """TorchRec's placement string (torchrec.distributed.sharding_plan.placement)."""
    where = f"cuda:{rank % local_world_size}" if device == "cuda" else device
    return f"rank:{rank}/{where}"


class _Table:
    """Builds one table's export; collects why it is adjusted or inexpressible."""

    def __init__(self, tp: TablePlan, rows: int, dim: int, world: int, local: int,
                 device: str) -> None:
        self.tp, self.rows, self.dim = tp, rows, dim
        self.world, self.local, self.device = world, local, device
        self.adjust: list[str] = []
        self.refuse: list[str] = []

    def shard(self, rank: int, r0: int, rn: int, c0: int, cn: int) -> TorchRecShard:
        return TorchRecShard(shard_offsets=(r0, c0), shard_sizes=(rn, cn),
                             placement=placement(self.device, rank, self.local))

    def row_split(self, pieces: list[PlanPiece], first_rank: int, parts: int,
                  what: str) -> list[tuple[int, int, int]]:
        """(rank, row offset, rows) as TorchRec runs them; notes where ours differs."""
        ours = sorted(pieces, key=lambda p: p.row_offset)
        theirs = ceil_row_split(self.rows, parts)
        want_ranks = list(range(first_rank, first_rank + parts))
        if [p.rank for p in ours] != want_ranks:
            self.adjust.append(
                f"{what}: TorchRec puts row block i on rank {first_rank}+i; our ranks in row "
                f"order are {[p.rank for p in ours]}, exported as {want_ranks}")
        if [(p.row_offset, p.row_count) for p in ours] != theirs:
            moved = max(abs(p.row_count - n) for p, (_, n) in zip(ours, theirs, strict=False))
            self.adjust.append(
                f"{what}: TorchRec routes ids by blocks of ceil({self.rows}/{parts}) = "
                f"{theirs[0][1]} rows, so it cannot hold our split "
                f"{[p.row_count for p in ours][:4]}...; exported its split "
                f"{[n for _, n in theirs][:4]}... (at most {moved} rows per GPU differ)")
        return [(r, off, n) for r, (off, n) in zip(want_ranks, theirs, strict=True)]

    def build(self) -> TorchRecTable:
        tp = self.tp
        kind = tp.sharding_type
        pieces = tp.pieces
        shards: list[TorchRecShard] | None
        if kind is ShardingType.DATA_PARALLEL:
            if tp.tier is not Tier.HBM:
                self.refuse.append("TorchRec's data_parallel replicas are dense HBM tensors; "
                                   f"tier {tp.tier.value} has no equivalent")
            ranks = sorted(p.rank for p in pieces)
            shards = None
        elif kind in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                      ShardingType.TABLE_COLUMN_WISE):
            ordered = sorted(pieces, key=lambda p: p.col_offset)
            ranks = [p.rank for p in ordered]
            shards = [self.shard(p.rank, p.row_offset, p.row_count, p.col_offset, p.col_count)
                      for p in ordered]
            if kind is ShardingType.TABLE_COLUMN_WISE and len({r // self.local
                                                                for r in ranks}) != 1:
                self.refuse.append("table_column_wise pieces span several hosts")
        elif kind is ShardingType.ROW_WISE:
            split = self.row_split(pieces, 0, self.world, "row_wise")
            ranks = [r for r, _, _ in split]
            shards = [self.shard(r, off, n, 0, self.dim) for r, off, n in split]
        elif kind is ShardingType.TABLE_ROW_WISE:
            host = pieces[0].rank // self.local
            split = self.row_split(pieces, host * self.local, self.local, "table_row_wise")
            ranks = [r for r, _, _ in split]
            shards = [self.shard(r, off, n, 0, self.dim) for r, off, n in split]
        else:  # grid
            ranks, shards = self.grid()
        return self.finish(ranks, shards)

    def grid(self) -> tuple[list[int], list[TorchRecShard]]:
        chunks: dict[tuple[int, int], list[PlanPiece]] = {}
        for p in self.tp.pieces:
            chunks.setdefault((p.col_offset, p.col_count), []).append(p)
        widths = {cn for _, cn in chunks}
        hosts = [ps[0].rank // self.local for _, ps in sorted(chunks.items())]
        if len(widths) != 1:
            self.refuse.append(f"grid_shard needs equal column blocks; ours are {sorted(widths)}")
        if len(set(hosts)) != len(hosts):
            self.refuse.append(f"grid_shard runs one column block per host; our blocks sit on "
                               f"hosts {hosts}")
        ranks: list[int] = []
        shards: list[TorchRecShard] = []
        for (c0, cn), ps in sorted(chunks.items()):
            host = ps[0].rank // self.local
            split = self.row_split(ps, host * self.local, self.local, f"grid columns {c0}+{cn}")
            ranks += [r for r, _, _ in split]
            shards += [self.shard(r, off, n, c0, cn) for r, off, n in split]
        return ranks, shards

    def finish(self, ranks: list[int], shards: list[TorchRecShard] | None) -> TorchRecTable:
        tp = self.tp
        if self.refuse:
            return TorchRecTable(name=tp.name, status="inexpressible", notes=self.refuse)
        kernel = ("dense" if tp.sharding_type is ShardingType.DATA_PARALLEL
                  else TORCHREC_KERNEL[tp.tier])
        cache = None
        notes = list(self.adjust)
        if kernel in CACHED_KERNELS:
            cache = TorchRecCacheParams(load_factor=tp.cache_ratio or 1.0)
        if tp.tier is Tier.SSD:
            notes.append(f"ssd: written as key_value (FBGEMM's SSD TBE) with cache load factor "
                         f"{cache.load_factor if cache else 1.0:g}; FBGEMM keeps that cache in "
                         "HBM/UVM where our model puts it in host DDR")
        ps = TorchRecParameterSharding(sharding_type=TORCHREC_TYPE[tp.sharding_type],
                                       compute_kernel=kernel, ranks=ranks,
                                       sharding_spec=shards, cache_params=cache)
        return TorchRecTable(name=tp.name, status="adjusted" if self.adjust else "exact",
                             notes=notes, parameter_sharding=ps)


def features_of(spec: TableSpec, batch_size_per_gpu: int
                ) -> tuple[list[str], list[float], list[int] | None]:
    """A table's feature names, per-feature pooling factors and, when some feature has its
    own batch, per-feature batch sizes, as TorchRec's EmbeddingBagConfig.feature_names and
    ParameterConstraints.pooling_factors / batch_sizes take them. A table without
    `features` is one feature named as the table."""
    if not spec.features:
        assert spec.pooling_factor is not None
        return [spec.name], [spec.pooling_factor], None
    sizes = ([f.batch_size_per_gpu or batch_size_per_gpu for f in spec.features]
             if any(f.batch_size_per_gpu is not None for f in spec.features) else None)
    return ([f.name for f in spec.features], [f.pooling_factor for f in spec.features], sizes)


def to_torchrec(layout: PlanLayout, device: str = "cuda", module_path: str = "",
                ec_module_path: str = "") -> TorchRecExport:
    """Every table of `layout` as TorchRec's ParameterSharding, with its status and notes.

    `device` is the placement written ("cuda" for a GPU job; "cpu" for gloo on CPU), and
    `module_path` the EmbeddingBagCollection's path inside the model DistributedModelParallel
    wraps ("" when the EBC is the model itself); `ec_module_path` the EmbeddingCollection's,
    which holds the sequence tables (pooling_mode none, TorchRec's EmbeddingConfig). A model
    with both kinds needs two different paths (build_sharding_plan refuses one).
    """
    hw = layout.request.hardware
    model = layout.request.model
    specs = {t.name: t for t in model.tables}
    tables = []
    for tp in layout.tables:
        spec = specs[tp.name]
        built = _Table(tp, spec.num_embeddings, spec.embedding_dim,
                       hw.hosts * hw.gpus_per_host, hw.gpus_per_host, device).build()
        names, pfs, sizes = features_of(spec, model.batch_size_per_gpu)
        tables.append(built.model_copy(update={"feature_names": names, "pooling_factors": pfs,
                                               "batch_sizes": sizes,
                                               "pooling": spec.pooling_mode or "sum"}))
    return TorchRecExport(module_path=module_path, ec_module_path=ec_module_path,
                          device="cuda" if device == "cuda" else "cpu",
                          world_size=hw.hosts * hw.gpus_per_host,
                          local_world_size=hw.gpus_per_host, tables=tables)
