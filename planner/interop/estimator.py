"""TorchRec's shard estimators as an `Estimator` (cost_models/estimator.py): the planner
searches, and the checker and the executor's prediction price, with the seconds TorchRec's
own planner gives its proposals.

A table's pieces become one TorchRec ShardingOption (the table's enumerated option with our
sharding type, compute kernel, cache load factor and shard sizes; export.py's mapping), and
TorchRec's EmbeddingPerfEstimator fills each shard's Perf, as `score_with_torchrec` does for
a whole plan. The price depends on the exact sharding type (not only our type classes), so
the estimator is not `per_shape`. Its estimate of a shard does not read the rank it lands
on, so the shards get placeholder ranks. Per piece: lookup = Perf.fwd_compute,
backward = bwd_compute, cache_miss = prefetch_compute, output_a2a = fwd_comms + bwd_comms
(a replica's: allreduce).
A GPU's step (not pipelined) is then the sum of its shards' Perf.total, the figure
TorchRec's planner rates a rank by. Perf's input_dist_comms is not charged, as Perf.total
leaves it out (TorchRec's planner assumes the train pipeline hides the input all-to-all).
No step-wide terms (no call latency, no owner side): TorchRec has none. Bytes and memory
stay our model's.
"""

import copy
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from cost_models import CostBreakdown, PieceTraffic, ShardingType, Tier
from planner.errors import BadInputError
from planner.interop.torchrec_format import CACHED_KERNELS, TORCHREC_KERNEL, TORCHREC_TYPE
from planner.interop.torchrec_model import TorchRecProblem, partition_by
from planner.spec import ResolvedRequest

_S = 1e-3  # TorchRec's perf is in milliseconds


class TorchRecEstimator:
    name = "torchrec"
    per_shape = False  # priced by exact sharding type, a table's shards together
    step_terms = False

    def __init__(self, problem: TorchRecProblem) -> None:
        self.problem = problem
        self.names = [t.name for t in problem.request.model.tables]
        # One option per table as a template (pieces() sets its type, kernel, cache and
        # shards): enumerated with each table's constraints narrowed to table-wise fused, so
        # TorchRec does not enumerate and estimate every option of every table first (23 s
        # of 1,000 tables on one host, measured). The narrowed fields only filter the
        # enumeration (enumerators.py); TorchRec's estimators read neither, so this
        # enumerator prices as the request's own would (the tests hold it to
        # score_with_torchrec, which uses the request's).
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

        narrow = {name: dataclasses.replace(pc, sharding_types=["table_wise"],
                                            compute_kernels=["fused"])
                  for name, pc in problem.constraints.items()}
        request = problem.request
        first = EmbeddingEnumerator(topology=problem.topology,
                                    batch_size=request.model.batch_size_per_gpu,
                                    constraints=narrow)
        self._templates: dict[str, Any] = {}
        for o in first.enumerate(problem.module, problem.sharders):
            self._templates.setdefault(o.name, o)
        self._enum = first

    @classmethod
    def of(cls, request: ResolvedRequest) -> "TorchRecEstimator":
        for i, t in enumerate(request.model.tables):
            if t.sequence:
                raise BadInputError(
                    f"model.tables[{i}].pooling_mode",
                    "options.estimator torchrec prices pooled tables (EmbeddingBagCollection) "
                    "only; use the analytic estimator for a sequence table", table=t.name)
        # TorchRec warns that a Topology built directly skips its hardware presets: ours
        # carries the request's bandwidths on purpose.
        quiet = logging.getLogger("torchrec.distributed.planner.types")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            return cls(TorchRecProblem.of(request))
        except ImportError as e:
            raise BadInputError("options.estimator",
                                f"torchrec is not installed here ({e})") from e
        finally:
            quiet.setLevel(level)

    def pieces(self, table: int, kind: ShardingType, tier: Tier, cache_ratio: float,
               shapes: Sequence[tuple[int, int]], traffic: Sequence[PieceTraffic]
               ) -> list[CostBreakdown]:
        from torchrec.distributed.planner.types import Shard
        from torchrec.distributed.types import CacheParams

        name = self.names[table]
        template = self._templates.get(name)
        if template is None:
            raise BadInputError(f"model.tables[{table}]",
                                "TorchRec's enumerator proposes no sharding for this table",
                                table=name)
        if kind is ShardingType.DATA_PARALLEL and tier is not Tier.HBM:
            raise BadInputError(f"model.tables[{table}]", "TorchRec's data_parallel replicas "
                                f"are dense HBM tensors; tier {tier.value} has no equivalent",
                                table=name)
        o = copy.deepcopy(template)
        o.sharding_type = TORCHREC_TYPE[kind]
        o.compute_kernel = ("dense" if kind is ShardingType.DATA_PARALLEL
                            else TORCHREC_KERNEL[tier])
        o.partition_by = partition_by(o.sharding_type)
        o.cache_params = (CacheParams(load_factor=cache_ratio)
                          if o.compute_kernel in CACHED_KERNELS else None)
        # Offsets do not enter the estimate; sizes and their count do.
        o.shards = [Shard(size=[rows, cols], offset=[0, 0], rank=i)
                    for i, (rows, cols) in enumerate(shapes)]
        self._enum.populate_estimates([o])
        out = []
        for s in o.shards:
            p = s.perf
            comms = (p.fwd_comms + p.bwd_comms) * _S  # a replica's: its gradient all-reduce
            replica = kind is ShardingType.DATA_PARALLEL
            out.append(CostBreakdown(lookup=p.fwd_compute * _S, backward=p.bwd_compute * _S,
                                     cache_miss=p.prefetch_compute * _S,
                                     output_a2a=0.0 if replica else comms,
                                     allreduce=comms if replica else 0.0))
        return out

    def fixed(self) -> CostBreakdown:
        return CostBreakdown()
