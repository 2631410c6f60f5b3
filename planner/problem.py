"""The planner's internal view of a resolved request: cost-model value types, no pydantic."""

from dataclasses import dataclass, field, replace

from cost_models import (
    AccessModel,
    CurveAccess,
    Estimator,
    HardwareProfile,
    ModelGeom,
    StepBuffers,
    TableGeom,
    UniformAccess,
    ZipfAccess,
    owner_buffers,
)
from cost_models.cache_policy import DEFAULT_POLICY
from cost_models.sizes import optimizer_state_row_bytes, weight_row_bytes
from planner.errors import BadInputError
from planner.estimators import estimator_for
from planner.spec import ResolvedRequest, TableConstraints, TableSpec
from planner.spec import table as table_spec


@dataclass(frozen=True)
class TableInfo:
    index: int
    name: str
    geom: TableGeom
    constraints: TableConstraints

    @property
    def bytes(self) -> int:
        """Weights plus optimizer state of the whole table."""
        g = self.geom
        return g.rows * (
            weight_row_bytes(g.data_type, g.dim) + optimizer_state_row_bytes(g.optimizer, g.dim)
        )


@dataclass(frozen=True)
class Problem:
    """`hw.hbm_cap` is what the pieces may use: the GPU's HBM after the hardware's reserve
    and after `step_reserve`, the step buffers every GPU holds as the owner of its samples
    (cost_models.owner_buffers), whatever the placement."""

    request: ResolvedRequest
    hw: HardwareProfile
    model: ModelGeom
    tables: tuple[TableInfo, ...]
    # What prices a piece (cost_models/estimator.py): the request's.
    estimator: Estimator
    step_reserve: StepBuffers = field(default_factory=StepBuffers)

    @property
    def hbm_cap_reported(self) -> int:
        """The per-GPU HBM cap a plan reports: before the step reserve."""
        return self.hw.hbm_cap + self.step_reserve.total


def access_model(spec: TableSpec) -> AccessModel:
    af = spec.access_frequency
    if isinstance(af, table_spec.ZipfAccess):
        return ZipfAccess(alpha=af.alpha)
    if isinstance(af, table_spec.CurveAccess):
        return CurveAccess(points=tuple((float(x), float(y)) for x, y in af.points))
    return UniformAccess()


def table_geom(spec: TableSpec, batch_size_per_gpu: int) -> TableGeom:
    """The table as the cost model sees it. The one place a table's features become its
    `pooling` (ids per sample of the model's batch b, summed over features:
    sum_f pooling_f * b_f / b) and `bags` (sum_f b_f / b); a table without `features` is one
    feature over the whole batch: its pooling_factor and 1 bag. Also the one place its output
    vectors per sample are set (`outputs`): one per bag for a pooled table, one per id
    (`pooling`) for a sequence table (pooling_mode "none")."""
    if spec.features:
        b = batch_size_per_gpu
        sizes = [f.batch_size_per_gpu or b for f in spec.features]
        pooling = sum(f.pooling_factor * n for f, n in zip(spec.features, sizes, strict=True)) / b
        bags = sum(sizes) / b
    else:
        assert spec.pooling_factor is not None  # TableSpec's validator
        pooling, bags = spec.pooling_factor, 1.0
    return TableGeom(
        rows=spec.num_embeddings,
        dim=spec.embedding_dim,
        pooling=pooling,
        bags=bags,
        sequence=spec.sequence,
        outputs=pooling if spec.sequence else bags,
        access=access_model(spec),
        data_type=spec.data_type,
        optimizer=spec.optimizer,
        cache_policy=spec.cache_policy or DEFAULT_POLICY,
    )


def _constraints(spec: TableSpec, field: str) -> TableConstraints:
    """The table's constraints; a sequence table's sharding types are those TorchRec's
    EmbeddingCollectionSharder shards (SEQUENCE_SHARDING_TYPES): the allowed ones when none
    are asked, an error naming the field and table when another is."""
    c = spec.constraints or TableConstraints()
    if not spec.sequence:
        return c
    allowed = table_spec.SEQUENCE_SHARDING_TYPES
    if c.sharding_types is None:
        return c.model_copy(update={"sharding_types": list(allowed)})
    bad = [t.value for t in c.sharding_types if t not in allowed]
    if bad:
        raise BadInputError(
            f"{field}.constraints.sharding_types",
            f"{', '.join(bad)} cannot shard a sequence table (pooling_mode none: one vector "
            f"per id, TorchRec's EmbeddingCollection); allowed: "
            f"{', '.join(t.value for t in allowed)}",
            table=spec.name,
        )
    return c


def build_problem(req: ResolvedRequest) -> Problem:
    """Convert specs to cost-model types and reject what cannot hold on this hardware."""
    hw = req.hardware.profile()
    m = req.model
    model = ModelGeom(
        batch_per_gpu=m.batch_size_per_gpu,
        fwd_precision=m.fwd_comm_precision,
        bwd_precision=m.bwd_comm_precision,
        pipelined=m.pipelined,
    )
    cluster_bytes = hw.world_size * hw.hbm_cap + hw.hosts * (hw.ddr_cap + hw.ssd_cap)
    tables = []
    for i, spec in enumerate(m.tables):
        field = f"model.tables[{i}]"
        info = TableInfo(i, spec.name, table_geom(spec, m.batch_size_per_gpu),
                         _constraints(spec, field))
        if info.bytes > cluster_bytes:
            raise BadInputError(
                f"{field}.num_embeddings",
                f"the table needs {info.bytes:,} bytes, more than all memory of the cluster "
                f"({cluster_bytes:,} bytes of HBM, DDR and SSD)",
                table=spec.name,
            )
        c = info.constraints
        for r in c.pinned_ranks or ():
            if r >= hw.world_size:
                raise BadInputError(
                    f"{field}.constraints.pinned_ranks",
                    f"rank {r} does not exist (the cluster has ranks 0..{hw.world_size - 1})",
                    table=spec.name,
                )
        if c.min_column_shard_width is not None and c.min_column_shard_width > spec.embedding_dim:
            raise BadInputError(
                f"{field}.constraints.min_column_shard_width",
                f"{c.min_column_shard_width} is wider than embedding_dim {spec.embedding_dim}",
                table=spec.name,
            )
        tables.append(info)
    # When the reserve passes the cap, nothing fits and "infeasible" says why
    # (planner/infeasibility.py, the step-buffers certificate).
    reserve = owner_buffers([t.geom for t in tables], model)
    hw = replace(hw, hbm_reserved_bytes=hw.hbm_reserved_bytes + reserve.total)
    return Problem(request=req, hw=hw, model=model, tables=tuple(tables), step_reserve=reserve,
                   estimator=estimator_for(req, hw))
