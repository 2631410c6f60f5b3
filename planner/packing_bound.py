"""A lower bound from packing the chosen candidates' pieces into the GPUs: dual feasible
functions over the candidate choice.

The average bound (planner/bounds.py) lets the work of the chosen candidates spread over the
GPUs as if it were fluid. It is not: each piece lands whole on one GPU. With 26 table-wise
pieces of about equal size on 8 GPUs some GPU holds four of them, which no average sees.

For a makespan M, each GPU carries its fixed seconds F and the pieces on it (their compute
plus communication; the owner side of the all-to-alls is at least zero), so the pieces on
one GPU have sizes s with sum s <= C = M - F. A dual feasible function f maps [0, 1] to
[0, 1] so that sum x <= 1 implies sum f(x) <= 1; hence over the whole cluster
    sum over the chosen pieces of f(s / C) <= W,
for every such f. Used here: the identity (the average bound again), Fekete and Schepers'
u_k(x) = floor((k + 1) x) / k (x itself where (k + 1) x is an integer; the lower of the
two is taken at a boundary, so rounding never overcounts) for k = 1.._K, and their
threshold functions (1 above 1 - e, 0 below e, x between) for e in _EPS. Every size is
scaled down by (1 - _SAFE) first, far more than the float error of a GPU's summed pieces.

M is impossible when no choice of one candidate per table (among those whose pieces all fit
under C) satisfies all these rows and the cluster's HBM, DDR and SSD totals together. The
LP relaxation of that choice (GLOP, the rows normalised to <= 1 + s, s minimised) finds
rows that cannot all hold; its duals y >= 0 are then checked here, in other arithmetic:
    sum_t min_c sum_r y_r A_r[t, c] > sum_r y_r b_r
proves that no choice satisfies every row (each choice that did would have its y-weighted
sum at most the right side), whatever GLOP's tolerances. Every M found so is below the
optimum; the bound is the largest found in a bisection above the bound already known.

Pipelined steps are not bounded here (a piece's compute side can be negative there): 0.
None of this reads the plan.
"""

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder as mb

from cost_models import fixed_floors
from planner.candidates import Candidate
from planner.problem import Problem
from planner.relaxation import cluster_caps, memory_matrix

# Fekete-Schepers u_k for k = 1.._K, and threshold functions for these e.
_K = 16
_EPS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
# Sizes are scaled by (1 - _SAFE) before any function: a margin over float rounding.
_SAFE = 1e-9
# Above this many distinct (candidate, piece size) pairs in all: 0 (each test evaluates every
# function on every pair).
_MAX_PAIRS = 200_000
_MAX_PIECES = 4 * _MAX_PAIRS
# Bisection: stop at this relative width; growth steps (2%, 4%, ... above the known bound).
_REL_TOL = 1e-4
_GROW_STEPS = 8
# A refutation needs the recomputed Lagrangian above the right side by this much (relative).
_MARGIN = 1e-9


class _Pieces:
    """Every candidate's distinct piece sizes, flat: pair i is a piece size `size[i]` that
    candidate `owner[i]` has `count[i]` of; `cand_max` is each candidate's largest piece."""

    @classmethod
    def of(cls, cands: list[list[Candidate]]) -> "_Pieces | None":
        """None above _MAX_PIECES pieces or _MAX_PAIRS distinct pairs."""
        if sum(len(g) for cs in cands for c in cs for g in c.groups) > _MAX_PIECES:
            return None
        per_cand = [np.concatenate([g.comp + g.comm for g in c.groups])
                    for cs in cands for c in cs]
        lengths = np.array([len(s) for s in per_cand])
        p = cls(cands, per_cand, lengths)
        return None if len(p.size) > _MAX_PAIRS else p

    def __init__(self, cands: list[list[Candidate]], per_cand: list[np.ndarray],
                 lengths: np.ndarray) -> None:
        owner = np.repeat(np.arange(len(per_cand)), lengths)
        size = np.concatenate(per_cand)
        order = np.lexsort((size, owner))
        owner, size = owner[order], size[order]
        first = np.ones(len(size), dtype=bool)
        first[1:] = (owner[1:] != owner[:-1]) | (size[1:] != size[:-1])
        starts = np.flatnonzero(first)
        self.owner = owner[starts]
        self.size = size[starts]
        self.count = np.diff(np.append(starts, len(size))).astype(float)
        self.cand_max = np.full(len(per_cand), -np.inf)
        np.maximum.at(self.cand_max, self.owner, self.size)
        self.table = np.repeat(np.arange(len(cands)), [len(cs) for cs in cands])


def _dff_rows(x: np.ndarray) -> np.ndarray:
    """(R, pairs) values of every dual feasible function at x (already scaled by 1 - _SAFE):
    the identity, u_k for k = 1.._K, then the threshold functions."""
    rows = [x]
    for k in range(1, _K + 1):
        rows.append(np.floor((k + 1) * x * (1 - _SAFE)) / k)
    for e in _EPS:
        rows.append(np.where(x > 1 - e, 1.0, np.where(x >= e, x, 0.0)))
    return np.vstack(rows)


def _candidate_rows(p: _Pieces, cap: float, allowed: np.ndarray) -> np.ndarray:
    """(R, candidates) each function summed over each allowed candidate's pieces at C = cap."""
    x = np.minimum(p.size / cap, 1.0) * (1 - _SAFE)
    vals = _dff_rows(x) * p.count
    out = np.zeros((vals.shape[0], len(p.cand_max)))
    for r in range(vals.shape[0]):
        out[r] = np.bincount(p.owner, weights=vals[r], minlength=len(p.cand_max))
    return out[:, allowed]


def _duals(a: np.ndarray, table: np.ndarray, tables: int) -> np.ndarray | None:
    """GLOP on: min s, one x per table summing to 1, each row a @ x <= 1 + s. The rows'
    duals (>= 0) where s > 0 at the optimum, else None (no row need fail)."""
    rows, n = a.shape
    ones = sp.csr_matrix((np.ones(n), (table, np.arange(n))), shape=(tables, n + 1))
    block = sp.hstack([sp.csr_matrix(a), sp.csr_matrix(-np.ones((rows, 1)))])
    matrix = sp.vstack([ones, block]).tocsr()
    model = mb.ModelBuilder()
    objective = np.zeros(n + 1)
    objective[n] = 1.0
    model.helper.fill_model_from_sparse_data(
        np.concatenate([np.zeros(n), [-1.0]]), np.concatenate([np.ones(n), [np.inf]]),
        objective, np.concatenate([np.ones(tables), np.full(rows, -np.inf)]),
        np.ones(tables + rows), matrix)
    solver = mb.ModelSolver("glop")
    if solver.solve(model) != mb.SolveStatus.OPTIMAL or solver.objective_value <= 0:
        return None
    duals = solver.dual_values(model.get_linear_constraints()[tables:]).to_numpy()
    return np.maximum(-duals, 0.0)


def _refuted(m: float, fixed: float, gpus: int, p: _Pieces, mem: np.ndarray,
             caps: np.ndarray, prices: np.ndarray, tables: int) -> bool:
    """Whether no choice of candidates can have makespan m (module docstring)."""
    cap = m - fixed
    if cap <= 0:
        return True
    allowed = p.cand_max <= cap
    table = p.table[allowed]
    if len(np.unique(table)) < tables:
        return True  # some table has no candidate whose pieces fit under C
    finite = np.flatnonzero(np.isfinite(caps) & (caps > 0))
    a = np.vstack([_candidate_rows(p, cap, allowed) / gpus,
                   (mem[allowed][:, finite] / caps[finite]).T])
    # Each table's least-work candidate (row 0 is the work over C), then with memory priced
    # (the average bound's prices). When such a choice keeps every row, the LP's optimum
    # does too: M is not refuted. When it breaks only the work and memory rows, the packing
    # functions do not bind there and the average bound has said what those rows say: M is
    # left unrefuted without the LP (a shortcut that only gives up; the LP costs 0.5 s on
    # 43,000 candidates).
    packing_rows = slice(1, a.shape[0] - len(finite))
    for key in (a[0], a[0] * cap * gpus + mem[allowed] @ prices):
        order = np.lexsort((key, table))  # by table, then by key
        head = np.ones(len(order), dtype=bool)
        head[1:] = table[order[1:]] != table[order[:-1]]
        over = a[:, order[head]].sum(axis=1) > 1.0
        if not over[packing_rows].any():
            return False
        if not prices.any():
            break
    y = _duals(a, table, tables)
    if y is None:
        return False
    priced = y @ a
    least = np.full(tables, np.inf)
    np.minimum.at(least, table, priced)
    return float(least.sum()) > float(y.sum()) * (1 + _MARGIN)


def packing_bound(problem: Problem, cands: list[list[Candidate]], known_s: float,
                  prices: np.ndarray | None = None, memory: bool = True) -> float:
    """The largest makespan found refuted above `known_s` (a bound already proven); 0 where
    it refutes nothing above it, the step is pipelined, or there are more than _MAX_PAIRS
    (candidate, piece size) pairs. `prices` (HBM, DDR, SSD per byte), where given, pick a
    choice that may show a makespan possible without the LP (a shortcut only). Without
    `memory` the cluster's HBM, DDR and SSD totals are left out (a bound on plans that
    ignore memory, which benchmarks/bound_falsify.py draws)."""
    if problem.model.pipelined or known_s <= 0:
        return 0.0
    p = _Pieces.of(cands)
    if p is None:
        return 0.0
    hw = problem.hw
    fixed = fixed_floors(problem.estimator.fixed(), False, hw.constants.pipeline_overlap)[0]
    # Candidates in the flat order of _Pieces: each table's, in its own order.
    mem = np.concatenate([memory_matrix([cs])[0] for cs in cands])
    caps = cluster_caps(hw) if memory else np.full(3, np.inf)
    lam = np.zeros(3) if prices is None or not memory else np.asarray(prices, dtype=float)

    def refuted(m: float) -> bool:
        return _refuted(m, fixed, hw.world_size, p, mem, caps, lam, len(cands))

    lo = known_s
    if not refuted(lo):
        return 0.0
    step, hi = 0.02, None
    for _ in range(_GROW_STEPS):
        trial = known_s * (1 + step)
        if not refuted(trial):
            hi = trial
            break
        lo, step = trial, step * 2
    if hi is not None:
        while hi - lo > _REL_TOL * lo:
            mid = (lo + hi) / 2
            if refuted(mid):
                lo = mid
            else:
                hi = mid
    return lo if lo > known_s else 0.0
