"""TorchRec -> ours: table configs into a model spec, and a TorchRec plan into our layout so
`planner evaluate` can score it."""

from typing import Any

from pydantic import ValidationError

from cost_models import ShardingType
from planner.errors import BadInputError
from planner.interop.torchrec_format import (
    CACHED_KERNELS,
    DEFAULT_CACHE_LOAD_FACTOR,
    OUR_TIER,
    OUR_TYPE,
    TorchRecExport,
)
from planner.plan_model import PlanLayout, PlanPiece, TablePlan
from planner.spec import ModelSpec, ResolvedRequest
from planner.validation import bad_input_from

# TorchRec DataType names -> ours.
_DATA_TYPES = {"FP32": "fp32", "FP16": "fp16", "BF16": "bf16", "INT8": "int8"}


def _pooling(cfg: dict[str, Any], name: str) -> list[float]:
    """Mean ids per sample of each feature (TorchRec's ParameterConstraints.pooling_factors,
    one per feature), or a single `pooling_factor`."""
    if "pooling_factors" in cfg:
        pfs = cfg["pooling_factors"]
        if not isinstance(pfs, list) or not pfs:
            raise BadInputError("pooling_factors", "expected a non-empty list of numbers",
                                table=name)
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in pfs):
            raise BadInputError("pooling_factors", "expected numbers", table=name)
        return [float(x) for x in pfs]
    if "pooling_factor" in cfg:
        return [cfg["pooling_factor"]]
    raise BadInputError("pooling_factors", "missing: give the mean ids per sample of each "
                        "feature (TorchRec's ParameterConstraints.pooling_factors)", table=name)


def _features(cfg: dict[str, Any], name: str, names: list[Any]) -> dict[str, Any]:
    """The table's `pooling_factor` (one feature) or `features` (several: each its name,
    pooling factor and, given TorchRec's ParameterConstraints.batch_sizes, its batch)."""
    pfs = _pooling(cfg, name)
    if len(names) == 1:
        if len(pfs) != 1:
            raise BadInputError("pooling_factors", f"{len(pfs)} pooling factors for one "
                                "feature", table=name)
        return {"pooling_factor": pfs[0]}
    if len(pfs) != len(names):
        raise BadInputError("pooling_factors", f"{len(pfs)} pooling factors for "
                            f"{len(names)} features (one per feature)", table=name)
    sizes = cfg.get("batch_sizes")
    if sizes is not None and (not isinstance(sizes, list) or len(sizes) != len(names)):
        raise BadInputError("batch_sizes", f"expected a list of {len(names)} batch sizes "
                            "(one per feature)", table=name)
    feats = []
    for i, (fname, pf) in enumerate(zip(names, pfs, strict=True)):
        f: dict[str, Any] = {"name": fname, "pooling_factor": pf}
        if sizes is not None:
            f["batch_size_per_gpu"] = sizes[i]
        feats.append(f)
    return {"features": feats}


def model_from_torchrec_tables(configs: list[dict[str, Any]], batch_size_per_gpu: int,
                               name: str = "torchrec_model", **model_fields: Any) -> ModelSpec:
    """TorchRec EmbeddingBagConfig-like dicts (name, num_embeddings, embedding_dim,
    feature_names, data_type, plus pooling_factors) -> our ModelSpec.

    A table read by several features gets `features`, one per feature name with its pooling
    factor (and batch, given `batch_sizes`): each is its own bag and pooled vector."""
    if not isinstance(configs, list) or not configs:
        raise BadInputError("tables", "expected a non-empty list of table configs")
    tables = []
    for i, cfg in enumerate(configs):
        if not isinstance(cfg, dict):
            raise BadInputError(f"tables[{i}]", "expected an object")
        tname = cfg.get("name") or f"#{i}"
        names = cfg.get("feature_names") or [tname]
        if not isinstance(names, list):
            raise BadInputError("feature_names", "expected a list of names", table=tname)
        table: dict[str, Any] = {
            "name": cfg.get("name"), "num_embeddings": cfg.get("num_embeddings"),
            "embedding_dim": cfg.get("embedding_dim"), **_features(cfg, tname, names),
        }
        dt = cfg.get("data_type")
        if dt is not None:
            key = str(dt).rsplit(".", 1)[-1].upper()
            if key not in _DATA_TYPES:
                raise BadInputError("data_type", f"{dt!r} is not one of {sorted(_DATA_TYPES)}",
                                    table=tname)
            table["data_type"] = _DATA_TYPES[key]
        pooling = cfg.get("pooling")
        if pooling is not None:
            # TorchRec's PoolingType (SUM, MEAN, NONE; or our pooling_mode): NONE is a
            # sequence table (an EmbeddingConfig of an EmbeddingCollection).
            key = str(pooling).rsplit(".", 1)[-1].lower()
            if key not in ("sum", "mean", "none"):
                raise BadInputError("pooling", f"{pooling!r} is not one of SUM, MEAN, NONE",
                                    table=tname)
            if key != "sum":
                table["pooling_mode"] = key
        for extra in ("access_frequency", "optimizer", "constraints"):
            if extra in cfg:
                table[extra] = cfg[extra]
        tables.append(table)
    raw = {"name": name, "batch_size_per_gpu": batch_size_per_gpu, "tables": tables,
           **model_fields}
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise bad_input_from(exc, "model", raw) from None


def layout_from_torchrec(export: TorchRecExport, request: ResolvedRequest) -> PlanLayout:
    """A TorchRec plan (in our export format) as our layout, for `planner evaluate`.

    Every table of the request must be in the plan with a parameter sharding; ranks must
    exist in the request's cluster. Empty shards are dropped, so a row-wise table TorchRec
    split into fewer non-empty blocks than GPUs is scored as it runs (the checker then notes
    that it does not cover every GPU)."""
    hw = request.hardware
    g, world = hw.gpus_per_host, hw.hosts * hw.gpus_per_host
    specs = {t.name: t for t in request.model.tables}
    given = {t.name: t for t in export.tables}
    missing = [n for n in specs if n not in given]
    if missing:
        raise BadInputError("tables", f"the TorchRec plan has no sharding for "
                            f"{len(missing)} table(s)", table=missing[0])
    out = []
    for name, spec in specs.items():
        ps = given[name].parameter_sharding
        if ps is None:
            raise BadInputError("parameter_sharding", "missing (the table is marked "
                                f"{given[name].status})", table=name)
        if ps.sharding_type not in OUR_TYPE:
            raise BadInputError("sharding_type", f"{ps.sharding_type!r} is not one of "
                                f"{sorted(OUR_TYPE)}", table=name)
        if ps.compute_kernel not in OUR_TIER:
            raise BadInputError("compute_kernel", f"{ps.compute_kernel!r} is not one of "
                                f"{sorted(OUR_TIER)}", table=name)
        bad = [r for r in ps.ranks if r >= world]
        if bad:
            raise BadInputError("ranks", f"rank {bad[0]} does not exist in a cluster of "
                                f"{world} GPUs", table=name)
        kind = OUR_TYPE[ps.sharding_type]
        tier = OUR_TIER[ps.compute_kernel]
        ratio = None
        if ps.compute_kernel in CACHED_KERNELS:
            ratio = ps.cache_params.load_factor if ps.cache_params else DEFAULT_CACHE_LOAD_FACTOR
        rows, dim = spec.num_embeddings, spec.embedding_dim
        if kind is ShardingType.DATA_PARALLEL or ps.sharding_spec is None:
            if kind is not ShardingType.DATA_PARALLEL:
                raise BadInputError("sharding_spec", f"missing for {ps.sharding_type}",
                                    table=name)
            pieces = [PlanPiece(rank=r, host=r // g, row_offset=0, row_count=rows,
                                col_offset=0, col_count=dim) for r in sorted(ps.ranks)]
        else:
            if len(ps.sharding_spec) != len(ps.ranks):
                raise BadInputError("sharding_spec", f"{len(ps.sharding_spec)} shards but "
                                    f"{len(ps.ranks)} ranks", table=name)
            # TorchRec's row split leaves empty shards past the last block (5 rows on 4 GPUs:
            # 2, 2, 1, 0): they hold no rows and get no ids, so they are not pieces.
            pieces = [PlanPiece(rank=r, host=r // g, row_offset=s.shard_offsets[0],
                                row_count=s.shard_sizes[0], col_offset=s.shard_offsets[1],
                                col_count=s.shard_sizes[1])
                      for r, s in zip(ps.ranks, ps.sharding_spec, strict=True)
                      if s.shard_sizes[0] and s.shard_sizes[1]]
        out.append(TablePlan(name=name, sharding_type=kind, tier=tier, cache_ratio=ratio,
                             pieces=pieces))
    return PlanLayout(request=request, tables=out)
