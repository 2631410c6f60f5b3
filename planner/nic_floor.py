"""Which candidates no plan of makespan M can use, because the GPU holding their heaviest
piece would also carry its host's NIC floor: the owner side of the all-to-alls.

On several hosts a GPU r on host h pays, per step (cost_models/placement.py, the analytic
model's loads as partition/state.py sums them):

    load_r = F + sum over its pieces of e_p + sum_k max(O_hk, I_rk),

F its fixed seconds, e_p = comp + comm - inter-host seconds (a piece's work that its NIC
time does not cover), I_rk its pieces' inter-host seconds in phase k, and O_hk =
b * (owner bytes per sample of the pieces off host h) / NIC, the same for every GPU of h.
So a GPU holding piece P carries at least F + e_P + (the replicas' exposed share, on every
GPU) + sum_k max(O_hk, I_Pk). The owner side O_h is what the placement can move: a host
that holds more of the pooled-vector-heavy pieces receives less. But every host's GPUs must
fit under M too, with their own owner side; so the least O_h any host can have is the
optimum of an LP over the hosts' contents (host h and the other H - 1 together, each
table's candidate and each group's share of host h fractional, each host side's load
summed with its NIC deficit as in planner/host_bound.py: sum_r max(0, d_r) >= max(0,
sum_r d_r)):

    min  replicas' exposed share + sum_k u_k,   u_k >= O_hk,   u_k >= I_Pk
    s.t. one candidate per table; each group's share of h between 0 and its candidate's;
         h: sum of its pieces' work + sum_k max(0, G O_hk - I_hk) <= G (M - F);
         the others: the same, summed, <= (H - 1) G (M - F);
         the cluster's memory; and, for P's own floor, P's candidate chosen and P on h.

A candidate whose heaviest piece P has e_P > M - F - (that optimum) is in no plan of
makespan <= M. The optimum is read through its duals: the Lagrangian at GLOP's duals is
recomputed here over the variables' bounds (a lower bound on the LP's optimum whatever
GLOP's tolerances, by weak duality), so a candidate is ruled out only on a proven floor.
The floor without P (no candidate forced, u_k >= O_hk only) is one LP per M and holds for
every candidate; P's own floor, higher, is solved for the few candidates nearest the edge.

A heavy piece that fits (e_P over half the room, so no two share a GPU) still leaves its GPU
waiting on the owner side: the GPU's other pieces have at most M - F - e_P - O of e, hence
at most that over rho inter-host seconds (rho: the least e per inter-host second of any
piece), too few to fill O - I_P. Each GPU's load is F + its work + its wait, so that wait
(`deficit`, from the owner-only optimum of the same LP) adds to the cluster's average.

Identical tables (same candidates, piece for piece) are one class in the LP, their choices
summed: the LP over classes has the same optimum (any solution averages over a class's
tables). Pipelined steps are left alone (their compute side can hide input all-to-all
seconds, so the floor above is not theirs): nothing is excluded there.
"""

import hashlib

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder as mb

from cost_models import fixed_floors
from planner.candidates import Candidate, Group, Scope
from planner.problem import Problem
from planner.relaxation import cluster_caps

_MS = 1e3  # seconds -> milliseconds in the LP
_GB = 1e-9  # bytes -> GB in the memory rows
# Above this many LP columns (class candidates and groups) no floor is computed: classes of
# identical tables keep the fixtures' LPs at a few hundred columns, where one is about 10
# ms; 1,000 distinct tables on 16 hosts (synthetic_1000) would be 15,830, about 0.2 s each.
_MAX_COLUMNS = 6_000
# Candidates whose own floor is solved per makespan, at most: those whose heaviest exposed
# piece takes at least _OWN_SHARE of what the floor without them leaves.
_OWN_FLOORS = 6
_OWN_SHARE = 0.75
# GLOP's simplex iterations per LP (tens to a few hundred here); past them, no floor.
_MAX_ITERATIONS = 20_000
# A floor counts only this far (relative) below its recomputed value.
_MARGIN = 1e-9


def exposed_seconds(g: Group, nic_bw: float) -> np.ndarray:
    """Each piece's exposed seconds: its work (comp + comm) less its inter-host seconds, the
    part its NIC time does not cover."""
    return g.comp + g.comm - g.inter.sum(axis=1) / nic_bw


def _exposed(c: Candidate, nic_bw: float) -> list[np.ndarray]:
    return [exposed_seconds(g, nic_bw) for g in c.groups]


def _signature(cs: list[Candidate]) -> bytes:
    """A table's candidates, piece for piece, as bytes: equal for identical tables."""
    h = hashlib.sha256()
    for c in cs:
        h.update(f"{c.kind.value}|{c.tier.value}|{c.cache_ratio}|{c.scope.value}|".encode())
        for g in c.groups:
            for arr in (g.comp, g.comm, g.inter, g.rate, g.hbm, g.ddr, g.ssd):
                h.update(np.ascontiguousarray(arr).tobytes())
                h.update(b"/")
        h.update(b";")
    return h.digest()


class NicFloor:
    """The LP of the module docstring over a problem's candidates, built once; `excluded`
    answers per makespan."""

    def __init__(self, problem: Problem, cands: list[list[Candidate]], memory: bool = True
                 ) -> None:
        hw, model = problem.hw, problem.model
        self.active = hw.hosts > 1 and not model.pipelined
        self.room = 0.0  # excluded's last: a GPU's seconds above its floor
        self.deficit = np.zeros(0)  # excluded's last: per class candidate, its owner wait
        if not self.active:
            return
        nic = hw.eff_nic_bw
        b = model.batch_per_gpu
        self.hosts, self.g = hw.hosts, hw.gpus_per_host
        self.fixed = fixed_floors(problem.estimator.fixed(), False,
                                  hw.constants.pipeline_overlap)[0]
        # Tables with different candidates' work or largest piece are in different classes:
        # where even those keys give too many columns, no class is hashed.
        rough: dict[tuple, int] = {}
        for cs in cands:
            rough.setdefault(tuple((c.work, c.max_piece) for c in cs), sum(
                1 + (0 if c.scope is Scope.WORLD else len(c.groups)) for c in cs))
        if sum(rough.values()) > _MAX_COLUMNS:
            self.active = False
            return
        # Classes of identical tables: their first table stands for all.
        first: dict[bytes, int] = {}
        self.class_of = np.array([first.setdefault(_signature(cs), len(first))
                                  for cs in cands])
        first_table = np.unique(self.class_of, return_index=True)[1]  # class ids in order
        reps = [cands[int(t)] for t in first_table]
        mult = np.bincount(self.class_of).astype(float)
        flat = [c for cs in reps for c in cs]
        self.flat_of_class = np.repeat(np.arange(len(reps)), [len(cs) for cs in reps])
        # Each table's candidates, in order, map onto its class's: column offsets.
        self.col_start = np.concatenate([[0], np.cumsum([len(cs) for cs in reps])[:-1]])
        n = len(flat)
        groups = [(i, g) for i, c in enumerate(flat) if c.scope is not Scope.WORLD
                  for g in c.groups]
        if n + len(groups) > _MAX_COLUMNS:
            self.active = False
            return
        hosts, g = self.hosts, self.g
        # Per candidate, the coefficients of its choice x in host h's rows and in the other
        # hosts' rows (seconds; per phase where three). A non-world candidate's pieces reach
        # h through its groups' shares z; a world-scope one's (a piece on every GPU) are
        # split over the hosts by rank, and each row takes the split that loosens it (the
        # least or the most any host holds), so the rows hold for every host.
        hx_work, ox_work = np.zeros(n), np.zeros(n)
        hx_o, hx_i, ox_o, ox_i = (np.zeros((n, 3)) for _ in range(4))
        share = np.zeros(n)  # the replicas' exposed seconds on one GPU (the least)
        self.emax = np.zeros(n)
        self.heavy: list[tuple[int, np.ndarray]] = []  # per candidate: (group, P's inter s)
        negative = False
        # The least exposed seconds any piece brings per inter-host second it sends (over
        # every piece with some): a GPU's other pieces fill its owner deficit by at most
        # their e / rho.
        self.rho = np.inf
        for i, c in enumerate(flat):
            exposed = _exposed(c, nic)
            for grp, e in zip(c.groups, exposed, strict=True):
                sent = grp.inter.sum(axis=1) / nic
                if (sent > 0).any():
                    self.rho = min(self.rho, float((e[sent > 0] / sent[sent > 0]).min()))
            if c.scope is Scope.WORLD:
                share[i] = sum(float(e.min()) for e in exposed)
                per_host = sum((grp.comp + grp.comm).reshape(hosts, g).sum(axis=1)
                               for grp in c.groups)
                inter_h = sum(grp.inter.reshape(hosts, g, 3).sum(axis=1) for grp in c.groups)
                owner_h = sum(b * grp.rate.reshape(hosts, g, 3).sum(axis=1)
                              for grp in c.groups)
                inter_h, owner_h = inter_h / nic, owner_h / nic
                hx_work[i] = per_host.min()
                ox_work[i] = c.work - per_host.max()
                hx_o[i] = owner_h.sum(axis=0) - owner_h.max(axis=0)
                hx_i[i] = inter_h.max(axis=0)
                ox_o[i] = (hosts - 2) * owner_h.sum(axis=0) + owner_h.min(axis=0)
                ox_i[i] = inter_h.sum(axis=0) - inter_h.min(axis=0)
                self.heavy.append((-1, np.zeros(3)))
                continue
            negative |= any(bool((e < 0).any()) for e in exposed)
            owner_c = sum(b * grp.rate.sum(axis=0) for grp in c.groups) / nic
            hx_o[i] = owner_c
            ox_work[i] = c.work
            ox_o[i] = (hosts - 2) * owner_c
            ox_i[i] = sum(grp.inter.sum(axis=0) for grp in c.groups) / nic
            k = int(np.argmax([float(e.max()) for e in exposed]))
            p = int(np.argmax(exposed[k]))
            self.emax[i] = float(exposed[k][p])
            self.heavy.append((k, c.groups[k].inter[p] / nic))
        if negative:
            # A piece whose work is less than its NIC seconds could lower its GPU's load
            # below the floor by sharing it: the argument needs e >= 0.
            self.active = False
            return
        self.n, self.ng = n, len(groups)
        g_of = np.array([i for i, _ in groups], dtype=int)
        g_work = np.array([float((grp.comp + grp.comm).sum()) for _, grp in groups])
        g_inter = np.array([grp.inter.sum(axis=0) / nic for _, grp in groups]).reshape(-1, 3)
        g_owner = np.array([b * grp.rate.sum(axis=0) / nic for _, grp in groups]).reshape(-1, 3)
        # Each candidate's first group column (groups are listed candidate by candidate).
        self.group_start = np.zeros(n, dtype=int)
        firsts, at = np.unique(g_of, return_index=True)
        self.group_start[firsts] = at
        x_cols, z_cols = np.arange(n), n + np.arange(self.ng)
        s0, s1, u = n + self.ng, n + self.ng + 3, n + self.ng + 6
        self.n_cols = n + self.ng + 9
        rows: list[tuple[np.ndarray, np.ndarray, float, float]] = []

        def row(cols: np.ndarray, vals: np.ndarray, lo: float, hi: float) -> None:
            keep = vals != 0
            rows.append((cols[keep], vals[keep], lo, hi))

        for k in range(len(reps)):  # one candidate per table, summed over the class
            cols = x_cols[self.flat_of_class == k]
            row(cols, np.ones(len(cols)), mult[k], mult[k])
        for j in range(self.ng):  # a group's share of h at most its candidate's
            row(np.array([z_cols[j], g_of[j]]), np.array([1.0, -1.0]), -np.inf, 0.0)
        # h: its pieces' work + sum_k s0_k <= G (M - F), s0_k >= G O_hk - I_hk, with
        # O_hk = the owner seconds of the pieces off h.
        self.load_rows = [len(rows)]
        row(np.concatenate([x_cols, z_cols, s0 + np.arange(3)]),
            np.concatenate([hx_work, g_work, np.ones(3)]), -np.inf, 0.0)
        for k in range(3):
            row(np.concatenate([[s0 + k], x_cols, z_cols]),
                np.concatenate([[1.0], -g * hx_o[:, k] + hx_i[:, k],
                                g * g_owner[:, k] + g_inter[:, k]]), 0.0, np.inf)
        # The other hosts summed: their work + sum_k s1_k <= (H - 1) G (M - F), s1_k >= G
        # (their owner sides summed: (H - 2) Tot_k + R_hk) - their inter-host seconds.
        self.load_rows.append(len(rows))
        row(np.concatenate([x_cols, z_cols, s1 + np.arange(3)]),
            np.concatenate([ox_work, -g_work, np.ones(3)]), -np.inf, 0.0)
        for k in range(3):
            row(np.concatenate([[s1 + k], x_cols, z_cols]),
                np.concatenate([[1.0], -g * ox_o[:, k] + ox_i[:, k],
                                -g * g_owner[:, k] - g_inter[:, k]]), 0.0, np.inf)
        for k in range(3):  # u_k >= O_hk
            row(np.concatenate([[u + k], x_cols, z_cols]),
                np.concatenate([[1.0], -hx_o[:, k], g_owner[:, k]]), 0.0, np.inf)
        if memory:
            caps = cluster_caps(hw)
            mem = np.array([(c.hbm_total, c.ddr_total, c.ssd_total) for c in flat], dtype=float)
            for a in np.flatnonzero(np.isfinite(caps) & (caps > 0)):
                row(x_cols, mem[:, a] * _GB, -np.inf, float(caps[a]) * _GB)
        self.objective = np.zeros(self.n_cols)
        self.objective[x_cols] = share * _MS
        self.objective[u:u + 3] = _MS
        # The owner side alone (no replicas' share): what a heavy piece's deficit reads.
        self.owner_objective = np.zeros(self.n_cols)
        self.owner_objective[u:u + 3] = _MS
        self.u = u
        r_idx = np.concatenate([np.full(len(c), i) for i, (c, _, _, _) in enumerate(rows)])
        self.matrix = sp.csr_matrix(
            (np.concatenate([v for _, v, _, _ in rows]) * _MS,
             (r_idx, np.concatenate([c for c, _, _, _ in rows]))),
            shape=(len(rows), self.n_cols))
        # Every row is scaled by _MS (seconds -> ms; the memory rows' GB alike).
        self.row_lo = np.array([lo for _, _, lo, _ in rows]) * _MS
        self.row_hi = np.array([hi for _, _, _, hi in rows]) * _MS
        self.mult = mult
        # Bounds on the helper columns that every plan of makespan <= M meets (finite, so
        # that the Lagrangian is finite): a group's share of h at most its class's tables; a
        # host side's NIC deficit at most what its load row allows; u_k at most the owner
        # side of every piece off h, or P's inter-host seconds.
        self.z_hi = mult[self.flat_of_class[g_of]]
        self.owner_max = np.zeros(3)
        for k in range(len(reps)):
            self.owner_max += mult[k] * hx_o[self.flat_of_class == k].max(axis=0)

    def lp_bounds(self, m: float, usable: np.ndarray, forced: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(column lower, column upper, row lower, row upper) bounds of the LP at makespan m
        over the usable class candidates, `forced` (a class candidate) chosen with its
        heaviest piece on h; the matrix and objective are `matrix` and `objective`."""
        lo_v = np.zeros(self.n_cols)
        hi_v = np.full(self.n_cols, np.inf)
        hi_v[:self.n] = np.where(usable, self.mult[self.flat_of_class], 0.0)
        hi_v[self.n:self.n + self.ng] = self.z_hi
        row_hi = self.row_hi.copy()
        cap = (m - self.fixed) * _MS
        row_hi[self.load_rows[0]] = self.g * cap
        row_hi[self.load_rows[1]] = (self.hosts - 1) * self.g * cap
        hi_v[self.u - 6:self.u - 3] = self.g * cap / _MS
        hi_v[self.u - 3:self.u] = (self.hosts - 1) * self.g * cap / _MS
        hi_v[self.u:self.u + 3] = self.owner_max
        if forced is not None:
            k, inter_p = self.heavy[forced]
            lo_v[forced] = 1.0
            lo_v[self.n + self.group_start[forced] + k] = 1.0
            lo_v[self.u:self.u + 3] = inter_p
            hi_v[self.u:self.u + 3] = np.maximum(self.owner_max, inter_p)
        return lo_v, hi_v, self.row_lo, row_hi

    def floor(self, m: float, usable: np.ndarray, forced: int | None = None,
              owner_only: bool = False) -> float:
        """A proven lower bound (seconds) on the LP's optimum at makespan m over the usable
        class candidates, `forced` (a class candidate) chosen with its heaviest piece on h;
        with `owner_only`, of the owner side alone (no replicas' share); -inf where none is
        found."""
        lo_v, hi_v, row_lo, row_hi = self.lp_bounds(m, usable, forced)
        objective = self.owner_objective if owner_only else self.objective
        lp = mb.ModelBuilder()
        lp.helper.fill_model_from_sparse_data(lo_v, hi_v, objective, row_lo, row_hi,
                                              self.matrix)
        solver = mb.ModelSolver("glop")
        solver.set_solver_specific_parameters(f"max_number_of_iterations: {_MAX_ITERATIONS}")
        if solver.solve(lp) != mb.SolveStatus.OPTIMAL:
            return -np.inf
        y = solver.dual_values(lp.get_linear_constraints()).to_numpy()
        return max(_lagrangian(objective, self.matrix, row_lo, row_hi, lo_v, hi_v,
                               sign * y) for sign in (1.0, -1.0)) / _MS

    def excluded(self, m: float, usable: np.ndarray) -> np.ndarray:
        """Per class candidate (the flat order of the classes' first tables), whether no
        plan of makespan <= m can use it; `usable` the class candidates still in play. Only
        where `active`."""
        room = m - self.fixed - self.floor(m, usable, None)
        self.room = room  # what every GPU has left above its floor for its pieces' e
        out = usable & (self.emax > room * (1 + _MARGIN))
        # Own floors for the candidates with the heaviest exposed pieces not yet ruled out
        # (each floor holds with the exclusions found before it).
        near = np.flatnonzero(usable & ~out & (self.emax >= _OWN_SHARE * room))
        for i in near[np.argsort(-self.emax[near], kind="stable")][:_OWN_FLOORS]:
            own = m - self.fixed - self.floor(m, usable & ~out, int(i))
            if self.emax[i] > own * (1 + _MARGIN):
                out[i] = True
        self.deficit = self._deficits(m, usable & ~out, room)
        return out

    def _deficits(self, m: float, usable: np.ndarray, room: float) -> np.ndarray:
        """Per class candidate, the owner wait its heaviest piece P's GPU carries at least
        in a plan of makespan <= m (0 for a piece of at most half the room, two of which may
        share a GPU). With O the GPU's owner side (at least the owner-only floor O_f), its
        other pieces' e at most m - F - e_P - O, and their inter-host seconds at most their
        e / rho, the wait sum_k max(0, O_k - I_k) >= O - I_P - (m - F - e_P - O) / rho,
        which rises with O. Two such pieces (each over half the room) never share a GPU, so
        their waits add up over the cluster's loads."""
        out = np.zeros(self.n)
        heavy = usable & (self.emax > 0.5 * room * (1 + _MARGIN))
        if not heavy.any() or not np.isfinite(room):
            return out
        owner = self.floor(m, usable, owner_only=True)
        if not np.isfinite(owner) or owner <= 0:
            return out
        for i in np.flatnonzero(heavy):
            sent = float(self.heavy[i][1].sum())
            fill = (m - self.fixed - self.emax[i] - owner) / self.rho if self.rho > 0 else (
                np.inf)
            out[i] = max(0.0, owner - sent - max(fill, 0.0)) * (1 - _MARGIN)
        return out

    def flat_mask(self, class_mask: np.ndarray, cands: list[list[Candidate]]) -> np.ndarray:
        """Per class candidate values (a mask, or emax) spread over every table's candidates
        (planner order)."""
        parts = [class_mask[self.col_start[k]:self.col_start[k] + len(cs)]
                 for k, cs in zip(self.class_of, cands, strict=True)]
        return np.concatenate(parts)

    def class_mask(self, flat: np.ndarray, cands: list[list[Candidate]]) -> np.ndarray:
        """A mask over every table's candidates read on the classes: a class candidate is
        usable where any table of the class has it usable."""
        out = np.zeros(self.n, dtype=bool)
        pos = 0
        for k, cs in zip(self.class_of, cands, strict=True):
            out[self.col_start[k]:self.col_start[k] + len(cs)] |= flat[pos:pos + len(cs)]
            pos += len(cs)
        return out


def _lagrangian(c: np.ndarray, a: sp.csr_matrix, row_lo: np.ndarray, row_hi: np.ndarray,
                lo_v: np.ndarray, hi_v: np.ndarray, y: np.ndarray) -> float:
    """min over lo_v <= v <= hi_v of c.v - y.(A v - b), b the row bound y's sign points at
    (lo for y > 0, hi for y < 0; y set to 0 where that bound is infinite): a lower bound on
    min c.v over the rows and bounds for any such y (weak duality)."""
    y = np.where((y > 0) & np.isfinite(row_lo), y, np.where((y < 0) & np.isfinite(row_hi), y,
                                                            0.0))
    b = np.where(y > 0, row_lo, np.where(y < 0, row_hi, 0.0))
    reduced = c - a.T @ y
    with np.errstate(invalid="ignore"):
        at_lo = np.where(reduced >= 0, reduced * lo_v, np.nan)
        at_hi = np.where(reduced < 0, reduced * hi_v, np.nan)
    if np.isinf(at_hi[reduced < 0]).any() or np.isinf(at_lo[reduced >= 0]).any():
        return -np.inf
    return float(np.nansum(at_lo) + np.nansum(at_hi) + y @ b)
