"""`plan()`: the one function the CLI, the service and training launchers call."""

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from planner.bounds import LowerBound, lower_bound
from planner.candidates import (
    Candidate,
    candidate_of_pieces,
    drop_held_bytes,
    enumerate_candidates,
    slow_tiers_needed,
)
from planner.collector import collector_paused
from planner.infeasibility import capacity_certificate, infeasible_error
from planner.partition import pipeline
from planner.partition.assignment import Assignment
from planner.partition.cpsat import ProgressFn, makespan
from planner.partition.policy import DEFAULT_POLICY
from planner.piece_layout import PieceLayout, piece_layout
from planner.plan_build import build_plan, certificate_of
from planner.plan_model import Plan as Plan
from planner.plan_model import PlanLayout, SolverPoint
from planner.presets import resolve_hardware
from planner.problem import Problem, build_problem
from planner.spec import PlanRequest, ResolvedRequest
from planner.validation import validate_model

log = logging.getLogger("planner")


def resolve(request: PlanRequest | ResolvedRequest | dict[str, Any]) -> ResolvedRequest:
    """Validate a request (a model or its JSON-like dict) and expand its hardware preset;
    `"model": NAME` is a bundled fixture's spec (planner/spec/request.py, the same lookup as
    the CLI's and the service's)."""
    if isinstance(request, ResolvedRequest):
        return request
    if not isinstance(request, PlanRequest):
        # A dict, or anything else a caller passed: validate_model names what is wrong.
        request = validate_model(PlanRequest, request)
    return ResolvedRequest(model=request.model, hardware=resolve_hardware(request.hardware),
                           options=request.options)


def candidates_for(problem: Problem, slow: bool | None = None
                   ) -> tuple[list[list[Candidate]], bool]:
    """Every table's candidates, and whether slower tiers were costed for all tables.

    A table none of whose HBM candidates fits an empty cluster gets its slower-tier and cached
    candidates whatever the pressure heuristic says; when the tables' leanest candidates
    together pass the cluster's memory, every table gets them. "Infeasible" is raised only
    with a certificate (planner/infeasibility.py)."""
    slow = slow_tiers_needed(problem) if slow is None else slow
    if slow:
        # Every tier is about to be costed: first the capacity arguments, which read the
        # pieces' bytes alone (10,000 tables on 8 GPUs: their step buffers alone pass the
        # HBM, known before a single lookup or all-to-all is priced).
        cert = capacity_certificate(problem)
        if cert is not None:
            drop_held_bytes(problem)
            raise infeasible_error(problem, cert)
    cands = []
    for t in problem.tables:
        cs = enumerate_candidates(problem, t, slow)
        if not cs and not slow:
            cs = enumerate_candidates(problem, t, slow_tiers=True)
        if not cs:
            raise infeasible_error(problem)
        cands.append(cs)
    if not slow and _short_of_memory(problem, cands):
        return candidates_for(problem, slow=True)
    return cands, slow


def _short_of_memory(problem: Problem, cands: list[list[Candidate]]) -> bool:
    hw = problem.hw
    need = sum(min(c.total_bytes for c in cs) for cs in cands)
    return need > hw.world_size * hw.hbm_cap + hw.hosts * (hw.ddr_cap + hw.ssd_cap)


def layout_of(problem: Problem, assignment: Assignment) -> PieceLayout:
    """The assignment's pieces as arrays (planner/piece_layout.py), in plan order: tables in
    request order, each candidate's groups in order, each group's pieces in order."""
    geometry: list[np.ndarray] = []
    ranks: list[np.ndarray] = []
    counts: list[int] = []
    for t, ch in zip(problem.tables, assignment.choices, strict=True):
        n = 0
        for grp, grp_ranks in zip(ch.cand.groups, ch.ranks, strict=True):
            r = np.asarray(grp_ranks).reshape(-1)
            if len(r) != len(grp.geometry):
                raise ValueError(f"table '{t.name}': {len(r)} ranks for a group of "
                                 f"{len(grp.geometry)} pieces")
            geometry.append(grp.geometry)
            ranks.append(r)
            n += len(r)
        counts.append(n)
    choices = assignment.choices
    return piece_layout(problem.request, [t.name for t in problem.tables],
                        [c.cand.kind for c in choices], [c.cand.tier for c in choices],
                        [c.cand.cache_ratio for c in choices], geometry, ranks, counts,
                        problem.hw.gpus_per_host, [c.cand.figures for c in choices])


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


def plan(request: PlanRequest | ResolvedRequest | dict[str, Any],
         progress: ProgressFn | None = None) -> Plan:
    """Plan the sharding of a model's embedding tables on a cluster.

    `progress`, if given, is called with each improvement CP-SAT finds (the CLI shows them).
    Raises BadInputError (a field and table named) for malformed input, InfeasibleError (a
    table or cap, the bytes short, and a certificate) when no plan fits, and NoPlanFoundError
    when the budget ended with neither a plan nor a proof that none exists.
    """
    with collector_paused():
        return _plan(request, progress)


def _plan(request: PlanRequest | ResolvedRequest | dict[str, Any],
          progress: ProgressFn | None) -> Plan:
    req = resolve(request)
    problem = build_problem(req)
    cands, slow = candidates_for(problem)
    bound = lower_bound(problem, cands)
    log.info("%d tables, %d candidates, lower bound %.6g s", len(cands),
             sum(len(c) for c in cands), bound.value_s)
    policy = DEFAULT_POLICY

    def widen() -> tuple[list[list[Candidate]], LowerBound]:
        every_tier, _ = candidates_for(problem, slow=True)
        return every_tier, lower_bound(problem, every_tier)

    start, cands, slow, bound = pipeline.heuristic(problem, cands, slow, bound, req.options,
                                                   widen, policy)
    flat = pipeline.is_flat(problem, cands, policy)
    try:
        solved, skipped = pipeline.improve(problem, cands, bound, start, req.options, flat,
                                           progress, policy)
    except Exception as exc:  # an internal error of a CP-SAT mode: the heuristic plan stands
        log.exception("CP-SAT failed; keeping the heuristic plan")
        solved, skipped = None, [f"CP-SAT failed ({type(exc).__name__}: {exc}); kept the "
                                 "heuristic plan"]
    heuristic = replace(start, notes=[*start.notes, *skipped]) if skipped else start
    assignment = solved.assignment if solved is not None else heuristic
    if solved is not None and solved.bound_s is not None:
        bound = bound.with_solver(solved.bound_s)
    # Proven optimal over the candidate space when the plan meets a bound, the analytic one
    # included (the checker recomputes it): the heuristic's plan too, where the search was
    # skipped.
    proven = makespan(problem, assignment.choices) <= bound.value_s * (1 + policy.proven_tol)
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
        if solved.assignment is start:
            solver = f"{assignment.solver} + cp-sat"
        status = "optimal" if proven else solved.status
        det = solved.det_time
        history = [SolverPoint(det_time=p.det_time, incumbent_s=p.incumbent_s,
                               bound_s=p.bound_s) for p in solved.history]
    elif proven:
        status = "optimal"
    return build_plan(layout, problem, bound, solver, status, warnings,
                      _decisions(problem, slow, bound, assignment), det, history,
                      certificate=certificate_of(
                          bound, problem, candidates="all-tiers" if slow else "planner",
                          model="exact" if flat else "hierarchical"))


def evaluate(layout: PlanLayout) -> Plan:
    """Score any layout (ours, hand-made or imported) under the cost model. Its lower bound
    covers our candidate space and the layout's own shapes, tiers and cache ratios, so a
    layout outside our grid gets a bound valid for it too; what the checker finds wrong with
    it goes into its warnings."""
    from planner.check import check_plan

    layout = PlanLayout(schema_version=layout.schema_version, request=layout.request,
                        tables=layout.tables)
    problem = build_problem(layout.request)
    cands, _ = candidates_for(problem)
    try:
        own = own_candidates(problem, layout)
        why = "the layout's tables do not match the request's one for one"
    except ValueError as exc:  # a table's pieces break its type's definition
        own, why = None, str(exc)
    if own is not None:
        cands = [[*cs, c] for cs, c in zip(cands, own, strict=True)]
    bound = lower_bound(problem, cands)
    cert = certificate_of(bound, problem,
                          candidates="planner+layout" if own is not None else "planner")
    note = [] if own is not None else [
        f"{why}: its bound covers only the planner's candidate space, so the gap may not "
        "hold for this layout"]
    draft = build_plan(layout, problem, bound, "external", "evaluated", note, [],
                       certificate=cert)
    problems = check_plan(draft).errors
    if not problems:
        return draft
    return build_plan(layout, problem, bound, "external", "evaluated (fails the checker)",
                      note + problems, [], certificate=cert)


def own_candidates(problem: Problem, layout: PlanLayout) -> list[Candidate] | None:
    """Each table's candidate as the layout has it, in the problem's table order; None when
    the layout does not name each table of the request exactly once."""
    by_name = {tp.name: tp for tp in layout.tables}
    if len(by_name) != len(layout.tables) or set(by_name) != {t.name for t in problem.tables}:
        return None
    out = []
    for t in problem.tables:
        tp = by_name[t.name]
        pieces = [(p.row_offset, p.row_count, p.col_offset, p.col_count) for p in tp.pieces]
        if not pieces:
            return None
        try:
            out.append(candidate_of_pieces(problem, t, tp.sharding_type, tp.tier,
                                           tp.cache_ratio, pieces))
        except ValueError as exc:
            raise ValueError(f"table '{t.name}': {exc}") from exc
    return out
