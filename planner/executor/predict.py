"""The cost model's figures for each rank and piece of a plan, taken from cost_models only
(piece_traffic, hit_rate, piece_memory) and the plan's per-GPU cost terms, for the
configuration that runs (the scaled plan), with the one term the executor pays differently
from a training job: whole all-reduce calls for its replicas (_whole_calls)."""

from dataclasses import dataclass, field

from cost_models import (
    HardwareProfile,
    ModelGeom,
    ShardingType,
    Tier,
    hit_rate,
    piece_memory,
    piece_traffic,
    placed_piece_buffers,
    sides_of,
    step_time,
)
from cost_models.latency import whole_calls_s
from cost_models.memory import (
    Allocator,
    StepBuffers,
    bags_per_gpu,
    host_reduce_index_bytes,
    owner_buffers,
    step_peak,
)
from cost_models.sizes import comm_row_bytes, param_bytes
from planner.plan_model import CostTerms, Plan
from planner.problem import Problem, TableInfo, build_problem

# The byte counts compared per rank, per step.
COLLECTIVES = ("input_lengths", "input_ids", "output_fwd", "output_bwd", "allreduce")


@dataclass
class PiecePrediction:
    key: str
    table: str
    kind: str
    tier: str
    rank: int
    ids_bytes: float  # id bytes received from other ranks (an expectation for row splits)
    lengths_bytes: float  # bag-length bytes received from other ranks
    ids_total: float  # ids the piece serves per step, from every rank (its own included)
    out_fwd_bytes: float
    out_bwd_bytes: float
    hit_rate: float | None  # cached tiers only


@dataclass
class RankPrediction:
    rank: int
    bytes: dict[str, float] = field(default_factory=dict)  # per collective, per step
    memory: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    # The step buffers at the step's peak over its phases (cost_models.memory.step_peak),
    # and their terms summed over the rank's pieces and its owner side.
    step_peak: int = 0
    buffer_terms: dict[str, int] = field(default_factory=dict)


def predict(plan: Plan, allocator: Allocator = "cuda"
            ) -> tuple[list[RankPrediction], list[PiecePrediction]]:
    """Per rank and per piece: what the executor should see of `plan`. `allocator`: whose
    backward arrays the step buffers count (cost_models.memory.GRAD_ARRAYS_PER_ID; a CPU
    run's check holds the CPU's allocator to its own)."""
    problem = build_problem(plan.request)
    hw, model = problem.hw, problem.model
    by_name = {t.name: t for t in problem.tables}
    ranks = [RankPrediction(r, dict.fromkeys(COLLECTIVES, 0.0), {"hbm": 0, "ddr": 0, "ssd": 0})
             for r in range(hw.world_size)]
    pieces = []
    bufs: list[list[StepBuffers]] = [[] for _ in ranks]
    for ti, tp in enumerate(plan.tables):
        geom = by_name[tp.name].geom
        ratio = tp.cache_ratio if tp.cache_ratio is not None else 1.0
        for j, p in enumerate(tp.pieces):
            tr = piece_traffic(geom, tp.sharding_type, tp.tier, ratio, p.row_count, p.col_count,
                               hw, model)
            rp = ranks[p.rank]
            ids = tr.ids_intra + tr.ids_inter - tr.lengths
            fwd = tr.out_fwd_intra + tr.out_fwd_inter
            bwd = tr.out_bwd_intra + tr.out_bwd_inter
            rp.bytes["input_lengths"] += tr.lengths
            rp.bytes["input_ids"] += ids
            rp.bytes["output_fwd"] += fwd
            rp.bytes["output_bwd"] += bwd
            rp.bytes["allreduce"] += tr.allreduce
            m = piece_memory(geom, tp.tier, ratio, p.row_count, p.col_count, hw)
            rp.memory["hbm"] += m.hbm
            rp.memory["ddr"] += m.ddr
            rp.memory["ssd"] += m.ssd
            bufs[p.rank].append(placed_piece_buffers(geom, tp.sharding_type, tp.tier, ratio,
                                                     p.row_count, p.col_count, hw, model,
                                                     allocator))
            cached = tp.tier in (Tier.HBM_CACHE, Tier.SSD)
            pieces.append(PiecePrediction(
                key=f"{ti}.{j}", table=tp.name, kind=tp.sharding_type.value, tier=tp.tier.value,
                rank=p.rank, ids_bytes=ids, lengths_bytes=tr.lengths,
                ids_total=tr.lookups, out_fwd_bytes=fwd, out_bwd_bytes=bwd,
                hit_rate=hit_rate(geom, tp.tier, ratio, p.row_count) if cached else None))
    geoms = [by_name[tp.name].geom for tp in plan.tables]
    dp = [tp.sharding_type is ShardingType.DATA_PARALLEL for tp in plan.tables]
    # One index per distinct count of bags per rank among host-reduced tables (rank.py).
    host_index = sum(host_reduce_index_bytes(hw.hosts, hw.gpus_per_host, nb) for nb in {
        bags_per_gpu(by_name[tp.name].geom, model.batch_per_gpu) for tp in plan.tables
        if tp.sharding_type in (ShardingType.TABLE_ROW_WISE, ShardingType.GRID)})
    for rp, bs in zip(ranks, bufs, strict=True):
        # The owner exchanges one block per piece on another GPU (row-split: one per range).
        remote = [sum(p.col_count for p in tp.pieces if p.rank != rp.rank)
                  for tp in plan.tables]
        sliced = [sum(p.col_count for p in tp.pieces
                      if p.rank != rp.rank and p.col_count < geom.dim)
                  for tp, geom in zip(plan.tables, geoms, strict=True)]
        owner = (owner_buffers(geoms, model, dp, remote, sliced)
                 + StepBuffers(ids=host_index))
        rp.step_peak = step_peak(bs, owner)
        terms = sum(bs, owner)
        rp.buffer_terms = {k: getattr(terms, k) for k in (
            "ids", "pooled", "grads", "dense", "dense_grad")}
        rp.buffer_terms["exchange_fwd"] = terms.exchange(True)
        rp.buffer_terms["exchange_bwd"] = terms.exchange(False)
        rp.buffer_terms["workspace_largest_piece"] = max((b.workspace for b in bs), default=0)
    whole = whole_call_seconds(plan, problem)
    for g in plan.gpus:
        c = g.cost
        ranks[g.rank].seconds = {
            "lookup": c.lookup_s, "backward": c.backward_s, "cache_miss": c.cache_miss_s,
            "input_a2a": c.input_a2a_s, "output_a2a": c.output_a2a_s,
            "allreduce": c.allreduce_s + whole[g.rank],
            "total": with_whole_calls(c, whole[g.rank], plan.request.model.pipelined,
                                      hw.constants.pipeline_overlap)}
    return ranks, pieces


def whole_call_seconds(plan: Plan, problem: Problem | None = None) -> list[float]:
    """Per rank: the all-reduce seconds the executor's whole calls add to what `plan`
    charges its replicas (_whole_calls; 0 under an estimator without step-wide terms, as
    TorchRec's). `problem`: the plan's request built, where the caller has it."""
    problem = problem or build_problem(plan.request)
    if not problem.estimator.step_terms:
        return [0.0] * problem.hw.world_size
    # The executor's whole all-reduce calls are the analytic model's step-wide accounting.
    by_name = {t.name: t for t in problem.tables}
    return _whole_calls(plan, by_name, problem.hw, problem.model)


def with_whole_calls(cost: CostTerms, whole_s: float, pipelined: bool, overlap: float
                     ) -> float:
    """A GPU's step time (cost.step_time) with `whole_s` more all-reduce latency
    (`overlap`: the profile's pipeline_overlap)."""
    sides = sides_of(cost.compute_s, cost.comm_s + whole_s, cost.input_a2a_s, pipelined,
                     overlap)
    return float(step_time(*sides, pipelined))


def _whole_calls(plan: Plan, by_name: dict[str, TableInfo], hw: HardwareProfile,
                 model: ModelGeom) -> list[float]:
    """Per rank, the all-reduce latency the executor pays beyond the plan's figure: the plan
    charges replicas their share of calls (a job's dense part all-reduces anyway), the
    executor, with no dense part, makes whole calls (cost_models.latency.whole_calls_s)."""
    grads: list[list[float]] = [[] for _ in range(hw.world_size)]
    params: list[list[int]] = [[] for _ in range(hw.world_size)]
    for tp in reversed(plan.tables):  # ready order, as rank.py buckets them
        if tp.sharding_type is not ShardingType.DATA_PARALLEL:
            continue
        g = by_name[tp.name].geom
        for r in sorted({p.rank for p in tp.pieces}):
            grads[r].append(g.rows * comm_row_bytes(model.bwd_precision, g.dim))
            params[r].append(param_bytes(g.data_type, g.rows, g.dim))
    return [whole_calls_s(hw, gs, ps) for gs, ps in zip(grads, params, strict=True)]
