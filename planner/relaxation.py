"""The LP relaxation of candidate choice, solved with OR-Tools' GLOP.

    min  sum_{t,c} work[t,c] x[t,c]
    s.t. sum_c x[t,c] = 1                       for every table t
         sum_{t,c} mem[t,c,k] x[t,c] <= cap[k]  for k in HBM, DDR, SSD (cluster totals)
         x >= 0

Its optimum is the Lagrangian dual's (the memory rows are the only coupling ones), so the
duals of the three memory rows are the best memory prices lambda for planner.bounds, and
every lambda >= 0 gives a valid bound there whatever the solver returned. With three coupling
rows a basic optimum has at most three tables split between candidates: rounding each table
to its largest x is a choice of candidates that nearly fits, which the priced start places.

The model is built from sparse arrays in one call (`fill_model_from_sparse_data`), not
variable by variable; units are milliseconds and GB so that GLOP's tolerances mean the same
on every instance.
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder as mb

from cost_models import HardwareProfile
from planner.candidates import Candidate

_MS = 1e3  # objective: seconds -> milliseconds
_GB = 1e-9  # memory rows: bytes -> GB


def candidate_matrix(cands: list[list[Candidate]], attr: str) -> np.ndarray:
    """(T, C) of a numeric Candidate attribute, inf where a table has fewer than C."""
    width = max(len(c) for c in cands)
    out = np.full((len(cands), width), np.inf)
    for i, cs in enumerate(cands):
        out[i, : len(cs)] = [getattr(c, attr) for c in cs]
    return out


def memory_matrix(cands: list[list[Candidate]]) -> np.ndarray:
    """(T, C, 3) HBM, DDR and SSD bytes, 0 where a table has fewer than C candidates."""
    width = max(len(c) for c in cands)
    out = np.zeros((len(cands), width, 3))
    for i, cs in enumerate(cands):
        out[i, : len(cs)] = [(c.hbm_total, c.ddr_total, c.ssd_total) for c in cs]
    return out


def cluster_caps(hw: HardwareProfile) -> np.ndarray:
    """(3,) the cluster's HBM (after the reserve and step buffers), DDR and SSD, bytes."""
    return np.array([hw.world_size * hw.hbm_cap, hw.hosts * hw.ddr_cap, hw.hosts * hw.ssd_cap],
                    dtype=float)


@dataclass(frozen=True)
class Relaxation:
    prices: np.ndarray  # (3,) duals of the HBM, DDR, SSD rows, seconds per byte, >= 0
    choice: np.ndarray  # per table, the column of its largest x (the lowest on ties)


def solve_relaxation(work: np.ndarray, mem: np.ndarray, caps: np.ndarray,
                     usable: np.ndarray | None = None) -> Relaxation | None:
    """The LP over `work` (T, C) and `mem` (T, C, 3), padded with inf / anything where a table
    has fewer than C candidates, under `caps` (3,) (inf: no cap). `usable` (T, C), if given,
    leaves out the False entries (every table needs one). None when GLOP finds no optimum
    (memory short of every mix of candidates, or the solver failed)."""
    ok = np.isfinite(work) if usable is None else np.isfinite(work) & usable
    if not ok.any(axis=1).all():
        return None
    rows, cols = np.nonzero(ok)  # row-major: each table's candidates in column order
    solved = _glop(work[rows, cols] * _MS, rows, cols, work.shape[0], mem, caps, slack=False)
    if solved is None:
        return None
    x, prices = solved
    prices = prices / _MS  # per byte of work in ms -> seconds
    dense = np.full(work.shape, -1.0)
    dense[rows, cols] = x
    return Relaxation(prices=prices, choice=dense.argmax(axis=1))


def excess_prices(mem: np.ndarray, caps: np.ndarray, usable: np.ndarray) -> np.ndarray | None:
    """Where no mix of the `usable` (T, C) candidates fits `caps` (3,): memory prices lambda
    >= 0 (per byte) from the LP that minimises the bytes over the caps, summed (GLOP; its
    memory rows' duals). By LP duality, at its optimum
      sum_t min_c lambda . mem[t,c] - lambda . caps = the least excess > 0,
    which a caller recomputes before relying on it (a Farkas certificate: scaled up, these
    prices drive the Lagrangian bound of any work past any budget). None when GLOP fails or
    finds the candidates fit."""
    if not usable.any(axis=1).all():
        return None
    rows, cols = np.nonzero(usable)
    solved = _glop(np.zeros(len(rows)), rows, cols, usable.shape[0], mem, caps, slack=True)
    return None if solved is None else solved[1]


def _glop(cost: np.ndarray, rows: np.ndarray, cols: np.ndarray, tables: int, mem: np.ndarray,
          caps: np.ndarray, slack: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """GLOP on: min cost . x (+ the bytes over the caps, summed, with `slack`) subject to
    each table's x summing to 1 and the memory rows under the finite caps; x over the
    (rows, cols) candidates. (x, memory-row duals turned into prices per byte) at the
    optimum; None when there is none, or with `slack`, when nothing is over the caps."""
    n = len(rows)
    coupled = np.flatnonzero(np.isfinite(caps))
    k = len(coupled) if slack else 0
    block = sp.csr_matrix(mem[rows, cols][:, coupled].T * _GB)
    if slack:
        block = sp.hstack([block, -sp.identity(k)])
    matrix = sp.vstack([sp.csr_matrix((np.ones(n), (rows, np.arange(n))), shape=(tables, n + k)),
                        block]).tocsr()
    model = mb.ModelBuilder()
    model.helper.fill_model_from_sparse_data(
        np.zeros(n + k), np.full(n + k, np.inf), np.concatenate([cost, np.ones(k)]),
        np.concatenate([np.ones(tables), np.full(len(coupled), -np.inf)]),
        np.concatenate([np.ones(tables), caps[coupled] * _GB]), matrix)
    solver = mb.ModelSolver("glop")
    if solver.solve(model) != mb.SolveStatus.OPTIMAL or (slack and solver.objective_value <= 0):
        return None
    x = solver.values(model.get_variables()).to_numpy()[:n]
    duals = solver.dual_values(model.get_linear_constraints()[tables:]).to_numpy()
    prices = np.zeros(3)
    prices[coupled] = np.maximum(-duals, 0.0) * _GB
    return x, prices
