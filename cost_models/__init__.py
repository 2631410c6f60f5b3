"""Analytic performance and memory models for sharded embedding tables (numpy only)."""

from cost_models.access import AccessModel, CurveAccess, UniformAccess, ZipfAccess
from cost_models.cache_policy import CachePolicy
from cost_models.cost import (
    CostBreakdown,
    fixed_floors,
    piece_cost,
    sides_of,
    step_fixed,
    step_time,
    traffic_cost,
)
from cost_models.estimator import AnalyticEstimator, Estimator, priced_sides
from cost_models.geometry import ModelGeom, TableGeom, cache_rows
from cost_models.hardware import CostConstants, HardwareProfile
from cost_models.memory import (
    MemoryFootprint,
    StepBuffers,
    owner_buffers,
    piece_buffers,
    piece_memory,
    placed_piece_buffers,
)
from cost_models.placement import owner_wait, piece_sides
from cost_models.traffic import PieceTraffic, hit_rate, piece_traffic
from cost_models.types import CommPrecision, DataType, Optimizer, ShardingType, Tier

__all__ = [
    "AccessModel",
    "AnalyticEstimator",
    "CachePolicy",
    "CommPrecision",
    "CostBreakdown",
    "CostConstants",
    "CurveAccess",
    "DataType",
    "Estimator",
    "HardwareProfile",
    "MemoryFootprint",
    "ModelGeom",
    "Optimizer",
    "PieceTraffic",
    "ShardingType",
    "StepBuffers",
    "TableGeom",
    "Tier",
    "UniformAccess",
    "ZipfAccess",
    "cache_rows",
    "fixed_floors",
    "hit_rate",
    "owner_buffers",
    "owner_wait",
    "piece_buffers",
    "piece_cost",
    "piece_memory",
    "piece_sides",
    "piece_traffic",
    "placed_piece_buffers",
    "priced_sides",
    "sides_of",
    "step_fixed",
    "step_time",
    "traffic_cost",
]
