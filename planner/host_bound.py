"""A lower bound from the hosts' side: each host's GPUs together, with the owner side of the
all-to-alls, and the heaviest table's groups placed (branching, host symmetry).

The balanced bound (planner/bounds.py) spreads work over GPUs as if any mix were possible;
the owner-side bound (planner/owner_bound.py) looks at one GPU. Neither sees that a table too
heavy for one GPU must fill whole hosts (a grid or table-row-wise candidate puts a group of
pieces on every GPU of a host) and that those hosts then receive, over their NICs, the
pooled vectors of every piece elsewhere (cost_models/placement.py). Per host h (G GPUs, b
samples per GPU), summing a GPU's load comp + comm + wait over the host, and per phase k
sum_r max(0, d_rk) >= max(0, sum_r d_rk) over the owner deficits d (placement.owner_deficit):

  G M >= G fixed + sum of the loads on h + sum_k max(0, G b (Tot_k - R_hk) - I_hk) / NIC,

Tot_k the owner bytes per sample of every piece, R_hk those of the pieces on h, I_hk the
pieces on h's inter-host bytes. When the step is pipelined the loads are the two sides'
sum, x + y <= y + max(x, 0) (cost.step_time), so the same holds. Letting the choice of
candidates and each group's host be fractional gives an LP (GLOP): a relaxation, so its
optimum is at most every plan's makespan. Pins are left out (a relaxation too), which makes
every host alike (unless a world-scope group brings hosts different loads, _hosts_alike:
then every host tuple is its own branch and nothing is relabelled): any plan can be
relabelled so that the anchor table's groups land on hosts 0, 1, ... in the order of their
first use, so fixing the anchor's candidate and the partition of its groups over hosts,
branch by branch, leaves a relaxation of each branch, and the least over the branches
bounds every plan. The anchors are the tables whose cheapest
candidate carries the most work, in that order: the branch with the least bound is split on
the next anchor (its groups on the hosts already used or on new ones in order of first use,
placements alike up to relabelling kept once), best first, within a budget of LPs; the
least bound over the open branches holds whenever the search stops. (Spread fractionally,
a table's groups balance every host's owner side; fixed whole, they show the wait the plan
cannot avoid.)

Every candidate whose largest piece (plus the fixed seconds) exceeds T is left out of the LP
at T: a plan with makespan M <= T uses none of them, so if the LP at T is above T, every plan
of the branch is slower than T. The LP's value only falls as T grows, so per branch the
largest such T is found by bisection over the candidates' piece sizes, above the bound
already known. GLOP's optimum is trusted to within _TOL relative.
"""

import heapq
import itertools
from dataclasses import dataclass
from itertools import count

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder as mb

from cost_models import fixed_floors
from planner.candidates import Candidate, Scope
from planner.problem import Problem

_MS = 1e3  # seconds -> milliseconds in the LP
_GB = 1e-9  # bytes -> GB in the memory rows
_TOL = 1e-6
# Where hosts differ (_hosts_alike), a group set's placements are all host tuples, kept
# fractional above this many.
_MAX_PLACEMENTS = 64
# GLOP's simplex iterations per LP (the LPs here take tens to a few thousand).
_MAX_ITERATIONS = 20_000
# Above this many variables the bound is not computed (0): a few hundred tables on a few
# hosts; each LP is then milliseconds and a bound a few dozen of them.
MAX_VARS = 6_000
# The anchor's groups are placed by set partition (Bell(4) = 15 at most, fewer where groups
# are alike); a candidate with more groups keeps them fractional.
_MAX_GROUPS = 4


@dataclass(frozen=True)
class HostBound:
    value_s: float  # 0 when not computed or not above the bound it started from
    anchor: str  # the branched table's name ("" when not computed)
    branches: int  # branches solved
    lps: int  # LPs solved


@dataclass(frozen=True)
class _Lp:
    """The LP's fixed part: the constraint matrix and row bounds, the variables' layout."""

    matrix: sp.csr_matrix
    row_lb: np.ndarray
    row_ub: np.ndarray
    n_vars: int
    x_index: list[list[int]]  # per table, per candidate: the x column (0, 1, ... in order)
    z_index: list[list[list[int]]]  # per table, per candidate, per group: first z column
    m_col: int
    maxp: list[list[float]]  # per table, per candidate: largest piece + fixed seconds
    maxp_flat: np.ndarray  # the same in x column order


def _build(problem: Problem, cands: list[list[Candidate]], memory: bool) -> _Lp:
    hw, model = problem.hw, problem.model
    hosts, g = hw.hosts, hw.gpus_per_host
    # The load rows sum both sides (fixed: both fixed sides); a piece's own step rises by the
    # second of cost.fixed_floors only.
    fixed, piece_fixed = fixed_floors(problem.estimator.fixed(), model.pipelined,
                                      hw.constants.pipeline_overlap)
    owner = g * model.batch_per_gpu / hw.eff_nic_bw * _MS  # ms per owner byte per sample
    nic = _MS / hw.eff_nic_bw  # ms per inter-host byte
    n_tables = len(cands)
    col = count()
    x_index: list[list[int]] = []
    z_index: list[list[list[int]]] = []
    maxp: list[list[float]] = []
    entries: list[tuple[int, int, float]] = []  # (row, column, value)
    row = count()
    choose_rows = [next(row) for _ in range(n_tables)]
    for t, cs in enumerate(cands):
        x_index.append([next(col) for _ in cs])
        maxp.append([c.max_piece + piece_fixed for c in cs])
        for j in range(len(cs)):
            entries.append((choose_rows[t], x_index[t][j], 1.0))
    # Host rows come after the groups' rows; their numbers are known once groups are counted.
    groups = [(t, j, k) for t, cs in enumerate(cands) for j, c in enumerate(cs)
              if c.scope is not Scope.WORLD for k in range(len(c.groups))]
    group_rows = {key: next(row) for key in groups}
    load_rows = [next(row) for _ in range(hosts)]
    wait_rows = [[next(row) for _ in range(3)] for _ in range(hosts)]
    mem_rows = [[next(row) for _ in range(3)] for _ in range(hosts)]
    n_rows = next(row)
    for t, cs in enumerate(cands):
        z_index.append([])
        for j, c in enumerate(cs):
            x = x_index[t][j]
            total = sum(grp.rate.sum(axis=0) for grp in c.groups)
            for h in range(hosts):
                for k in range(3):  # Tot_k: every piece's owner bytes, wherever it is
                    entries.append((wait_rows[h][k], x, -owner * float(total[k])))
            z_index[t].append([])
            if c.scope is Scope.WORLD:
                for grp in c.groups:  # piece i on rank i
                    for h in range(hosts):
                        s = slice(h * g, (h + 1) * g)
                        _host_terms(entries, x, grp, s, load_rows[h], wait_rows[h],
                                    mem_rows[h], owner, nic)
                continue
            for k_grp, grp in enumerate(c.groups):
                first = next(col)
                z_index[t][j].append(first)
                for _ in range(hosts - 1):
                    next(col)
                r = group_rows[(t, j, k_grp)]
                entries.append((r, x, -1.0))
                for h in range(hosts):
                    entries.append((r, first + h, 1.0))
                    _host_terms(entries, first + h, grp, slice(None), load_rows[h],
                                wait_rows[h], mem_rows[h], owner, nic)
    w_first = next(col)
    for h in range(hosts):
        for k in range(3):
            if h or k:
                next(col)
            entries.append((wait_rows[h][k], w_first + 3 * h + k, 1.0))
            entries.append((load_rows[h], w_first + 3 * h + k, -1.0))
    m_col = next(col)
    n_vars = m_col + 1
    for h in range(hosts):
        entries.append((load_rows[h], m_col, float(g)))
    r_, c_, v_ = zip(*entries, strict=True)
    matrix = sp.csr_matrix((v_, (r_, c_)), shape=(n_rows, n_vars))
    lb = np.zeros(n_rows)
    ub = np.zeros(n_rows)
    lb[choose_rows] = ub[choose_rows] = 1.0
    for h in range(hosts):
        lb[load_rows[h]], ub[load_rows[h]] = g * fixed * _MS, np.inf
        for k in range(3):
            lb[wait_rows[h][k]], ub[wait_rows[h][k]] = 0.0, np.inf
        caps = (g * hw.hbm_cap, hw.ddr_cap, hw.ssd_cap)
        for k in range(3):
            lb[mem_rows[h][k]], ub[mem_rows[h][k]] = -np.inf, caps[k] * _GB if memory else np.inf
    return _Lp(matrix.tocsr(), lb, ub, n_vars, x_index, z_index, m_col, maxp,
               np.array([p for ps in maxp for p in ps]))


def _host_terms(entries: list[tuple[int, int, float]], var: int, grp, s: slice, load_row: int,
                wait_row: list[int], mem_row: list[int], owner: float, nic: float) -> None:
    """The pieces `s` of group `grp` on one host, scaled by column `var`: their loads, their
    owner bytes (R) and inter-host bytes (I) in the wait rows, their memory."""
    entries.append((load_row, var, -float((grp.comp[s] + grp.comm[s]).sum()) * _MS))
    rate, inter = grp.rate[s].sum(axis=0), grp.inter[s].sum(axis=0)
    for k in range(3):
        entries.append((wait_row[k], var, owner * float(rate[k]) + nic * float(inter[k])))
    for k, arr in enumerate((grp.hbm, grp.ddr, grp.ssd)):
        entries.append((mem_row[k], var, float(arr[s].sum()) * _GB))


def _solve(lp: _Lp, var_lb: np.ndarray, var_ub: np.ndarray) -> float | None:
    """The LP's optimum in seconds, None when GLOP proves none or fails."""
    obj = np.zeros(lp.n_vars)
    obj[lp.m_col] = 1.0
    model = mb.ModelBuilder()
    model.helper.fill_model_from_sparse_data(var_lb, var_ub, obj, lp.row_lb, lp.row_ub,
                                             lp.matrix)
    solver = mb.ModelSolver("glop")
    # A deterministic cap (a time limit would make the bound depend on the machine): one
    # degenerate LP of a drawn 4-host instance ran on for minutes. Capped, it proves nothing.
    solver.set_solver_specific_parameters(f"max_number_of_iterations: {_MAX_ITERATIONS}")
    if solver.solve(model) != mb.SolveStatus.OPTIMAL:
        return None
    return float(solver.objective_value) / _MS


def host_bound(problem: Problem, cands: list[list[Candidate]], known_s: float,
               memory: bool = True) -> HostBound:
    """The bound of the module docstring where it is above `known_s` (a bound already proven)
    and the largest piece every plan has; value 0 where it is not, on one host, or above
    MAX_VARS variables. `memory` False leaves the hosts' memory caps out (a bound on plans
    that need not fit, which benchmarks/bound_falsify holds random plans to).

    Branch and bound: the first anchor's branches all bounded (one that proves nothing
    above known_s ends it, as do more than _FIRST_MAX_LPS LPs: 0), then, best first, the
    branch with the least bound is split on the next anchor's candidate and placement,
    while the further LPs solved stay within _MAX_LPS and _LP_CELLS (LPs x variables;
    deterministic). The least bound over the open branches holds at any point, since they
    cover every plan."""
    none = HostBound(0.0, "", 0, 0)
    hosts = problem.hw.hosts
    if hosts < 2 or not cands:
        return none
    size = sum(1 + (0 if c.scope is Scope.WORLD else hosts * len(c.groups))
               for cs in cands for c in cs) + 3 * hosts + 1
    if size > MAX_VARS:  # the LP's columns, as _build lays them out
        return none
    lp = _build(problem, cands, memory)
    anchors = sorted(range(len(cands)), key=lambda t: (-min(c.work for c in cands[t]), t))
    anchors = anchors[:_DEPTH]
    # Every plan carries some piece of every table: the least largest piece is a bound.
    known_s = max(known_s, max(min(ps) for ps in lp.maxp))
    points = sorted({p for ps in lp.maxp for p in ps if p > known_s})
    search = _Search(lp, cands, hosts, points, None, _hosts_alike(problem, cands))
    name = problem.tables[anchors[0]].name
    heap: list[tuple[float, int, tuple[_Fix, ...]]] = [(known_s, 0, ())]
    order = count(1)
    while heap and len(heap[0][2]) < len(anchors):
        bound, _, fixes = heap[0]
        kids = search.expand(fixes, anchors[len(fixes)], bound)
        if kids is None:  # nothing above this branch's bound, or the budget spent
            break
        if search.budget is None:  # the first anchor's branches bounded: now the budget
            search.budget = search.lps + max(1, min(_MAX_LPS, _LP_CELLS // lp.n_vars))
        heapq.heappop(heap)
        for kid_bound, kid in kids:
            heapq.heappush(heap, (kid_bound, next(order), kid))
    value = heap[0][0] if heap else np.inf
    if not np.isfinite(value) or value <= known_s:
        return HostBound(0.0, name, search.branches, search.lps)
    return HostBound(float(value), name, search.branches, search.lps)


# A fixed choice: (table, candidate, host of each group; () where the groups stay
# fractional).
_Fix = tuple[int, int, tuple[int, ...]]
# Anchors branched on, in order (the tables whose cheapest candidate carries the most work).
_DEPTH = 3
# The LPs the splits below the first anchor may solve (the first anchor's branches are
# always bounded): at most _MAX_LPS, and _LP_CELLS as LPs x variables. criteo_dcnv2 on 4
# hosts (1,581 variables): 3.715 ms after the first anchor's ~50 LPs, 3.806 with 80 more,
# 3.811 with 120 (0.6, 1.0, 1.3 s); on 16 hosts (5,802) 43 more, which gain nothing there.
# Small instances solve many small LPs: without the count cap a 4-host instance of a few
# tables took seconds.
_MAX_LPS = 80
_LP_CELLS = 250_000
# The first anchor's branches, all bounded or no bound: at most this many LPs. The fixtures
# need at most 56 (criteo_dcnv2 x 16 h100 hosts); criteo_dcnv2 on 2 hosts of 8 GiB GPUs
# needed 244 LPs with memory rows (23 s on the 2-CPU machine) for 6.1847 ms where the
# other bounds give 6.1816.
_FIRST_MAX_LPS = 2 * _MAX_LPS


class _Search:
    """The branches' LPs: what each fixes, how many were solved, and children by anchor."""

    def __init__(self, lp: _Lp, cands: list[list[Candidate]], hosts: int,
                 points: list[float], budget: int | None, alike: bool) -> None:
        self.lp, self.cands, self.hosts, self.points = lp, cands, hosts, points
        self.alike = alike
        self.budget, self.lps, self.branches = budget, 0, 0
        self._sigs: dict[tuple[int, int], list[bytes]] = {}

    def _value_at(self, fixes: tuple[_Fix, ...], t_s: float) -> float | None:
        lp, hosts = self.lp, self.hosts
        for t, j, _ in fixes:
            if lp.maxp[t][j] > t_s * (1 + 1e-12):
                return np.inf  # a fixed candidate alone is slower than t_s
        self.lps += 1
        var_lb, var_ub = np.zeros(lp.n_vars), np.full(lp.n_vars, np.inf)
        # Candidates whose largest piece exceeds t_s left out (x columns come first).
        var_ub[:len(lp.maxp_flat)] = np.where(lp.maxp_flat <= t_s * (1 + 1e-12), 1.0, 0.0)
        for t, j_fix, labels in fixes:
            for j, x in enumerate(lp.x_index[t]):
                var_lb[x] = var_ub[x] = 1.0 if j == j_fix else 0.0
            for k, first in enumerate(lp.z_index[t][j_fix] if labels else ()):
                for h in range(hosts):
                    var_lb[first + h] = var_ub[first + h] = 1.0 if h == labels[k] else 0.0
        return _solve(lp, var_lb, var_ub)

    def proves(self, fixes: tuple[_Fix, ...], t_s: float) -> tuple[bool, float]:
        v = self._value_at(fixes, t_s)
        return (v is not None and v > t_s * (1 + _TOL)), (v or 0.0)

    def _key(self, fixes: tuple[_Fix, ...]) -> tuple:
        """The fixes up to a relabelling of hosts: each host's groups, as a sorted list
        (the fixes themselves where hosts differ)."""
        if not self.alike:
            return fixes
        per_host: dict[int, list[tuple[int, int, bytes]]] = {}
        for t, j, labels in fixes:
            sigs = self._sigs.setdefault((t, j), [_signature(g) for g in
                                                  self.cands[t][j].groups])
            if not labels:
                per_host.setdefault(-1 - t, []).append((t, j, b""))
            for k, h in enumerate(labels):
                per_host.setdefault(h, []).append((t, j, sigs[k]))
        return tuple(sorted(tuple(sorted(v)) for v in per_host.values()))

    def children(self, fixes: tuple[_Fix, ...], t: int) -> list[tuple[_Fix, ...]]:
        """Table t's candidates, each with its groups' hosts: the hosts already used or new
        ones in order of first use, one of each set alike up to relabelling."""
        used = max((max(labels) + 1 for _, _, labels in fixes if labels), default=0)
        out, seen = [], set()
        for j, c in enumerate(self.cands[t]):
            n = len(c.groups)
            if c.scope is Scope.WORLD or n > _MAX_GROUPS:
                out.append((*fixes, (t, j, ())))
                continue
            if self.alike:
                placements = _grown(n, used, self.hosts)
            elif self.hosts ** n <= _MAX_PLACEMENTS:
                placements = itertools.product(range(self.hosts), repeat=n)
            else:
                out.append((*fixes, (t, j, ())))
                continue
            for labels in placements:
                kid = (*fixes, (t, j, labels))
                key = self._key(kid)
                if key not in seen:
                    seen.add(key)
                    out.append(kid)
        return out

    def expand(self, fixes: tuple[_Fix, ...], t: int, bound: float
               ) -> list[tuple[float, tuple[_Fix, ...]]] | None:
        """The children's bounds, or None when one proves nothing above `bound` (splitting
        gains nothing) or the budget ends before every child is bounded."""
        kids = self.children(fixes, t)
        # The least constraining first, the likeliest to prove nothing: groups left
        # fractional, then fewer groups (a table-wise piece on one host), then the most
        # spread (hugectr_200 x 2 hosts: its table-wise child fails first, 5 -> 1 LP).
        kids.sort(key=lambda k: (len(k[-1][2]),
                                 -(max(k[-1][2]) + 1 if k[-1][2] else self.hosts), k))
        first = []
        for kid in kids:
            if self.lps >= (_FIRST_MAX_LPS if self.budget is None else self.budget):
                return None
            ok, v = self.proves(kid, bound)
            if not ok:
                return None
            first.append(v)
        out = []
        for i in sorted(range(len(kids)), key=lambda i: (first[i], i)):
            kid_bound = _branch_bound(kids[i], bound, first[i], self.points, np.inf,
                                      self.proves)
            if self.lps > (_FIRST_MAX_LPS if self.budget is None else self.budget):
                return None
            out.append((kid_bound, kids[i]))
        self.branches += len(kids)
        return out


def _hosts_alike(problem: Problem, cands: list[list[Candidate]]) -> bool:
    """Whether every host is alike to the LP: each world-scope group (piece i on rank i)
    brings each host exactly the same loads, bytes and memory. A row-wise table with skewed
    access or uneven row bands does not (its first band's host carries more), and then
    relabelling hosts is no longer free."""
    hosts, g = problem.hw.hosts, problem.hw.gpus_per_host
    for cs in cands:
        for c in cs:
            if c.scope is not Scope.WORLD:
                continue
            for grp in c.groups:
                for arr in (grp.comp + grp.comm, grp.hbm, grp.ddr, grp.ssd, grp.rate,
                            grp.inter):
                    per_host = arr.reshape(hosts, g, -1).sum(axis=1)
                    if not (per_host == per_host[0]).all():
                        return False
    return True


def _grown(n: int, used: int, hosts: int):
    """Host labels for n groups: any of the `used` hosts, or the next new one (restricted
    growth above them), below `hosts`."""
    def grow(prefix: list[int], top: int):
        if len(prefix) == n:
            yield tuple(prefix)
            return
        for label in range(min(top + 2, hosts)):
            yield from grow([*prefix, label], max(top, label))
    yield from grow([], used - 1)


def _signature(grp) -> bytes:
    return b"".join(np.ascontiguousarray(a).tobytes() for a in
                    (grp.comp, grp.comm, grp.rate, grp.inter, grp.hbm, grp.ddr, grp.ssd))


def _branch_bound(branch, known_s: float, v0: float, points: list[float], cap: float,
                  proves) -> float:
    """The largest T (at most `cap`) that the branch's LP proves no plan of it reaches, the
    LP having proven known_s with value v0. The LP's value v is constant on each segment
    [T_i, T_i+1) between piece sizes and falls from one to the next; on a segment, T is
    proven below v."""
    starts = [known_s, *(p for p in points if p < min(cap, v0))]
    # The last segment start that the LP proves (binary search: proven ones come first).
    lo, hi = 0, len(starts) - 1
    values = {0: v0}
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ok, v = proves(branch, starts[mid])
        if ok:
            lo, values[mid] = mid, v
        else:
            hi = mid - 1
    end = starts[lo + 1] if lo + 1 < len(starts) else cap
    # GLOP's optimum is trusted to within _TOL: the value is taken that much lower.
    return min(values[lo] * (1 - _TOL), end)
