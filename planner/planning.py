"""`plan()`: the one function the CLI, the service and training launchers call."""

import logging
from typing import Any

import numpy as np

from cost_models import ShardingType
from planner.bounds import LowerBound, lower_bound
from planner.candidates import (
    Candidate,
    enumerate_candidates,
    slow_tiers_needed,
)
from planner.errors import InfeasibleError
from planner.partition.assignment import Assignment
from planner.partition.cpsat import (
    EXACT_MAX_VARS,
    ProgressFn,
    SolveResult,
    exact_model_size,
    makespan,
    repack,
    solve_exact,
)
from planner.partition.greedy import greedy
from planner.partition.hierarchical import host_model_size, solve_hierarchical
from planner.partition.local_search import local_search
from planner.partition.state import LoadState
from planner.plan_build import build_plan
from planner.plan_model import Plan as Plan
from planner.plan_model import PlanLayout, PlanPiece, SolverPoint, TablePlan
from planner.presets import resolve_hardware
from planner.problem import Problem, build_problem
from planner.spec import PlanRequest, ResolvedRequest
from planner.validation import validate_model

log = logging.getLogger("planner")

# Local-search step budget: steps, not seconds, so the same request gives the same plan.
_STEPS_PER_TABLE = 20
_MIN_STEPS, _MAX_STEPS = 2000, 20_000
# Extra heuristic starts only up to this many tables: the table-wise one pays on few, evenly
# sized tables (criteo_kaggle); above it neither has won a case, and each costs a local search.
_SMALL_TABLES = 256
# auto: a plan this close to the bound is good enough; CP-SAT runs only for plans further
# away, and stops as soon as it gets this close.
AUTO_GAP = 0.01
# A plan this close to a proven bound is optimal up to the CP-SAT models' resolution: costs in
# units of 1e-7 of the makespan, rounded down, then summed over up to hundreds of pieces on a
# GPU or host (criteo_kaggle x 16 hosts: 3e-5 between the plan and the proven bound).
PROVEN_TOL = 1e-4
# auto runs CP-SAT only on models up to this many variables. Every plan CP-SAT improved or
# proved in benchmarks/results/solvers.md came from a model under 6,000 variables; at
# hugectr_200 x 16 GPUs (20,000) it spent 8 s and changed nothing (vs_torchrec).
AUTO_MAX_VARS = 10_000
# Up to this many hosts the flat exact model; above it the hierarchical one (see _solve).
_FLAT_MAX_HOSTS = 2


def resolve(request: PlanRequest | ResolvedRequest | dict[str, Any]) -> ResolvedRequest:
    """Validate a request (a model or its JSON-like dict) and expand its hardware preset."""
    if isinstance(request, dict):
        request = validate_model(PlanRequest, request)
    if isinstance(request, ResolvedRequest):
        return request
    return ResolvedRequest(model=request.model, hardware=resolve_hardware(request.hardware),
                           options=request.options)


def candidates_for(problem: Problem) -> tuple[list[list[Candidate]], bool]:
    slow = slow_tiers_needed(problem)
    cands = [enumerate_candidates(problem, t, slow) for t in problem.tables]
    for t, cs in zip(problem.tables, cands, strict=True):
        if not cs:
            raise _unplaceable(problem, t.index)
    _check_total_memory(problem, cands)
    return cands, slow


def _unplaceable(problem: Problem, table: int) -> InfeasibleError:
    """Why a table has no candidate that fits even an empty cluster."""
    t = problem.tables[table]
    every = enumerate_candidates(problem, t, slow_tiers=True, keep_unfit=True)
    name = t.name
    if not every:
        return InfeasibleError(
            reason=f"table '{name}': its constraints allow no sharding on this cluster "
                   f"(types {t.constraints.sharding_types}, pinned ranks "
                   f"{t.constraints.pinned_ranks})",
            table=name,
        )
    empty = LoadState(problem.hw, problem.model)
    short = min((empty.shortfall(c, None) for c in every), key=lambda s: s.need - s.free)
    return InfeasibleError(
        reason=(f"table '{name}' fits no GPU or host with the shardings and tiers it allows: "
                f"its smallest piece needs {short.need:,} bytes of {short.cap}, the cap is "
                f"{short.free:,} (short by {short.need - short.free:,} bytes)"),
        table=name, cap=short.cap, short_bytes=short.need - short.free,
    )


def _check_total_memory(problem: Problem, cands: list[list[Candidate]]) -> None:
    hw = problem.hw
    need = sum(min(c.hbm_total + c.ddr_total + c.ssd_total for c in cs) for cs in cands)
    have = hw.world_size * hw.hbm_cap + hw.hosts * (hw.ddr_cap + hw.ssd_cap)
    if need > have:
        raise InfeasibleError(
            reason=(f"all tables together need at least {need:,} bytes; the cluster holds "
                    f"{have:,} bytes of HBM, DDR and SSD (short by {need - have:,} bytes)"),
            cap="cluster memory", short_bytes=need - have,
        )


def layout_of(problem: Problem, assignment: Assignment) -> PlanLayout:
    g = problem.hw.gpus_per_host
    tables = []
    for t, ch in zip(problem.tables, assignment.choices, strict=True):
        pieces = []
        for grp, ranks in zip(ch.cand.groups, ch.ranks, strict=True):
            for geo, rank in zip(grp.geometry.tolist(), np.asarray(ranks).tolist(), strict=True):
                # Built from our own integers: construct without re-validating each of up to
                # a million pieces (21 s of 10,000 tables x 1,024 GPUs went to validation).
                pieces.append(PlanPiece.model_construct(
                    rank=rank, host=rank // g, row_offset=geo[0], row_count=geo[1],
                    col_offset=geo[2], col_count=geo[3]))
        tables.append(TablePlan.model_construct(
            name=t.name, sharding_type=ch.cand.kind, tier=ch.cand.tier,
            cache_ratio=ch.cand.cache_ratio, pieces=pieces))
    return PlanLayout(request=problem.request, tables=tables)


def _decisions(problem: Problem, slow: bool, bound: LowerBound, a: Assignment) -> list[str]:
    hw = problem.hw
    need = sum(t.bytes for t in problem.tables)
    have = hw.world_size * hw.hbm_cap
    out = [f"tables need {need / 2**30:,.1f} GiB with optimizer state; the cluster has "
           f"{have / 2**30:,.1f} GiB of HBM for embeddings ({need / have:.0%})"]
    if slow:
        out.append("HBM is under pressure, so hbm_cache, ddr and ssd candidates were costed "
                   "for every table")
    if bound.memory_priced:
        out.append("lower bound and greedy price memory (Lagrangian): HBM "
                   f"{bound.prices[0]:.3g}, DDR {bound.prices[1]:.3g}, SSD {bound.prices[2]:.3g} "
                   "s/byte")
    too_big = [t.name for t in problem.tables if t.bytes > hw.hbm_cap]
    if too_big:
        out.append(f"{len(too_big)} table(s) larger than one GPU's free HBM must be split "
                   f"or tiered: {', '.join(too_big[:5])}{' ...' if len(too_big) > 5 else ''}")
    out.extend(a.notes)
    return out


def _best_start(problem: Problem, cands: list[list[Candidate]], bound: LowerBound) -> Assignment:
    """Local search from several deterministic starts, keep the best: the candidate-choosing
    greedy; on up to _SMALL_TABLES tables also a table-wise-only LPT (the ZionEX-style start,
    which wins on few, evenly sized tables) and, on several hosts, the greedy that scores the
    all-to-alls' owner side while it builds (better on some multi-host instances)."""
    steps = min(_MAX_STEPS, max(_MIN_STEPS, _STEPS_PER_TABLE * len(cands)))
    best = local_search(problem, cands, greedy(problem, cands, bound.prices), steps)
    if len(cands) > _SMALL_TABLES:
        return best
    others: list[tuple[str, list[list[Candidate]], bool]] = []
    table_wise = [[c for c in cs if c.kind is ShardingType.TABLE_WISE] for cs in cands]
    if all(table_wise) and any(len(tw) < len(cs)
                               for tw, cs in zip(table_wise, cands, strict=True)):
        others.append(("the table-wise start", table_wise, False))
    if problem.hw.hosts > 1:
        others.append(("the owner-side-aware greedy", cands, True))
    best_s = makespan(problem, best.choices)
    for label, pool, owner in others:
        try:
            other = local_search(problem, cands,
                                 greedy(problem, pool, bound.prices, owner_side=owner), steps)
        except InfeasibleError:
            continue
        other_s = makespan(problem, other.choices)
        if other_s < best_s:
            other.notes.append(f"kept the plan grown from {label}")
            best, best_s = other, other_s
    return best


def plan(request: PlanRequest | ResolvedRequest | dict[str, Any],
         progress: ProgressFn | None = None) -> Plan:
    """Plan the sharding of a model's embedding tables on a cluster.

    `progress`, if given, is called with each improvement CP-SAT finds (the CLI shows them).
    Raises BadInputError (a field and table named) for malformed input and InfeasibleError
    (a table or cap, and the bytes short) when no plan fits.
    """
    req = resolve(request)
    problem = build_problem(req)
    cands, slow = candidates_for(problem)
    bound = lower_bound(problem, cands)
    log.info("%d tables, %d candidates, lower bound %.6g s", len(cands),
             sum(len(c) for c in cands), bound.value_s)
    heuristic = _best_start(problem, cands, bound)
    solved = _solve(problem, cands, bound, heuristic, req, progress)
    assignment = solved.assignment if solved is not None else heuristic
    if solved is not None and solved.bound_s is not None:
        bound = bound.with_solver(solved.bound_s)
    proven = solved is not None and makespan(problem, assignment.choices) <= bound.value_s * (
        1 + PROVEN_TOL)
    layout = layout_of(problem, assignment)
    warnings = []
    tiers = {c.cand.tier.value for c in assignment.choices}
    if tiers - {"hbm"}:
        warnings.append("plan uses slower memory tiers: " + ", ".join(sorted(tiers - {"hbm"})))
    solver, status = assignment.solver, assignment.status
    det, history = 0.0, []
    if solved is not None:
        # The status is CP-SAT's, whichever of the two found the plan: "optimal" means
        # proven optimal over the candidate space.
        if solved.assignment is heuristic:
            solver = f"{assignment.solver} + cp-sat"
        status = "optimal" if proven else solved.status
        det = solved.det_time
        history = [SolverPoint(det_time=p.det_time, incumbent_s=p.incumbent_s,
                               bound_s=p.bound_s) for p in solved.history]
    return build_plan(layout, problem, bound, solver, status, warnings,
                      _decisions(problem, slow, bound, assignment), det, history)


def _solve(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
           start: Assignment, req: ResolvedRequest,
           progress: ProgressFn | None) -> SolveResult | None:
    """CP-SAT after the heuristic, as the options ask: `greedy` never, `ilp` always, `auto`
    unless the heuristic plan is already within AUTO_GAP of the bound or the model would pass
    AUTO_MAX_VARS. Which CP-SAT mode (measured in benchmarks/results/solvers.md):
    - one or two hosts: the exact model when it is small enough, else the re-pack;
    - several hosts: the hierarchical model (hosts, then GPUs) when its host level is small
      enough, which proved what the flat model could not on 16 hosts and gives the tighter
      bound, then the re-pack with the rest of the budget;
    The result is never worse than `start`."""
    opts = req.options
    if opts.solver == "greedy":
        return None
    gap = makespan(problem, start.choices) / bound.value_s - 1 if bound.value_s > 0 else 0.0
    if opts.solver == "auto" and gap <= AUTO_GAP:
        start.notes.append(f"heuristic plan within {AUTO_GAP:.1%} of the bound: CP-SAT skipped")
        return None
    flat = problem.hw.hosts <= _FLAT_MAX_HOSTS
    size = exact_model_size(problem, cands) if flat else host_model_size(problem, cands)
    if opts.solver == "auto" and size > AUTO_MAX_VARS:
        start.notes.append(f"CP-SAT model would have {size:,} variables (auto's limit "
                           f"{AUTO_MAX_VARS:,}): skipped; --solver ilp runs it")
        return None
    target = AUTO_GAP if opts.solver == "auto" else None
    budget, seed = opts.time_limit_s, opts.seed
    if flat:
        result = solve_exact(problem, cands, start, budget, seed, bound.value_s, target,
                             progress)
        return result or repack(problem, cands, start, budget, seed, progress)
    if size > EXACT_MAX_VARS:
        return repack(problem, cands, start, budget, seed, progress)
    first = solve_hierarchical(problem, cands, start, budget / 2, seed, progress)
    best = max(bound.value_s, first.bound_s or 0.0)
    if target is not None and makespan(problem, first.assignment.choices) <= best * (1 + target):
        return first
    second = repack(problem, cands, first.assignment, budget - first.det_time, seed, progress)
    return SolveResult(second.assignment,
                       f"{first.status}; re-pack: {second.status}", first.bound_s,
                       round(first.det_time + second.det_time, 6),
                       first.history + second.history)


def evaluate(layout: PlanLayout) -> Plan:
    """Score any layout (ours, hand-made or imported) under the cost model, with the same
    lower bound ours gets; what the checker finds wrong with it goes into its warnings."""
    from planner.check import check_plan

    layout = PlanLayout(schema_version=layout.schema_version, request=layout.request,
                        tables=layout.tables)
    problem = build_problem(layout.request)
    cands, _ = candidates_for(problem)
    bound = lower_bound(problem, cands)
    draft = build_plan(layout, problem, bound, "external", "evaluated", [], [])
    problems = check_plan(draft).errors
    if not problems:
        return draft
    return build_plan(layout, problem, bound, "external", "evaluated (fails the checker)",
                      problems, [])
