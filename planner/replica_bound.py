"""A lower bound that charges the replicas to the GPU of every large piece.

The balanced bound (planner/bounds.py) lets a table keep a piece as large as the makespan M,
while every data-parallel or row-wise table chosen puts a piece on every GPU, that one
included. Write rho for what the world-scope candidates of a plan put on each GPU at least
(the sum over them of their smallest piece), and fixed for the step's fixed seconds. Then a
GPU holding a piece of size p (compute + communication, the step not pipelined) carries
  M >= fixed + rho + p,
and all GPUs together carry the plan's work: W (M - fixed) >= sum of the chosen work.

So M is impossible when no choice of candidates has both. Split on where rho lies: sort the
slacks u = M - fixed - p of the one-GPU-scope candidates; for rho in (u_(i-1), u_i], only
candidates with slack >= u_i may be chosen, and rho <= u_i. For each part the least work is
bounded below by the Lagrangian of the rho row (any mu >= 0):
  min work >= sum_t min_c (work_tc + mu rho_tc) - mu u_i,
and M is refuted when every part's bound passes W (M - fixed). Parts may be merged (a merged
part allows the candidates of its first, the rho of its last: a relaxation of both). A test
that holds for the optimum holds for every M above it, so any refuted M is below the
optimum, whatever the merging; the bound is the largest M refuted in a bisection.

The owner side is at least zero and memory caps and pins only remove plans, so leaving them
out keeps it valid. Pipelined steps (a GPU's step is not the sum of its pieces' sides) are
not bounded here: 0. None of this reads the plan.
"""


import numpy as np

from cost_models import fixed_floors
from planner.candidates import Candidate, Scope
from planner.problem import Problem
from planner.refutation_search import largest_refuted
from planner.relaxation import candidate_matrix

# Parts of the rho split tested per M (merged evenly over the slacks beyond this many).
_PARTS = 64
# Lagrange multipliers tried per part (bisection on the rho row's subgradient).
_MU_STEPS = 30
# Above this many candidates in all, 0 (the tests cost parts x mu steps x candidates each).
_MAX_CANDIDATES = 40_000
# Bisection: stop at this relative width; at most this many doublings to find a passing M.
_REL_TOL = 1e-4
_GROW_STEPS = 12


def _matrices(cands: list[list[Candidate]]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray]:
    """(work, max piece, rho, world) per table and candidate; work inf where none."""
    work = candidate_matrix(cands, "work")
    maxp = candidate_matrix(cands, "max_piece")
    rho = np.zeros(work.shape)
    world = np.zeros(work.shape, dtype=bool)
    for t, cs in enumerate(cands):
        for i, c in enumerate(cs):
            if c.scope is Scope.WORLD:
                world[t, i] = True
                rho[t, i] = min(float((g.comp + g.comm).min()) for g in c.groups)
    return work, maxp, rho, world


def _part_refuted(work: np.ndarray, rho: np.ndarray, allowed: np.ndarray, rho_cap: float,
                  budget: float) -> bool:
    """Whether every choice of one allowed candidate per table with summed rho at most
    rho_cap has summed work over `budget`: a Lagrangian above it proves so; a choice within
    both disproves it; else (neither found) not refuted. mu = 0 first, then grown until the
    choice keeps rho under the cap, then bisected on the rho row's subgradient."""
    if not allowed.any(axis=1).all():
        return True
    w = np.where(allowed, work, np.inf)
    r = np.where(allowed, rho, 0.0)
    rows = np.arange(len(w))

    def probe(mu: float) -> bool | None:
        """True: refuted at mu; False: a choice within both; None: mu's choice has rho
        over the cap (a larger mu is needed), or under it with too much work (smaller)."""
        priced = w + mu * r
        pick = priced.argmin(axis=1)
        if float(priced[rows, pick].sum()) - mu * rho_cap > budget:
            return True
        under = r[rows, pick].sum() <= rho_cap
        if under and float(w[rows, pick].sum()) <= budget:
            return False
        nonlocal lo, hi
        if under:
            hi = mu
        else:
            lo = mu
        return None

    lo, hi = 0.0, 1.0
    found = probe(0.0)  # undecided at 0: its choice has rho over the cap
    if found is not None:
        return found
    for _ in range(_MU_STEPS + _GROW_STEPS * 2 - 1):
        found = probe(hi)
        if found is not None:
            return found
        if lo < hi:  # hi's choice keeps rho under the cap: bisect below it
            break
        hi *= 4
    for _ in range(_MU_STEPS):
        found = probe((lo + hi) / 2)
        if found is not None:
            return found
    return False


def _parts(slack: np.ndarray, cap: float) -> list[tuple[float, float]]:
    """(admit one-GPU candidates with slack >= first, rho <= last) per part of rho's range:
    one part per distinct slack where there are at most _PARTS, else a grid of _PARTS equal
    steps of [0, cap] (rho in (g_j, g_j+1] admits slack > g_j: the next float up); and rho
    above every slack, where no one-GPU candidate fits."""
    levels = np.unique(slack[slack >= 0])
    if len(levels) <= _PARTS:
        parts = [(float(u), float(u)) for u in levels]
    else:
        grid = np.linspace(0.0, cap, _PARTS + 1)
        parts = [(0.0, float(grid[1]))] + [
            (float(np.nextafter(grid[j], np.inf)), float(grid[j + 1]))
            for j in range(1, _PARTS)]
    parts.append((np.inf, np.inf))
    return parts


def _refuted(m: float, fixed: float, gpus: int, work: np.ndarray, maxp: np.ndarray,
             rho: np.ndarray, world: np.ndarray) -> bool:
    """Whether no choice of candidates can have makespan m (module docstring)."""
    cap = m - fixed
    if cap <= 0:
        return True
    finite = np.isfinite(work)
    world_ok = world & finite & (maxp <= cap)
    slack = np.where(~world & finite, cap - maxp, -np.inf)
    budget = gpus * cap
    for first, last in reversed(_parts(slack, cap)):  # the most replicas allowed first
        if not _part_refuted(work, rho, world_ok | (slack >= first), last, budget):
            return False
    return True


def replica_bound(problem: Problem, cands: list[list[Candidate]], known_s: float) -> float:
    """The largest makespan found refuted above `known_s` (a bound already proven); 0 where
    it refutes nothing above it, the step is pipelined, no candidate is world-scope or
    there are more than _MAX_CANDIDATES candidates."""
    if problem.model.pipelined or sum(len(c) for c in cands) > _MAX_CANDIDATES:
        return 0.0
    work, maxp, rho, world = _matrices(cands)
    if not world.any() or known_s <= 0:
        return 0.0
    hw = problem.hw
    fixed = fixed_floors(problem.estimator.fixed(), False, hw.constants.pipeline_overlap)[0]
    found = largest_refuted(
        lambda m: _refuted(m, fixed, hw.world_size, work, maxp, rho, world), known_s,
        _GROW_STEPS, _REL_TOL)
    if found is None:
        return 0.0
    return found[0] if found[0] > known_s else 0.0  # nothing above what was known: not named
