"""Our request as TorchRec's planner sees it: an EmbeddingBagCollection on the meta device,
a Topology with our bandwidths and capacities, per-table constraints (pooling factors), and
a sharder with our communication precisions. Used to run TorchRec's EmbeddingShardingPlanner
on the same problem, and to score any plan with TorchRec's own shard estimators.

Mapping (TorchRec bandwidths are bytes per millisecond, per device; its perf is in ms):
- hbm_cap: our HBM left for embeddings (capacity - hbm_reserved_bytes); the storage
  reservation's dense percentage is 0, because that reservation is already subtracted.
- ddr_cap, ssd_cap: our host DDR (less ddr_reserved_bytes) and SSD divided by GPUs per host.
- hbm_mem_bw: HBM bandwidth x hbm_efficiency (TorchRec's 897 GB/s default is likewise an
  achieved, not a peak, A100 figure); hbm_to_ddr_mem_bw: our GPU's read rate of host DDR
  (min of PCIe x pcie_efficiency and its share of DDR x ddr_efficiency); ddr_mem_bw: that
  DDR share; ssd_mem_bw: its share of SSD x ssd_efficiency.
- intra_host_bw, inter_host_bw: NVLink and NIC per GPU per direction x their efficiencies.
Everything else (bwd_compute_multiplier, kernel penalties, proposers) is TorchRec's default.
"""

import copy
from dataclasses import dataclass
from typing import Any

from planner.interop.torchrec_format import TorchRecExport
from planner.spec import ModelSpec, ResolvedRequest

_MS = 1000.0  # bytes/s -> bytes/ms


def topology_for(request: ResolvedRequest) -> Any:
    from torchrec.distributed.planner.types import Topology

    hw = request.hardware
    prof = hw.profile()
    g = hw.gpus_per_host
    return Topology(
        world_size=hw.hosts * g, compute_device="cuda", local_world_size=g,
        hbm_cap=prof.hbm_cap, ddr_cap=prof.ddr_cap // g, ssd_cap=prof.ssd_cap // g,
        hbm_mem_bw=prof.eff_hbm_bw / _MS,
        ddr_mem_bw=prof.ddr_bw * prof.constants.ddr_efficiency / g / _MS,
        ssd_mem_bw=prof.eff_ssd_bw / _MS,
        hbm_to_ddr_mem_bw=prof.eff_host_read_bw / _MS,
        intra_host_bw=prof.eff_nvlink_bw / _MS, inter_host_bw=prof.eff_nic_bw / _MS,
    )


def _optimizer_class(name: str) -> Any:
    import torch
    from torchrec.optim import RowWiseAdagrad

    return {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
            "rowwise_adagrad": RowWiseAdagrad, "adam": torch.optim.Adam}[name]


def ebc_on_meta(model: ModelSpec) -> Any:
    """The model's tables as an EmbeddingBagCollection on the meta device (no memory), each
    with its fused optimizer, which TorchRec's storage estimate reads."""
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    dtypes = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16,
              "int8": DataType.INT8}
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim,
                                  num_embeddings=t.num_embeddings,
                                  feature_names=t.feature_names(),
                                  data_type=dtypes[t.data_type.value])
               for t in model.tables]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    for t in model.tables:
        param = ebc.embedding_bags[t.name].weight
        _apply_optimizer_in_backward(_optimizer_class(t.optimizer.value), [param], {"lr": 0.01})
    return ebc


def constraints_for(model: ModelSpec) -> dict[str, Any]:
    from torchrec.distributed.planner.types import ParameterConstraints

    from planner.interop.export import features_of

    out = {}
    for t in model.tables:
        _, pfs, sizes = features_of(t, model.batch_size_per_gpu)
        out[t.name] = ParameterConstraints(pooling_factors=pfs, batch_sizes=sizes)
    return out


def sharders_for(model: ModelSpec) -> list[Any]:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fbgemm_qcomm_codec import (
        CommType,
        QCommsConfig,
        get_qcomm_codecs_registry,
    )

    registry = None
    fwd, bwd = model.fwd_comm_precision.value, model.bwd_comm_precision.value
    if (fwd, bwd) != ("fp32", "fp32"):
        registry = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=CommType(fwd), backward_precision=CommType(bwd)))
    return [EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)]


@dataclass
class TorchRecProblem:
    """One request, set up once for TorchRec's planner and estimators."""

    request: ResolvedRequest
    topology: Any
    module: Any
    constraints: dict[str, Any]
    sharders: list[Any]

    @classmethod
    def of(cls, request: ResolvedRequest) -> "TorchRecProblem":
        model = request.model
        return cls(request, topology_for(request), ebc_on_meta(model), constraints_for(model),
                   sharders_for(model))

    def planner(self) -> Any:
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.storage_reservations import (
            HeuristicalStorageReservation,
        )

        return EmbeddingShardingPlanner(
            topology=self.topology, batch_size=self.request.model.batch_size_per_gpu,
            constraints=self.constraints, debug=False,
            storage_reservation=HeuristicalStorageReservation(percentage=0.0))

    def plan(self) -> Any:
        """TorchRec's own plan for this problem (its ShardingPlan)."""
        return self.planner().plan(self.module, self.sharders)

    def enumerator(self) -> Any:
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

        return EmbeddingEnumerator(topology=self.topology,
                                   batch_size=self.request.model.batch_size_per_gpu,
                                   constraints=self.constraints)


@dataclass
class TorchRecScore:
    step_ms: float  # slowest rank's total perf: TorchRec's NoopPerfModel rating
    per_rank_ms: list[float]
    max_hbm_bytes: int  # largest per-rank HBM use by TorchRec's storage estimate
    hbm_cap_bytes: int
    shards: list[tuple[str, int, float]]  # (table, rank, ms) of every shard

    def slowest_rank_mix(self, kinds: dict[str, str]) -> dict[str, float]:
        """ms on the slowest rank, summed by `kinds[table]` (e.g. sharding type/kernel)."""
        rank = max(range(len(self.per_rank_ms)), key=self.per_rank_ms.__getitem__)
        mix: dict[str, float] = {}
        for table, r, ms in self.shards:
            if r == rank:
                mix[kinds[table]] = mix.get(kinds[table], 0.0) + ms
        return mix


def partition_by(sharding_type: str) -> str:
    # As torchrec's EmbeddingEnumerator sets it (only the partitioner reads it).
    if sharding_type in ("table_row_wise", "table_column_wise", "grid_shard"):
        return "host"
    if sharding_type in ("data_parallel", "row_wise"):
        return "uniform"
    return "device"


def score_with_torchrec(problem: TorchRecProblem, export: TorchRecExport) -> TorchRecScore:
    """Score a plan with TorchRec's shard estimators (perf and storage), as its planner
    scores its own proposals: per rank, the sum of its shards' Perf.total; the plan, the
    slowest rank. Tables must all carry a parameter sharding (exact or adjusted)."""
    from torchrec.distributed.planner.types import Shard
    from torchrec.distributed.types import CacheParams

    enum = problem.enumerator()
    options = enum.enumerate(problem.module, problem.sharders)
    template = {}
    for o in options:
        template.setdefault(o.name, o)
    chosen = []
    for t in export.tables:
        ps = t.parameter_sharding
        if ps is None:
            raise ValueError(f"table '{t.name}' has no TorchRec sharding ({t.status})")
        o = copy.deepcopy(template[t.name])
        o.sharding_type = ps.sharding_type
        o.compute_kernel = ps.compute_kernel
        o.partition_by = partition_by(ps.sharding_type)
        o.cache_params = (CacheParams(load_factor=ps.cache_params.load_factor)
                          if ps.cache_params else None)
        if ps.sharding_spec is None:  # data_parallel: a full replica on each rank
            rows, cols = o.tensor.shape
            o.shards = [Shard(size=[rows, cols], offset=[0, 0], rank=r) for r in ps.ranks]
        else:
            o.shards = [Shard(size=list(s.shard_sizes), offset=list(s.shard_offsets), rank=r)
                        for r, s in zip(ps.ranks, ps.sharding_spec, strict=True)]
        chosen.append(o)
    enum.populate_estimates(chosen)
    world = problem.topology.world_size
    perf = [0.0] * world
    hbm = [0] * world
    shards = []
    for o in chosen:
        for s in o.shards:
            perf[s.rank] += s.perf.total
            hbm[s.rank] += s.storage.hbm
            shards.append((o.name, s.rank, s.perf.total))
    return TorchRecScore(step_ms=max(perf), per_rank_ms=perf, max_hbm_bytes=max(hbm),
                         hbm_cap_bytes=problem.topology.devices[0].storage.hbm, shards=shards)
