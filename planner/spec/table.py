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
    model_validator,
)

from cost_models import CachePolicy, DataType, Optimizer, ShardingType, Tier

# Rows beyond this are not a table any cluster holds (1e13 rows of 1 fp32 element = 40 TB).
MAX_ROWS = 10**13
MAX_DIM = 65536


class StrictModel(BaseModel):
    """Unknown fields are errors; numbers are not parsed out of strings."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


def drop_absent(data: Any, keys: tuple[str, ...], absent: Any = None) -> Any:
    """A serialized model without the optional `keys` whose value is `absent`: fields added
    after plans were hashed are left out of the JSON when unset, so older requests and plans
    keep their hashes (each model's wrap serializer calls this)."""
    if isinstance(data, dict):
        for key in keys:
            if key in data and (data[key] is None if absent is None else data[key] == absent):
                del data[key]
    return data


PositiveInt = Annotated[int, Field(strict=True, ge=1)]
Fraction = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]


class UniformAccess(StrictModel):
    kind: Literal["uniform"] = Field(
        "uniform", description=(
            "Every row is equally likely to be looked up."))


class ZipfAccess(StrictModel):
    kind: Literal["zipf"] = Field(
        description=(
            "Zipf access: the row of popularity rank k is looked up with probability "
            "proportional to k^-alpha."))
    alpha: Annotated[float, Field(strict=True, gt=0.0, le=10.0, allow_inf_nan=False)] = Field(
        description=(
            "Zipf exponent (dimensionless, 0 < alpha <= 10): larger is more skewed towards "
            "the hottest rows."))


class CurveAccess(StrictModel):
    """Cumulative access curve: points (fraction of hottest rows, fraction of accesses)."""

    kind: Literal["curve"] = Field(description="An explicit cumulative access curve.")
    points: Annotated[list[tuple[Fraction, Fraction]],
                      Field(min_length=1, max_length=1000)] = Field(
        description=(
            "Points (fraction of the hottest rows, fraction of all lookups they receive), "
            "both in [0, 1]; row fractions strictly increase, lookup fractions never "
            "decrease; (0, 0) and (1, 1) are implied and points are joined linearly."))

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
    sharding_types: Annotated[list[ShardingType], Field(min_length=1)] | None = Field(
        None, description=(
            "Sharding types the planner may use for this table (default: all)."))
    memory_tiers: Annotated[list[Tier], Field(min_length=1)] | None = Field(
        None, description=(
            "Memory tiers the table's pieces may live in: hbm, hbm_cache (an HBM cache in "
            "front of host DDR), ddr, ssd (on SSD behind a DDR cache); default: all."))
    pinned_ranks: Annotated[list[Annotated[int, Field(strict=True, ge=0)]],
                            Field(min_length=1)] | None = Field(
        None, description=(
            "Global GPU ranks (0-based) the table's pieces may be placed on (default: any)."))
    min_column_shard_width: Annotated[int, Field(strict=True, ge=1, le=MAX_DIM)] | None = Field(
        None, description=(
            "Narrowest column chunk allowed when the table is split by columns, in columns "
            "(elements of an embedding vector); default 32."))
    cache_load_factor: Annotated[float, Field(strict=True, gt=0.0, le=1.0,
                                              allow_inf_nan=False)] | None = (
        Field(None, description=(
            "Share of each piece's rows its cache holds when the table is cached (hbm_cache: "
            "an HBM cache in front of DDR; ssd: a DDR cache in front of SSD), as TorchRec's "
            "CacheParams.load_factor; a fraction in (0, 1]. Default: the planner chooses "
            "among its grid of ratios.")))

    @model_serializer(mode="wrap")
    def _drop_absent_load_factor(self, handler: SerializerFunctionWrapHandler) -> Any:
        return drop_absent(handler(self), ("cache_load_factor",))


PoolingMode = Literal["sum", "mean", "none"]
# What TorchRec's EmbeddingCollectionSharder shards a sequence table as (torchrec/distributed/
# embedding.py, sharding_types): no host-local or grid types.
SEQUENCE_SHARDING_TYPES = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE,
                           ShardingType.COLUMN_WISE, ShardingType.ROW_WISE)
PoolingFactor = Annotated[float, Field(strict=True, gt=0.0, le=1e6, allow_inf_nan=False)]
# A name: 1 to 256 characters, no whitespace and no control characters (a NUL was taken).
Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s\x00-\x1f\x7f]+$")]
FeatureName = Name


class FeatureSpec(StrictModel):
    """One sparse feature that reads its table (TorchRec's feature_names of an
    EmbeddingBagConfig): each feature is its own bag per sample, so its own pooled vector
    in the output all-to-all."""

    name: FeatureName = Field(
        description=(
            "Feature name, without whitespace; unique across the whole model."))
    pooling_factor: PoolingFactor = Field(
        description=(
            "Mean number of ids of this feature per sample (ids per sample, > 0)."))
    batch_size_per_gpu: Annotated[int, Field(strict=True, ge=1, le=10_000_000)] | None = Field(
        None, description=(
            "Samples per GPU per step that carry this feature (samples; TorchRec's variable "
            "batch per feature), at most the model's batch_size_per_gpu; absent means the "
            "model's."))


class TableSpec(StrictModel):
    name: Name = Field(
        description=(
            "Unique table name, without whitespace or control characters."))
    num_embeddings: Annotated[int, Field(strict=True, ge=1, le=MAX_ROWS)] = Field(
        description=(
            "Rows of the table (a count)."))
    embedding_dim: Annotated[int, Field(strict=True, ge=1, le=MAX_DIM)] = Field(
        description=(
            "Columns of the table: elements per embedding vector (a count)."))
    pooling_factor: PoolingFactor | None = Field(
        None, description=(
            "Mean number of ids looked up in this table per sample (ids per sample, > 0; 1 "
            "for a single-hot feature). Required unless `features` is given, and refused "
            "with it."))
    features: Annotated[list[FeatureSpec], Field(min_length=1, max_length=1024)] | None = Field(
        None, description=(
            "The features that read this table, each with its own pooling factor (ids per "
            "sample) and batch (samples): each is its own bag per sample and its own pooled "
            "vector in the output all-to-all. Absent: one feature named as the table, with "
            "`pooling_factor`."))
    access_frequency: AccessFrequency = Field(
        UniformAccess(), description=(
            "How lookups spread over the table's rows (uniform, zipf or an explicit curve); "
            "sets the hit rate of the cached tiers."))
    data_type: DataType = Field(
        DataType.FP32, description=(
            "Storage type of the weights: fp32 (4 bytes per element), fp16 or bf16 (2), int8 "
            "(1, plus 8 bytes of scale and bias per row)."))
    optimizer: Optimizer = Field(
        Optimizer.ROWWISE_ADAGRAD, description=(
            "The table's optimizer, which sets its state per row: sgd (none), rowwise_adagrad"
            " (one fp32 per row), adagrad (one fp32 per element), adam (two fp32 per "
            "element)."))
    constraints: TableConstraints | None = Field(
        None, description=(
            "Optional limits on how the table may be sharded and where its pieces may go."))
    # Eviction policy of the table's cache if a plan caches it (hbm_cache, ssd): lfu or lru,
    # as FBGEMM's cache_algorithm (TorchRec's CacheParams.algorithm). Absent: lfu. Left out
    # of the JSON when absent, so requests and plans written before it keep their hashes.
    cache_policy: CachePolicy | None = Field(
        None, description=(
            "Eviction policy of the table's cache when a plan caches it (hbm_cache and ssd "
            "tiers): lfu or lru; absent means lfu."))
    # How a bag's vectors become the table's output (TorchRec's PoolingType): summed (the
    # default), averaged, or not at all: "none" is a sequence table (TorchRec's
    # EmbeddingConfig in an EmbeddingCollection), every id its own output vector. Left out of
    # the JSON when absent, so requests and plans written before it keep their hashes.
    pooling_mode: PoolingMode | None = Field(
        None, description=(
            "How the vectors of a bag become the table's output: sum (the default) or mean "
            "of the bag (one pooled vector per bag), or none: a sequence table (TorchRec's "
            "EmbeddingCollection), where every id looked up returns its own vector, so the "
            "output all-to-all carries one vector per id. A sequence table may be sharded "
            f"{', '.join(t.value for t in SEQUENCE_SHARDING_TYPES)} only."))

    @property
    def sequence(self) -> bool:
        """Unpooled: one output vector per id (pooling_mode "none")."""
        return self.pooling_mode == "none"

    @model_validator(mode="after")
    def _pooling_or_features(self) -> "TableSpec":
        if self.features is None and self.pooling_factor is None:
            raise ValueError("give pooling_factor (ids per sample) or features (each with "
                             "its own pooling_factor)")
        if self.features is not None and self.pooling_factor is not None:
            raise ValueError("give either pooling_factor or features, not both: with "
                             "features, each feature has its own pooling_factor")
        if self.features is not None:
            seen: dict[str, int] = {}
            for i, f in enumerate(self.features):
                if f.name in seen:
                    raise ValueError(f"duplicate feature name '{f.name}' (features[{seen[f.name]}]"
                                     f" and features[{i}])")
                seen[f.name] = i
        return self

    def feature_names(self) -> list[str]:
        """The features reading this table: their names, or the table's own name."""
        return [f.name for f in self.features] if self.features else [self.name]

    @model_serializer(mode="wrap")
    def _drop_absent_policy(self, handler: SerializerFunctionWrapHandler) -> Any:
        return drop_absent(handler(self),
                           ("cache_policy", "features", "pooling_factor", "pooling_mode"))
