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
admits). Between two consecutive largest-piece sizes the admitted candidates, and so the
floor the LP proves, stay the same: a refuted M refutes every M of its run below that floor,
and where the floor ends the run, no larger M is refuted (more candidates only lower it).
So the bound is found in a test or two where it lies inside a run (zionex_12t x 16 h100
hosts: one LP, where a bisection took 20), and by bisection over the runs otherwise. A
solver's inexact duals only loosen it; the floor is taken 1e-9 below. None of this reads the
plan.
"""

import numpy as np

from planner.candidates import Candidate
from planner.relaxation import candidate_matrix, excess_prices, solve_relaxation

# Bisection: stop at this relative width; at most this many doublings (from 2%) to find an
# M that is not refuted.
_REL_TOL = 1e-4
_GROW_STEPS = 12
# LPs solved per bound: at most _LP_CELLS / (the LP's columns), between _MIN_LPS and
# _MAX_LPS; past it no M is refuted (the bound found so far stands). zionex_12t x 16 h100
# hosts (about 100,000 columns) took 20 LPs, 3-4 s on the 2-CPU machine, for 18.687 ->
# 18.691 ms.
_LP_CELLS = 2_000_000
_MIN_LPS, _MAX_LPS = 4, 40
# A run of refuted M ends at a floor proven in floats: the bound is taken this much below it.
_EDGE = 1e-9


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
        columns = int(np.isfinite(self.maxp).sum())
        self.lps_left = max(_MIN_LPS, min(_MAX_LPS, _LP_CELLS // max(1, columns)))

    def _dot_caps(self, lam: np.ndarray) -> float:
        return float(_priced(self.capped_caps, lam))

    def _over_memory(self, usable: np.ndarray) -> bool:
        if self.lps_left <= 0:
            return False
        self.lps_left -= 1
        lam = excess_prices(self.mem, self.caps, usable)  # 0 on uncapped memory
        if lam is None:
            return False
        priced = np.where(usable, _priced(self.mem, lam), np.inf)
        # Rounding margin: a mix that fits to the byte must not pass for an excess.
        caps = self._dot_caps(lam)
        return float(priced.min(axis=1).sum()) - caps > _EDGE * caps

    def _floor(self, usable: np.ndarray) -> float:
        """A lower bound on the slowest GPU of any plan choosing only `usable` candidates,
        from its average work (the largest over the step's sides): inf where no mix of them
        fits the memory; where the LP budget runs out, what was proven before it."""
        best = 0.0
        for work, offset in self.works:
            capped = np.where(usable, work, np.inf)
            value = float(capped.min(axis=1).sum())
            cheapest = self.mem[self.rows, capped.argmin(axis=1)].sum(axis=0)
            if not (cheapest <= self.caps).all():  # memory binds: price it
                if self.lps_left <= 0:
                    return best
                self.lps_left -= 1
                relaxed = solve_relaxation(capped, self.mem, self.caps)
                if relaxed is None:
                    return np.inf if self._over_memory(usable) else best
                lam = relaxed.prices  # 0 on uncapped memory
                value = max(value, float((capped + _priced(self.mem, lam)).min(axis=1).sum())
                            - self._dot_caps(lam))
            best = max(best, value / self.gpus + offset)
        return best

    def test(self, m: float) -> tuple[bool, float, bool]:
        """(refuted, up_to, last): whether M = m is refuted; if so, every M below `up_to`
        is too (the candidates under the cap, and so the floor, stay the same up to the next
        largest piece); `last`: the floor, not the next piece, ended that run, so no M above
        it is refuted either (more candidates only lower the floor)."""
        piece_cap = m - self.piece_offset
        if piece_cap <= 0:
            return True, m, False
        usable = np.isfinite(self.maxp) & (self.maxp <= piece_cap)
        above = self.maxp[np.isfinite(self.maxp) & (self.maxp > piece_cap)]
        next_m = float(above.min()) + self.piece_offset if above.size else np.inf
        if not usable.any(axis=1).all():
            return True, next_m, False
        floor = self._floor(usable)
        if floor <= m:
            return False, m, True
        up_to = min(floor, next_m)
        return True, up_to, floor < next_m


def capped_bound(cands: list[list[Candidate]], mem: np.ndarray, caps: np.ndarray, gpus: int,
                 pipelined: bool, offsets: tuple[float, float], known_s: float) -> float:
    """The largest makespan found refuted above `known_s` (a bound already proven); 0 where
    nothing just above it is refuted. Costs no LP where memory does not bind under the cap
    (its cheapest choice fits the cluster), else one or two per M tested, within the LP
    budget above. A refuted M refutes the rest of its run of equal candidates up to the
    floor found there, so most bounds take a test or two; bisection covers the rest."""
    if known_s <= 0:
        return 0.0
    test = _Capped(cands, mem, caps, gpus, pipelined, offsets)
    lo, hi = known_s, None

    def refute(m: float) -> bool | None:
        """True: m refuted (lo raised); False: not; None: refuted and nothing above is."""
        nonlocal lo
        refuted, up_to, last = test.test(m)
        if not refuted:
            return False
        # Every M below up_to is refuted: take just under it (not past what was proven).
        lo = max(lo, m, up_to * (1 - _EDGE) if np.isfinite(up_to) else m)
        return None if last else True

    step = 0.02
    m = known_s * (1 + _REL_TOL)
    for _ in range(_GROW_STEPS):
        found = refute(m)
        if found is None:
            return lo if lo > known_s else 0.0
        if not found:
            hi = m
            break
        m = max(lo * (1 + _REL_TOL), known_s * (1 + step))
        step *= 2
    while hi is not None and hi - lo > _REL_TOL * lo:
        mid = (lo + hi) / 2
        found = refute(mid)
        if found is None:
            break
        if not found:
            hi = mid
    return lo if lo > known_s else 0.0
