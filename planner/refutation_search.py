"""The search the refutation bounds share (planner/replica_bound.py, planner/packing_bound.py):
from a bound already proven, grow the makespan until a test stops refuting it, then bisect.

A refuted makespan is below the optimum whatever the tests' monotonicity, so the largest one
found is a valid bound; the search only decides how hard to look."""

from collections.abc import Callable


def largest_refuted(refuted: Callable[[float], bool], known_s: float, grow_steps: int,
                    rel_tol: float) -> tuple[float, bool] | None:
    """None when `known_s` itself is not refuted. Else (the largest makespan found refuted,
    whether one above it stood): growth steps of 2%, 4%, ... above `known_s` (at most
    `grow_steps`), then bisection to `rel_tol` between the last refuted and the first that
    stood."""
    if not refuted(known_s):
        return None
    lo, step, hi = known_s, 0.02, None
    for _ in range(grow_steps):
        trial = known_s * (1 + step)
        if not refuted(trial):
            hi = trial
            break
        lo, step = trial, step * 2
    if hi is None:
        return lo, False
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        if refuted(mid):
            lo = mid
        else:
            hi = mid
    return lo, True
