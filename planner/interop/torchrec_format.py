"""The TorchRec-style sharding plan we write and read: per table, what TorchRec's
`ParameterSharding` holds (sharding type, compute kernel, ranks, and the shards of its
`EnumerableShardingSpec`), plus how faithfully it expresses our plan.

Plain pydantic, no torch: the JSON export works without torchrec installed; the
`ShardingPlan` object is built from it by `planner.interop.sharding_plan`.
"""

from typing import Annotated, Literal

from pydantic import Field

from cost_models import ShardingType, Tier
from planner.spec.table import StrictModel

# torchrec.distributed.types.ShardingType values, by our sharding type. Our `grid` is
# TorchRec's `grid_shard` (column blocks, each row-split over the GPUs of one host).
TORCHREC_TYPE: dict[ShardingType, str] = {
    ShardingType.TABLE_WISE: "table_wise",
    ShardingType.COLUMN_WISE: "column_wise",
    ShardingType.ROW_WISE: "row_wise",
    ShardingType.TABLE_ROW_WISE: "table_row_wise",
    ShardingType.TABLE_COLUMN_WISE: "table_column_wise",
    ShardingType.GRID: "grid_shard",
    ShardingType.DATA_PARALLEL: "data_parallel",
}
OUR_TYPE: dict[str, ShardingType] = {v: k for k, v in TORCHREC_TYPE.items()}

# torchrec EmbeddingComputeKernel values, by our memory tier (data-parallel uses "dense").
TORCHREC_KERNEL: dict[Tier, str] = {
    Tier.HBM: "fused",
    Tier.HBM_CACHE: "fused_uvm_caching",
    Tier.DDR: "fused_uvm",
    Tier.SSD: "key_value",
}
OUR_TIER: dict[str, Tier] = {v: k for k, v in TORCHREC_KERNEL.items()} | {"dense": Tier.HBM}
# Kernels that keep a cache whose size is `CacheParams.load_factor` of the rows.
CACHED_KERNELS = frozenset({"fused_uvm_caching", "key_value"})
# What FBGEMM/TorchRec use when a caching kernel is given no load factor
# (torchrec.distributed.planner.constants.UVM_CACHING_RATIO and KV_CACHING_RATIO).
DEFAULT_CACHE_LOAD_FACTOR = 0.2

Status = Literal["exact", "adjusted", "inexpressible"]
NonNeg = Annotated[int, Field(strict=True, ge=0)]


class TorchRecShard(StrictModel):
    """One `ShardMetadata`: [row, col] offsets and sizes, and its placement string."""

    shard_offsets: tuple[NonNeg, NonNeg]
    shard_sizes: tuple[NonNeg, NonNeg]
    placement: str


class TorchRecCacheParams(StrictModel):
    load_factor: Annotated[float, Field(gt=0.0, le=1.0)]


class TorchRecParameterSharding(StrictModel):
    """The fields of torchrec.distributed.types.ParameterSharding that a plan sets."""

    sharding_type: str
    compute_kernel: str
    ranks: list[NonNeg]
    # None for data_parallel, as TorchRec writes it.
    sharding_spec: list[TorchRecShard] | None = None
    cache_params: TorchRecCacheParams | None = None


class TorchRecTable(StrictModel):
    name: str
    # The features reading the table (EmbeddingBagConfig.feature_names: the table's own name
    # for a table without `features`), and per feature its pooling factor and, when the
    # model gives features their own batch, its batch (ParameterConstraints.pooling_factors
    # and batch_sizes). Empty when read from an export that predates them.
    feature_names: list[str] = Field(default_factory=list)
    pooling_factors: list[float] = Field(default_factory=list)
    batch_sizes: list[int] | None = None
    # How the table pools (our pooling_mode, TorchRec's PoolingType in lower case): "none" is
    # a sequence table, an EmbeddingConfig in the EmbeddingCollection at `ec_module_path`;
    # the others are EmbeddingBagConfigs in the EmbeddingBagCollection at `module_path`.
    pooling: Literal["sum", "mean", "none"] = "sum"
    # exact: TorchRec runs our plan as written; adjusted: it runs what `parameter_sharding`
    # says, which differs from our plan as `notes` explain; inexpressible: nothing is written.
    status: Status
    notes: list[str] = Field(default_factory=list)
    parameter_sharding: TorchRecParameterSharding | None = None


class TorchRecExport(StrictModel):
    format: Literal["torchrec"] = "torchrec"
    target: str = "torchrec 1.8.0"
    module_path: str = ""
    # The EmbeddingCollection's path (sequence tables), beside the EmbeddingBagCollection's.
    ec_module_path: str = ""
    device: Literal["cuda", "cpu"] = "cuda"
    world_size: Annotated[int, Field(strict=True, ge=1)]
    local_world_size: Annotated[int, Field(strict=True, ge=1)]
    tables: list[TorchRecTable]

    def by_status(self, status: Status) -> list[TorchRecTable]:
        return [t for t in self.tables if t.status == status]
