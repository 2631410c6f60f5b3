"""CP-SAT on the partition: the exact model for small instances, and a large-neighbourhood
re-pack (a few GPUs at a time) for large ones, both started from the heuristic plan.

Determinism: CP-SAT stops on a deterministic-time budget (its work counters, not the clock)
with one worker, so the same request gives the same plan on any machine; a generous
wall-clock limit only guards against a runaway solve. The history records deterministic
time, not seconds, for the same reason. Measured on criteo_dcnv2 (26 tables, 32 GPUs, 2
det-s): one worker with the full LP linearization kept to its budget (2.0 det-s, 1.9 s wall)
and gave the best bound; 2 and 8 interleaved workers overran it (3.8 and 6.9 det-s) and
bounded worse.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from planner.candidates import Candidate, Scope
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.cpsat_model import ExtractionError, PartitionModel
from planner.partition.state import LoadState
from planner.problem import Problem

log = logging.getLogger("planner.cpsat")

# Integer resolution: the start's makespan is this many units (see cpsat_model for rounding).
UNITS_PER_MAKESPAN = 10_000_000
# The wall clock only stops a solve that runs far past its deterministic budget (a loaded
# 2-core machine took 13 s of wall time for 0.8 deterministic s); if it ever binds, the plan
# says so, since it is then not reproducible.
_WALL_FACTOR, _WALL_SLACK_S = 20.0, 60.0
# The exact model is built when it has at most this many variables.
EXACT_MAX_VARS = 60_000
# Re-pack neighbourhood: the slowest GPUs, the least loaded, and a few drawn at random.
_SLOWEST, _LEAST, _RANDOM = 3, 6, 3
_MAX_FREE_TABLES = 120
_MAX_ROUND_VARS = 20_000  # variables of one re-pack model
_ROUND_BUDGET = 0.5  # deterministic seconds per re-pack round
# Rounds without improvement before the re-pack stops: at least _PATIENCE, and more with a
# larger budget (a budget is there to be used), never fewer, so that a larger budget runs
# the smaller one's rounds first and then more (see repack).
_PATIENCE = 6
_PATIENCE_PER_DET_S = 4
_REL_EPS = 1e-9


@dataclass(frozen=True)
class Progress:
    """One point of the solve: deterministic time, the incumbent and the bound (seconds)."""

    det_time: float
    incumbent_s: float
    bound_s: float | None


ProgressFn = Callable[[Progress], None]


@dataclass
class SolveResult:
    assignment: Assignment
    status: str  # what CP-SAT achieved, in words: "optimal", "feasible (...)", "improved", ...
    bound_s: float | None  # a valid lower bound on every plan in the candidate space
    det_time: float
    history: list[Progress] = field(default_factory=list)


def makespan(problem: Problem, choices: list[TableChoice]) -> float:
    state = LoadState.of_choices(problem, choices)
    return float(state.load().max())


def hit_wall(solver: cp_model.CpSolver) -> bool:
    return solver.wall_time >= solver.parameters.max_time_in_seconds * 0.99


def deterministic_solver(budget: float, seed: int) -> cp_model.CpSolver:
    """A solver that stops on `budget` deterministic seconds with one worker (so the same
    model gives the same answer anywhere), the wall clock only as a runaway guard."""
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_deterministic_time = max(budget, 0.01)
    p.max_time_in_seconds = _WALL_FACTOR * budget + _WALL_SLACK_S
    p.num_workers = 1
    p.random_seed = seed
    return solver


def solver_params(budget: float, seed: int) -> cp_model.CpSolver:
    """deterministic_solver, tuned for the partition models (measured below)."""
    solver = deterministic_solver(budget, seed)
    p = solver.parameters
    p.linearization_level = 2
    # Symmetry detection over identical GPUs cost up to 10 s of wall time and stalled the
    # solve after presolve on deeprecsys_rm2 x 128 GPUs; without it, proved optimal in 0.9 s.
    p.symmetry_level = 0
    # Presolve probing took 1.45 of a 2 det-s budget (5.4 s of wall time) on the
    # hierarchical model of criteo_dcnv2 x 16 hosts and ignored its own time limit, leaving
    # nothing to search with; without it CP-SAT starts from the hint at once.
    p.cp_model_probing_level = 0
    return solver


class _Recorder(cp_model.CpSolverSolutionCallback):
    """Records each incumbent; stops once it is within `target_gap` of the best bound known
    (ours or the solver's). Called at deterministic points, so stopping is deterministic."""

    def __init__(self, unit: float, history: list[Progress], progress: ProgressFn | None,
                 bound_s: float, target_gap: float | None) -> None:
        super().__init__()
        self.unit, self.history, self.progress = unit, history, progress
        self.bound_s, self.target_gap = bound_s, target_gap

    def on_solution_callback(self) -> None:
        incumbent = self.objective_value * self.unit
        bound = self.best_objective_bound * self.unit
        point = Progress(round(self.deterministic_time, 6), incumbent, max(bound, 0.0))
        self.history.append(point)
        if self.progress is not None:
            self.progress(point)
        best = max(bound, self.bound_s)
        if self.target_gap is not None and incumbent <= best * (1 + self.target_gap):
            self.stop_search()


def exact_model_size(problem: Problem, cands: list[list[Candidate]]) -> int:
    """Variables the exact model would have (an upper estimate), without building it."""
    hw = problem.hw
    g, w, hosts = hw.gpus_per_host, hw.world_size, hw.hosts
    per_group = {Scope.GPU: lambda k: w, Scope.HOST_FIXED: lambda k: hosts,
                 Scope.HOST_FREE: lambda k: hosts * (1 + k * g), Scope.WORLD: lambda k: 0}
    return sum(1 + sum(per_group[c.scope](len(grp)) for grp in c.groups)
               for cs in cands for c in cs)


def solve_exact(problem: Problem, cands: list[list[Candidate]], start: Assignment,
                budget: float, seed: int, bound_s: float, target_gap: float | None = None,
                progress: ProgressFn | None = None) -> SolveResult | None:
    """The whole partition in one CP-SAT model, hinted with `start`. None when the model
    would be too large (the caller re-packs instead). Stops early once within `target_gap`
    of the best bound, when one is given."""
    hw = problem.hw
    size = exact_model_size(problem, cands)
    if size > EXACT_MAX_VARS:
        log.info("exact model would have %d variables (> %d): re-pack instead",
                 size, EXACT_MAX_VARS)
        return None
    start_s = makespan(problem, start.choices)
    unit = max(start_s, 1e-12) / UNITS_PER_MAKESPAN
    model = PartitionModel(problem, cands, list(range(len(cands))),
                           np.ones(hw.world_size, dtype=bool),
                           LoadState.empty(problem), unit, allow_world=True)
    model.hint(dict(enumerate(start.choices)))
    solver = solver_params(budget, seed)
    history: list[Progress] = []
    status = solver.solve(model.model,
                          _Recorder(unit, history, progress, bound_s, target_gap))
    det = round(solver.deterministic_time, 6)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        log.info("CP-SAT found no solution within %.3g deterministic s", budget)
        return SolveResult(start, "no better plan within the limit", None, det, history)
    # The bound: unit * (integer bound), valid because coefficients were rounded down.
    bound = max(solver.best_objective_bound, 0.0) * unit
    try:
        chosen = model.extract(solver)
    except ExtractionError as err:
        log.warning("CP-SAT exact model: %s; kept the heuristic plan", err)
        return SolveResult(start, f"internal error in the exact model ({err}): kept the "
                                  "heuristic plan", None, det, [])
    choices = [chosen[t] for t in range(len(cands))]
    if hit_wall(solver):
        label = "feasible (stopped by the wall-clock safety limit: not reproducible)"
    elif status == cp_model.OPTIMAL:
        label = "optimal"
    elif history and target_gap is not None and history[-1].incumbent_s <= max(
            bound, bound_s) * (1 + target_gap):
        label = f"feasible (within {target_gap:.1%} of the bound)"
    else:
        label = "feasible (stopped at the limit)"
    log.info("CP-SAT exact: %s, %d variables, objective %.6g s, bound %.6g s, %.3g det s",
             label, model.num_vars, solver.objective_value * unit, bound, det)
    notes = [f"CP-SAT exact model ({model.num_vars:,} variables): {label}"]
    if makespan(problem, choices) >= start_s * (1 - _REL_EPS):
        return SolveResult(start, label, bound, det, history)
    return SolveResult(Assignment(choices, "cp-sat", label, start.notes + notes),
                       label, bound, det, history)


def repack(problem: Problem, cands: list[list[Candidate]], start: Assignment,
           budget: float, seed: int, progress: ProgressFn | None = None) -> SolveResult:
    """Large-neighbourhood search: re-solve a few GPUs at a time with CP-SAT, letting the
    tables that live only on them change their sharding too; keep a round only when it
    lowers the slowest GPU of its neighbourhood.

    Every round gets the same deterministic budget and its own seed, and a round runs only
    when its whole budget is left (a budget under one round's runs none), so the rounds of a
    smaller budget are a prefix of a larger one's (patience grows with the budget too): more
    budget never gives a worse plan.
    """
    hw = problem.hw
    rng = np.random.default_rng(seed)
    choices = list(start.choices)
    state = LoadState.of_choices(problem, choices)
    current = float(state.load().max())
    history: list[Progress] = []
    spent, rounds, idle, improved = 0.0, 0, 0, 0
    patience = max(_PATIENCE, int(budget * _PATIENCE_PER_DET_S))
    # A round starts only when its whole budget is left, and each is charged the
    # deterministic time it used, so the sequence of rounds depends on the budget only
    # through where it ends.
    while (spent + _ROUND_BUDGET <= budget * (1 + _REL_EPS) and idle < patience
           and hw.world_size > 1):
        rounds += 1
        scope = _neighbourhood(state, rng)
        free = _free_tables(choices, cands, scope, state)
        if not free:
            idle += 1
            continue
        base = state.copy()
        for t in free:
            for grp, ranks in zip(choices[t].cand.groups, choices[t].ranks, strict=True):
                base.apply(grp, ranks, -1)
        local_before = float(state.load()[scope].max())
        unit = max(local_before, 1e-12) / UNITS_PER_MAKESPAN
        model = PartitionModel(problem, cands, free, scope, base, unit, allow_world=False)
        model.hint({t: choices[t] for t in free})
        solver = solver_params(_ROUND_BUDGET, seed + rounds)
        status = solver.solve(model.model)
        spent += solver.deterministic_time
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            idle += 1
            continue
        try:
            new = model.extract(solver)
        except ExtractionError as err:
            log.warning("CP-SAT re-pack round %d: %s; round dropped", rounds, err)
            idle += 1
            continue
        trial = base.copy()
        for ch in new.values():
            for grp, ranks in zip(ch.cand.groups, ch.ranks, strict=True):
                trial.apply(grp, ranks)
        after = trial.load()
        # The owner side moves with the hosts' shares, so GPUs outside the neighbourhood can
        # change too: keep the round only if the whole cluster's makespan does not rise.
        if (float(after[scope].max()) < local_before * (1 - _REL_EPS)
                and float(after.max()) <= current * (1 + _REL_EPS)):
            for t, ch in new.items():
                choices[t] = ch
            state = trial
            current = float(after.max())
            improved += 1
            idle = 0
            point = Progress(round(spent, 6), current, None)
            history.append(point)
            if progress is not None:
                progress(point)
        else:
            idle += 1
    status = "improved" if improved else "no improvement"
    log.info("CP-SAT re-pack: %d rounds, %d improved, makespan %.6g s, %.3g det s",
             rounds, improved, current, spent)
    if not improved:
        return SolveResult(start, status, None, round(spent, 6), history)
    notes = [*start.notes, f"CP-SAT re-pack: {improved} of {rounds} rounds improved the plan"]
    return SolveResult(Assignment(choices, "cp-sat-lns", "feasible", notes), status, None,
                       round(spent, 6), history)


def _neighbourhood(state: LoadState, rng: np.random.Generator) -> np.ndarray:
    """The slowest GPUs, the least loaded and a few at random (seeded)."""
    load = state.load()
    w = len(load)
    order = np.argsort(-load, kind="stable")
    picked = set(order[:_SLOWEST].tolist()) | set(order[::-1][:_LEAST].tolist())
    rest = [r for r in range(w) if r not in picked]
    if rest:
        k = min(_RANDOM, len(rest))
        picked |= set(rng.choice(rest, size=k, replace=False).tolist())
    scope = np.zeros(w, dtype=bool)
    scope[sorted(picked)] = True
    return scope


def _free_tables(choices: list[TableChoice], cands: list[list[Candidate]],
                 scope: np.ndarray, state: LoadState) -> list[int]:
    """Tables whose pieces all lie in the neighbourhood (not world-wide ones), the most
    expensive on the slowest GPU of the neighbourhood first, while the model stays under
    _MAX_FREE_TABLES tables and about _MAX_ROUND_VARS variables."""
    load = state.load()
    hot = int(np.flatnonzero(scope)[np.argmax(load[scope])])
    inside: list[tuple[float, int]] = []
    for t, ch in enumerate(choices):
        if ch.cand.scope is Scope.WORLD:
            continue
        ranks = np.concatenate([np.asarray(r) for r in ch.ranks])
        if not scope[ranks].all():
            continue
        on_hot = sum(float((g.comp + g.comm)[np.asarray(r) == hot].sum())
                     for g, r in zip(ch.cand.groups, ch.ranks, strict=True))
        inside.append((-on_hot, t))
    inside.sort()
    size, chosen = 0, []
    gpus = int(scope.sum())
    for _, t in inside[:_MAX_FREE_TABLES]:
        # GPU-scope groups dominate the size: one variable per group and GPU of the scope.
        cost = sum(1 + len(c.groups) * gpus for c in cands[t] if c.scope is not Scope.WORLD)
        if chosen and size + cost > _MAX_ROUND_VARS:
            break
        size += cost
        chosen.append(t)
    return sorted(chosen)

