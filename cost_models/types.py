"""Enumerations shared by the cost model, the planner and the plan format.

They live here, at the bottom of the import graph, so that `cost_models` stays free of
pydantic and every other layer names these things the same way.
"""

from enum import StrEnum


class ShardingType(StrEnum):
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID = "grid"
    DATA_PARALLEL = "data_parallel"


class Tier(StrEnum):
    HBM = "hbm"
    HBM_CACHE = "hbm_cache"
    DDR = "ddr"
    SSD = "ssd"


class DataType(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"


class CommPrecision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"


class Optimizer(StrEnum):
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAM = "adam"


# Sharding types whose pieces all sit on the GPUs of one host.
HOST_LOCAL_TYPES = frozenset({ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE})
# Sharding types whose pieces split the rows (and so the ids) of the table.
ROW_SPLIT_TYPES = frozenset(
    {ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID}
)
