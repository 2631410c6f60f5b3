"""A plan scaled down to fit a laptop: fewer rows (and optionally a smaller batch), same shape.

Every table keeps its sharding type, tier, cache ratio, pieces, ranks and column cuts; row
ranges shrink in proportion (each piece keeps at least one row). The scaled layout is scored
again by `planner.planning.evaluate`, so the predictions the executor compares with are the
cost model's for the configuration that really runs.
"""

from planner.plan_model import Plan, PlanLayout, PlanPiece, TablePlan


def _scaled_cuts(offsets: list[int], rows: int, new_rows: int) -> list[int]:
    """Start rows of consecutive ranges after scaling, strictly increasing, all < new_rows."""
    n = len(offsets)
    cuts = []
    for i, off in enumerate(offsets):
        c = round(off * new_rows / rows)
        low = cuts[-1] + 1 if cuts else 0
        high = new_rows - (n - i)
        cuts.append(min(max(c, low), high))
    return cuts


def _scale_table(tp: TablePlan, rows: int, new_rows: int) -> TablePlan:
    if new_rows == rows:
        return tp
    pieces: list[PlanPiece | None] = [None] * len(tp.pieces)
    bands: dict[tuple[int, int], list[int]] = {}
    for j, p in enumerate(tp.pieces):
        # Replicas (data-parallel) each cover all rows: scale each on its own.
        key = (p.col_offset, p.col_count, j) if p.row_count == rows else (
            p.col_offset, p.col_count, -1)
        bands.setdefault(key, []).append(j)
    for idx in bands.values():
        idx.sort(key=lambda j: tp.pieces[j].row_offset)
        cuts = _scaled_cuts([tp.pieces[j].row_offset for j in idx], rows, new_rows)
        ends = [*cuts[1:], new_rows]
        for j, c0, c1 in zip(idx, cuts, ends, strict=True):
            pieces[j] = tp.pieces[j].model_copy(update={"row_offset": c0, "row_count": c1 - c0})
    return tp.model_copy(update={"pieces": pieces})


def scaled_plan(plan: Plan, scale_rows: float = 1.0, batch: int | None = None) -> Plan:
    """The plan with every table's rows times `scale_rows` and, if given, `batch` samples per
    rank; re-evaluated under the cost model. Identity (the same plan) when nothing changes."""
    if not 0.0 < scale_rows <= 1.0:
        raise ValueError("scale_rows must be in (0, 1]")
    model = plan.request.model
    if scale_rows == 1.0 and (batch is None or batch == model.batch_size_per_gpu):
        return plan
    by_name = {t.name: t for t in plan.tables}
    specs, tables = [], []
    for spec in model.tables:
        tp = by_name[spec.name]
        need = max(sum(1 for p in tp.pieces if p.col_offset == c) for c in
                   {p.col_offset for p in tp.pieces})
        new_rows = max(need, round(spec.num_embeddings * scale_rows), 1)
        upd_t: dict[str, object] = {"num_embeddings": new_rows}
        if batch is not None and spec.features:
            # A feature's own batch scales with the model's (at least 1, at most the batch).
            upd_t["features"] = [f.model_copy(update={"batch_size_per_gpu": min(batch, max(
                1, round(f.batch_size_per_gpu * batch / model.batch_size_per_gpu)))})
                if f.batch_size_per_gpu is not None else f for f in spec.features]
        specs.append(spec.model_copy(update=upd_t))
    new_by_name = {s.name: s for s in specs}
    orig = {s.name: s.num_embeddings for s in model.tables}
    for tp in plan.tables:
        tables.append(_scale_table(tp, orig[tp.name], new_by_name[tp.name].num_embeddings))
    upd: dict[str, object] = {"tables": specs}
    if batch is not None:
        upd["batch_size_per_gpu"] = batch
    request = plan.request.model_copy(update={"model": model.model_copy(update=upd)})
    from planner.planning import evaluate

    # Round-trip through JSON so the copied pydantic models are validated again.
    layout = PlanLayout.model_validate_json(
        PlanLayout(request=request, tables=tables).model_dump_json())
    return evaluate(layout)


def with_cache_policy(plan: Plan, policy: str) -> Plan:
    """The plan with every table's cache policy set to `policy` (lfu or lru), re-evaluated:
    the hit rates the executor checks are the model's for the policy that runs."""
    model = plan.request.model
    from cost_models import CachePolicy

    specs = [s.model_copy(update={"cache_policy": CachePolicy(policy)}) for s in model.tables]
    request = plan.request.model_copy(update={"model": model.model_copy(update={
        "tables": specs})})
    from planner.planning import evaluate

    layout = PlanLayout.model_validate_json(
        PlanLayout(request=request, tables=plan.tables).model_dump_json())
    return evaluate(layout)
