"""Lower bounds on the slowest GPU's step time that hold for every plan in the candidate space.

Every plan picks one candidate per table, and its slowest GPU carries at least
  (a) the average load: (sum of the chosen candidates' work) / W, and
  (b) the largest single piece of any chosen candidate.
So  LB = max( sum_t min_c work[t,c] / W ,  max_t min_c max_piece[t,c] ).
The first term tightens with memory: the chosen candidates together fit the cluster's total
HBM, DDR and SSD, so for any prices lambda >= 0 (Lagrangian relaxation of those three caps)
  sum_t work[t,c_t] >= sum_t min_c (work[t,c] + lambda . mem[t,c]) - lambda . cap,
and every lambda gives a valid bound; the best lambda are the duals of the memory rows of
the LP relaxation of candidate choice (planner/relaxation.py, GLOP), whose optimum this
equals. When the step is pipelined, a GPU's step is max(comp + comm, comm) (cost.step_time,
over the candidates' sides): the average bound is taken on both, each a valid floor.
Both combine into one bound that is much tighter when there are few tables per GPU: if the
best plan's slowest GPU is M, every chosen candidate has its largest piece <= M, so
  S(M) = sum_t min{ work[t,c] + lambda . mem[t,c] : max_piece[t,c] <= M } - lambda . cap <= W*M.
S is a non-increasing step function of M, so the smallest M that satisfies this is found by
bisection over the candidates' max_piece values; it is a valid lower bound.
Pins tighten it: the tables pinned inside a set P of ranks put all their pieces on P, so the
same two bounds hold on P alone, with |P| GPUs (and P's share of HBM, DDR and SSD) in place
of the cluster's; each distinct pin set is tried, with every table pinned inside it (the
owner side of the all-to-alls is at least zero, so leaving it out keeps the bound valid). It
is folded into balanced_s, which it never lowers. So is the capped-LP bound
(planner/capped_bound.py): the same LP re-solved over the candidates under each M, with its
own memory prices, where short memory leaves only large-piece candidates that fit.
The owner-side bound (planner/owner_bound.py) adds what one GPU must carry
whatever the plan: the busiest piece, every replica, and its samples' vectors from pieces on
other hosts, traded against what its host can hold.
The host bound (planner/host_bound.py) sums each host's GPUs with the owner side, the
heaviest table's groups placed branch by branch: hosts that one large table fills must
receive the other tables' vectors, a wait no spreading of work removes.
The replica bound (planner/replica_bound.py) charges the replicas every GPU holds to the GPU
of each large piece: a table may keep a piece nearly as large as the makespan only where few
replicas are chosen, and the work of choosing fewer is counted.
The packing bound (planner/packing_bound.py) counts that pieces land whole: dual feasible
functions of the pieces' sizes over the makespan, summed over the chosen candidates, fit W
(26 table-wise pieces of equal size on 8 GPUs: some GPU holds four). On several hosts it
also leaves out, per makespan, the candidates whose heaviest piece's GPU cannot carry it
beside its host's owner side (planner/nic_floor.py), and packs the pieces' exposed seconds
into what each GPU has above that floor.
None of this reads the plan the partitioner chose.
"""

from dataclasses import dataclass, replace

import numpy as np

from cost_models import fixed_floors
from cost_models.portable_math import dot_last
from planner.candidates import Candidate
from planner.capped_bound import capped_bound
from planner.host_bound import host_bound
from planner.owner_bound import owner_bound
from planner.packing_bound import packing_bound_detail
from planner.problem import Problem
from planner.relaxation import (
    candidate_matrix,
    cluster_caps,
    memory_matrix,
    solve_relaxation,
)
from planner.replica_bound import replica_bound


@dataclass(frozen=True)
class LowerBound:
    value_s: float
    average_s: float  # (a), memory-priced when that is tighter
    largest_piece_s: float  # (b)
    balanced_s: float  # the combined bound: smallest M with S(M) <= W*M
    memory_priced: bool
    prices: tuple[float, float, float]  # lambda for HBM, DDR, SSD, seconds per byte
    solver_s: float = 0.0  # CP-SAT's best bound on the exact model, when it ran
    pinned_s: float = 0.0  # the pinned-set part of balanced_s (0 without pins)
    # The busiest piece's GPU with its replicas and owner side (planner/owner_bound.py).
    owner_s: float = 0.0
    # Each host's GPUs with the owner side, one table's groups placed (planner/host_bound.py;
    # 0 where not computed or not above the other bounds: one host, too large an LP).
    host_s: float = 0.0
    # Every large piece's GPU with the replicas beside it (planner/replica_bound.py; 0 where
    # not computed or not above the other bounds: pipelined, no replicas, too many
    # candidates).
    replica_s: float = 0.0
    # The chosen pieces packed whole into the GPUs (planner/packing_bound.py; 0 where not
    # computed or not above the other bounds: pipelined, too many pieces).
    packing_s: float = 0.0
    # Whether the packing bound ruled candidates out by their heaviest piece's GPU's NIC floor
    # (planner/nic_floor.py) at the makespan it gave.
    nic_floor: bool = False

    def with_solver(self, solver_s: float) -> "LowerBound":
        """Adopt the solver's bound where it is tighter (it is valid over the same space)."""
        return replace(self, value_s=max(self.value_s, solver_s), solver_s=solver_s)


def _dual(work: np.ndarray, mem: np.ndarray, caps: np.ndarray, lam: np.ndarray) -> float:
    priced = work + dot_last(mem, lam)
    return float(priced.min(axis=1).sum() - dot_last(caps, lam))


def lagrangian_bound(work: np.ndarray, mem: np.ndarray, caps: np.ndarray
                     ) -> tuple[float, np.ndarray]:
    """max over lambda >= 0 of the Lagrangian dual: lambda the duals of the memory rows of the
    LP relaxation (planner/relaxation.py), whose optimum the dual's equals. The value is the
    dual function at that lambda, recomputed here: any lambda >= 0 gives a valid bound, so a
    solver's inexact duals only loosen it. lambda = 0 (no memory prices) when GLOP fails."""
    relaxed = solve_relaxation(work, mem, caps)
    lam = np.zeros(3) if relaxed is None else relaxed.prices
    value = _dual(work, mem, caps, lam)
    plain = _dual(work, mem, caps, np.zeros(3))
    return (value, lam) if value > plain else (plain, np.zeros(3))


def balanced_bound(work: np.ndarray, maxp: np.ndarray, mem: np.ndarray, caps: np.ndarray,
                   lam: np.ndarray, capacity_per_s: float) -> float:
    """Smallest M such that S(M) <= capacity_per_s * M (see the module docstring)."""
    priced = work + dot_last(mem, lam)
    offset = float(dot_last(caps, lam))
    floor = float(maxp.min(axis=1).max())
    points = np.unique(maxp[np.isfinite(maxp) & (maxp >= floor)])

    def s_of(m: float) -> float:
        return float(np.where(maxp <= m, priced, np.inf).min(axis=1).sum()) - offset

    # Segment i is [points[i], points[i+1]); S is constant on it and falls from one to the next.
    lo, hi = 0, len(points) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if s_of(float(points[mid + 1])) <= capacity_per_s * float(points[mid + 1]):
            hi = mid
        else:
            lo = mid + 1
    # Within segment lo the smallest M is max(its start, S / capacity), unless that passes
    # the segment's end, where the condition was seen to hold.
    m = max(float(points[lo]), s_of(float(points[lo])) / capacity_per_s)
    if lo + 1 < len(points):
        m = min(m, float(points[lo + 1]))
    return m


# Pin sets tried: the _MAX_PIN_SETS whose own tables weigh most per GPU get the plain
# average bound; the full one (memory prices, balanced) runs on the _FULL_PIN_SETS of them
# whose plain bound is highest. Any subset of sets gives a valid bound; this keeps it cheap.
_MAX_PIN_SETS, _FULL_PIN_SETS = 256, 8


def _offset(attr: str, offsets: tuple[float, float]) -> float:
    """What the fixed seconds add to a floor on `attr` (cost.fixed_floors' two offsets: on
    the pieces' work, on their comm alone)."""
    return offsets[0] if attr == "work" else offsets[1]


def _work_bounds(cands: list[list[Candidate]], caps: np.ndarray, gpus: int,
                 pipelined: bool, offsets: tuple[float, float] = (0.0, 0.0),
                 mem: np.ndarray | None = None) -> tuple[float, float, float, np.ndarray]:
    """(plain average, memory-priced average, balanced, prices) of `cands` on `gpus` GPUs
    holding `caps` of HBM, DDR and SSD: every bound of the module docstring but the largest
    piece, each floor raised by the fixed seconds `offsets` (cost.fixed_floors: on the
    pieces' work, on their comm alone)."""
    mem = memory_matrix(cands) if mem is None else mem
    maxp = candidate_matrix(cands, "max_piece")
    parts = ["work", "comm_work"] if pipelined else ["work"]
    plain, priced, balanced, prices = 0.0, 0.0, 0.0, np.zeros(3)
    for attr in parts:
        off = _offset(attr, offsets)
        work = candidate_matrix(cands, attr)
        plain = max(plain, float(work.min(axis=1).sum()) / gpus + off)
        value, lam = lagrangian_bound(work, mem, caps)
        if value / gpus + off > priced:
            priced, prices = value / gpus + off, lam
        # The balanced bound's M also caps each chosen piece's own step, which rises by the
        # second offset only (equal to the first unless a pipelined step's fixed compute
        # side is positive).
        for trial in (np.zeros(3), lam):
            balanced = max(balanced, balanced_bound(work, maxp, mem, caps, trial,
                                                    gpus) + offsets[1])
    return plain, priced, balanced, prices


def pinned_bound(problem: Problem, cands: list[list[Candidate]],
                 offsets: tuple[float, float] = (0.0, 0.0)) -> float:
    """The balanced and average bounds on each pin set P alone, over the tables pinned
    inside P (see the module docstring); 0 when no table is pinned to fewer than all GPUs."""
    hw = problem.hw
    w, g = hw.world_size, hw.gpus_per_host
    by_set: dict[int, list[int]] = {}  # pin set as a bit mask -> its tables
    sizes: dict[int, int] = {}
    for i, t in enumerate(problem.tables):
        pins = set(t.constraints.pinned_ranks or ())
        if pins and len(pins) < w:
            mask = sum(1 << r for r in pins)
            by_set.setdefault(mask, []).append(i)
            sizes[mask] = len(pins)
    if not by_set:
        return 0.0
    pipelined = problem.model.pipelined
    parts = ("work", "comm_work") if pipelined else ("work",)
    floors = {a: candidate_matrix(cands, a).min(axis=1) for a in parts}

    def plain(idx: list[int], gpus: int) -> float:
        return max(float(floors[a][idx].sum()) / gpus + _offset(a, offsets) for a in parts)

    # Which sets P to try: the _MAX_PIN_SETS whose own tables weigh most per GPU; each then
    # with every table whose pin set lies inside it.
    tried = sorted(by_set, key=lambda m: (-plain(by_set[m], sizes[m]), m))[:_MAX_PIN_SETS]
    members = {p: [i for q, idx in by_set.items() if q & ~p == 0 for i in idx] for p in tried}
    quick = {p: plain(members[p], sizes[p]) for p in tried}
    best = max(quick.values())
    for p in sorted(tried, key=lambda m: (-quick[m], m))[:_FULL_PIN_SETS]:
        sub = [cands[i] for i in sorted(members[p])]
        hosts = len({r // g for r in range(w) if p >> r & 1})
        caps = np.array([sizes[p] * hw.hbm_cap, hosts * hw.ddr_cap, hosts * hw.ssd_cap],
                        dtype=float)
        _, priced, balanced, _ = _work_bounds(sub, caps, sizes[p], pipelined, offsets)
        best = max(best, priced, balanced)
    return best


def lower_bound(problem: Problem, cands: list[list[Candidate]]) -> LowerBound:
    hw = problem.hw
    w = hw.world_size
    # Every GPU also pays the step's fixed latency (cost.step_fixed): each floor rises by
    # what cost.fixed_floors says it may (on the pieces' work by both fixed sides; on comm
    # alone and on one piece's step_time, pipelined, by less where the fixed compute side
    # is positive, as a calibrated profile's phase starts make it).
    offsets = fixed_floors(problem.estimator.fixed(), problem.model.pipelined,
                           hw.constants.pipeline_overlap)
    largest = float(candidate_matrix(cands, "max_piece").min(axis=1).max()) + offsets[1]
    caps = cluster_caps(hw)
    mem = memory_matrix(cands)
    pipelined = problem.model.pipelined
    plain, priced, balanced, prices = _work_bounds(cands, caps, w, pipelined, offsets, mem)
    pinned = pinned_bound(problem, cands, offsets)
    average = max(plain, priced)
    owner = owner_bound(problem, cands)  # counts the fixed latency itself
    known = max(average, largest, balanced, pinned, owner)
    capped = capped_bound(cands, mem, caps, w, pipelined, offsets, known)
    known = max(known, capped)
    host = host_bound(problem, cands, known).value_s  # counts the fixed latency itself
    replica = replica_bound(problem, cands, max(known, host))  # counts it too
    packing, nic = packing_bound_detail(problem, cands, max(known, host, replica),
                                        prices)  # and it
    return LowerBound(
        value_s=max(known, host, replica, packing),
        average_s=average,
        largest_piece_s=largest,
        balanced_s=max(balanced, pinned, capped),
        memory_priced=priced > plain * (1 + 1e-9),
        prices=(float(prices[0]), float(prices[1]), float(prices[2])),
        pinned_s=pinned,
        owner_s=owner,
        host_s=host,
        replica_s=replica,
        packing_s=packing,
        nic_floor=nic,
    )
