"""TorchRec objects from our export and back (needs torchrec; imported inside functions).

`build_sharding_plan(export)` gives the `ShardingPlan` to pass to
`DistributedModelParallel(plan=...)`; `export_from_sharding_plan(plan)` reads one that
TorchRec's own planner made into our export format, for `layout_from_torchrec`.
"""

from collections.abc import Mapping
from typing import Any

from planner.errors import BadInputError
from planner.interop.torchrec_format import (
    TorchRecCacheParams,
    TorchRecExport,
    TorchRecParameterSharding,
    TorchRecShard,
    TorchRecTable,
)


def build_sharding_plan(export: TorchRecExport, module_path: str | None = None,
                        ec_module_path: str | None = None,
                        table_paths: Mapping[str, str] | None = None) -> Any:
    """torchrec.distributed.types.ShardingPlan for one EmbeddingBagCollection (the pooled
    tables, at `module_path`) and, given sequence tables, one EmbeddingCollection (at
    `ec_module_path`; TorchRec shards it with its EmbeddingCollectionSharder).

    `table_paths` (table name -> its collection's module path) puts each table it names under
    its own path instead, for a model with several collections (`plan_from_torchrec`); the
    tables of one path must all be pooled or all sequence tables.

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
    path = export.module_path if module_path is None else module_path
    ec_path = export.ec_module_path if ec_module_path is None else ec_module_path
    table_paths = dict(table_paths or {})
    stray = sorted(set(table_paths) - {t.name for t in export.tables})
    if stray:
        raise BadInputError("table_paths", "not a table of the plan", table=stray[0])

    def path_of(t: TorchRecTable) -> str:
        return table_paths.get(t.name, ec_path if t.pooling == "none" else path)

    kinds: dict[str, set[bool]] = {}
    for t in export.tables:
        kinds.setdefault(path_of(t), set()).add(t.pooling == "none")
    mixed = [p for p, k in kinds.items() if k == {True, False}]
    if mixed:
        field = "table_paths" if table_paths else "ec_module_path"
        raise BadInputError(field, f"the model has pooled and sequence tables: "
                            f"the EmbeddingBagCollection and the EmbeddingCollection need "
                            f"different module paths (both {mixed[0]!r})")
    per_module: dict[str, dict[str, Any]] = {}
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
        per_module.setdefault(path_of(t), {})[t.name] = \
            ParameterSharding(
                sharding_type=ps.sharding_type, compute_kernel=ps.compute_kernel,
                ranks=list(ps.ranks), sharding_spec=spec, cache_params=cache)
    if not per_module:
        per_module[path] = {}
    return ShardingPlan(plan={p: EmbeddingModuleShardingPlan(per_table)
                              for p, per_table in per_module.items()})


def export_from_sharding_plan(plan: Any, world_size: int, local_world_size: int,
                              module_path: str = "",
                              ec_module_path: str | None = None) -> TorchRecExport:
    """A TorchRec ShardingPlan (for example from EmbeddingShardingPlanner) in our format;
    given `ec_module_path`, also the sequence tables of the EmbeddingCollection there."""
    modules = [(module_path, "module_path", "sum")]
    if ec_module_path is not None:
        modules.append((ec_module_path, "ec_module_path", "none"))
    entries = []
    for path, field, pooling in modules:
        module_plan = plan.plan.get(path)
        if module_plan is None:
            raise BadInputError(field, f"{path!r} is not in the plan "
                                f"(it has {sorted(plan.plan)})")
        entries.extend((name, ps, pooling) for name, ps in module_plan.items())
    tables = []
    device = "cuda"
    for name, ps, pooling in entries:
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
            name=name, status="exact", pooling=pooling,
            parameter_sharding=TorchRecParameterSharding(
                sharding_type=ps.sharding_type, compute_kernel=ps.compute_kernel,
                ranks=list(ps.ranks or []), sharding_spec=shards,
                cache_params=TorchRecCacheParams(load_factor=lf) if lf else None)))
    return TorchRecExport(module_path=module_path, ec_module_path=ec_module_path or "",
                          device=device, world_size=world_size,
                          local_world_size=local_world_size, tables=tables)
