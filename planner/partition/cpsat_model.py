"""The CP-SAT model of the partition: one candidate per table, a place for every group, caps,
minimise the slowest GPU.

Variables, per table t and candidate c (docs/DESIGN.md, "Partitioning"):
  x[t,c]             the table uses candidate c (exactly one per table);
  GPU scope          y[t,c,g,r]: group g (one piece) on rank r, sum_r y = x;
  HOST_FIXED scope   z[t,c,g,h]: group g on host h (piece j on the host's j-th GPU), sum_h z = x;
  HOST_FREE scope    z[t,c,h] and v[t,c,j,h,l]: piece j on local GPU l of host h, each piece
                     once on the chosen host, at most one piece per GPU;
  WORLD scope        fixed: piece i on rank i whenever x is set.
Per GPU r, load_r = base_r + sum of the chosen pieces' seconds + e_r <= T (and, when the step
is pipelined, its communication alone + e_r <= T: cost.step_time); HBM per GPU and DDR and
SSD per host stay
under caps. e_r is the owner side of the all-to-alls (cost_models/placement.py), per phase k:
  H[h,k] = owner seconds of the pieces on host h,   e[r,k] >= sum_h H[h,k] - H[host(r),k]
           - (inter-host seconds of r's own pieces),  e[r,k] >= 0.

Seconds become integers in units of `unit`, rounded down (the pieces' own inter-host seconds,
subtracted in e, rounded up). Every plan's true load is then at least unit * its integer load,
so unit * (the solver's bound) is a valid lower bound on the true makespan; the plan itself is
re-costed exactly by plan_build.

The same builder serves the exact model (every table, every GPU) and the large-neighbourhood
re-pack (a few GPUs, the tables that live only on them, the rest fixed as base load).
"""

from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from cost_models import step_time
from planner.candidates import Candidate, Group, Scope
from planner.partition.assignment import TableChoice
from planner.partition.greedy import allowed_mask
from planner.partition.state import LoadState
from planner.problem import Problem

# CP-SAT's integers are 64-bit: a capacity above this (a spec may give 1e20 bytes) binds
# nothing any real table set reaches, so it is held here.
CP_INT_MAX = 2**62


def cp_cap(value: int) -> int:
    """A capacity in bytes as CP-SAT can take it (CP_INT_MAX at most)."""
    return min(int(value), CP_INT_MAX)


class ExtractionError(RuntimeError):
    """A solution the model's own constraints should have ruled out (an internal error: the
    callers keep the heuristic plan and drop the model's bound, which is then suspect)."""


@dataclass
class _GroupPlacement:
    """The variables that place one group, and the ranks each one stands for."""

    options: list[tuple[cp_model.IntVar, np.ndarray]] = field(default_factory=list)
    # HOST_FREE only: per host, its z var and the v vars [piece][local GPU] (None if absent).
    free: list[tuple[int, cp_model.IntVar, list[list[cp_model.IntVar | None]]]] = field(
        default_factory=list)


@dataclass
class _CandVars:
    cand: Candidate
    x: cp_model.IntVar
    groups: list[_GroupPlacement]


@dataclass
class _Load:
    """Linear terms of one GPU's (or host's) resources."""

    vars: list[cp_model.IntVar] = field(default_factory=list)
    comp: list[int] = field(default_factory=list)
    comm: list[int] = field(default_factory=list)
    mem: list[int] = field(default_factory=list)  # HBM for a GPU
    inter: list[tuple[int, int, int]] = field(default_factory=list)  # per phase, GPU only
    # Host only: the vars with DDR or SSD, their bytes; every var on the host, its rates.
    mvars: list[cp_model.IntVar] = field(default_factory=list)
    ddr: list[int] = field(default_factory=list)
    ssd: list[int] = field(default_factory=list)
    rvars: list[cp_model.IntVar] = field(default_factory=list)
    rate: list[tuple[int, int, int]] = field(default_factory=list)


def ticks_of(x: Group | LoadState, unit: float,
             problem: Problem) -> tuple[np.ndarray, ...]:
    """Integer ticks of a group's pieces (or a load state's GPUs and hosts): compute, comm,
    own inter-host seconds per phase (rounded up), and the owner seconds per phase they
    cause on other hosts' GPUs (rounded down); see the module docstring for why."""
    nic, b = problem.hw.eff_nic_bw, problem.model.batch_per_gpu

    def down(seconds: np.ndarray) -> np.ndarray:
        return np.floor(np.asarray(seconds, dtype=np.float64) / unit).astype(np.int64)

    inter = np.ceil(x.inter / nic / unit).astype(np.int64)
    return down(x.comp), down(x.comm), inter, down(x.rate * b / nic)


class PartitionModel:
    """Builds the model over the ranks in `scope` for the tables in `free`; the loads and
    memory of everything else come in `base`. `group_host`, when given, puts group g of
    table t on host group_host[t][g] (the hierarchical mode's second level)."""

    def __init__(self, problem: Problem, cands: list[list[Candidate]], free: list[int],
                 scope: np.ndarray, base: LoadState, unit: float,
                 allow_world: bool, group_host: dict[int, list[int]] | None = None) -> None:
        self.problem, self.unit = problem, unit
        self.group_host = group_host
        hw = problem.hw
        self.g, self.w, self.hosts = hw.gpus_per_host, hw.world_size, hw.hosts
        self.scope = scope
        self.base = base
        self.model = cp_model.CpModel()
        self.gpu = [_Load() for _ in range(self.w)]
        self.host = [_Load() for _ in range(self.hosts)]
        whole_hosts = scope.reshape(self.hosts, self.g).all(axis=1)
        self.tables: dict[int, list[_CandVars]] = {}
        for t in free:
            pins = allowed_mask(problem, t)
            allowed = scope if pins is None else scope & pins
            entries = []
            for ci, cand in enumerate(cands[t]):
                if cand.scope is Scope.WORLD and not allow_world:
                    continue
                entry = self._candidate(t, ci, cand, allowed, whole_hosts)
                if entry is not None:
                    entries.append(entry)
            self.tables[t] = entries
            self.model.add_exactly_one(e.x for e in entries)
        self.makespan = self._limits()

    def _add_piece(self, var: cp_model.IntVar, rank: int, grp: Group, j: int,
                   ticks: tuple[np.ndarray, ...]) -> None:
        comp, comm, inter, rate = ticks
        gl = self.gpu[rank]
        gl.vars.append(var)
        gl.comp.append(int(comp[j]))
        gl.comm.append(int(comm[j]))
        gl.mem.append(int(grp.hbm[j]))
        gl.inter.append((int(inter[j, 0]), int(inter[j, 1]), int(inter[j, 2])))
        hl = self.host[rank // self.g]
        if grp.ddr[j] or grp.ssd[j]:
            hl.mvars.append(var)
            hl.ddr.append(int(grp.ddr[j]))
            hl.ssd.append(int(grp.ssd[j]))
        if rate[j].any():
            hl.rvars.append(var)
            hl.rate.append((int(rate[j, 0]), int(rate[j, 1]), int(rate[j, 2])))

    def _add_group(self, var: cp_model.IntVar, grp: Group, ranks: np.ndarray) -> None:
        ticks = ticks_of(grp, self.unit, self.problem)
        for j, r in enumerate(ranks.tolist()):
            self._add_piece(var, r, grp, j, ticks)

    def _candidate(self, t: int, ci: int, cand: Candidate, allowed: np.ndarray,
                   whole_hosts: np.ndarray) -> _CandVars | None:
        """The variables of one candidate, or None when some group has no place at all.

        Pins (`allowed`) restrict every piece: a GPU-scope piece goes to an allowed GPU; a
        HOST_FIXED group needs every GPU of its host in scope and allowed (piece j on local
        GPU j); a HOST_FREE group needs as many allowed GPUs of its host as it has pieces,
        and its pieces go only to those (the heuristic places it the same way)."""
        m, g = self.model, self.g
        hw = self.problem.hw
        per_host = allowed.reshape(self.hosts, g)
        fixed_ok = whole_hosts & per_host.all(axis=1)
        groups: list[tuple[np.ndarray, np.ndarray]] = []  # per group: GPUs, hosts it may use
        for gi, grp in enumerate(cand.groups):
            if cand.scope is Scope.WORLD:
                if not allowed.all():
                    return None
                groups.append((allowed, np.ones(self.hosts, dtype=bool)))
                continue
            if cand.scope is Scope.HOST_FREE:
                host_ok = per_host.sum(axis=1) >= len(grp)
            else:
                host_ok = fixed_ok
            on_gpus = allowed & (grp.hbm.max() <= hw.hbm_cap)
            if self.group_host is not None:
                only = self.group_host[t][gi]
                on_gpus = on_gpus & (np.arange(self.w) // g == only)
                host_ok = host_ok & (np.arange(self.hosts) == only)
            if cand.scope is Scope.GPU and not on_gpus.any():
                return None
            if cand.scope is not Scope.GPU and not host_ok.any():
                return None
            groups.append((on_gpus, host_ok))
        x = m.new_bool_var(f"x_t{t}_c{ci}")
        entry = _CandVars(cand, x, [])
        for gi, (grp, (on_gpus, on_hosts)) in enumerate(zip(cand.groups, groups, strict=True)):
            place = _GroupPlacement()
            if cand.scope is Scope.WORLD:
                place.options.append((x, np.arange(self.w)))
                self._add_group(x, grp, np.arange(self.w))
            elif cand.scope is Scope.GPU:
                for r in np.flatnonzero(on_gpus).tolist():
                    y = m.new_bool_var(f"y_t{t}_c{ci}_g{gi}_r{r}")
                    place.options.append((y, np.array([r])))
                    self._add_group(y, grp, np.array([r]))
                m.add(sum(v for v, _ in place.options) == x)
            elif cand.scope is Scope.HOST_FIXED:
                for h in np.flatnonzero(on_hosts).tolist():
                    z = m.new_bool_var(f"z_t{t}_c{ci}_g{gi}_h{h}")
                    ranks = h * g + np.arange(len(grp))
                    place.options.append((z, ranks))
                    self._add_group(z, grp, ranks)
                m.add(sum(v for v, _ in place.options) == x)
            else:
                self._host_free(t, ci, gi, grp, on_hosts, allowed, place, x)
            entry.groups.append(place)
        return entry

    def _host_free(self, t: int, ci: int, gi: int, grp: Group, host_ok: np.ndarray,
                   allowed: np.ndarray, place: _GroupPlacement, x: cp_model.IntVar) -> None:
        """z[h]: the group on host h; v[j][l]: piece j on local GPU l, only where GPU l is
        allowed (None elsewhere); each piece once, at most one piece per GPU."""
        m, g, k = self.model, self.g, len(grp)
        ticks = ticks_of(grp, self.unit, self.problem)
        zs = []
        for h in np.flatnonzero(host_ok).tolist():
            z = m.new_bool_var(f"z_t{t}_c{ci}_g{gi}_h{h}")
            zs.append(z)
            locs = [loc for loc in range(g) if allowed[h * g + loc]]
            v: list[list[cp_model.IntVar | None]] = []
            for j in range(k):
                row: list[cp_model.IntVar | None] = [None] * g
                for loc in locs:
                    var = m.new_bool_var(f"v_t{t}_c{ci}_g{gi}_h{h}_p{j}_l{loc}")
                    row[loc] = var
                    self._add_piece(var, h * g + loc, grp, j, ticks)
                m.add(sum(var for var in row if var is not None) == z)
                v.append(row)
            for loc in locs:
                m.add(sum(v[j][loc] for j in range(k)) <= z)
            place.free.append((h, z, v))
        # Always tied to x: a candidate with no host left can never be chosen.
        m.add(sum(zs) == x)

    def _base_ticks(self) -> tuple[np.ndarray, ...]:
        """The fixed part's compute, comm, own inter-host and per-host owner ticks."""
        return ticks_of(self.base, self.unit, self.problem)

    def _owner_side(self) -> dict[int, list[cp_model.IntVar]]:
        """e[r,k] per GPU in scope (none on one host, where nothing crosses a NIC)."""
        m = self.model
        self.host_rate_vars: list[list[cp_model.IntVar]] = []
        if self.hosts < 2:
            return {}
        _, _, base_inter, base_rate = self._base_ticks()
        top = int(base_rate.sum()) + sum(sum(sum(x) for x in hl.rate) for hl in self.host)
        top = max(top, 1)
        for h, hl in enumerate(self.host):
            row = []
            for k in range(3):
                v = m.new_int_var(0, top, f"owner_h{h}_k{k}")
                m.add(v == cp_model.LinearExpr.weighted_sum(hl.rvars, [x[k] for x in hl.rate])
                      + int(base_rate[h, k]))
                row.append(v)
            self.host_rate_vars.append(row)
        hv = self.host_rate_vars
        total = [sum(hv[h][k] for h in range(self.hosts)) for k in range(3)]
        out: dict[int, list[cp_model.IntVar]] = {}
        for r in np.flatnonzero(self.scope).tolist():
            gl, h = self.gpu[r], r // self.g
            es = []
            for k in range(3):
                e = m.new_int_var(0, top, f"owner_r{r}_k{k}")
                own = cp_model.LinearExpr.weighted_sum(gl.vars, [x[k] for x in gl.inter])
                m.add(e >= total[k] - hv[h][k] - own - int(base_inter[r, k]))
                es.append(e)
            out[r] = es
        self.owner_top = top
        return out

    def _limits(self) -> cp_model.IntVar:
        m, hw, base = self.model, self.problem.hw, self.base
        pipelined = self.problem.model.pipelined
        base_comp, base_comm, _, _ = self._base_ticks()
        base_load = step_time(base_comp, base_comm, pipelined)
        self.owner = self._owner_side()
        ranks = np.flatnonzero(self.scope)
        upper = int(base_load[ranks].max()) if len(ranks) else 0
        upper += 3 * getattr(self, "owner_top", 0)
        for r in ranks.tolist():
            gl = self.gpu[r]
            # Pipelined, a piece's comp side may be below 0 (CostBreakdown.sides).
            upper += sum(abs(c) for c in gl.comp) + sum(gl.comm)
        t_var = m.new_int_var(0, max(upper, 1), "makespan")
        for r in ranks.tolist():
            gl = self.gpu[r]
            wait = sum(self.owner.get(r, []))
            # cost.step_time: comp + comm, pipelined max(comp + comm, comm); the wait is comm.
            both = [a + b for a, b in zip(gl.comp, gl.comm, strict=True)]
            m.add(cp_model.LinearExpr.weighted_sum(gl.vars, both)
                  + int(base_comp[r] + base_comm[r]) + wait <= t_var)
            if pipelined:
                m.add(cp_model.LinearExpr.weighted_sum(gl.vars, gl.comm) + int(base_comm[r])
                      + wait <= t_var)
            free_hbm = cp_cap(int(hw.hbm_cap) - int(base.hbm[r]))
            if gl.vars and sum(gl.mem) > free_hbm:
                m.add(cp_model.LinearExpr.weighted_sum(gl.vars, gl.mem) <= free_hbm)
        for h, hl in enumerate(self.host):
            if not hl.mvars:
                continue
            free_ddr = cp_cap(int(hw.ddr_cap) - int(base.ddr[h]))
            free_ssd = cp_cap(int(hw.ssd_cap) - int(base.ssd[h]))
            if sum(hl.ddr) > free_ddr:
                m.add(cp_model.LinearExpr.weighted_sum(hl.mvars, hl.ddr) <= free_ddr)
            if sum(hl.ssd) > free_ssd:
                m.add(cp_model.LinearExpr.weighted_sum(hl.mvars, hl.ssd) <= free_ssd)
        m.minimize(t_var)
        return t_var

    @property
    def num_vars(self) -> int:
        return len(self.model.proto.variables)

    def hint(self, choices: dict[int, TableChoice]) -> None:
        """Hint every variable: the given choices set, everything else clear, and the
        makespan those choices give in the model's own integer units."""
        m = self.model
        on: set[int] = set()
        for t, entries in self.tables.items():
            ch = choices[t]
            for e in entries:
                if e.cand is not ch.cand:
                    continue
                on.add(e.x.index)
                for place, ranks in zip(e.groups, ch.ranks, strict=True):
                    target = np.asarray(ranks)
                    for var, rk in place.options:
                        if np.array_equal(rk, target):
                            on.add(var.index)
                    for h, z, v in place.free:
                        if int(target[0]) // self.g != h:
                            continue
                        on.add(z.index)
                        for j, r in enumerate(target.tolist()):
                            var = v[j][r - h * self.g]
                            if var is not None:
                                on.add(var.index)
        ints = self._hinted_ints(on)
        for i in range(len(m.proto.variables)):
            if i not in ints:
                m.add_hint(m.get_bool_var_from_proto_index(i), i in on)
        for i, value in ints.items():
            m.add_hint(m.get_int_var_from_proto_index(i), value)

    def _hinted_ints(self, on: set[int]) -> dict[int, int]:
        """The owner-side and makespan values the hinted booleans imply, by proto index."""
        pipelined = self.problem.model.pipelined
        base_comp, base_comm, base_inter, base_rate = self._base_ticks()
        out: dict[int, int] = {}
        rate = base_rate.copy()
        for h, hl in enumerate(self.host):
            for v, x in zip(hl.rvars, hl.rate, strict=True):
                if v.index in on:
                    rate[h] += np.array(x)
        for h, row in enumerate(self.host_rate_vars):
            for k, v in enumerate(row):
                out[v.index] = int(rate[h, k])
        total = rate.sum(axis=0)
        worst = 0
        for r in np.flatnonzero(self.scope).tolist():
            gl = self.gpu[r]
            chosen = [i for i, v in enumerate(gl.vars) if v.index in on]
            comp = int(base_comp[r]) + sum(gl.comp[i] for i in chosen)
            comm = int(base_comm[r]) + sum(gl.comm[i] for i in chosen)
            for k, e in enumerate(self.owner.get(r, [])):
                own = int(base_inter[r, k]) + sum(gl.inter[i][k] for i in chosen)
                value = max(0, int(total[k] - rate[r // self.g, k]) - own)
                out[e.index] = value
                comm += value
            worst = max(worst, int(step_time(comp, comm, pipelined)))
        out[self.makespan.index] = worst
        return out

    def extract(self, solver: cp_model.CpSolver) -> dict[int, TableChoice]:
        """The choices of the solver's best solution, for the tables this model decides."""
        out: dict[int, TableChoice] = {}
        for t, entries in self.tables.items():
            for e in entries:
                if not solver.boolean_value(e.x):
                    continue
                ranks = []
                for place in e.groups:
                    ranks.append(self._ranks_of(solver, place))
                out[t] = TableChoice(e.cand, ranks)
                break
        return out

    def _ranks_of(self, solver: cp_model.CpSolver, place: _GroupPlacement) -> np.ndarray:
        for var, ranks in place.options:
            if solver.boolean_value(var):
                return ranks
        for h, z, v in place.free:
            if not solver.boolean_value(z):
                continue
            local = [next(loc for loc, var in enumerate(row)
                          if var is not None and solver.boolean_value(var)) for row in v]
            return h * self.g + np.array(local, dtype=np.int64)
        raise ExtractionError("a chosen candidate's group has no placement in the solution")
