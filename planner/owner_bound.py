"""A lower bound that counts the owner side of the all-to-alls and the replicas on every GPU.

The average and balanced bounds (planner/bounds.py) spread work evenly; on several hosts they
miss what a single GPU must carry whatever the plan: its own samples' pooled vectors from the
pieces on other hosts (the owner side, cost_models/placement.py), and a replica of every
data-parallel table. It holds for every plan of the candidate space. Below, a GPU's time is
compute + communication; when the step is pipelined (cost.step_time: max(x + y, y) over the
sides x = compute - input_a2a, y = comm, the owner-side wait in y) the same argument runs on
communication alone (load = comm, fixed = the fixed communication) and on the chain x + y
with the two output phases only (the ids phase's piece side is hidden there, and leaving its
owner side out lowers the floor; nonnic = x + y - the output phases' NIC >= compute >= 0, as
the argument needs), each a floor of the step, and the larger is taken.

Take any plan and any table a (the anchor). Let r be the GPU of the heaviest piece P of a's
chosen candidate, h its host (G GPUs), M the plan's step time. Per piece p write load_p =
comp + comm (what it adds to its GPU), nic_pk its inter-host bytes of phase k over the NIC
rate, nonnic_p = load_p - sum_k nic_pk, and own_pk = b * rate_pk / NIC (b samples per GPU;
rate the owner bytes per sample) for k in ids, vectors, gradients. On r, per phase the NIC
carries the longer of the pieces' side I_k(r) >= nic_Pk and the owner side O_k(h) = sum of
own_qk over the pieces q off host h (placement.py: a full-duplex NIC), so for any theta in
[0, 1]^3 (max(x, y) >= (1 - theta) x + theta y):

  (1) M >= load(r) >= fixed + a_P + sum_{q off h} o_q + sum of a_p over the other pieces on r,
      a_p = nonnic_p + sum_k (1 - theta_k) nic_pk,   o_q = sum_k theta_k own_qk.
  (2) G M >= sum over h's GPUs >= G fixed + sum_{p on h} load_p.

(1) + mu (2), mu >= 0: (1 + mu G) M >= fixed (1 + mu G) + a_P + mu load_P + sum over the
other pieces q of: mu load_q if q is on h, o_q if it is off h. A piece that is neither on r
nor anywhere forced is worth at least min(mu load_q, o_q), whatever host the plan gives it; a
data-parallel or row-wise group (piece i on rank i) is placed already, so it is worth its
share exactly, at the host of its own least: min over hosts h' of (min a_p on h' + mu load
on h' + o off h'). Minimizing over every table's candidates gives, for every mu and theta,

  M >= [fixed (1 + mu G) + sum_t min_c cost_t,c + max_a (min_c anchor_a,c - min_c cost_a,c)]
       / (1 + mu G),

a valid bound for each (mu, theta); the largest over a small grid is taken. On one host
there is no owner side and no piece off h (o = inf). Memory caps and pins are left out (a
relaxation: fewer constraints, a lower minimum). None of this reads the plan.
"""

from dataclasses import dataclass

import numpy as np

from cost_models.portable_math import dot_last
from planner.candidates import Candidate, Scope
from planner.problem import Problem

# The search over (theta, mu, nu, host_owner): hill climbing from these starts, each step to
# the first neighbour that is better (one theta_k to another of _THETAS, mu or nu halved or
# doubled or set to or from 0, host_owner flipped), until none is or _EVALS points have been
# valued. Deterministic; any point gives a valid bound.
_THETAS = (0.0, 0.5, 1.0)
_STARTS = (((0.0, 1.0, 1.0), 1 / 16, 0.0, False), ((1.0, 1.0, 1.0), 1 / 4, 1.0, False),
           ((0.0, 0.0, 0.0), 2.0, 4.0, False))
_EVALS = 150
# Above this many numbers in the flat arrays the bound is not computed (0): 10,000 tables on
# 1,024 GPUs would take gigabytes.
_MAX_CELLS = 8_000_000


@dataclass(frozen=True)
class _Pieces:
    """Per piece: load, nonnic (N,), nic and own (3, N), as in the module docstring."""

    load: np.ndarray
    nonnic: np.ndarray
    nic: np.ndarray
    own: np.ndarray

    def at(self, theta: np.ndarray, mu: float, nu: float, host_owner: bool, hosts: int,
           g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, what the piece costs on r's host, what it costs wherever it is) per piece."""
        keep = 1.0 - theta
        a = self.nonnic + keep[0] * self.nic[0] + keep[1] * self.nic[1] + keep[2] * self.nic[2]
        on_h = mu * (a if host_owner else self.load)
        if hosts > 1:
            scale = theta * (1.0 + mu * g if host_owner else 1.0)
            free = np.minimum(on_h, scale[0] * self.own[0] + scale[1] * self.own[1]
                              + scale[2] * self.own[2])
        else:  # one host: every piece is on h
            free = on_h.copy()
        if nu:
            free += nu * self.load
        return a, on_h, free


@dataclass(frozen=True)
class _Flat:
    """The distinct pieces of each candidate outside world scope with their counts, each
    candidate's heaviest piece, and the world candidates' pieces summed per host."""

    pieces: _Pieces  # distinct (candidate, piece figures) rows
    cand: np.ndarray  # (U,) candidate of each row
    count: np.ndarray  # (U,) how many of the candidate's pieces it stands for
    heavy: _Pieces  # (C,) each candidate's heaviest piece
    table: np.ndarray  # (C,) table of each candidate
    world: np.ndarray  # (K,) the candidates with one piece on every GPU
    # Per world candidate and host: the least nonnic and nic of its pieces there (their sum
    # bounds the least a_p from below), and the sums of load, nonnic, nic, own.
    w_min_nonnic: np.ndarray  # (K, H)
    w_min_nic: np.ndarray  # (K, H, 3)
    w_load: np.ndarray  # (K, H)
    w_nonnic: np.ndarray  # (K, H)
    w_nic: np.ndarray  # (K, H, 3)
    w_own: np.ndarray  # (K, H, 3)
    w_heavy_host: np.ndarray  # (K,) host of the heaviest piece


@dataclass(frozen=True)
class _Gathered:
    """Every piece of every candidate, flat (gathered once for both sides of a pipelined
    step): compute and communication seconds, NIC seconds and owner seconds per phase."""

    comp: np.ndarray  # (N,)
    comm: np.ndarray  # (N,)
    nic: np.ndarray  # (N, 3)
    own: np.ndarray  # (N, 3)
    sizes: list[int]  # pieces per candidate
    table: list[int]  # table of each candidate
    world: list[int]  # the candidates with one piece on every GPU


def _gather(cands: list[list[Candidate]], problem: Problem) -> _Gathered | None:
    hw = problem.hw
    w = hw.world_size
    # World candidates alone can pass the limit (one piece per GPU each): counted first.
    if 8 * w * sum(c.scope is Scope.WORLD for cs in cands for c in cs) > _MAX_CELLS:
        return None
    groups, sizes, table, world = [], [], [], []
    for t, cs in enumerate(cands):
        for c in cs:
            n = 0
            for grp in c.groups:
                groups.append(grp)
                n += len(grp.comp)
            if c.scope is Scope.WORLD and n == w:
                world.append(len(sizes))
            sizes.append(n)
            table.append(t)
    if 8 * sum(sizes) + 14 * len(world) * hw.hosts > _MAX_CELLS:
        return None
    nic_bw = hw.eff_nic_bw
    return _Gathered(
        comp=np.concatenate([grp.comp for grp in groups]),
        comm=np.concatenate([grp.comm for grp in groups]),
        nic=np.concatenate([np.asarray(grp.inter).reshape(-1, 3) for grp in groups]) / nic_bw,
        own=np.concatenate([np.asarray(grp.rate).reshape(-1, 3) for grp in groups])
        * (problem.model.batch_per_gpu / nic_bw),
        sizes=sizes, table=table, world=world)


def _flatten(gathered: _Gathered, problem: Problem, side: str) -> _Flat:
    """`side`: "total" (compute + communication), or for a pipelined step "comm" (its
    communication) or "chain" (its two sides' sum, the output phases' NIC terms only)."""
    hw = problem.hw
    h, g, w = hw.hosts, hw.gpus_per_host, hw.world_size
    sizes, table, world = gathered.sizes, gathered.table, gathered.world
    comp, comm, nic, own = gathered.comp, gathered.comm, gathered.nic, gathered.own
    load = comm if side == "comm" else comp + comm
    if side == "chain":  # the ids phase left out (module docstring)
        nic, own = nic.copy(), own.copy()
        nic[:, 0] = 0.0
        own[:, 0] = 0.0
    nonnic = load - nic.sum(axis=1)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    # Each candidate's heaviest piece: the first at its largest load.
    cand_of = np.repeat(np.arange(len(sizes)), sizes)
    top = np.maximum.reduceat(load, starts)
    at_top = np.flatnonzero(load == top[cand_of])
    heavy = at_top[np.r_[True, cand_of[at_top][1:] != cand_of[at_top][:-1]]]
    world_a = np.array(world, dtype=np.int64)
    k = len(world_a)
    idx = (starts[world_a][:, None] + np.arange(w)[None, :]).reshape(k, h, g)
    # Pieces of one shape cost alike: each run of equal pieces in a candidate (an even split's
    # rows, a column split's chunks) once, with its length (no sort: 0.07 s at 1,000 tables).
    in_world = np.zeros(len(sizes), dtype=bool)
    in_world[world_a] = True
    keep = ~in_world[cand_of]
    rows = np.column_stack([cand_of[keep], load[keep], nonnic[keep], nic[keep], own[keep]])
    starts_run = np.ones(len(rows), dtype=bool)
    starts_run[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    uniq = rows[starts_run]
    count = np.diff(np.r_[np.flatnonzero(starts_run), len(rows)])
    return _Flat(
        pieces=_Pieces(load=uniq[:, 1].copy(), nonnic=uniq[:, 2].copy(),
                       nic=np.ascontiguousarray(uniq[:, 3:6].T),
                       own=np.ascontiguousarray(uniq[:, 6:9].T)),
        cand=uniq[:, 0].astype(np.int64), count=count.astype(float),
        heavy=_Pieces(load=load[heavy], nonnic=nonnic[heavy],
                      nic=np.ascontiguousarray(nic[heavy].T),
                      own=np.ascontiguousarray(own[heavy].T)),
        table=np.array(table), world=world_a,
        w_min_nonnic=nonnic[idx].min(axis=2), w_min_nic=nic[idx].min(axis=2),
        w_load=load[idx].sum(axis=2), w_nonnic=nonnic[idx].sum(axis=2),
        w_nic=nic[idx].sum(axis=2), w_own=own[idx].sum(axis=2),
        w_heavy_host=(heavy[world_a] - starts[world_a]) // g)


def _values(f: _Flat, theta: np.ndarray, mu: float, nu: float, host_owner: bool,
            hosts: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(cost, anchor) per candidate at one point (mu, nu per GPU); see the module docstring."""
    _, _, free = f.pieces.at(theta, mu, nu, host_owner, hosts, g)
    cost = np.bincount(f.cand, weights=f.count * free, minlength=len(f.table))
    a, on_h, free_h = f.heavy.at(theta, mu, nu, host_owner, hosts, g)
    anchor = cost - free_h + nu * f.heavy.load + a + on_h
    if len(f.world):
        keep = 1.0 - theta
        off_scale = 1.0 + mu * g if host_owner else 1.0
        on = mu * (f.w_nonnic + dot_last(f.w_nic, keep) if host_owner else f.w_load)  # (K, H)
        wo = dot_last(f.w_own, theta) * off_scale
        off = wo.sum(axis=1, keepdims=True) - wo if hosts > 1 else np.zeros_like(on)
        base = nu * f.w_load.sum(axis=1, keepdims=True) + on + off
        cost[f.world] = (f.w_min_nonnic + dot_last(f.w_min_nic, keep) + base).min(axis=1)
        k = np.arange(len(f.world))
        anchor[f.world] = a[f.world] + base[k, f.w_heavy_host]
    return cost, anchor


_Point = tuple[tuple[float, float, float], float, float, bool]


def _neighbours(p: _Point) -> list[_Point]:
    theta, mu, nu, ho = p
    out: list[_Point] = []
    for k in range(3):
        for x in _THETAS:
            if x != theta[k]:
                out.append(((*theta[:k], x, *theta[k + 1:]), mu, nu, ho))
    for m in ((mu / 2, mu * 2) if mu > 0 else (1 / 64,)) + ((0.0,) if mu > 0 else ()):
        out.append((theta, m, nu, ho))
    for v in ((nu / 2, nu * 2) if nu > 0 else (1 / 4,)) + ((0.0,) if nu > 0 else ()):
        out.append((theta, mu, v, ho))
    out.append((theta, mu, nu, not ho))
    return out


def owner_bound(problem: Problem, cands: list[list[Candidate]]) -> float:
    """The bound of the module docstring, seconds (0 when the candidates are too many to hold
    as arrays)."""
    if not cands:
        return 0.0
    gathered = _gather(cands, problem)
    if gathered is None:
        return 0.0
    fixed = problem.estimator.fixed()
    if not problem.model.pipelined:
        return _side_bound(problem, gathered, "total", fixed.compute + fixed.comm)
    return max(_side_bound(problem, gathered, "comm", fixed.comm),
               _side_bound(problem, gathered, "chain",
                           sum(fixed.sides(True, problem.hw.constants.pipeline_overlap))))


def _side_bound(problem: Problem, gathered: _Gathered, side: str, fixed_s: float) -> float:
    hw = problem.hw
    g, hosts, w = hw.gpus_per_host, hw.hosts, hw.world_size
    f = _flatten(gathered, problem, side)
    t_start = np.flatnonzero(np.r_[True, f.table[1:] != f.table[:-1]])
    seen: dict[_Point, float] = {}

    def value(p: _Point) -> float:
        if p not in seen:
            theta, m, v, ho = p
            if hosts == 1:  # no owner side: theta and ho play no part
                theta, ho = (0.0, 0.0, 0.0), False
            mu, nu = m / g, v / w
            cost, anchor = _values(f, np.array(theta), mu, nu, ho, hosts, g)
            least = np.minimum.reduceat(cost, t_start)
            gain = float((np.minimum.reduceat(anchor, t_start) - least).max())
            scale = 1.0 + mu * g + nu * w
            seen[p] = (fixed_s * scale + float(least.sum()) + gain) / scale
        return seen[p]

    best = 0.0
    for start in _STARTS:
        point, val = start, value(start)
        improved = True
        while improved and len(seen) < _EVALS:
            improved = False
            for nxt in _neighbours(point):
                if value(nxt) > val:
                    point, val, improved = nxt, value(nxt), True
                    break
        best = max(best, val)
    return best
