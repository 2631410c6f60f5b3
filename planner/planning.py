"""`plan()`: the one function the CLI, the service and training launchers call."""

import logging
from typing import Any

import numpy as np

from cost_models import ShardingType
from planner.bounds import LowerBound, lower_bound
from planner.candidates import (
    Candidate,
    candidate_of_pieces,
    enumerate_candidates,
    slow_tiers_needed,
)
from planner.collector import collector_paused
from planner.errors import InfeasibleError, NoPlanFoundError
from planner.feasibility import FEASIBILITY_MIN_S, cpsat_feasible, memory_first, packing_search
from planner.infeasibility import InfeasibilityCertificate, capacity_certificate, describe
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
from planner.partition.lp_start import (
    PIECE_SHARES,
    RELAXATION_FILLS,
    Relaxer,
    lp_start,
    relaxed_choices,
)
from planner.partition.state import LoadState
from planner.piece_layout import PieceLayout, piece_layout
from planner.plan_build import build_plan, certificate_of
from planner.plan_model import Plan as Plan
from planner.plan_model import PlanLayout, SolverPoint
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
# Up to this many hosts the flat exact model; above it the hierarchical one (see _solve),
# unless the flat model has at most _FLAT_ANY_HOSTS_VARS variables: deeprecsys_rm3 on 4 h100
# hosts (390) is proven optimal by it at 0.5917 ms, where the hierarchical bound was 0.5341.
_FLAT_MAX_HOSTS = 2
_FLAT_ANY_HOSTS_VARS = 2_000


def _flat(problem: Problem, cands: list[list[Candidate]]) -> bool:
    """Whether CP-SAT runs the flat exact model (else the hierarchical one)."""
    return (problem.hw.hosts <= _FLAT_MAX_HOSTS
            or exact_model_size(problem, cands) <= _FLAT_ANY_HOSTS_VARS)


def _steps(cands: list[list[Candidate]]) -> int:
    """The local search's step budget for this many tables."""
    return min(_MAX_STEPS, max(_MIN_STEPS, _STEPS_PER_TABLE * len(cands)))


def resolve(request: PlanRequest | ResolvedRequest | dict[str, Any]) -> ResolvedRequest:
    """Validate a request (a model or its JSON-like dict) and expand its hardware preset;
    `"model": NAME` is a bundled fixture's spec (planner/spec/request.py, the same lookup as
    the CLI's and the service's)."""
    if isinstance(request, dict):
        request = validate_model(PlanRequest, request)
    if isinstance(request, ResolvedRequest):
        return request
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
            raise _infeasible(problem, cert)
    cands = []
    for t in problem.tables:
        cs = enumerate_candidates(problem, t, slow)
        if not cs and not slow:
            cs = enumerate_candidates(problem, t, slow_tiers=True)
        if not cs:
            raise _infeasible(problem)
        cands.append(cs)
    if not slow and _short_of_memory(problem, cands):
        return candidates_for(problem, slow=True)
    return cands, slow


def _short_of_memory(problem: Problem, cands: list[list[Candidate]]) -> bool:
    hw = problem.hw
    need = sum(min(c.total_bytes for c in cs) for cs in cands)
    return need > hw.world_size * hw.hbm_cap + hw.hosts * (hw.ddr_cap + hw.ssd_cap)


def _infeasible(problem: Problem, cert: InfeasibilityCertificate | None = None
                ) -> InfeasibleError:
    """The answer "infeasible", with its certificate (a capacity argument when none given)."""
    cert = cert or capacity_certificate(problem)
    if cert is None:  # the callers only get here when a capacity argument holds
        raise AssertionError("infeasible without a certificate")
    log.info("infeasible: %s", describe(cert))
    return InfeasibleError(reason=describe(cert), table=cert.table, cap=cert.cap,
                           short_bytes=cert.short_bytes if cert.kind != "cp-sat" else None,
                           certificate=cert.model_dump(mode="json"))


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


# Smaller pieces are tried only for a plan more than this above the bound: each share costs
# a relaxation, a placement and a local search, and every case they improved was over 5%
# above (hugectr_510 x 2 hosts 7.9%, mixed_2000 x 32 8.8%, synthetic_1000 x 128 15.4%); at
# 3.4% (synthetic_10000 x 128 hosts) they took 8 s and found nothing.
_SHARES_MIN_GAP = 0.05


def _waits(problem: Problem, a: Assignment, bound: LowerBound) -> bool:
    """Whether the plan is over _SHARES_MIN_GAP above the bound and its slowest GPU waits on
    the owner side of the all-to-alls: what smaller pieces can mend (_priced_start)."""
    state = LoadState.of_choices(problem, a.choices)
    load = state.load()
    slowest = int(np.argmax(load))
    return bool(load[slowest] > bound.value_s * (1 + _SHARES_MIN_GAP)
                and state.wait()[slowest] > 0)


def _priced_start(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
                  steps: int, best: Assignment | None, spread: bool
                  ) -> tuple[Assignment | None, float]:
    """The LP relaxation's choices, replicas placed first (partition/lp_start.py), with and
    without the owner side in view, at each fill of the cluster's memory while memory binds
    (a fuller fill leaves less work but packs worse, and which wins varies: zionex_12t x 4
    h100 hosts is best at 97%, x 16 at 88%); kept where one beats `best`. Returns the best
    plan and the fill it grew from (the first fill when `best` stood). On many-host models
    whose small tables want to be data-parallel it is the better start by far (a 400-table
    set on 4 hosts: 145.1 -> 126.4 ms, bound 123.5), since the greedy places them last, when
    some GPU's HBM is already full; where memory binds, by more (zionex_12t x 4: 232.4 ->
    97.0 ms)."""
    best_fill = RELAXATION_FILLS[0]
    for fill, choice in relaxed_choices(problem, cands, bound.value_s):
        other = _grown(problem, cands, choice, steps, best, spread, (False, True), fill=fill)
        if other is not best:
            best, best_fill = other, fill
    return best, best_fill


def _grown(problem: Problem, cands: list[list[Candidate]], choice: list[int], steps: int,
           best: Assignment | None, spread: bool, owners: tuple[bool, ...], fill: float,
           share: float = 1.0) -> Assignment | None:
    """`choice` placed (lp_start) and improved (local_search), once per owner-side setting;
    the best of those and `best`."""
    best_s = makespan(problem, best.choices) if best is not None else float("inf")
    for owner in owners if problem.hw.hosts > 1 else (False,):
        start = lp_start(problem, cands, choice, owner_side=owner, spread_hosts=spread,
                         fill=fill, piece_share=share)
        if start is None:
            continue
        other = local_search(problem, cands, start, steps)
        other_s = makespan(problem, other.choices)
        if other_s < best_s * (1 - 1e-9):
            other.notes.append("kept the plan grown from the relaxation's choices")
            best, best_s = other, other_s
    return best


def _smaller_pieces(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
                    best: Assignment, spread: bool, fill: float) -> Assignment:
    """On several hosts, when the best plan's slowest GPU waits on the owner side and is
    over _SHARES_MIN_GAP above the bound: the relaxation with the largest piece capped at
    PIECE_SHARES of the bound, at the fill and host-spreading the best plan grew with, placed
    owner-aware; kept where one beats `best`. Run once per plan, after both spreadings."""
    if problem.hw.hosts < 2 or not _waits(problem, best, bound):
        return best
    relaxer = Relaxer(problem, cands)
    steps = _steps(cands)
    tried: set[tuple[int, ...]] = set()
    for share in PIECE_SHARES[1:]:
        relaxed = relaxer.choose(bound.value_s * share, fill)
        if relaxed is None or tuple(relaxed.choice) in tried:
            continue
        tried.add(tuple(relaxed.choice))
        found = _grown(problem, cands, relaxed.choice, steps, best, spread, (True,), fill,
                       share)
        assert found is not None  # `best` stands unless beaten
        best = found
    return best


def _best_start(problem: Problem, cands: list[list[Candidate]], bound: LowerBound) -> Assignment:
    """The better of _starts with GPUs tied on load taken in rank order and, on several
    hosts, on the least loaded host first (partition/state.py): spreading the largest pieces
    over the hosts cut hugectr_200 x 4 hosts from 36.29 to 35.36 ms and hugectr_510 x 2 from
    38.46 to 36.98, but made zionex_12t x 16 zionex_a100 hosts 16.6% worse, so both run.
    Then _smaller_pieces, once, with the winner's spreading and fill."""
    if problem.hw.hosts < 2:
        return _starts(problem, cands, bound, spread=False)[0]
    best: tuple[Assignment, float] | None
    try:
        best = _starts(problem, cands, bound, spread=False)
    except InfeasibleError:
        best = None
    try:
        spread = _starts(problem, cands, bound, spread=True)
    except InfeasibleError:
        if best is None:
            raise
        return _smaller_pieces(problem, cands, bound, best[0], False, best[1])
    if best is None or makespan(problem, spread[0].choices) < makespan(
            problem, best[0].choices) * (1 - 1e-9):
        spread[0].notes.append("kept the plan grown with the largest pieces spread over the "
                               "hosts")
        return _smaller_pieces(problem, cands, bound, spread[0], True, spread[1])
    return _smaller_pieces(problem, cands, bound, best[0], False, best[1])


def _starts(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
            spread: bool) -> tuple[Assignment, float]:
    """Local search from several deterministic starts, keep the best: the candidate-choosing
    greedy; on up to _SMALL_TABLES tables also a table-wise-only LPT (the ZionEX-style start,
    which wins on few, evenly sized tables) and, on several hosts, the greedy that scores the
    all-to-alls' owner side while it builds (better on some multi-host instances). Returns
    the best plan and the memory fill of the relaxation it grew from (the first fill when it
    did not grow from one)."""
    steps = _steps(cands)
    try:
        best = local_search(problem, cands,
                            greedy(problem, cands, bound.prices, spread_hosts=spread), steps)
    except InfeasibleError:
        best = None
    best, fill = _priced_start(problem, cands, bound, steps, best, spread)
    if best is None:
        raise InfeasibleError(reason="neither the greedy nor the priced start fit every "
                                     "table")
    if len(cands) > _SMALL_TABLES:
        return best, fill
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
                                 greedy(problem, pool, bound.prices, owner_side=owner,
                                        spread_hosts=spread), steps)
        except InfeasibleError:
            continue
        other_s = makespan(problem, other.choices)
        if other_s < best_s:
            other.notes.append(f"kept the plan grown from {label}")
            best, best_s, fill = other, other_s, RELAXATION_FILLS[0]
    return best, fill


def _start(problem: Problem, cands: list[list[Candidate]], slow: bool, bound: LowerBound,
           req: ResolvedRequest
           ) -> tuple[Assignment, list[list[Candidate]], bool, LowerBound]:
    """The heuristic plan; when it cannot place everything, the fallbacks of
    planner/feasibility.py before any "infeasible" (then with a certificate, or "no plan
    found within the budget" when neither a plan nor a proof came)."""
    tried = []
    try:
        return _best_start(problem, cands, bound), cands, slow, bound
    except InfeasibleError as err:
        tried.append(f"greedy + local search: {err.reason}")
        log.info("heuristic found no plan: %s", err.reason)
    if not slow:
        cands, slow = candidates_for(problem, slow=True)
        bound = lower_bound(problem, cands)
        try:
            found = _best_start(problem, cands, bound)
            found.notes.append("the heuristic fit only with slower tiers costed for every "
                               "table")
            return found, cands, slow, bound
        except InfeasibleError as err:
            tried.append(f"greedy + local search with every tier: {err.reason}")
    steps = _steps(cands)
    packed = memory_first(problem, cands)
    if packed is not None:
        return local_search(problem, cands, packed, steps), cands, slow, bound
    tried.append("memory-first packing (3 candidate orders x best, first and worst fit): "
                 "no fit")
    searched = packing_search(problem, cands)
    if searched is not None:
        return local_search(problem, cands, searched, steps), cands, slow, bound
    tried.append("bin completion and depth-first packing search: no fit within their node "
                 "budgets")
    cert = capacity_certificate(problem)
    if cert is not None:
        raise _infeasible(problem, cert)
    opts = req.options
    # The optimisation budget may be too small to settle feasibility (one tight-pins instance
    # needed 0.61 det s); "no plan" is answered only after at least FEASIBILITY_MIN_S.
    budget = max(opts.time_limit_s, FEASIBILITY_MIN_S)
    status, found_cp, size = cpsat_feasible(problem, cands, budget, opts.seed)
    if found_cp is not None:
        return local_search(problem, cands, found_cp, steps), cands, slow, bound
    if status == "infeasible":
        raise _infeasible(problem, InfeasibilityCertificate(
            kind="cp-sat", cap="all caps and pins", candidates=sum(len(c) for c in cands),
            detail=(f"feasibility model of {size:,} variables over "
                    f"{sum(len(c) for c in cands):,} candidates: INFEASIBLE")))
    tried.append(f"CP-SAT feasibility model ({size:,} variables): {status} within "
                 f"{budget:g} deterministic s")
    raise NoPlanFoundError(reason="; ".join(tried), tried=tried)


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
    heuristic, cands, slow, bound = _start(problem, cands, slow, bound, req)
    flat = _flat(problem, cands)
    try:
        solved = _solve(problem, cands, bound, heuristic, req, flat, progress)
    except Exception as exc:  # an internal error of a CP-SAT mode: the heuristic plan stands
        log.exception("CP-SAT failed; keeping the heuristic plan")
        heuristic.notes.append(f"CP-SAT failed ({type(exc).__name__}: {exc}); kept the "
                               "heuristic plan")
        solved = None
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
                      _decisions(problem, slow, bound, assignment), det, history,
                      certificate=certificate_of(
                          bound, problem, candidates="all-tiers" if slow else "planner",
                          model="exact" if flat else "hierarchical"))


def _solve(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
           start: Assignment, req: ResolvedRequest, flat: bool,
           progress: ProgressFn | None) -> SolveResult | None:
    """CP-SAT after the heuristic, as the options ask: `greedy` never, `ilp` always, `auto`
    unless the heuristic plan is already within AUTO_GAP of the bound or the model would pass
    AUTO_MAX_VARS. `flat`: the flat exact model, not the hierarchical one (_flat). Which
    CP-SAT mode (measured in benchmarks/results/solvers.md):
    - one or two hosts, or an exact model of at most _FLAT_ANY_HOSTS_VARS variables: the
      exact model when it is small enough, else the re-pack;
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
    """Score any layout (ours, hand-made or imported) under the cost model. Its lower bound
    covers our candidate space and the layout's own shapes, tiers and cache ratios, so a
    layout outside our grid gets a bound valid for it too; what the checker finds wrong with
    it goes into its warnings."""
    from planner.check import check_plan

    layout = PlanLayout(schema_version=layout.schema_version, request=layout.request,
                        tables=layout.tables)
    problem = build_problem(layout.request)
    cands, _ = candidates_for(problem)
    own = own_candidates(problem, layout)
    if own is not None:
        cands = [[*cs, c] for cs, c in zip(cands, own, strict=True)]
    bound = lower_bound(problem, cands)
    cert = certificate_of(bound, problem,
                          candidates="planner+layout" if own is not None else "planner")
    note = [] if own is not None else [
        "the layout's tables do not match the request's one for one: its bound covers only "
        "the planner's candidate space, so the gap may not hold for this layout"]
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
        out.append(candidate_of_pieces(problem, t, tp.sharding_type, tp.tier, tp.cache_ratio,
                                       pieces))
    return out
