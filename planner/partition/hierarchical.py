"""Hierarchical CP-SAT: tables and pieces to hosts first, then pieces to GPUs within each host.

Level 1 decides every table's candidate and the host of every group, on host totals: per
host h, with T the makespan,
    sum of the host's pieces' seconds + e[h] <= G * T      (and, when the step is pipelined,
                                                            the communication alone)
    T >= the largest piece of each chosen candidate
    HBM of the host's pieces <= G * HBM cap;  DDR, SSD <= the host's caps
    e[h,k] >= G * b * (owner bytes of all pieces - of the host's) - the host's own inter bytes
Each is implied by the per-GPU constraints of the exact model (summed over the host's GPUs;
the owner side by convexity of max), so level 1 relaxes the exact model and its bound is a
valid lower bound on every plan in the candidate space, with W/G times fewer placement
variables. Level 2 fixes those choices and hosts and solves the placement on GPUs (the exact
model restricted to them), where HBM per GPU is checked again.
"""

import logging
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from cost_models import step_time
from planner.candidates import Candidate, Group, Scope
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.cpsat import (
    UNITS_PER_MAKESPAN,
    Progress,
    ProgressFn,
    SolveResult,
    hit_wall,
    makespan,
    solver_params,
)
from planner.partition.cpsat_model import ExtractionError, PartitionModel, cp_cap, ticks_of
from planner.partition.greedy import allowed_mask
from planner.partition.state import LoadState
from planner.problem import Problem

log = logging.getLogger("planner.hierarchical")

# Share of the budget for level 1; level 2 gets the rest.
_LEVEL1_SHARE = 0.6


def host_model_size(problem: Problem, cands: list[list[Candidate]]) -> int:
    """Variables of the level-1 model, without building it."""
    hosts = problem.hw.hosts
    return sum(1 + (0 if c.scope is Scope.WORLD else len(c.groups) * hosts)
               for cs in cands for c in cs)


@dataclass
class _Entry:
    cand: Candidate
    x: cp_model.IntVar
    hosts: list[list[tuple[int, cp_model.IntVar]]]  # per group: (host, var)


class HostModel:
    def __init__(self, problem: Problem, cands: list[list[Candidate]], unit: float) -> None:
        self.problem, self.unit = problem, unit
        hw = problem.hw
        self.g, self.hosts = hw.gpus_per_host, hw.hosts
        m = self.model = cp_model.CpModel()
        n = self.hosts
        # Per host: vars and coefficients of compute, comm, HBM, DDR, SSD, inter (3), rate (3).
        self.terms: list[dict[str, list]] = [
            {k: [] for k in ("v", "comp", "comm", "hbm", "ddr", "ssd", "inter", "rate")}
            for _ in range(n)]
        self.entries: list[list[_Entry]] = []
        self.var_terms: dict[int, tuple[int, np.ndarray]] = {}
        self.piece_floor: dict[int, int] = {}
        piece_floor = []
        for t, cs in enumerate(cands):
            entries = []
            pins = allowed_mask(problem, t)
            allowed = np.ones(hw.world_size, dtype=bool) if pins is None else pins
            per_host = allowed.reshape(n, self.g)
            for ci, c in enumerate(cs):
                ok = self._hosts_ok(c, per_host)
                if ok is None:
                    continue
                x = m.new_bool_var(f"x_t{t}_c{ci}")
                entry = _Entry(c, x, [])
                for gi, grp in enumerate(c.groups):
                    if c.scope is Scope.WORLD:  # fixed placement: folded in by _limits
                        entry.hosts.append([])
                        continue
                    opts = []
                    for h in np.flatnonzero(ok).tolist():
                        v = m.new_bool_var(f"u_t{t}_c{ci}_g{gi}_h{h}")
                        opts.append((h, v))
                        self._add(h, v, grp)
                    m.add(sum(v for _, v in opts) == x)
                    entry.hosts.append(opts)
                entries.append(entry)
                piece_floor.append((x, int(np.floor(c.max_piece / unit))))
                self.piece_floor[x.index] = piece_floor[-1][1]
            m.add_exactly_one(e.x for e in entries)
            self.entries.append(entries)
        self._limits(piece_floor)

    def _hosts_ok(self, c: Candidate, per_host: np.ndarray) -> np.ndarray | None:
        k = max(len(grp) for grp in c.groups)
        if c.scope is Scope.WORLD:
            return np.ones(self.hosts, dtype=bool) if per_host.all() else None
        if c.scope is Scope.GPU:
            ok = per_host.any(axis=1)
        elif c.scope is Scope.HOST_FIXED:
            ok = per_host.all(axis=1)
        else:
            ok = per_host.sum(axis=1) >= k
        return ok if ok.any() else None

    def _vectors(self, grp: Group) -> np.ndarray:
        """Per piece: compute, comm, HBM, DDR, SSD, own inter-host (3), owner (3) ticks."""
        comp, comm, inter, rate = ticks_of(grp, self.unit, self.problem)
        return np.column_stack([comp, comm, grp.hbm, grp.ddr, grp.ssd, inter, rate])

    def _add(self, h: int, v: cp_model.IntVar, grp: Group) -> None:
        total = self._vectors(grp).sum(axis=0)
        self.var_terms[v.index] = (h, total)
        tm = self.terms[h]
        tm["v"].append(v)
        for i, key in enumerate(("comp", "comm", "hbm", "ddr", "ssd")):
            tm[key].append(int(total[i]))
        tm["inter"].append(tuple(int(x) for x in total[5:8]))
        tm["rate"].append(tuple(int(x) for x in total[8:11]))

    def _limits(self, piece_floor: list[tuple[cp_model.IntVar, int]]) -> None:
        m, hw = self.model, self.problem.hw
        pipelined = self.problem.model.pipelined
        # WORLD candidates: their per-host totals, times their choice variable.
        world: list[tuple[cp_model.IntVar, np.ndarray]] = []
        self.world = world
        for entries in self.entries:
            for e in entries:
                if e.cand.scope is Scope.WORLD:
                    vec = self._vectors(e.cand.groups[0])
                    world.append((e.x, vec.reshape(self.hosts, self.g, -1).sum(axis=1)))
        top = 0
        for h in range(self.hosts):
            tm = self.terms[h]
            top += sum(abs(x) for x in tm["comp"]) + sum(tm["comm"])
        top += sum(int(np.abs(pv[:, :2]).sum()) for _, pv in world)
        rate_top = sum(sum(sum(r) for r in tm["rate"]) for tm in self.terms)
        rate_top += sum(int(pv[:, 8:11].sum()) for _, pv in world)
        top = max(top + 3 * self.g * rate_top, 1)
        t_var = m.new_int_var(0, top, "T")
        self.makespan: cp_model.IntVar = t_var
        for x, floor in piece_floor:
            m.add(t_var >= floor).only_enforce_if(x)
        # Host owner totals per phase.
        self.e_vars: list[list[cp_model.IntVar]] = []
        host_rate = []
        for h in range(self.hosts):
            tm = self.terms[h]
            row = []
            for k in range(3):
                expr = cp_model.LinearExpr.weighted_sum(tm["v"], [r[k] for r in tm["rate"]])
                expr += sum(int(pv[h, 8 + k]) * x for x, pv in world)
                v = m.new_int_var(0, max(rate_top, 1), f"H_h{h}_k{k}")
                m.add(v == expr)
                row.append(v)
            host_rate.append(row)
        self.host_rate = host_rate
        total = [sum(host_rate[h][k] for h in range(self.hosts)) for k in range(3)]
        g = self.g
        for h in range(self.hosts):
            tm = self.terms[h]

            def lin(key: str, col: int, tm: dict = tm, h: int = h) -> cp_model.LinearExpr:
                return (cp_model.LinearExpr.weighted_sum(tm["v"], tm[key])
                        + sum(int(pv[h, col]) * x for x, pv in world))

            wait = []
            if self.hosts > 1:
                for k in range(3):
                    own = (cp_model.LinearExpr.weighted_sum(tm["v"], [r[k] for r in tm["inter"]])
                           + sum(int(pv[h, 5 + k]) * x for x, pv in world))
                    e = m.new_int_var(0, g * max(rate_top, 1), f"e_h{h}_k{k}")
                    m.add(e >= g * (total[k] - host_rate[h][k]) - own)
                    wait.append(e)
            self.e_vars.append(wait)
            # Each GPU's step (cost.step_time) is at least comp + comm + wait; pipelined,
            # also at least comm + wait (comp may be below 0 there): so are the host's sums.
            m.add(lin("comp", 0) + lin("comm", 1) + sum(wait) <= g * t_var)
            if pipelined:
                m.add(lin("comm", 1) + sum(wait) <= g * t_var)
            m.add(lin("hbm", 2) <= cp_cap(g * hw.hbm_cap))
            m.add(lin("ddr", 3) <= cp_cap(hw.ddr_cap))
            m.add(lin("ssd", 4) <= cp_cap(hw.ssd_cap))
        m.minimize(t_var)

    def hint(self, choices: list[TableChoice]) -> None:
        """Hint every variable from a plan: its candidates and hosts, and the host totals,
        owner-side terms and makespan they imply."""
        g, m = self.g, self.model
        on: set[int] = set()
        for t, entries in enumerate(self.entries):
            ch = choices[t]
            for e in entries:
                chosen = e.cand is ch.cand
                m.add_hint(e.x, chosen)
                if chosen:
                    on.add(e.x.index)
                for opts, ranks in zip(e.hosts, ch.ranks if chosen else [None] * len(e.hosts),
                                       strict=True):
                    host = int(np.asarray(ranks)[0]) // g if ranks is not None else -1
                    for h, v in opts:
                        m.add_hint(v, h == host)
                        if h == host:
                            on.add(v.index)
        per_host = np.zeros((self.hosts, 11))
        for idx in on:
            if idx in self.var_terms:
                h, vec = self.var_terms[idx]
                per_host[h] += vec
        for x, pv in self.world:
            if x.index in on:
                per_host += pv
        rate = per_host[:, 8:11]
        total = rate.sum(axis=0)
        need = max((self.piece_floor[i] for i in on if i in self.piece_floor), default=0)
        for h in range(self.hosts):
            for k, v in enumerate(self.host_rate[h]):
                m.add_hint(v, int(rate[h, k]))
            wait = 0
            for k, e in enumerate(self.e_vars[h]):
                value = max(0, int(g * (total[k] - rate[h, k]) - per_host[h, 5 + k]))
                m.add_hint(e, value)
                wait += value
            comp, comm = int(per_host[h, 0]), int(per_host[h, 1])
            load = int(step_time(comp, comm + wait, self.problem.model.pipelined))
            need = max(need, -(-load // g))
        m.add_hint(self.makespan, need)

    def extract(self, solver: cp_model.CpSolver) -> tuple[list[list[Candidate]],
                                                         dict[int, list[int]]]:
        """Per table, its chosen candidate alone, and the host of each of its groups."""
        chosen: list[list[Candidate]] = []
        hosts: dict[int, list[int]] = {}
        for t, entries in enumerate(self.entries):
            e = next(e for e in entries if solver.boolean_value(e.x))
            chosen.append([e.cand])
            hosts[t] = [next((h for h, v in opts if solver.boolean_value(v)), -1)
                        for opts in e.hosts]
        return chosen, hosts


def _level2_hint(problem: Problem, start: list[TableChoice], chosen: list[list[Candidate]],
                 hosts: dict[int, list[int]]) -> dict[int, TableChoice]:
    """A complete hint for level 2: the start's placement where level 1 kept its candidate
    and hosts, else the host's GPUs in order (CP-SAT repairs a hint that breaks a cap)."""
    g = problem.hw.gpus_per_host
    out: dict[int, TableChoice] = {}
    for t, (cand,) in enumerate(chosen):
        ch = start[t]
        same = ch.cand is cand and (cand.scope is Scope.WORLD or all(
            int(np.asarray(r)[0]) // g == h for r, h in zip(ch.ranks, hosts[t], strict=True)))
        if same or cand.scope is Scope.WORLD:
            out[t] = ch if same else TableChoice(cand, [np.arange(problem.hw.world_size)])
            continue
        out[t] = TableChoice(cand, [h * g + np.arange(len(grp))
                                    for grp, h in zip(cand.groups, hosts[t], strict=True)])
    return out


def solve_hierarchical(problem: Problem, cands: list[list[Candidate]], start: Assignment,
                       budget: float, seed: int,
                       progress: ProgressFn | None = None) -> SolveResult:
    """Level 1 on hosts, level 2 on GPUs; the better of that plan and `start`, and level 1's
    bound (valid for every plan in the candidate space)."""
    hw = problem.hw
    start_s = makespan(problem, start.choices)
    unit = max(start_s, 1e-12) / UNITS_PER_MAKESPAN
    level1 = HostModel(problem, cands, unit)
    level1.hint(start.choices)
    s1 = solver_params(budget * _LEVEL1_SHARE, seed)
    status = s1.solve(level1.model)
    det = s1.deterministic_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult(start, "hierarchical: no host assignment within the limit", None,
                           round(det, 6), [])
    bound = max(s1.best_objective_bound, 0.0) * unit
    proved = status == cp_model.OPTIMAL and not hit_wall(s1)
    chosen, hosts = level1.extract(s1)
    level2 = PartitionModel(problem, chosen, list(range(len(chosen))),
                            np.ones(hw.world_size, dtype=bool), LoadState.empty(problem),
                            unit, allow_world=True, group_host=hosts)
    level2.hint(_level2_hint(problem, start.choices, chosen, hosts))
    s2 = solver_params(max(budget - det, 0.05), seed)
    status2 = s2.solve(level2.model)
    det += s2.deterministic_time
    history = [Progress(round(det, 6), start_s, bound)]
    label = ("hierarchical: hosts optimal" if proved else
             "hierarchical: hosts stopped at the limit")
    if status2 not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        log.info("hierarchical level 2 found no placement within the limit")
        return SolveResult(start, f"{label}; no GPU placement within the limit", bound,
                           round(det, 6), history)
    try:
        picked = level2.extract(s2)
    except ExtractionError as err:
        log.warning("hierarchical level 2: %s; kept the heuristic plan", err)
        return SolveResult(start, f"{label}; internal error in the GPU level ({err}): kept "
                                  "the heuristic plan", bound, round(det, 6), history)
    choices = [picked[t] for t in range(len(cands))]
    found = makespan(problem, choices)
    history.append(Progress(round(det, 6), min(found, start_s), bound))
    if progress is not None:
        progress(history[-1])
    log.info("hierarchical: level-1 bound %.6g s, plan %.6g s (start %.6g s), %.3g det s",
             bound, found, start_s, det)
    if found >= start_s * (1 - 1e-9):
        return SolveResult(start, f"{label}; kept the heuristic plan", bound, round(det, 6),
                           history)
    notes = [*start.notes, "hierarchical CP-SAT: hosts, then GPUs within each host"]
    return SolveResult(Assignment(choices, "cp-sat-hierarchical", "feasible", notes),
                       label, bound, round(det, 6), history)
