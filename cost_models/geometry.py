"""Value types the cost model reads: a table's shape and access pattern, the model settings."""

from dataclasses import dataclass

from cost_models.access import AccessModel
from cost_models.cache_policy import DEFAULT_POLICY, CachePolicy
from cost_models.types import CommPrecision, DataType, Optimizer


@dataclass(frozen=True)
class TableGeom:
    """`pooling`: ids per sample of the model's batch b, summed over the table's features
    (sum_f pooling_f * b_f / b); `bags`: bags per sample, one per feature and sample of that
    feature (sum_f b_f / b; 1.0 for a table read by one feature over the whole batch). Per
    sample of b, a table gets `pooling` ids in `bags` bags, and sends `outputs` vectors to the
    sample's owner: `bags` pooled vectors, or for a `sequence` table (unpooled, TorchRec's
    EmbeddingCollection) one vector per id, `pooling`. planner/problem.py table_geom sets
    both."""

    rows: int
    dim: int
    pooling: float
    access: AccessModel
    data_type: DataType
    optimizer: Optimizer
    # Eviction policy of the table's cache (hbm_cache, ssd tiers): what its hit rate follows.
    cache_policy: CachePolicy = DEFAULT_POLICY
    bags: float = 1.0
    sequence: bool = False
    outputs: float = 1.0


@dataclass(frozen=True)
class ModelGeom:
    batch_per_gpu: int
    fwd_precision: CommPrecision
    bwd_precision: CommPrecision
    pipelined: bool


def cache_rows(cache_ratio: float, rows: int) -> int:
    """Rows a cache of `cache_ratio` holds: whole rows only, at least one."""
    return max(1, int(cache_ratio * rows))
