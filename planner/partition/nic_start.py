"""A start for several hosts: the relaxation's choice with every GPU's NIC floor in view.

On several hosts each GPU's NIC carries, per phase of the all-to-alls, the longer of its
pieces' inter-host bytes and its samples' owner side (cost_models/placement.py), and the
owner side is about the same on every GPU: (H - 1) / H of the owner bytes of every piece.
So a GPU's step is at least its fixed seconds, its replicas' share, that owner side and the
rest of its pieces' work, e = comp + comm - inter-host seconds: the part of a piece's work
that no NIC time hides. Pieces heavy in e (many lookups, few pooled vectors) then pack into
what is left, C = bound - fixed - owner side - replicas, and two of them may not fit one GPU
even where the cluster's average says they do: hugectr_510 on 2 h100 hosts has 20
table-wise pieces of e = 6.9 ms against C = 13.3 on 16 GPUs, so four of its tables must be
split, not twenty (the plan grown from the plain relaxation split all twenty, 36.17 ms
against a bound of 34.27; from this one, 34.93).

The relaxation here is planner/relaxation.py's (least work, one candidate per table, the
cluster's memory) with the packing rows of planner/packing_bound.py over e / C added (the
u_k and threshold functions: sum over the chosen pieces <= W). It is a start, not a bound:
C is an estimate (the owner side of the least-work choice, spread evenly over the hosts),
and the rows need not hold for every plan. Returned only where the rows change the choice.
"""

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder as mb

from cost_models import fixed_floors
from planner.candidates import Candidate, Scope
from planner.nic_floor import exposed_seconds
from planner.packing_bound import dff_rows
from planner.problem import Problem
from planner.relaxation import cluster_caps

_MS = 1e3  # objective: seconds -> milliseconds
_GB = 1e-9  # memory rows: bytes -> GB
# Sizes scaled down by this before the functions (as packing_bound does).
_SAFE = 1e-9
# No LP above this many (candidate, piece) values in all.
_MAX_PIECES = 400_000


def _exposed(c: Candidate, nic_bw: float) -> np.ndarray:
    """Each piece's work less its inter-host seconds (none for a world-scope candidate's:
    those sit on every GPU and are taken off the capacity instead)."""
    if c.scope is Scope.WORLD:
        return np.zeros(0)
    return np.concatenate([exposed_seconds(g, nic_bw) for g in c.groups])


def _rows(cands: list[Candidate], nic_bw: float, cap: float, gpus: int) -> np.ndarray:
    """(R, candidates) the packing functions but the identity of each piece's exposed
    seconds over `cap`, summed over each candidate's pieces, over the GPUs."""
    exposed = [_exposed(c, nic_bw) for c in cands]
    owner = np.repeat(np.arange(len(cands)), [len(e) for e in exposed])
    values = dff_rows(np.clip(np.concatenate(exposed) / cap, 0.0, 1.0) * (1 - _SAFE))[1:]
    return np.vstack([np.bincount(owner, weights=v, minlength=len(cands)) for v in values]
                     ) / gpus


def nic_packing_choice(problem: Problem, cands: list[list[Candidate]], bound_s: float
                       ) -> list[int] | None:
    """Per table, the index of its candidate in the relaxation with the NIC-floor packing
    rows (module docstring); None on one host, for a pipelined step, where the rows leave
    the least-work choice as it is, or where the LP has no optimum."""
    hw, model = problem.hw, problem.model
    if hw.hosts < 2 or model.pipelined or bound_s <= 0:
        return None
    if sum(len(g) for cs in cands for c in cs for g in c.groups) > _MAX_PIECES:
        return None
    nic = hw.eff_nic_bw
    fixed = fixed_floors(problem.estimator.fixed(), False, hw.constants.pipeline_overlap)[0]
    least = [min(range(len(cs)), key=lambda j: (cs[j].work, j)) for cs in cands]
    chosen = [cs[j] for cs, j in zip(cands, least, strict=True)]
    owner = sum(float(g.rate.sum()) for c in chosen for g in c.groups)
    owner_s = model.batch_per_gpu * owner / nic * (hw.hosts - 1) / hw.hosts
    replicas_s = sum(c.work for c in chosen if c.scope is Scope.WORLD) / hw.world_size
    cap = bound_s - fixed - owner_s - replicas_s
    if cap <= 0:
        return None
    flat = [c for cs in cands for c in cs]
    table = np.repeat(np.arange(len(cands)), [len(cs) for cs in cands])
    starts = np.concatenate([[0], np.cumsum([len(cs) for cs in cands])[:-1]])
    picked = starts + np.array(least)
    if not (_rows([flat[i] for i in picked], nic, cap, hw.world_size).sum(axis=1) > 1.0).any():
        return None  # the least-work choice keeps every row: nothing new to grow
    rows = _rows(flat, nic, cap, hw.world_size)
    caps = cluster_caps(hw)
    finite = np.flatnonzero(np.isfinite(caps) & (caps > 0))
    mem = np.array([(c.hbm_total, c.ddr_total, c.ssd_total) for c in flat], dtype=float)
    n, tables = len(flat), len(cands)
    matrix = sp.vstack([
        sp.csr_matrix((np.ones(n), (table, np.arange(n))), shape=(tables, n)),
        sp.csr_matrix(rows),
        sp.csr_matrix(mem[:, finite].T * _GB)]).tocsr()
    lp = mb.ModelBuilder()
    lp.helper.fill_model_from_sparse_data(
        np.zeros(n), np.ones(n), np.array([c.work for c in flat]) * _MS,
        np.concatenate([np.ones(tables), np.full(len(rows) + len(finite), -np.inf)]),
        np.concatenate([np.ones(tables), np.ones(len(rows)), caps[finite] * _GB]), matrix)
    solver = mb.ModelSolver("glop")
    if solver.solve(lp) != mb.SolveStatus.OPTIMAL:
        return None
    x = solver.values(lp.get_variables()).to_numpy()
    return [int(np.argmax(x[s:s + len(cs)])) for s, cs in zip(starts, cands, strict=True)]
