"""Input model of one embedding table and its optional constraints."""

import itertools
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from cost_models import CachePolicy, DataType, Optimizer, ShardingType, Tier

# Rows beyond this are not a table any cluster holds (1e13 rows of 1 fp32 element = 40 TB).
MAX_ROWS = 10**13
MAX_DIM = 65536


class StrictModel(BaseModel):
    """Unknown fields are errors; numbers are not parsed out of strings."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


PositiveInt = Annotated[int, Field(strict=True, ge=1)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class UniformAccess(StrictModel):
    kind: Literal["uniform"] = "uniform"


class ZipfAccess(StrictModel):
    kind: Literal["zipf"]
    alpha: Annotated[float, Field(gt=0.0, le=10.0, allow_inf_nan=False)]


class CurveAccess(StrictModel):
    """Cumulative access curve: points (fraction of hottest rows, fraction of accesses)."""

    kind: Literal["curve"]
    points: Annotated[list[tuple[Fraction, Fraction]], Field(min_length=1, max_length=1000)]

    @field_validator("points")
    @classmethod
    def _monotone(cls, pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            if not x1 > x0:
                raise ValueError("row fractions must strictly increase")
            if y1 < y0:
                raise ValueError("access fractions must not decrease")
        return pts


AccessFrequency = Annotated[UniformAccess | ZipfAccess | CurveAccess, Field(discriminator="kind")]


class TableConstraints(StrictModel):
    sharding_types: Annotated[list[ShardingType], Field(min_length=1)] | None = None
    memory_tiers: Annotated[list[Tier], Field(min_length=1)] | None = None
    pinned_ranks: Annotated[list[Annotated[int, Field(strict=True, ge=0)]],
                            Field(min_length=1)] | None = None
    min_column_shard_width: Annotated[int, Field(strict=True, ge=1, le=MAX_DIM)] | None = None


class TableSpec(StrictModel):
    name: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")]
    num_embeddings: Annotated[int, Field(strict=True, ge=1, le=MAX_ROWS)]
    embedding_dim: Annotated[int, Field(strict=True, ge=1, le=MAX_DIM)]
    pooling_factor: Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)]
    access_frequency: AccessFrequency = UniformAccess()
    data_type: DataType = DataType.FP32
    optimizer: Optimizer = Optimizer.ROWWISE_ADAGRAD
    constraints: TableConstraints | None = None
    # Eviction policy of the table's cache if a plan caches it (hbm_cache, ssd): lfu or lru,
    # as FBGEMM's cache_algorithm (TorchRec's CacheParams.algorithm). Absent: lfu. Left out
    # of the JSON when absent, so requests and plans written before it keep their hashes.
    cache_policy: CachePolicy | None = None

    @model_serializer(mode="wrap")
    def _drop_absent_policy(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and "cache_policy" in data and data["cache_policy"] is None:
            del data["cache_policy"]
        return data
