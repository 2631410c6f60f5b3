"""Why a table is sharded the way the plan has it (`planner explain PLAN.json TABLE`).

Everything is recomputed from the plan's request with the planner's own public functions
(planning.resolve / candidates_for, problem.build_problem, candidates.enumerate_candidates,
the cost model): the candidates the planner had for the table, and the ones it did not have
(ruled out by a constraint, a pin, a cap, the replica threshold, the tier pressure rule or
dominance). Each is re-placed in the plan's layout, every other table where the plan put it
(a greedy best fit for the table's pieces under the HBM, DDR and SSD caps), and the whole
layout is scored: the loss of an alternative is on the makespan (the slowest GPU), not only on
the table's own cost. The best rejected alternative is scored again with planning.evaluate,
so the figure printed is the one `planner evaluate` gives for that layout.
"""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cost_models import (
    CommPrecision,
    CostBreakdown,
    Optimizer,
    ShardingType,
    Tier,
    owner_wait,
    piece_memory,
    piece_traffic,
    priced_sides,
    sides_of,
    step_time,
)
from planner.candidates import (
    COLUMN_SPLIT_TYPES,
    DATA_PARALLEL_MAX_HBM_SHARE,
    HBM_CACHE_RATIOS,
    SLOW_TIER_PRESSURE,
    SSD_CACHE_RATIOS,
    Candidate,
    Scope,
    candidate_of_pieces,
    column_splits,
    enumerate_candidates,
    min_column_width,
)
from planner.errors import BadInputError
from planner.estimators import table_prices
from planner.plan_model import Plan, PlanLayout, PlanPiece, TablePlan
from planner.planning import candidates_for, evaluate
from planner.problem import Problem, TableInfo, build_problem
from planner.spec import TableConstraints

# Relative differences below this are ties (float sums taken in a different order).
_TIE = 1e-9
_QUANTIZED = (CommPrecision.FP8, CommPrecision.INT8)

# ---------------------------------------------------------------------------------------------
# Per-piece figures (shared with the HTML report and the diff)


def piece_row(problem: Problem, info: TableInfo, tp_kind: ShardingType, tier: Tier,
              ratio: float | None, rows: int, cols: int,
              cost: CostBreakdown | None = None) -> np.ndarray:
    """One piece's 15 figures, as plan_build sums them per GPU: lookup, backward, cache miss,
    input a2a, output a2a, all-reduce (s); HBM, DDR, SSD (bytes); inter-host bytes and owner
    rates of the three all-to-all phases. `cost`: its price (table_prices) where the
    estimator prices a table's pieces together."""
    hw = problem.hw
    r = ratio if ratio is not None else 1.0
    traffic = piece_traffic(info.geom, tp_kind, tier, r, rows, cols, hw, problem.model)
    c = cost if cost is not None else problem.estimator.pieces(
        info.index, tp_kind, tier, r, [(rows, cols)], [traffic])[0]
    m = piece_memory(info.geom, tier, r, rows, cols, hw)
    inter, rate = priced_sides(problem.estimator, traffic)
    return np.array([c.lookup, c.backward, c.cache_miss, c.input_a2a, c.output_a2a,
                     c.allreduce, m.hbm, m.ddr, m.ssd, *inter.tolist(), *rate.tolist()])


class PieceCoster:
    """piece_row, memoized by shape (row-wise and data-parallel pieces repeat few shapes;
    an estimator that prices a table's pieces together is asked per table)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.by_name = {t.name: t for t in problem.tables}
        self.memo: dict[tuple[Any, ...], np.ndarray] = {}

    def _info(self, name: str) -> TableInfo:
        info = self.by_name.get(name)
        if info is None:
            raise BadInputError("tables", "no table of this name in the request", table=name)
        return info

    def row(self, name: str, kind: ShardingType, tier: Tier, ratio: float | None, rows: int,
            cols: int) -> np.ndarray:
        key = (name, kind, tier, ratio, rows, cols)
        out = self.memo.get(key)
        if out is None:
            out = self.memo[key] = piece_row(self.problem, self._info(name), kind, tier, ratio,
                                             rows, cols)
        return out

    def table_rows(self, tp: TablePlan) -> tuple[np.ndarray, np.ndarray]:
        """(ranks, figures) of a table's pieces."""
        ranks = np.array([p.rank for p in tp.pieces], dtype=np.int64)
        shapes = [(p.row_count, p.col_count) for p in tp.pieces]
        if self.problem.estimator.per_shape:
            rows = np.array([self.row(tp.name, tp.sharding_type, tp.tier, tp.cache_ratio, *sh)
                             for sh in shapes])
        else:
            info = self._info(tp.name)
            prices = table_prices(self.problem, info, tp.sharding_type, tp.tier,
                                  tp.cache_ratio, shapes)
            rows = np.array([piece_row(self.problem, info, tp.sharding_type, tp.tier,
                                       tp.cache_ratio, *sh, cost=prices[sh]) for sh in shapes])
        return ranks, rows.reshape(len(tp.pieces), 15)


def gpu_sums(problem: Problem, coster: PieceCoster, tables: list[TablePlan]) -> np.ndarray:
    """(world, 15) sums of piece_row over the given tables' pieces."""
    sums = np.zeros((problem.hw.world_size, 15))
    for tp in tables:
        ranks, rows = coster.table_rows(tp)
        np.add.at(sums, ranks, rows)
    return sums


def gpu_times(problem: Problem, sums: np.ndarray) -> np.ndarray:
    """Each GPU's step time from its sums, with the owner side of the all-to-alls."""
    hw = problem.hw
    host_of = np.arange(hw.world_size) // hw.gpus_per_host
    host_rate = np.zeros((hw.hosts, 3))
    np.add.at(host_rate, host_of, sums[:, 12:15])
    extra = owner_wait(sums[:, 9:12], host_rate, host_of, problem.model.batch_per_gpu,
                       hw.eff_nic_bw)
    pipelined = problem.model.pipelined
    # What every GPU pays whatever it holds.
    fixed = problem.estimator.fixed().sides(pipelined, hw.constants.pipeline_overlap)
    comp, comm = gpu_sides(problem, sums)
    return step_time(comp + fixed[0], comm + extra + fixed[1], pipelined)


def gpu_sides(problem: Problem, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each GPU's two sides (cost.sides_of) from its sums' six cost terms."""
    return sides_of(sums[:, 0:3].sum(axis=1), sums[:, 3:6].sum(axis=1), sums[:, 3],
                    problem.model.pipelined, problem.hw.constants.pipeline_overlap)


# ---------------------------------------------------------------------------------------------
# Explanations


@dataclass
class Option:
    """One way to shard the table, re-placed in the plan's layout."""

    label: str
    sharding_type: str
    tier: str
    cache_ratio: float | None
    work_s: float  # the table's own seconds, summed over its pieces
    max_piece_s: float  # the most one of its pieces adds to a GPU
    available: bool  # among the candidates the planner chose from
    why_not: str | None = None  # why the planner did not have it (None when available)
    makespan_s: float | None = None  # step time of the plan with this option in place
    loss_s: float | None = None  # makespan_s - the plan's step time
    evaluated: bool = False  # makespan_s confirmed by planning.evaluate
    placement: TablePlan | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["placement"] = self.placement.model_dump(mode="json") if self.placement else None
        return d


@dataclass
class Explanation:
    table: str
    step_time_s: float  # the plan's
    chosen: Option
    best_rejected: Option | None  # the best alternative the planner had (by makespan)
    best_unavailable: Option | None  # the best one it did not have, when it would do better
    bounds: list[str]  # what bound the choice
    warnings: list[str]  # where the choice changes training semantics
    notes: list[str] = field(default_factory=list)
    alternatives: list[Option] = field(default_factory=list)  # every option, best first

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table, "step_time_s": self.step_time_s,
            "chosen": self.chosen.to_dict(),
            "best_rejected": self.best_rejected.to_dict() if self.best_rejected else None,
            "best_unavailable": (self.best_unavailable.to_dict() if self.best_unavailable
                                 else None),
            "bounds": self.bounds, "warnings": self.warnings, "notes": self.notes,
            "alternatives": [o.to_dict() | {"placement": None} for o in self.alternatives],
        }

    def summary_line(self) -> str:
        """One line for a hover: the choice, the best rejected and its loss."""
        c = self.chosen
        if self.best_rejected is None or self.best_rejected.loss_s is None:
            alt = "no rejected alternative (the planner had no other candidate that fits)"
        else:
            b = self.best_rejected
            alt = f"best rejected {b.label}: {_signed_ms(b.loss_s)} on the step"
            if abs(b.loss_s) <= _TIE * self.step_time_s:
                alt += f" (a tie; {_signed_ms(b.work_s - c.work_s)} of its own GPU time)"
        return f"{c.label} ({_ms(c.work_s)} of GPU time); {alt}"


def _ms(s: float) -> str:
    return f"{s * 1e3:.4g} ms"


def _signed_ms(s: float) -> str:
    return f"{s * 1e3:+.4g} ms"


def _geometry_key(kind: ShardingType, tier: Tier, ratio: float | None,
                  geometry: list[tuple[int, int, int, int]]) -> tuple[Any, ...]:
    return (kind.value, tier.value, None if ratio is None else round(ratio, 9),
            tuple(sorted(geometry)))


def _cand_key(c: Candidate) -> tuple[Any, ...]:
    geo = [tuple(int(x) for x in row) for g in c.groups for row in g.geometry.tolist()]
    return _geometry_key(c.kind, c.tier, c.cache_ratio, geo)


def _plan_key(tp: TablePlan) -> tuple[Any, ...]:
    geo = [(p.row_offset, p.row_count, p.col_offset, p.col_count) for p in tp.pieces]
    return _geometry_key(tp.sharding_type, tp.tier, tp.cache_ratio, geo)


class _Layout:
    """The plan's layout without one table: per-GPU sums and free memory."""

    def __init__(self, problem: Problem, coster: PieceCoster, plan: PlanLayout,
                 table: str, full: np.ndarray | None = None) -> None:
        self.problem, self.coster = problem, coster
        if full is None:
            others = [tp for tp in plan.tables if tp.name != table]
            self.base = gpu_sums(problem, coster, others)
        else:  # every table's sums given: take this table's pieces out
            self.base = full.copy()
            for tp in plan.tables:
                if tp.name == table:
                    ranks, rows = coster.table_rows(tp)
                    np.add.at(self.base, ranks, -rows)
        hw = problem.hw
        self.g = hw.gpus_per_host
        self.host_of = np.arange(hw.world_size) // self.g
        self.hbm_free = hw.hbm_cap - self.base[:, 6]
        host_ddr = np.zeros(hw.hosts)
        host_ssd = np.zeros(hw.hosts)
        np.add.at(host_ddr, self.host_of, self.base[:, 7])
        np.add.at(host_ssd, self.host_of, self.base[:, 8])
        self.ddr_free = hw.ddr_cap - host_ddr
        self.ssd_free = hw.ssd_cap - host_ssd

    def _load(self, comp: np.ndarray, comm: np.ndarray) -> np.ndarray:
        return step_time(comp, comm, self.problem.model.pipelined)

    def place(self, cand: Candidate, allowed: np.ndarray | None) -> list[np.ndarray] | None:
        """Ranks for each of the candidate's groups, every other table fixed: each group
        where it leaves its GPUs' largest load lowest, under the caps; None if none fits."""
        hw = self.problem.hw
        w = hw.world_size
        ok_rank = np.ones(w, dtype=bool) if allowed is None else allowed
        comp, comm = gpu_sides(self.problem, self.base)  # new arrays: base is not changed
        hbm = self.hbm_free.copy()
        ddr, ssd = self.ddr_free.copy(), self.ssd_free.copy()

        def fits(ranks: np.ndarray, grp: Any, idx: np.ndarray) -> bool:
            if (grp.hbm[idx] > hbm[ranks]).any():
                return False
            d = np.zeros(hw.hosts)
            s = np.zeros(hw.hosts)
            np.add.at(d, self.host_of[ranks], grp.ddr[idx])
            np.add.at(s, self.host_of[ranks], grp.ssd[idx])
            return bool((d <= ddr).all() and (s <= ssd).all())

        def commit(ranks: np.ndarray, grp: Any, idx: np.ndarray) -> None:
            np.add.at(comp, ranks, grp.comp[idx])
            np.add.at(comm, ranks, grp.comm[idx])
            np.add.at(hbm, ranks, -grp.hbm[idx])
            np.add.at(ddr, self.host_of[ranks], -grp.ddr[idx])
            np.add.at(ssd, self.host_of[ranks], -grp.ssd[idx])

        out: list[np.ndarray | None] = [None] * len(cand.groups)
        order = sorted(range(len(cand.groups)),
                       key=lambda i: -float((cand.groups[i].comp + cand.groups[i].comm).sum()))
        for gi in order:
            grp = cand.groups[gi]
            k = len(grp)
            idx = np.arange(k)
            best: tuple[float, int] | None = None
            best_ranks = None
            if cand.scope is Scope.WORLD:
                ranks = np.arange(w)
                if ok_rank.all() and fits(ranks, grp, idx):
                    best_ranks = ranks
            elif cand.scope is Scope.GPU:
                load = self._load(comp + grp.comp[0], comm + grp.comm[0])
                for r in np.argsort(load, kind="stable").tolist():
                    ranks = np.array([r])
                    if ok_rank[r] and fits(ranks, grp, idx):
                        best_ranks = ranks
                        break
            else:
                for h in range(hw.hosts):
                    local = np.arange(h * self.g, (h + 1) * self.g)
                    if cand.scope is Scope.HOST_FIXED:
                        if not ok_rank[local].all():
                            continue
                        ranks = local[:k]
                    else:  # HOST_FREE: the k least loaded allowed GPUs of the host
                        free = local[ok_rank[local]]
                        if len(free) < k:
                            continue
                        cur = self._load(comp[free], comm[free])
                        ranks = free[np.argsort(cur, kind="stable")[:k]]
                        # largest pieces on the least loaded GPUs
                        idx = np.argsort(-(grp.comp + grp.comm), kind="stable")
                    if not fits(ranks, grp, idx):
                        continue
                    score = float(self._load(comp[ranks] + grp.comp[idx],
                                             comm[ranks] + grp.comm[idx]).max())
                    if best is None or score < best[0]:
                        best, best_ranks = (score, h), ranks
                if best_ranks is not None and cand.scope is Scope.HOST_FREE:
                    # put piece idx[j] on best_ranks[j]: reorder to piece order
                    idx = np.argsort(-(grp.comp + grp.comm), kind="stable")
                    ordered = np.empty(k, dtype=np.int64)
                    ordered[idx] = best_ranks
                    best_ranks = ordered
                    idx = np.arange(k)
            if best_ranks is None:
                return None
            commit(best_ranks, grp, idx)
            out[gi] = best_ranks
        return [o for o in out if o is not None]

    def table_plan(self, name: str, cand: Candidate, ranks: list[np.ndarray]) -> TablePlan:
        pieces = []
        for grp, rs in zip(cand.groups, ranks, strict=True):
            for geo, r in zip(grp.geometry.tolist(), rs.tolist(), strict=True):
                pieces.append(PlanPiece(rank=r, host=r // self.g, row_offset=geo[0],
                                        row_count=geo[1], col_offset=geo[2], col_count=geo[3]))
        return TablePlan(name=name, sharding_type=cand.kind, tier=cand.tier,
                         cache_ratio=cand.cache_ratio, pieces=pieces)

    def makespan(self, tp: TablePlan) -> float:
        ranks, rows = self.coster.table_rows(tp)
        sums = self.base.copy()
        np.add.at(sums, ranks, rows)
        return float(gpu_times(self.problem, sums).max())


def _why_not(problem: Problem, t: TableInfo, c: Candidate, slow: bool,
             available_keys: set[tuple[Any, ...]], pressure: float) -> str:
    """Why the planner's candidate set lacks `c` (a candidate of the unconstrained table)."""
    hw = problem.hw
    cons = t.constraints
    if cons.sharding_types and c.kind not in cons.sharding_types:
        return "constraint: sharding_types " + ", ".join(s.value for s in cons.sharding_types)
    if cons.memory_tiers and c.tier not in cons.memory_tiers:
        return "constraint: memory_tiers " + ", ".join(s.value for s in cons.memory_tiers)
    if c.kind in COLUMN_SPLIT_TYPES and cons.min_column_shard_width:
        width = int(c.groups[0].geometry[0, 3])
        if width < cons.min_column_shard_width:
            return f"constraint: min_column_shard_width {cons.min_column_shard_width}"
    if c.kind is ShardingType.DATA_PARALLEL and t.bytes > DATA_PARALLEL_MAX_HBM_SHARE * hw.hbm_cap:
        return (f"replica threshold: the table is {t.bytes / hw.hbm_cap:.1%} of a GPU's free "
                f"HBM, replicas only up to {DATA_PARALLEL_MAX_HBM_SHARE:.1%}")
    if cons.pinned_ranks:
        pins = set(cons.pinned_ranks)
        if c.scope is Scope.WORLD and len(pins) < hw.world_size:
            return "pin: this type needs every rank, the table is pinned to " \
                   f"{len(pins)} of {hw.world_size}"
        if c.scope in (Scope.HOST_FIXED, Scope.HOST_FREE):
            need = hw.gpus_per_host if c.scope is Scope.HOST_FIXED else len(c.groups[0])
            hosts_ok = sum(
                1 for h in range(hw.hosts)
                if len([r for r in range(h * hw.gpus_per_host, (h + 1) * hw.gpus_per_host)
                        if r in pins]) >= need)
            if hosts_ok < (len(c.groups) if c.scope is Scope.HOST_FIXED else 1):
                return "pin: not enough pinned GPUs in one host for this type"
    if c.max_piece_hbm > hw.hbm_cap:
        return (f"cap: its largest piece needs {c.max_piece_hbm / 2**30:,.1f} GiB of HBM, a "
                f"GPU has {hw.hbm_cap / 2**30:,.1f} GiB free")
    if c.ddr_total > hw.ddr_cap * hw.hosts or c.ssd_total > hw.ssd_cap * hw.hosts:
        return "cap: more DDR or SSD than the cluster's hosts have"
    if c.tier is not Tier.HBM and not slow:
        return (f"slower tiers not costed: the tables need {pressure:.0%} of the cluster's HBM, "
                f"under the {SLOW_TIER_PRESSURE:.0%} pressure rule")
    if _cand_key(c) not in available_keys:
        return "pruned as dominated (another candidate is no slower and no larger on any axis)"
    return "not enumerated"


def explain_table(plan: Plan, table: str, problem: Problem | None = None,
                  confirm: bool = True,
                  cands: tuple[list[list[Candidate]], bool] | None = None,
                  shared: tuple[PieceCoster, np.ndarray] | None = None) -> Explanation:
    """The explanation of one table of `plan`. `confirm` re-scores the best rejected (and the
    best unavailable) alternative with planning.evaluate."""
    problem = problem or build_problem(plan.request)
    by_name = {t.name: t for t in problem.tables}
    tp = next((x for x in plan.tables if x.name == table), None)
    if tp is None or table not in by_name:
        names = [x.name for x in plan.tables]
        hint = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
        raise BadInputError("TABLE", f"no table '{table}' in the plan (tables: {hint})",
                            table=table)
    t = by_name[table]
    hw = problem.hw
    own_set, slow = cands if cands is not None else candidates_for(problem)
    own = own_set[t.index]
    chosen_key = _plan_key(tp)
    if chosen_key not in {_cand_key(c) for c in own} and not slow:
        # the planner may have fallen back to every tier (pipeline.heuristic)
        cands_all, slow = candidates_for(problem, slow=True)
        own = cands_all[t.index]
    available = {_cand_key(c): c for c in own}
    coster, full = shared if shared is not None else (PieceCoster(problem), None)
    layout = _Layout(problem, coster, plan, table, full)
    step = plan.summary.step_time_s
    notes: list[str] = []

    pieces = [(p.row_offset, p.row_count, p.col_offset, p.col_count) for p in tp.pieces]
    chosen_c = available.get(chosen_key)
    if chosen_c is None:
        try:
            chosen_c = candidate_of_pieces(problem, t, tp.sharding_type, tp.tier,
                                           tp.cache_ratio, pieces)
        except ValueError as exc:  # pieces that break the type's definition
            raise BadInputError("plan", f"{exc}; `planner check` says what is wrong",
                                table=t.name) from exc
    in_set = chosen_key in available
    chosen = Option(chosen_c.label, tp.sharding_type.value, tp.tier.value, tp.cache_ratio,
                    chosen_c.work, chosen_c.max_piece, in_set,
                    None if in_set else "the plan's own shape, outside the planner's grid",
                    makespan_s=step, loss_s=0.0, placement=tp)
    if not in_set:
        notes.append("the plan's shape for this table is not one of the planner's candidates "
                     "(a hand-made or imported layout?)")

    # Every shape of the table with its constraints lifted (pins kept apart), every tier, plus
    # the replica the threshold keeps out.
    free_t = dataclasses.replace(t, constraints=TableConstraints())
    universe: dict[tuple[Any, ...], Candidate] = {}
    for c in enumerate_candidates(problem, free_t, slow_tiers=True, keep_unfit=True):
        universe.setdefault(_cand_key(c), c)
    if hw.world_size > 1 and not any(c.kind is ShardingType.DATA_PARALLEL
                                     for c in universe.values()):
        dp = candidate_of_pieces(problem, t, ShardingType.DATA_PARALLEL, Tier.HBM, None,
                                 [(0, t.geom.rows, 0, t.geom.dim)] * hw.world_size)
        universe.setdefault(_cand_key(dp), dp)
    for k, c in available.items():
        universe[k] = c

    pins = t.constraints.pinned_ranks
    pinned = None
    if pins:
        pinned = np.zeros(hw.world_size, dtype=bool)
        pinned[list(pins)] = True

    keys = set(available)
    pressure = sum(x.bytes for x in problem.tables) / (hw.world_size * hw.hbm_cap)
    options: list[Option] = []
    for key, c in universe.items():
        if key == chosen_key:
            continue
        avail = key in available
        why = None if avail else _why_not(problem, t, c, slow, keys, pressure)
        opt = Option(c.label, c.kind.value, c.tier.value, c.cache_ratio, c.work, c.max_piece,
                     avail, why)
        # The planner's own candidates keep the pins; the others are hypothetical ("what if
        # the constraint were lifted"): they keep the pins too where they can, else the pin is
        # lifted as well, and the option says so.
        ranks = layout.place(c, pinned)
        if ranks is None and pinned is not None and not avail:
            ranks = layout.place(c, None)
            if ranks is not None and not (why or "").startswith("pin"):
                opt.why_not = f"{why} (and the pin lifted)"
        if ranks is not None:
            opt.placement = layout.table_plan(table, c, ranks)
            opt.makespan_s = layout.makespan(opt.placement)
            opt.loss_s = opt.makespan_s - step
        elif avail:
            opt.why_not = "cap: does not fit next to the other tables' pieces in this layout"
        options.append(opt)

    def rank_key(o: Option) -> tuple[float, float]:
        return (o.makespan_s if o.makespan_s is not None else math.inf, o.work_s)

    options.sort(key=rank_key)
    rejected = [o for o in options if o.available and o.makespan_s is not None]
    best_rejected = rejected[0] if rejected else None
    better_unavail = [o for o in options if not o.available and o.makespan_s is not None
                      and o.makespan_s < step * (1 - _TIE)]
    best_unavailable = better_unavail[0] if better_unavail else None

    if confirm:
        for o in (best_rejected, best_unavailable):
            if o is None or o.placement is None:
                continue
            forced = force(plan, o.placement)
            o.makespan_s = evaluate(forced).summary.step_time_s
            o.loss_s = o.makespan_s - step
            o.evaluated = True

    bounds = _bounds(problem, t, tp, chosen_c, options, best_rejected, best_unavailable, step,
                     slow)
    return Explanation(table=table, step_time_s=step, chosen=chosen,
                       best_rejected=best_rejected, best_unavailable=best_unavailable,
                       bounds=bounds, warnings=semantic_warnings(problem, t, tp.sharding_type),
                       notes=notes, alternatives=options)


def force(plan: PlanLayout, placement: TablePlan) -> PlanLayout:
    """The plan's layout with one table replaced by `placement`."""
    tables = [placement if x.name == placement.name else x for x in plan.tables]
    return PlanLayout(schema_version=plan.schema_version, request=plan.request, tables=tables)


def _bounds(problem: Problem, t: TableInfo, tp: TablePlan, chosen: Candidate,
            options: list[Option], best_rejected: Option | None,
            best_unavailable: Option | None, step: float, slow: bool) -> list[str]:
    hw = problem.hw
    out: list[str] = []
    # What ruled out alternatives that would have made the step faster, grouped by reason.
    seen: set[str] = set()
    for o in options:
        if o.available or o.makespan_s is None or o.makespan_s >= step * (1 - _TIE):
            continue
        kind = (o.why_not or "").split(":")[0]
        if kind in seen:
            continue
        seen.add(kind)
        out.append(f"{o.why_not}: {o.label} would make the step {_ms(step - o.makespan_s)} "
                   "faster")
    cons = t.constraints
    if cons.sharding_types and "constraint" not in seen:
        out.append("constraint: sharding_types " + ", ".join(s.value for s in cons.sharding_types)
                   + " (not binding: nothing it excludes would do better here)")
    if cons.memory_tiers and "constraint" not in seen:
        out.append("constraint: memory_tiers " + ", ".join(s.value for s in cons.memory_tiers)
                   + " (not binding here)")
    if cons.pinned_ranks and "pin" not in seen:
        out.append(f"pin: ranks {', '.join(map(str, cons.pinned_ranks))}")
    # Caps: cheaper candidates (own cost) that did not fit.
    capped = [o for o in options if (o.why_not or "").startswith("cap")
              and o.work_s < chosen.work * (1 - _TIE)]
    # The cap in this layout (HBM, DDR or SSD taken by the other tables) first: it is what
    # pushes a table to a slower tier or a finer split; then the caps of a single GPU or host.
    capped.sort(key=lambda x: (not x.available, x.work_s))
    for prefix in ("cap: does not fit", "cap: its largest", "cap: more DDR"):
        group = [o for o in capped if (o.why_not or "").startswith(prefix)]
        if group:
            o = group[0]
            out.append(f"{o.why_not} (e.g. {o.label}, {_ms(chosen.work - o.work_s)} less "
                       "GPU time than the choice)")
    # The grid of column splits and cache ratios.
    if tp.sharding_type in COLUMN_SPLIT_TYPES:
        width = tp.pieces[0].col_count
        min_w = min_column_width(cons)
        k = t.geom.dim // width
        edge = not any(x > k for x in column_splits(t.geom.dim, min_w, t.geom.dim))
        out.append(f"grid: column splits into equal chunks at least {min_w} columns wide and "
                   f"a multiple of 4; chosen {k} chunks of {width}"
                   + (" (the finest the grid allows)" if edge else ""))
    if tp.cache_ratio is not None:
        grid = HBM_CACHE_RATIOS if tp.tier is Tier.HBM_CACHE else SSD_CACHE_RATIOS
        top = tp.cache_ratio >= grid[-1]
        out.append(f"grid: cache ratios costed {', '.join(f'{r:g}' for r in grid)} (and the "
                   f"largest that fits one {'GPU' if tp.tier is Tier.HBM_CACHE else 'host'}); "
                   f"chosen {tp.cache_ratio:g}" + (" (at the top of the grid)" if top else ""))
    if tp.sharding_type is ShardingType.DATA_PARALLEL:
        out.append(f"replica threshold: the table is {100 * t.bytes / hw.hbm_cap:.3g}% of a GPU's "
                   f"free HBM, under the 1/32 (3.1%) allowed for replicas")
    if best_rejected is not None and best_rejected.loss_s is not None \
            and best_rejected.loss_s < -_TIE * step:
        out.append(f"search: {best_rejected.label} was among the planner's candidates and "
                   f"would make the step {_ms(-best_rejected.loss_s)} faster with this table "
                   "re-placed alone: the search stopped at a local optimum")
    if best_unavailable is None:
        out.append("nothing outside the planner's choices binds it: no candidate ruled out by a "
                   "constraint, pin, cap, the replica threshold, the tier rule or dominance "
                   "makes the step faster in this layout")
    return out


def semantic_warnings(problem: Problem, t: TableInfo, kind: ShardingType) -> list[str]:
    """Where the chosen sharding changes what training computes, not only how fast."""
    out = []
    m = problem.model
    if kind in COLUMN_SPLIT_TYPES and t.geom.optimizer is Optimizer.ROWWISE_ADAGRAD:
        out.append(f"{kind.value} with rowwise_adagrad: each column chunk keeps its own per-row "
                   "state from its own columns' gradients, so the update differs from the "
                   "unsharded table's (one state per whole row)")
    if kind is ShardingType.DATA_PARALLEL and m.bwd_precision is not CommPrecision.FP32:
        word = "quantized" if m.bwd_precision in _QUANTIZED else "reduced-precision"
        out.append(f"data_parallel with {m.bwd_precision.value} backward communication: the "
                   f"replicas' gradient all-reduce sums {word} gradients, so every replica "
                   "steps on a rounded gradient")
    return out


def explain_all(plan: Plan, tables: list[str] | None = None, confirm: bool = False
                ) -> dict[str, Explanation]:
    """Explanations of several tables (all by default), sharing the candidates."""
    problem = build_problem(plan.request)
    cands = candidates_for(problem)
    coster = PieceCoster(problem)
    shared = (coster, gpu_sums(problem, coster, plan.tables))
    names = tables if tables is not None else [tp.name for tp in plan.tables]
    return {n: explain_table(plan, n, problem, confirm, cands, shared) for n in names}
