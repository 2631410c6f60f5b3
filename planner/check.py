"""An independent plan checker: trusts nothing in the plan but the request and the pieces.

It re-derives coverage, structure, memory and costs on its own (from `cost_models` only; the
seconds from the request's estimator, cost_models/estimator.py) and compares them with what
the plan reports:
- every table of the request appears once; every row and column of it is covered exactly
  once (once per replica, on every GPU, for data-parallel);
- each sharding type has its shape (table-wise: one whole piece; row-wise: one row range per
  GPU; table-row-wise: the rows over the GPUs of one host; ...);
- every piece sits on a GPU that exists, on the host that GPU belongs to, on a rank its
  constraints allow, in a tier and sharding type they allow;
- every GPU's HBM and every host's DDR and SSD stays within its cap;
- every figure the plan states equals its recomputed value, field by field, and a failure
  names the field ("gpus[3].cost.output_a2a_s: plan says X, recomputed Y"): each cost term,
  compute, comm and total of each GPU, its piece count and HBM/DDR/SSD bytes, each host's
  DDR and SSD bytes, every cap (from the request's hardware, never the plan's), the step
  time, mean, imbalance, sharding mix (tables_per_type, tables_per_tier), lower bound, gap
  and bound note; the plan hash matches the content;
- the lower bound is re-derived (planner/certificate.py): the analytic one recomputed over
  the candidate set rebuilt from the request; a tighter CP-SAT bound, and status `optimal`,
  only with a certificate the checker re-proves itself within a deterministic budget (one it
  cannot re-prove is a warning, or a failure when strict); a bound above the step time is
  always a failure.
"""

import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cost_models import (
    CostBreakdown,
    HardwareProfile,
    ShardingType,
    Tier,
    owner_wait,
    piece_memory,
    piece_sides,
    piece_traffic,
    placed_piece_buffers,
)
from planner.candidates import COLUMN_SPLIT_TYPES, min_column_width
from planner.hashing import plan_hash_of
from planner.plan_model import Plan, TablePlan
from planner.problem import TableInfo, build_problem

_REL = 1e-9


@dataclass
class CheckReport:
    errors: list[str] = field(default_factory=list)
    # Claims the checker could neither prove nor refute within its budget (not failures
    # unless strict).
    warnings: list[str] = field(default_factory=list)
    proofs: list[Any] = field(default_factory=list)  # certificate.Proof, one per re-proof

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
    if problem is None and kind in COLUMN_SPLIT_TYPES:
        # The request's minimum chunk width, or its documented default (TorchRec's).
        min_w = min_column_width(t.constraints)
        narrow = min(p.col_count for p in ps)
        if narrow < min_w:
            problem = (f"a column chunk of {narrow} columns is narrower than "
                       f"min_column_shard_width ({min_w}"
                       f"{'' if t.constraints.min_column_shard_width else ', the default'})")
    if problem:
        errs.append(f"table '{tp.name}': {problem}")


def check_plan(plan: Plan, strict: bool = False, proof_budget: float | None = None,
               prove: bool = True) -> CheckReport:
    """Check a plan against its request alone; see the module docstring. A claimed bound the
    checker cannot re-prove within `proof_budget` deterministic seconds (default: the
    request's CP-SAT budget, 1 to 60) is a warning, or a failure when `strict`. `prove`
    False skips the re-proofs (each claim is then unverified)."""
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
    # Every GPU holds the owner side's step buffers, whatever its pieces.
    hbm = [problem.step_reserve.total] * w
    buffers = [problem.step_reserve.total] * w
    ddr_gpu = [0] * w
    ssd_gpu = [0] * w
    costs: list[CostBreakdown | None] = [None] * w
    pieces = [0] * w
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
        cached = tp.tier in (Tier.HBM_CACHE, Tier.SSD)
        if c.cache_load_factor and cached and tp.cache_ratio != c.cache_load_factor:
            errs.append(f"table '{tp.name}': cache_ratio {tp.cache_ratio} is not its "
                        f"constraint's cache_load_factor {c.cache_load_factor}")
        if cached and tp.cache_ratio is None:
            errs.append(f"table '{tp.name}': tier {tp.tier.value} needs its cache_ratio")
        elif not cached and tp.cache_ratio is not None:
            errs.append(f"table '{tp.name}': cache_ratio {tp.cache_ratio} on tier "
                        f"{tp.tier.value}, which has no cache")
        bad = [p for p in tp.pieces if p.rank >= w or p.host != p.rank // g
               or p.row_count < 1 or p.col_count < 1]
        if bad:
            p = bad[0]
            if p.rank >= w:
                why = f"rank {p.rank} does not exist in a cluster of {hw.hosts} x {g} GPUs"
            elif p.host != p.rank // g:
                why = (f"rank {p.rank} is on host {p.rank // g} ({g} GPUs a host), not host "
                       f"{p.host}")
            else:
                why = f"the piece on rank {p.rank} is empty ({p.row_count} x {p.col_count})"
            errs.append(f"table '{tp.name}': {why}")
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
        # Seconds from the plan's estimator, the table's pieces priced together (as TorchRec's
        # estimator needs); the analytic one is cost.traffic_cost of each piece's bytes.
        traffic = [piece_traffic(t.geom, tp.sharding_type, tp.tier, ratio, p.row_count,
                                 p.col_count, hw, model) for p in tp.pieces]
        priced = problem.estimator.pieces(t.index, tp.sharding_type, tp.tier, ratio,
                                       [(p.row_count, p.col_count) for p in tp.pieces], traffic)
        for p, tr, cost in zip(tp.pieces, traffic, priced, strict=True):
            m = piece_memory(t.geom, tp.tier, ratio, p.row_count, p.col_count, hw)
            buf = placed_piece_buffers(t.geom, tp.sharding_type, tp.tier, ratio, p.row_count,
                                       p.col_count, hw, model).total
            hbm[p.rank] += m.hbm + buf
            buffers[p.rank] += buf
            ddr_gpu[p.rank] += m.ddr
            ssd_gpu[p.rank] += m.ssd
            pieces[p.rank] += 1
            held = costs[p.rank]
            costs[p.rank] = cost if held is None else held + cost
            inter, rate = piece_sides(tr)
            piece_inter[p.rank] += inter
            host_rate[p.rank // g] += rate
    for name in by_name.keys() - seen:
        errs.append(f"table '{name}' of the request is missing from the plan")
    # The step-wide terms, where the plan's estimator has them (the analytic one does;
    # TorchRec's prices shards alone). Every GPU owns samples, so the owner side can cost
    # time even where no piece is.
    steps = problem.estimator.step_terms
    waits = owner_wait(piece_inter, host_rate, np.arange(w) // g, model.batch_per_gpu,
                       hw.eff_nic_bw)
    for r, wait in enumerate(waits.tolist()):
        if wait > 0 and steps:
            costs[r] = (costs[r] or CostBreakdown()) + CostBreakdown(owner_a2a=wait)
    # Every GPU takes part in the step's six all-to-all calls (rank.py: lengths and ids in;
    # two stages out, forward and backward), each costing its call and per-peer latency;
    # counted here from the constants, not through cost_models.latency.
    if w > 1 and steps:
        k = hw.constants
        call = k.a2a_call_latency_s + k.a2a_peer_latency_s * (w - 1)
        for r in range(w):
            costs[r] = (costs[r] or CostBreakdown()) + CostBreakdown(input_a2a=2 * call,
                                                                     output_a2a=4 * call)
    if steps and (hw.constants.lookup_start_s or hw.constants.backward_start_s):
        # Each compute phase's first piece, after an all-to-all: once per GPU and step.
        start = CostBreakdown(lookup=hw.constants.lookup_start_s,
                              backward=hw.constants.backward_start_s)
        for r in range(w):
            costs[r] = (costs[r] or CostBreakdown()) + start
    if not steps and (own := problem.estimator.fixed()) != CostBreakdown():
        # An estimator with fixed seconds of its own: taken as it states them.
        for r in range(w):
            costs[r] = (costs[r] or CostBreakdown()) + own
    step = _figures(plan, problem.hw, problem.hbm_cap_reported, hbm, buffers, ddr_gpu,
                    ssd_gpu, pieces, costs, rep)
    if step is not None:
        from planner.certificate import check_bound

        found = check_bound(plan, problem, step, proof_budget, prove)
        errs.extend(found.errors)
        rep.proofs = found.proofs
        (errs if strict else rep.warnings).extend(found.unverified)
    return rep


def _differs(errs: list[str], name: str, said: object, recomputed: object,
             exact: bool = False) -> None:
    """One failure naming the field, when the plan's figure is not the recomputed one."""
    if exact or not isinstance(said, float | int) or not isinstance(recomputed, float | int):
        same = said == recomputed
    else:
        same = _close(float(said), float(recomputed))
    if not same:
        errs.append(f"{name}: plan says {said!r}, recomputed {recomputed!r}")


_TERMS = (("lookup_s", "lookup"), ("backward_s", "backward"), ("cache_miss_s", "cache_miss"),
          ("input_a2a_s", "input_a2a"), ("output_a2a_s", "output_a2a"),
          ("allreduce_s", "allreduce"), ("owner_a2a_s", "owner_a2a"))


def _figures(plan: Plan, hw: HardwareProfile, hbm_cap: int, hbm: list[int],
             buffers: list[int], ddr_gpu: list[int],
             ssd_gpu: list[int], pieces: list[int], costs: list[CostBreakdown | None],
             rep: CheckReport) -> float | None:
    """Caps (from the request's hardware), then every per-GPU, per-host and summary figure
    against its recomputed value, field by field. Returns the recomputed step time."""
    errs = rep.errors
    w, g = hw.world_size, hw.gpus_per_host
    pipelined = plan.request.model.pipelined
    overlap = hw.constants.pipeline_overlap
    for r in range(w):
        if hbm[r] > hbm_cap:
            errs.append(f"GPU {r}: HBM {hbm[r]:,} bytes (step buffers included) over its cap "
                        f"{hbm_cap:,} (by {hbm[r] - hbm_cap:,})")
    host_ddr = [sum(ddr_gpu[h * g:(h + 1) * g]) for h in range(hw.hosts)]
    host_ssd = [sum(ssd_gpu[h * g:(h + 1) * g]) for h in range(hw.hosts)]
    for h in range(hw.hosts):
        d, s = host_ddr[h], host_ssd[h]
        if d > hw.ddr_cap:
            errs.append(f"host {h}: DDR {d:,} bytes over its cap {hw.ddr_cap:,} "
                        f"(by {d - hw.ddr_cap:,})")
        if s > hw.ssd_cap:
            errs.append(f"host {h}: SSD {s:,} bytes over its cap {hw.ssd_cap:,} "
                        f"(by {s - hw.ssd_cap:,})")
    if [x.rank for x in plan.gpus] != list(range(w)):
        errs.append(f"gpus: the plan must report GPUs 0..{w - 1} in order")
        return None
    if [x.host for x in plan.hosts] != list(range(hw.hosts)):
        errs.append(f"hosts: the plan must report hosts 0..{hw.hosts - 1} in order")
        return None
    totals = []
    for x in plan.gpus:
        r, at = x.rank, f"gpus[{x.rank}]"
        _differs(errs, f"{at}.host", x.host, r // g, exact=True)
        _differs(errs, f"{at}.pieces", x.pieces, pieces[r], exact=True)
        _differs(errs, f"{at}.hbm_bytes", x.hbm_bytes, hbm[r], exact=True)
        _differs(errs, f"{at}.hbm_cap_bytes", x.hbm_cap_bytes, hbm_cap, exact=True)
        _differs(errs, f"{at}.hbm_buffer_bytes", x.hbm_buffer_bytes, buffers[r], exact=True)
        _differs(errs, f"{at}.ddr_bytes", x.ddr_bytes, ddr_gpu[r], exact=True)
        _differs(errs, f"{at}.ssd_bytes", x.ssd_bytes, ssd_gpu[r], exact=True)
        mine = costs[r] or CostBreakdown()
        for name, attr in _TERMS:
            _differs(errs, f"{at}.cost.{name}", getattr(x.cost, name), getattr(mine, attr))
        _differs(errs, f"{at}.cost.compute_s", x.cost.compute_s, mine.compute)
        _differs(errs, f"{at}.cost.comm_s", x.cost.comm_s, mine.comm)
        _differs(errs, f"{at}.cost.total_s", x.cost.total_s,
                 mine.total(pipelined, overlap))
        totals.append(mine.total(pipelined, overlap))
    for x in plan.hosts:
        h, at = x.host, f"hosts[{x.host}]"
        _differs(errs, f"{at}.ddr_bytes", x.ddr_bytes, host_ddr[h], exact=True)
        _differs(errs, f"{at}.ddr_cap_bytes", x.ddr_cap_bytes, hw.ddr_cap, exact=True)
        _differs(errs, f"{at}.ssd_bytes", x.ssd_bytes, host_ssd[h], exact=True)
        _differs(errs, f"{at}.ssd_cap_bytes", x.ssd_cap_bytes, hw.ssd_cap, exact=True)
    s = plan.summary
    step, mean = max(totals), math.fsum(totals) / len(totals)
    _differs(errs, "summary.step_time_s", s.step_time_s, step)
    _differs(errs, "summary.mean_gpu_time_s", s.mean_gpu_time_s, mean)
    _differs(errs, "summary.imbalance", s.imbalance, step / mean if mean > 0 else 1.0)
    kinds = Counter(t.sharding_type.value for t in plan.tables)
    tiers = Counter(t.tier.value for t in plan.tables)
    _differs(errs, "summary.tables_per_type", s.tables_per_type, dict(sorted(kinds.items())),
             exact=True)
    _differs(errs, "summary.tables_per_tier", s.tables_per_tier, dict(sorted(tiers.items())),
             exact=True)
    return step
