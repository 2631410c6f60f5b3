"""The one interface that prices pieces: an `Estimator` turns a table's pieces into seconds.

What a piece moves (its bytes: traffic.py) is the model's; how long that takes is the
estimator's. Every part that needs a piece's seconds (candidates, plan building, `evaluate`,
`explain`, the checker, the executor's prediction) asks the request's estimator, so a plan
is priced, searched, checked and compared with a measurement under one model:

- `AnalyticEstimator`: cost.traffic_cost over the hardware profile; its `fixed` is the step's
  all-to-all call latency (cost.step_fixed), and it has `step_terms`, so callers add the owner
  side of the all-to-alls (placement.py, from the pieces' bytes). A preset and a calibrated
  profile (`planner calibrate`) are two profiles of this one class.
- planner.interop.estimator's `TorchRecEstimator`: TorchRec's own shard estimators
  (EmbeddingPerfEstimator), as its planner prices its proposals; no step-wide terms.

An estimator prices a table's pieces together (`pieces`): TorchRec's estimator takes a
table's whole sharding option, whose shard list its post-processing hook may read (a no-op
in torchrec 1.8), and its price depends on the exact sharding type, not only on our three
type classes. `per_shape` says when a piece's price depends on its type class, tier, cache
ratio and shape alone, so callers may cache by shape.

`step_terms` means the analytic model's step-wide terms apply, both of them: `fixed` is then
cost.step_fixed (the checker recomputes that latency from the constants on its own) and the
owner side is added from the pieces' bytes. An estimator without them has its own `fixed`.
"""

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from cost_models.cost import CostBreakdown, step_fixed, traffic_cost
from cost_models.hardware import HardwareProfile
from cost_models.placement import piece_sides
from cost_models.traffic import PieceTraffic
from cost_models.types import ShardingType, Tier

Shape = tuple[int, int]  # a piece's (rows, cols)


class Estimator(Protocol):
    name: str
    # A piece's price depends only on its type class (data-parallel, host-reduced, other),
    # tier, cache ratio and shape: callers may price one shape once for every sharding.
    per_shape: bool
    # Whether the analytic model's step-wide terms apply: `fixed` is cost.step_fixed (every
    # GPU's all-to-all call latency) and callers add the sample owners' side of the
    # all-to-alls beyond its pieces' (placement.py).
    step_terms: bool

    def pieces(self, table: int, kind: ShardingType, tier: Tier, cache_ratio: float,
               shapes: Sequence[Shape], traffic: Sequence[PieceTraffic]
               ) -> list[CostBreakdown]:
        """Seconds per step each piece of one table (all of its pieces, in plan order, with
        their bytes) adds to its GPU."""
        ...

    def fixed(self) -> CostBreakdown:
        """Seconds every GPU pays per step whatever it holds."""
        ...


class AnalyticEstimator:
    """The analytic model: each piece's bytes over the profile's effective bandwidths, plus
    its latency terms (cost.traffic_cost)."""

    name = "analytic"
    per_shape = True
    step_terms = True

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw

    def pieces(self, table: int, kind: ShardingType, tier: Tier, cache_ratio: float,
               shapes: Sequence[Shape], traffic: Sequence[PieceTraffic]
               ) -> list[CostBreakdown]:
        return [traffic_cost(t, self.hw) for t in traffic]

    def fixed(self) -> CostBreakdown:
        return step_fixed(self.hw)


def priced_sides(est: Estimator, traffic: PieceTraffic) -> tuple[np.ndarray, np.ndarray]:
    """placement.piece_sides of a piece (inter-host bytes, owner bytes per sample), the owner
    rates zero where the estimator has no step terms (so no owner side is ever charged)."""
    inter, rate = piece_sides(traffic)
    return inter, (rate if est.step_terms else np.zeros(3))
