"""TorchRec objects from our export and back (needs torchrec; imported inside functions).

`build_sharding_plan(export)` gives the `ShardingPlan` to pass to
`DistributedModelParallel(plan=...)`; `export_from_sharding_plan(plan)` reads one that
TorchRec's own planner made into our export format, for `layout_from_torchrec`.
"""

from typing import Any

from planner.errors import BadInputError
from planner.interop.torchrec_format import (
    TorchRecCacheParams,
    TorchRecExport,
    TorchRecParameterSharding,
    TorchRecShard,
    TorchRecTable,
)


def build_sharding_plan(export: TorchRecExport, module_path: str | None = None) -> Any:
    """torchrec.distributed.types.ShardingPlan for one EmbeddingBagCollection.

    Refuses (BadInputError naming the table) when a table is inexpressible: a plan without it
    would make TorchRec shard that table its own way, silently."""
    from torchrec.distributed.types import (
        CacheParams,
        EmbeddingModuleShardingPlan,
        EnumerableShardingSpec,
        ParameterSharding,
        ShardingPlan,
        ShardMetadata,
    )

    bad = export.by_status("inexpressible")
    if bad:
        raise BadInputError("sharding_type", "TorchRec cannot express this table's sharding: "
                            + "; ".join(bad[0].notes), table=bad[0].name)
    per_table: dict[str, Any] = {}
    for t in export.tables:
        ps = t.parameter_sharding
        assert ps is not None  # exact and adjusted tables always carry one
        spec = None
        if ps.sharding_spec is not None:
            spec = EnumerableShardingSpec([
                ShardMetadata(shard_offsets=list(s.shard_offsets),
                              shard_sizes=list(s.shard_sizes), placement=s.placement)
                for s in ps.sharding_spec])
        cache = CacheParams(load_factor=ps.cache_params.load_factor) if ps.cache_params else None
        per_table[t.name] = ParameterSharding(
            sharding_type=ps.sharding_type, compute_kernel=ps.compute_kernel,
            ranks=list(ps.ranks), sharding_spec=spec, cache_params=cache)
    path = export.module_path if module_path is None else module_path
    return ShardingPlan(plan={path: EmbeddingModuleShardingPlan(per_table)})


def export_from_sharding_plan(plan: Any, world_size: int, local_world_size: int,
                              module_path: str = "") -> TorchRecExport:
    """A TorchRec ShardingPlan (for example from EmbeddingShardingPlanner) in our format."""
    module_plan = plan.plan.get(module_path)
    if module_plan is None:
        raise BadInputError("module_path", f"{module_path!r} is not in the plan "
                            f"(it has {sorted(plan.plan)})")
    tables = []
    device = "cuda"
    for name, ps in module_plan.items():
        shards = None
        if ps.sharding_spec is not None:
            shards = []
            for m in ps.sharding_spec.shards:
                shards.append(TorchRecShard(shard_offsets=tuple(m.shard_offsets),
                                            shard_sizes=tuple(m.shard_sizes),
                                            placement=str(m.placement)))
                device = "cuda" if "cuda" in str(m.placement) else "cpu"
        lf = ps.cache_params.load_factor if ps.cache_params is not None else None
        tables.append(TorchRecTable(
            name=name, status="exact",
            parameter_sharding=TorchRecParameterSharding(
                sharding_type=ps.sharding_type, compute_kernel=ps.compute_kernel,
                ranks=list(ps.ranks or []), sharding_spec=shards,
                cache_params=TorchRecCacheParams(load_factor=lf) if lf else None)))
    return TorchRecExport(module_path=module_path, device=device, world_size=world_size,
                          local_world_size=local_world_size, tables=tables)
