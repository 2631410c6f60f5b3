"""Value types the cost model reads: a table's shape and access pattern, the model settings."""

from dataclasses import dataclass

from cost_models.access import AccessModel
from cost_models.cache_policy import DEFAULT_POLICY, CachePolicy
from cost_models.types import CommPrecision, DataType, Optimizer


@dataclass(frozen=True)
class TableGeom:
    rows: int
    dim: int
    pooling: float
    access: AccessModel
    data_type: DataType
    optimizer: Optimizer
    # Eviction policy of the table's cache (hbm_cache, ssd tiers): what its hit rate follows.
    cache_policy: CachePolicy = DEFAULT_POLICY


@dataclass(frozen=True)
class ModelGeom:
    batch_per_gpu: int
    fwd_precision: CommPrecision
    bwd_precision: CommPrecision
    pipelined: bool


def cache_rows(cache_ratio: float, rows: int) -> int:
    """Rows a cache of `cache_ratio` holds: whole rows only, at least one."""
    return max(1, int(cache_ratio * rows))
