"""The partition pipeline: choose candidates (the LP relaxation, the greedy), place them
(LPT, replicas first), improve (local search, then CP-SAT: the exact or hierarchical model,
the re-pack). `heuristic` is the start `plan()` takes, `improve` what CP-SAT makes of it;
every threshold and budget they use is the SearchPolicy's (partition/policy.py).

Starts, each placed and improved by the local search, the best kept (best_start): the
candidate-choosing greedy; the relaxation's choices at each memory fill while memory binds,
placed with and without the all-to-alls' owner side in view; on few tables a table-wise
LPT and an owner-side-aware greedy; on several hosts all of it twice, with GPUs tied on
load taken in rank order and with the least loaded host first; then smaller pieces where
the best plan waits on the owner side."""

import logging
from collections.abc import Callable

import numpy as np

from cost_models import ShardingType
from planner.bounds import LowerBound
from planner.candidates import Candidate
from planner.errors import InfeasibleError, NoPlanFoundError
from planner.feasibility import FEASIBILITY_MIN_S, cpsat_feasible, memory_first, packing_search
from planner.infeasibility import (
    InfeasibilityCertificate,
    capacity_certificate,
    infeasible_error,
)
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
from planner.partition.lp_start import Relaxer, lp_start, relaxed_choices
from planner.partition.nic_start import nic_packing_choice
from planner.partition.policy import DEFAULT_POLICY, SearchPolicy
from planner.partition.ruin_recreate import RecreateResult, ruin_and_recreate
from planner.partition.state import LoadState
from planner.problem import Problem
from planner.spec import PlanOptions

log = logging.getLogger("planner")

# What `heuristic` calls when nothing fits: every table's candidates with the slower tiers
# costed, and their lower bound.
Widen = Callable[[], tuple[list[list[Candidate]], LowerBound]]


def is_flat(problem: Problem, cands: list[list[Candidate]],
            policy: SearchPolicy = DEFAULT_POLICY) -> bool:
    """Whether CP-SAT runs the flat exact model (else the hierarchical one)."""
    return (problem.hw.hosts <= policy.flat_max_hosts
            or exact_model_size(problem, cands) <= policy.flat_any_hosts_vars)


def _waits(problem: Problem, a: Assignment, bound: LowerBound, policy: SearchPolicy) -> bool:
    """Whether the plan is over the policy's shares_min_gap above the bound and its slowest
    GPU waits on the owner side of the all-to-alls: what smaller pieces can mend."""
    state = LoadState.of_choices(problem, a.choices)
    load = state.load()
    slowest = int(np.argmax(load))
    return bool(load[slowest] > bound.value_s * (1 + policy.shares_min_gap)
                and state.wait()[slowest] > 0)


def _priced_start(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
                  steps: int, best: Assignment | None, spread: bool, policy: SearchPolicy
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
    best_fill = policy.relaxation_fills[0]
    for fill, choice in relaxed_choices(problem, cands, bound.value_s, policy.relaxation_fills):
        other = _grown(problem, cands, choice, steps, best, spread, (False, True), fill=fill)
        if other is not best:
            best, best_fill = other, fill
    return best, best_fill


def _grown(problem: Problem, cands: list[list[Candidate]], choice: list[int], steps: int,
           best: Assignment | None, spread: bool, owners: tuple[bool, ...], fill: float,
           share: float = 1.0, held: bool = False, note: str = "the relaxation"
           ) -> Assignment | None:
    """`choice` placed (lp_start) and improved (local_search), once per owner-side setting;
    the best of those and `best`."""
    best_s = makespan(problem, best.choices) if best is not None else float("inf")
    for owner in owners if problem.hw.hosts > 1 else (False,):
        start = lp_start(problem, cands, choice, owner_side=owner, spread_hosts=spread,
                         fill=fill, piece_share=share, held=held)
        if start is None:
            continue
        other = local_search(problem, cands, start, steps)
        other_s = makespan(problem, other.choices)
        if other_s < best_s * (1 - 1e-9):
            other.notes.append(f"kept the plan grown from {note}'s choices")
            best, best_s = other, other_s
    return best


def _smaller_pieces(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
                    best: Assignment, spread: bool, fill: float, policy: SearchPolicy
                    ) -> Assignment:
    """On several hosts, when the best plan's slowest GPU waits on the owner side and is
    over the policy's shares_min_gap above the bound: the relaxation with the largest piece
    capped at each of its piece_shares of the bound, at the fill the best plan grew with and
    each fuller one (smaller pieces pack where whole tables did not), with its host-spreading,
    placed owner-aware, and once more with the tables `best` split over the cap held to
    their types (_held); kept where one beats `best`. Run once per plan, after both spreadings.
    zionex_12t x 16 h100 hosts grew best at 88% with whole pieces (21.03 ms before ruin and
    recreate); at 97% with pieces up to 60% of the bound it gives 19.89 (bound 18.69)."""
    if problem.hw.hosts < 2 or not _waits(problem, best, bound, policy):
        return best
    relaxer = Relaxer(problem, cands)
    steps = policy.steps(len(cands))
    tried: set[tuple[int, ...]] = set()
    fills = [f for f in policy.relaxation_fills if f >= fill]
    for share in policy.piece_shares[1:]:
        for at in fills:
            held = _held(cands, best, bound.value_s * share)
            for usable in (None, held) if held is not None else (None,):
                relaxed = relaxer.choose(bound.value_s * share, at, usable)
                if relaxed is None or tuple(relaxed.choice) in tried:
                    continue
                tried.add(tuple(relaxed.choice))
                found = _grown(problem, cands, relaxed.choice, steps, best, spread, (True,),
                               at, share, held=usable is not None)
                assert found is not None  # `best` stands unless beaten
                best = found
    return best


# Sharding types that leave a table whole: _held never holds them.
_UNSPLIT = (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL)


def _held(cands: list[list[Candidate]], best: Assignment, cap_s: float) -> np.ndarray | None:
    """(T, C) usable candidates where each table already split in `best` (the best plan
    before this cap and fill; neither table-wise nor data-parallel) whose piece is over
    `cap_s` keeps its sharding type, so that the cap refines its split instead of trading
    it for another type; None when no table is held. The free relaxation at hugectr_200 x 16
    h100 hosts, pieces up to 25% of the bound, trades the ten 50M-row table-row-wise tables
    for types whose pieces sit on more hosts; held, it grows a plan of 39.74 ms instead of
    40.23 before ruin and recreate (bound 36.04; zionex_a100: 80.16 -> 78.27)."""
    width = max(len(c) for c in cands)
    out = np.ones((len(cands), width), dtype=bool)
    for t, ch in enumerate(best.choices):
        if ch.cand.max_piece > cap_s and ch.cand.kind not in _UNSPLIT:
            out[t, :len(cands[t])] = [c.kind is ch.cand.kind for c in cands[t]]
    # All usable (no table held, or each held one has no other type): the free relaxation.
    return None if out.all() else out


def best_start(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
               policy: SearchPolicy = DEFAULT_POLICY) -> Assignment:
    """The better of _starts with GPUs tied on load taken in rank order and, on several
    hosts, on the least loaded host first (partition/state.py): spreading the largest pieces
    over the hosts cut hugectr_200 x 4 hosts from 36.29 to 35.36 ms and hugectr_510 x 2 from
    38.46 to 36.98, but made zionex_12t x 16 zionex_a100 hosts 16.6% worse, so both run.
    Then _smaller_pieces, once, with the winner's spreading and fill. The NIC-floor
    relaxation's choice (partition/nic_start.py; several hosts only) is solved once for
    both spreadings."""
    if problem.hw.hosts < 2:
        return _starts(problem, cands, bound, False, policy, None)[0]
    nic = nic_packing_choice(problem, cands, bound.value_s)
    best: tuple[Assignment, float] | None
    try:
        best = _starts(problem, cands, bound, False, policy, nic)
    except InfeasibleError:
        best = None
    try:
        spread = _starts(problem, cands, bound, True, policy, nic)
    except InfeasibleError:
        if best is None:
            raise
        return _smaller_pieces(problem, cands, bound, best[0], False, best[1], policy)
    if best is None or makespan(problem, spread[0].choices) < makespan(
            problem, best[0].choices) * (1 - 1e-9):
        spread[0].notes.append("kept the plan grown with the largest pieces spread over the "
                               "hosts")
        return _smaller_pieces(problem, cands, bound, spread[0], True, spread[1], policy)
    return _smaller_pieces(problem, cands, bound, best[0], False, best[1], policy)


def _starts(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
            spread: bool, policy: SearchPolicy, nic: list[int] | None
            ) -> tuple[Assignment, float]:
    """Local search from several deterministic starts, keep the best: the candidate-choosing
    greedy; on up to the policy's small_tables tables also a table-wise-only LPT (the
    ZionEX-style start, which wins on few, evenly sized tables) and, on several hosts, the
    greedy that scores the all-to-alls' owner side while it builds (better on some
    multi-host instances). Returns the best plan and the memory fill of the relaxation it
    grew from (the first fill when it did not grow from one). `nic`: the NIC-floor
    relaxation's choice, grown as the priced start's where given."""
    steps = policy.steps(len(cands))
    try:
        best = local_search(problem, cands,
                            greedy(problem, cands, bound.prices, spread_hosts=spread), steps)
    except InfeasibleError:
        best = None
    best, fill = _priced_start(problem, cands, bound, steps, best, spread, policy)
    if nic is not None:
        grown = _grown(problem, cands, nic, steps, best, spread, (False, True),
                       fill=policy.relaxation_fills[0], note="the NIC-floor relaxation")
        if grown is not best:
            best, fill = grown, policy.relaxation_fills[0]
    if best is None:
        raise InfeasibleError(reason="neither the greedy nor the priced start fit every "
                                     "table")
    if len(cands) > policy.small_tables:
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
            best, best_s, fill = other, other_s, policy.relaxation_fills[0]
    return best, fill


def heuristic(problem: Problem, cands: list[list[Candidate]], slow: bool, bound: LowerBound,
              options: PlanOptions, widen: Widen, policy: SearchPolicy = DEFAULT_POLICY
              ) -> tuple[Assignment, list[list[Candidate]], bool, LowerBound]:
    """The heuristic plan (best_start); when it cannot place everything, the same with every
    tier costed (`widen`: the candidates with slower tiers for every table and their bound),
    then the fallbacks of planner/feasibility.py before any "infeasible" (then with a
    certificate, or "no plan found within the budget" when neither a plan nor a proof came).
    Returns the plan with the candidates and bound it was found over."""
    tried = []
    try:
        return best_start(problem, cands, bound, policy), cands, slow, bound
    except InfeasibleError as err:
        tried.append(f"greedy + local search: {err.reason}")
        log.info("heuristic found no plan: %s", err.reason)
    if not slow:
        cands, bound = widen()
        slow = True
        try:
            found = best_start(problem, cands, bound, policy)
            found.notes.append("the heuristic fit only with slower tiers costed for every "
                               "table")
            return found, cands, slow, bound
        except InfeasibleError as err:
            tried.append(f"greedy + local search with every tier: {err.reason}")
    steps = policy.steps(len(cands))
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
        raise infeasible_error(problem, cert)
    # The optimisation budget may be too small to settle feasibility (one tight-pins instance
    # needed 0.61 det s); "no plan" is answered only after at least FEASIBILITY_MIN_S.
    budget = max(options.time_limit_s, FEASIBILITY_MIN_S)
    status, found_cp, size = cpsat_feasible(problem, cands, budget, options.seed)
    if found_cp is not None:
        return local_search(problem, cands, found_cp, steps), cands, slow, bound
    if status == "infeasible":
        raise infeasible_error(problem, InfeasibilityCertificate(
            kind="cp-sat", cap="all caps and pins", candidates=sum(len(c) for c in cands),
            detail=(f"feasibility model of {size:,} variables over "
                    f"{sum(len(c) for c in cands):,} candidates: INFEASIBLE")))
    tried.append(f"CP-SAT feasibility model ({size:,} variables): {status} within "
                 f"{budget:g} deterministic s")
    raise NoPlanFoundError(reason="; ".join(tried), tried=tried)


def improve(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
            start: Assignment, options: PlanOptions, flat: bool,
            progress: ProgressFn | None, policy: SearchPolicy = DEFAULT_POLICY
            ) -> tuple[SolveResult | None, list[str]]:
    """The search after the heuristic, as the options ask: `greedy` never; `auto` unless the
    heuristic plan is already within the policy's auto_gap of the bound; `ilp` always. Two
    searches, each from the heuristic plan, the better kept: CP-SAT (`_cpsat`; in `auto` only
    on models up to the policy's auto_max_vars), then, unless CP-SAT proved its plan
    optimal, ruin and recreate (partition/ruin_recreate.py). They share the budget (the
    policy's lns_share to ruin and recreate when both run, else all of it to the one). Each
    runs a prefix of the same deterministic sequence when given less budget, and neither
    starts from the other's result, so a larger budget never gives a worse plan. Returns the
    result (None: no search ran) and the notes on why a search did not run, for the plan's
    decisions (`start` is left as it is)."""
    if options.solver == "greedy":
        return None, []
    gap = makespan(problem, start.choices) / bound.value_s - 1 if bound.value_s > 0 else 0.0
    if options.solver == "auto" and gap <= policy.auto_gap:
        return None, [f"heuristic plan within {policy.auto_gap:.1%} of the bound: search "
                      "skipped"]
    notes: list[str] = []
    size = exact_model_size(problem, cands) if flat else host_model_size(problem, cands)
    run_cpsat = options.solver == "ilp" or size <= policy.auto_max_vars
    if not run_cpsat:
        notes.append(f"CP-SAT model would have {size:,} variables (auto's limit "
                     f"{policy.auto_max_vars:,}): skipped; --solver ilp runs it")
    budget = options.time_limit_s
    lns_budget = budget * policy.lns_share if run_cpsat else budget
    target = bound.value_s * (1 + policy.auto_gap) if options.solver == "auto" else 0.0
    cp, cp_s = None, float("inf")
    if run_cpsat:
        cp = _cpsat(problem, cands, bound, start, options, flat, progress, budget - lns_budget,
                    policy)
        # Proven optimal: nothing left to find. (Only a proof stops it here: a target gap
        # read off CP-SAT's bound, which a larger budget raises, could stop a larger budget's
        # search where a smaller one's went on to a better plan.)
        cp_s = makespan(problem, cp.assignment.choices)
        if cp_s <= max(bound.value_s, cp.bound_s or 0.0) * (1 + policy.proven_tol):
            return cp, notes
    lns = ruin_and_recreate(problem, cands, start, lns_budget, options.seed, target,
                            policy.steps(len(cands)))
    if cp is None:
        return SolveResult(lns.assignment, _lns_status(lns), None, lns.det_time), notes
    if lns.end_s < cp_s * (1 - 1e-9):
        return SolveResult(lns.assignment, f"{_lns_status(lns)}; CP-SAT: {cp.status}",
                           cp.bound_s, round(cp.det_time + lns.det_time, 6),
                           cp.history), notes
    # CP-SAT's plan kept: the status still says that ruin and recreate ran and what it found.
    lns_note = (f"ruin and recreate: {lns.improved} of {lns.rounds} rounds lowered the "
                "makespan, not below CP-SAT's plan" if lns.improved else _lns_status(lns))
    return SolveResult(cp.assignment, f"{cp.status}; {lns_note}", cp.bound_s,
                       round(cp.det_time + lns.det_time, 6), cp.history), notes


def _lns_status(result: RecreateResult) -> str:
    if result.improved:
        return (f"improved by ruin and recreate ({result.improved} of {result.rounds} rounds "
                "lowered the makespan)")
    return f"ruin and recreate: no improvement in {result.rounds} rounds"


def _cpsat(problem: Problem, cands: list[list[Candidate]], bound: LowerBound,
           start: Assignment, options: PlanOptions, flat: bool, progress: ProgressFn | None,
           budget: float, policy: SearchPolicy) -> SolveResult:
    """CP-SAT from `start` with `budget` deterministic seconds (measured in
    benchmarks/results/solvers.md):
    - one or two hosts, or an exact model of at most flat_any_hosts_vars variables: the
      exact model when it is small enough, else the re-pack;
    - several hosts: the hierarchical model (hosts, then GPUs) when its host level is small
      enough, which proved what the flat model could not on 16 hosts and gives the tighter
      bound, then the re-pack with the rest of the budget.
    Never worse than `start`."""
    target = policy.auto_gap if options.solver == "auto" else None
    seed = options.seed
    if flat:
        result = solve_exact(problem, cands, start, budget, seed, bound.value_s, target,
                             progress)
        return result or repack(problem, cands, start, budget, seed, progress)
    if host_model_size(problem, cands) > EXACT_MAX_VARS:
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
