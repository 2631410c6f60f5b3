"""An independent plan checker: trusts nothing in the plan but the request and the pieces.

It re-derives coverage, structure, memory and costs on its own (from `cost_models` only) and
compares them with what the plan reports:
- every table of the request appears once; every row and column of it is covered exactly
  once (once per replica, on every GPU, for data-parallel);
- each sharding type has its shape (table-wise: one whole piece; row-wise: one row range per
  GPU; table-row-wise: the rows over the GPUs of one host; ...);
- every piece sits on a GPU that exists, on the host that GPU belongs to, on a rank its
  constraints allow, in a tier and sharding type they allow;
- every GPU's HBM and every host's DDR and SSD stays within its cap;
- the per-GPU and per-host figures equal the recomputed ones, and the summary equals what
  the per-GPU figures add up to; the plan hash matches the content.
"""

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from cost_models import (
    CostBreakdown,
    ShardingType,
    Tier,
    owner_wait,
    piece_cost,
    piece_memory,
    piece_sides,
    piece_traffic,
)
from planner.hashing import plan_hash_of
from planner.plan_model import Plan, TablePlan
from planner.problem import TableInfo, build_problem

_REL = 1e-9


@dataclass
class CheckReport:
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL, abs_tol=1e-15)


def _coverage(tp: TablePlan, rows: int, dim: int, errs: list[str]) -> None:
    """Pieces tile rows x dim exactly: in each column band, row ranges are contiguous."""
    cuts = sorted({0, dim} | {p.col_offset for p in tp.pieces}
                  | {p.col_offset + p.col_count for p in tp.pieces})
    for p in tp.pieces:
        if p.row_offset + p.row_count > rows or p.col_offset + p.col_count > dim:
            errs.append(f"table '{tp.name}': piece rows {p.row_offset}+{p.row_count}, cols "
                        f"{p.col_offset}+{p.col_count} lies outside {rows} x {dim}")
            return
    for c0, c1 in itertools.pairwise(cuts):
        spans = sorted((p.row_offset, p.row_count) for p in tp.pieces
                       if p.col_offset <= c0 and p.col_offset + p.col_count >= c1)
        at = 0
        for off, n in spans:
            if off != at:
                kind = "overlap" if off < at else "gap"
                errs.append(f"table '{tp.name}': columns {c0}..{c1}: rows {min(off, at)}.."
                            f"{max(off, at)} {'covered twice' if kind == 'overlap' else 'missing'}")
                return
            at = off + n
        if at != rows:
            errs.append(f"table '{tp.name}': columns {c0}..{c1}: rows {at}..{rows} missing")
            return


def _structure(tp: TablePlan, t: TableInfo, w: int, g: int, errs: list[str]) -> None:
    kind, ps = tp.sharding_type, tp.pieces
    rows, dim = t.geom.rows, t.geom.dim
    ranks = [p.rank for p in ps]
    hosts = {p.rank // g for p in ps}
    full_rows = all(p.row_offset == 0 and p.row_count == rows for p in ps)
    full_cols = all(p.col_offset == 0 and p.col_count == dim for p in ps)
    problem = None
    if kind is ShardingType.TABLE_WISE and not (len(ps) == 1 and full_rows and full_cols):
        problem = "table_wise needs exactly one piece holding the whole table"
    elif kind is ShardingType.COLUMN_WISE and not (full_rows and len(ps) >= 2):
        problem = "column_wise pieces must hold all rows of two or more column chunks"
    elif kind is ShardingType.ROW_WISE and not (full_cols and sorted(ranks) == list(range(w))):
        problem = "row_wise needs one full-width row range on every GPU"
    elif kind is ShardingType.TABLE_ROW_WISE and not (
            full_cols and len(hosts) == 1 and len(set(ranks)) == len(ps) == g):
        problem = "table_row_wise needs one full-width row range on each GPU of one host"
    elif kind is ShardingType.TABLE_COLUMN_WISE and not (
            full_rows and len(hosts) == 1 and len(set(ranks)) == len(ps) >= 2):
        problem = "table_column_wise needs column chunks on distinct GPUs of one host"
    elif kind is ShardingType.GRID:
        chunks: dict[tuple[int, int], list[int]] = defaultdict(list)
        for p in ps:
            chunks[(p.col_offset, p.col_count)].append(p.rank)
        if len(chunks) < 2 or any(len({r // g for r in rs}) != 1 or len(set(rs)) != g
                                  for rs in chunks.values()):
            problem = "grid needs each column chunk row-split over all GPUs of one host"
    elif kind is ShardingType.DATA_PARALLEL and not (
            full_rows and full_cols and sorted(ranks) == list(range(w))):
        problem = "data_parallel needs one whole replica on every GPU"
    elif kind is ShardingType.DATA_PARALLEL and tp.tier is not Tier.HBM:
        problem = "data_parallel replicas live in HBM (the cost model has no tiered replica)"
    if problem:
        errs.append(f"table '{tp.name}': {problem}")


def check_plan(plan: Plan) -> CheckReport:
    rep = CheckReport()
    errs = rep.errors
    body = plan.model_dump(mode="json")
    if plan_hash_of(body) != plan.plan_hash:
        errs.append("plan_hash does not match the plan's content")
    problem = build_problem(plan.request)
    hw, model = problem.hw, problem.model
    w, g = hw.world_size, hw.gpus_per_host
    by_name = {t.name: t for t in problem.tables}
    seen: set[str] = set()
    hbm = [0] * w
    ddr_gpu = [0] * w
    ssd_gpu = [0] * w
    costs: list[CostBreakdown | None] = [None] * w
    piece_inter, host_rate = np.zeros((w, 3)), np.zeros((hw.hosts, 3))
    for tp in plan.tables:
        t = by_name.get(tp.name)
        if t is None:
            errs.append(f"table '{tp.name}' is not in the request")
            continue
        if tp.name in seen:
            errs.append(f"table '{tp.name}' appears more than once")
            continue
        seen.add(tp.name)
        c = t.constraints
        if c.sharding_types and tp.sharding_type not in c.sharding_types:
            errs.append(f"table '{tp.name}': sharding type {tp.sharding_type.value} not allowed")
        if c.memory_tiers and tp.tier not in c.memory_tiers:
            errs.append(f"table '{tp.name}': tier {tp.tier.value} not allowed")
        bad = [p for p in tp.pieces if p.rank >= w or p.host != p.rank // g
               or p.row_count < 1 or p.col_count < 1]
        if bad:
            p = bad[0]
            errs.append(f"table '{tp.name}': piece on rank {p.rank}, host {p.host} does not "
                        f"exist in a cluster of {hw.hosts} x {g} GPUs, or is empty")
            continue
        if c.pinned_ranks and any(p.rank not in c.pinned_ranks for p in tp.pieces):
            errs.append(f"table '{tp.name}': a piece is off its pinned ranks {c.pinned_ranks}")
        if tp.sharding_type is ShardingType.DATA_PARALLEL:
            for p in tp.pieces:
                _coverage(tp.model_copy(update={"pieces": [p]}), t.geom.rows, t.geom.dim, errs)
        else:
            _coverage(tp, t.geom.rows, t.geom.dim, errs)
        _structure(tp, t, w, g, errs)
        ratio = tp.cache_ratio if tp.cache_ratio is not None else 1.0
        for p in tp.pieces:
            m = piece_memory(t.geom, tp.tier, ratio, p.row_count, p.col_count, hw)
            hbm[p.rank] += m.hbm
            ddr_gpu[p.rank] += m.ddr
            ssd_gpu[p.rank] += m.ssd
            cost = piece_cost(t.geom, tp.sharding_type, tp.tier, ratio, p.row_count,
                              p.col_count, hw, model)
            held = costs[p.rank]
            costs[p.rank] = cost if held is None else held + cost
            inter, rate = piece_sides(piece_traffic(t.geom, tp.sharding_type, tp.tier, ratio,
                                                    p.row_count, p.col_count, hw, model))
            piece_inter[p.rank] += inter
            host_rate[p.rank // g] += rate
    for name in by_name.keys() - seen:
        errs.append(f"table '{name}' of the request is missing from the plan")
    # Every GPU owns samples, so the owner side can cost time even where no piece is.
    waits = owner_wait(piece_inter, host_rate, np.arange(w) // g, model.batch_per_gpu,
                       hw.eff_nic_bw)
    for r, wait in enumerate(waits.tolist()):
        if wait > 0:
            costs[r] = (costs[r] or CostBreakdown()) + CostBreakdown(owner_a2a=wait)
    _caps_and_figures(plan, hbm, ddr_gpu, ssd_gpu, costs, rep)
    return rep


def _caps_and_figures(plan: Plan, hbm: list[int], ddr_gpu: list[int], ssd_gpu: list[int],
                      costs: list[CostBreakdown | None], rep: CheckReport) -> None:
    errs = rep.errors
    problem_hw = plan.request.hardware.profile()
    w, g = problem_hw.world_size, problem_hw.gpus_per_host
    pipelined = plan.request.model.pipelined
    for r in range(w):
        if hbm[r] > problem_hw.hbm_cap:
            errs.append(f"GPU {r}: HBM {hbm[r]:,} bytes over its cap {problem_hw.hbm_cap:,} "
                        f"(by {hbm[r] - problem_hw.hbm_cap:,})")
    for h in range(problem_hw.hosts):
        d, s = sum(ddr_gpu[h * g:(h + 1) * g]), sum(ssd_gpu[h * g:(h + 1) * g])
        if d > problem_hw.ddr_cap:
            errs.append(f"host {h}: DDR {d:,} bytes over its cap {problem_hw.ddr_cap:,} "
                        f"(by {d - problem_hw.ddr_cap:,})")
        if s > problem_hw.ssd_cap:
            errs.append(f"host {h}: SSD {s:,} bytes over its cap {problem_hw.ssd_cap:,} "
                        f"(by {s - problem_hw.ssd_cap:,})")
    if len(plan.gpus) != w or [x.rank for x in plan.gpus] != list(range(w)):
        errs.append(f"the plan must report GPUs 0..{w - 1} in order")
        return
    totals = []
    for rep_gpu in plan.gpus:
        r = rep_gpu.rank
        if (rep_gpu.hbm_bytes, rep_gpu.ddr_bytes, rep_gpu.ssd_bytes) != (
                hbm[r], ddr_gpu[r], ssd_gpu[r]):
            errs.append(f"GPU {r}: reported memory differs from the pieces it holds")
        c = rep_gpu.cost
        parts = (c.lookup_s, c.backward_s, c.cache_miss_s, c.input_a2a_s, c.output_a2a_s,
                 c.allreduce_s, c.owner_a2a_s)
        comp, comm = c.lookup_s + c.backward_s + c.cache_miss_s, sum(parts[3:])
        total = max(comp, comm) if pipelined else comp + comm
        if not (_close(c.compute_s, comp) and _close(c.comm_s, comm) and _close(c.total_s, total)):
            errs.append(f"GPU {r}: cost terms do not add up to its compute, comm and total")
        mine = costs[r]
        if mine is not None and not _close(mine.total(pipelined), c.total_s):
            errs.append(f"GPU {r}: reported total {c.total_s:.9g} s, the cost model gives "
                        f"{mine.total(pipelined):.9g} s")
        if mine is None and c.total_s != 0:
            errs.append(f"GPU {r}: holds no piece but reports {c.total_s} s")
        totals.append(c.total_s)
    for h in plan.hosts:
        if h.ddr_bytes != sum(x.ddr_bytes for x in plan.gpus[h.host * g:(h.host + 1) * g]):
            errs.append(f"host {h.host}: DDR figure is not the sum of its GPUs'")
    s = plan.summary
    step, mean = max(totals), math.fsum(totals) / len(totals)
    if not _close(s.step_time_s, step):
        errs.append(f"summary step_time_s {s.step_time_s} is not the slowest GPU's {step}")
    if not _close(s.mean_gpu_time_s, mean):
        errs.append("summary mean_gpu_time_s is not the mean of the GPUs' totals")
    if mean > 0 and not _close(s.imbalance, step / mean):
        errs.append("summary imbalance is not slowest / mean")
    if s.lower_bound_s > 0 and not _close(s.gap, step / s.lower_bound_s - 1.0):
        errs.append("summary gap is not step_time / lower_bound - 1")
    if s.lower_bound_s > step * (1 + 1e-9):
        errs.append(f"lower bound {s.lower_bound_s} exceeds the plan's step time {step}")
