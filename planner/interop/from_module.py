"""Plan a TorchRec model as it stands: `plan_from_torchrec(module, hardware, ...)` reads every
EmbeddingBagCollection (pooled tables) and EmbeddingCollection (sequence tables, our
pooling_mode "none") inside `module`, plans their tables together with `planner.plan()`, and
returns our plan and TorchRec's `ShardingPlan`, each table under its own collection's path.

Needs torchrec (imported inside functions). The table configs become our model through
`importing.model_from_torchrec_tables` and the plan becomes TorchRec's through
`export.to_torchrec` and `sharding_plan.build_sharding_plan`: nothing here is a second
mapping of tables or shardings.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from planner.errors import BadInputError
from planner.interop.torchrec_format import OUR_TIER, OUR_TYPE
from planner.plan_model import Plan


@dataclass(frozen=True)
class Collection:
    """One EmbeddingBagCollection ("ebc") or EmbeddingCollection ("ec") of a model, at its
    fully qualified module path ("" when it is the model itself)."""

    path: str
    kind: str
    module: Any

    def configs(self) -> list[Any]:
        return (self.module.embedding_bag_configs() if self.kind == "ebc"
                else self.module.embedding_configs())

    def weight(self, table: str) -> Any:
        bags = self.module.embedding_bags if self.kind == "ebc" else self.module.embeddings
        return bags[table].weight


def collections_of(module: Any) -> list[Collection]:
    """Every EmbeddingBagCollection and EmbeddingCollection in `module` (itself included), in
    `named_modules` order, with its path. Subclasses count; a sharded module does not."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    found = []
    for path, sub in module.named_modules():
        if isinstance(sub, EmbeddingBagCollection):
            found.append(Collection(path, "ebc", sub))
        elif isinstance(sub, EmbeddingCollection):
            found.append(Collection(path, "ec", sub))
    if not found:
        raise BadInputError("module", f"no EmbeddingBagCollection or EmbeddingCollection in "
                            f"{type(module).__name__}")
    return found


def _optimizer_names() -> dict[type, str]:
    import torch
    from torchrec.optim import RowWiseAdagrad

    return {torch.optim.SGD: "sgd", torch.optim.Adagrad: "adagrad",
            RowWiseAdagrad: "rowwise_adagrad", torch.optim.Adam: "adam"}


def _optimizer(weight: Any, table: str) -> str | None:
    """The fused optimizer `_apply_optimizer_in_backward` put on the table's weight (what
    TorchRec's storage estimate reads), as ours; None when there is none (our default)."""
    classes = getattr(weight, "_optimizer_classes", None)
    if not classes:
        return None
    names = _optimizer_names()
    if classes[0] not in names:
        raise BadInputError("optimizer", f"{classes[0].__name__} has no equivalent here "
                            f"(one of {sorted(c.__name__ for c in names)})", table=table)
    return names[classes[0]]


def _constraints(pc: Any, table: str) -> dict[str, Any]:
    """TorchRec's ParameterConstraints' sharding_types, compute_kernels, min_partition and
    cache_params.load_factor as our table constraints (pooling_factors and batch_sizes are
    read per feature)."""
    out: dict[str, Any] = {}
    if pc.sharding_types:
        bad = [s for s in pc.sharding_types if s not in OUR_TYPE]
        if bad:
            raise BadInputError("constraints.sharding_types", f"{bad[0]!r} is not one of "
                                f"{sorted(OUR_TYPE)}", table=table)
        out["sharding_types"] = [OUR_TYPE[s].value for s in pc.sharding_types]
    if pc.compute_kernels:
        bad = [k for k in pc.compute_kernels if k not in OUR_TIER]
        if bad:
            raise BadInputError("constraints.compute_kernels", f"{bad[0]!r} is not one of "
                                f"{sorted(OUR_TIER)}", table=table)
        out["memory_tiers"] = sorted({OUR_TIER[k].value for k in pc.compute_kernels})
    if pc.min_partition is not None:
        out["min_column_shard_width"] = pc.min_partition
    cache = getattr(pc, "cache_params", None)
    if cache is not None and getattr(cache, "load_factor", None) is not None:
        out["cache_load_factor"] = float(cache.load_factor)
    return out


def _pooling_factors(table: str, features: list[str], pooling_factors: Mapping[str, float],
                     pc: Any, default: float | None) -> list[float]:
    """Each feature's mean ids per sample: `pooling_factors[feature]`, else the table's
    ParameterConstraints.pooling_factors (one per feature, in feature_names order), else
    `default`; none of these is an error naming the feature. A ParameterConstraints made
    without pooling_factors holds TorchRec's default [POOLING_FACTOR] (1.0), which cannot be
    told from one given: it does not count as given."""
    from torchrec.distributed.planner.constants import POOLING_FACTOR

    given = list(pc.pooling_factors) if pc is not None and pc.pooling_factors else None
    if given == [POOLING_FACTOR]:
        given = None
    if given is not None and len(given) != len(features):
        raise BadInputError("constraints.pooling_factors", f"{len(given)} pooling factors for "
                            f"{len(features)} features {features} (one per feature)",
                            table=table)
    out = []
    for i, f in enumerate(features):
        if f in pooling_factors:
            out.append(pooling_factors[f])
        elif given is not None:
            out.append(given[i])
        elif default is not None:
            out.append(default)
        else:
            raise BadInputError("pooling_factors", f"no pooling factor for feature {f!r}: pass "
                                f"pooling_factors={{{f!r}: ids per sample}}, TorchRec's "
                                f"constraints[{table!r}].pooling_factors (TorchRec's "
                                f"default [{POOLING_FACTOR:g}] does not count), or "
                                "default_pooling_factor", table=table)
    return out


def _plain(x: Any) -> Any:
    return x.model_dump(mode="json") if isinstance(x, BaseModel) else x


def model_request(module: Any, hardware: Any, *, batch_size_per_gpu: int,
                  pooling_factors: Mapping[str, float] | None = None,
                  constraints: Mapping[str, Any] | None = None,
                  default_pooling_factor: float | None = None, options: Any = None,
                  name: str = "torchrec_model"
                  ) -> tuple[dict[str, Any], dict[str, str], list[Collection]]:
    """The plan request for `module`'s tables, each table's module path, and the collections.

    A table config gives name, num_embeddings, embedding_dim, feature_names, data_type and
    pooling (an EmbeddingCollection's tables are sequence tables); its ParameterConstraints
    (`constraints[table]`, as TorchRec's planner takes them) give sharding_types,
    compute_kernels, min_partition, pooling_factors and batch_sizes."""
    from planner.interop.importing import model_from_torchrec_tables

    pooling_factors = dict(pooling_factors or {})
    constraints = dict(constraints or {})
    found = collections_of(module)
    configs: list[dict[str, Any]] = []
    paths: dict[str, str] = {}
    for coll in found:
        for cfg in coll.configs():
            tname = cfg.name
            if tname in paths:
                raise BadInputError("tables", f"table {tname!r} is in {paths[tname]!r} and "
                                    f"{coll.path!r}; table names must be unique across the "
                                    "model's collections", table=tname)
            paths[tname] = coll.path
            features = list(cfg.feature_names) or [tname]
            pc = constraints.get(tname)
            entry: dict[str, Any] = {
                "name": tname, "num_embeddings": cfg.num_embeddings,
                "embedding_dim": cfg.embedding_dim, "feature_names": features,
                "data_type": str(cfg.data_type),
                "pooling": "none" if coll.kind == "ec" else str(cfg.pooling),
                "pooling_factors": _pooling_factors(tname, features, pooling_factors, pc,
                                                    default_pooling_factor),
            }
            if pc is not None and pc.batch_sizes:
                entry["batch_sizes"] = list(pc.batch_sizes)
            if pc is not None and (ours := _constraints(pc, tname)):
                entry["constraints"] = ours
            opt = _optimizer(coll.weight(tname), tname)
            if opt is not None:
                entry["optimizer"] = opt
            configs.append(entry)
    unknown = sorted(set(constraints) - set(paths))
    if unknown:
        raise BadInputError("constraints", f"{unknown[0]!r} is not a table of the module "
                            f"(its tables: {sorted(paths)})")
    read = {f for c in configs for f in c["feature_names"]}
    stray = sorted(set(pooling_factors) - read)
    if stray:
        raise BadInputError("pooling_factors", f"{stray[0]!r} is not a feature of the "
                            f"module's tables (its features: {sorted(read)})")
    model = model_from_torchrec_tables(configs, batch_size_per_gpu, name=name)
    request: dict[str, Any] = {"model": model.model_dump(mode="json"),
                               "hardware": _plain(hardware)}
    if options is not None:
        request["options"] = _plain(options)
    return request, paths, found


def plan_from_torchrec(module: Any, hardware: Any, *, batch_size_per_gpu: int,
                       pooling_factors: Mapping[str, float] | None = None,
                       constraints: Mapping[str, Any] | None = None,
                       default_pooling_factor: float | None = None, options: Any = None,
                       device: str = "cuda", name: str = "torchrec_model"
                       ) -> tuple[Plan, Any]:
    """Plan the embedding tables of a TorchRec model and give TorchRec's ShardingPlan.

    `module`: an EmbeddingBagCollection, an EmbeddingCollection, or a model holding any
    number of them (found by `named_modules`, e.g. a DLRM's
    `sparse_arch.embedding_bag_collection`); the meta device is enough. `hardware`: what
    `plan()` takes (a preset reference such as {"preset": "h100", "hosts": 2}, or a full
    spec). `pooling_factors`: mean ids per sample by FEATURE name; `constraints`: TorchRec's
    `ParameterConstraints` by table name (its pooling_factors, batch_sizes, sharding_types,
    compute_kernels, min_partition are used); a feature with neither is a BadInputError
    naming it unless `default_pooling_factor` is given. `device` is the placements' device
    ("cuda", or "cpu" for gloo).

    Returns (our Plan, torchrec ShardingPlan) for `DistributedModelParallel(plan=...)`.
    Raises BadInputError like `plan()`, and when TorchRec cannot express a table's planned
    sharding (`build_sharding_plan`)."""
    from planner.interop.export import to_torchrec
    from planner.interop.sharding_plan import build_sharding_plan
    from planner.planning import plan

    request, paths, _ = model_request(
        module, hardware, batch_size_per_gpu=batch_size_per_gpu,
        pooling_factors=pooling_factors, constraints=constraints,
        default_pooling_factor=default_pooling_factor, options=options, name=name)
    ours = plan(request)
    export = to_torchrec(ours, device=device)
    return ours, build_sharding_plan(export, table_paths=paths)
