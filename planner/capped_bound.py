"""A lower bound from the LP relaxation with every chosen piece under the makespan.

The balanced bound (planner/bounds.py) caps each chosen candidate's largest piece at M, but
prices memory with one set of prices, those of the LP without the cap. Where memory is
short and the candidates that fit it are the ones with large pieces (a table that fits only
on a slow tier, whole), the cap changes which candidates can share the memory, and the right
prices change with it: hugectr_200 on 2 hosts of 16 GiB GPUs had a bound of 295.5 ms while
no mix of candidates with pieces under 470 ms fits the cluster's HBM and DDR at all.

So for a makespan M, the LP relaxation of candidate choice (planner/relaxation.py) is solved
again over the candidates whose largest piece fits under M (their piece plus the step's
fixed seconds, as the largest-piece bound counts it). M is refuted when
  - no mix of those candidates fits the cluster's memory: prices lambda from the LP of the
    least excess, with sum_t min_c lambda . mem[t,c] - lambda . caps > 0 recomputed here (a
    Farkas certificate: the Lagrangian bound then grows without limit as lambda is scaled), or
  - the Lagrangian bound at the capped LP's memory duals, recomputed here, passes W (M - fixed)
    (on both sides of a pipelined step, as planner/bounds.py takes them).
Every refuted M is below the optimum (any plan with makespan M is a choice the test
admits), so the bound is the largest M found refuted in a bisection above the known bound.
A solver's inexact duals only loosen it. None of this reads the plan.
"""

import numpy as np

from planner.candidates import Candidate
from planner.relaxation import candidate_matrix, excess_prices, solve_relaxation

# Bisection: stop at this relative width; at most this many doublings (from 2%) to find an
# M that is not refuted.
_REL_TOL = 1e-4
_GROW_STEPS = 12


def _priced(mem: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """(T, C) lambda . mem, summed term by term (no BLAS: the same bits on every machine)."""
    return mem[..., 0] * lam[0] + mem[..., 1] * lam[1] + mem[..., 2] * lam[2]


class _Capped:
    """The test of one M, over the candidate matrices built once."""

    def __init__(self, cands: list[list[Candidate]], mem: np.ndarray, caps: np.ndarray,
                 gpus: int, pipelined: bool, offsets: tuple[float, float]) -> None:
        self.maxp = candidate_matrix(cands, "max_piece")
        attrs = ("work", "comm_work") if pipelined else ("work",)
        self.works = [(candidate_matrix(cands, a), offsets[0] if a == "work" else offsets[1])
                      for a in attrs]
        self.mem, self.caps, self.gpus = mem, caps, gpus
        self.piece_offset = offsets[1]
        self.capped_caps = np.where(np.isfinite(caps), caps, 0.0)
        self.rows = np.arange(len(cands))

    def _over_memory(self, usable: np.ndarray) -> bool:
        lam = excess_prices(self.mem, self.caps, usable)
        if lam is None:
            return False
        lam = np.where(np.isfinite(self.caps), lam, 0.0)
        priced = np.where(usable, _priced(self.mem, lam), np.inf)
        return float(priced.min(axis=1).sum()) - float(self.capped_caps @ lam) > 0

    def refuted(self, m: float) -> bool:
        piece_cap = m - self.piece_offset
        if piece_cap <= 0:
            return True
        usable = np.isfinite(self.maxp) & (self.maxp <= piece_cap)
        if not usable.any(axis=1).all():
            return True
        for work, offset in self.works:
            capped = np.where(usable, work, np.inf)
            picked = capped.min(axis=1)
            if float(picked.sum()) / self.gpus + offset > m:
                return True  # without memory prices already
            cheapest = self.mem[self.rows, capped.argmin(axis=1)].sum(axis=0)
            if (cheapest <= self.caps).all():
                continue  # the cheapest choice fits: no memory price can raise it
            relaxed = solve_relaxation(capped, self.mem, self.caps)
            if relaxed is None:
                return self._over_memory(usable)
            lam = np.where(np.isfinite(self.caps), relaxed.prices, 0.0)
            value = (float((capped + _priced(self.mem, lam)).min(axis=1).sum())
                     - float(self.capped_caps @ lam))
            if value / self.gpus + offset > m:
                return True
        return False


def capped_bound(cands: list[list[Candidate]], mem: np.ndarray, caps: np.ndarray, gpus: int,
                 pipelined: bool, offsets: tuple[float, float], known_s: float) -> float:
    """The largest makespan found refuted above `known_s` (a bound already proven); 0 where
    nothing just above it is refuted. Costs one LP where memory does not bind under the cap
    (its cheapest choice fits the cluster), else one per bisection step."""
    if known_s <= 0:
        return 0.0
    test = _Capped(cands, mem, caps, gpus, pipelined, offsets)
    lo = known_s * (1 + _REL_TOL)
    if not test.refuted(lo):
        return 0.0
    step, hi = 0.02, None
    for _ in range(_GROW_STEPS):
        trial = known_s * (1 + step)
        if not test.refuted(trial):
            hi = trial
            break
        lo, step = trial, step * 2
    if hi is not None:
        while hi - lo > _REL_TOL * lo:
            mid = (lo + hi) / 2
            if test.refuted(mid):
                lo = mid
            else:
                hi = mid
    return lo
