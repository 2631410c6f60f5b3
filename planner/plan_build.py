"""From a layout to a full plan: cost every piece on its GPU, add up memory, summarize.

This is the one place where per-GPU figures are computed, for the planner's own layouts and
for any layout `planner evaluate` is given.
"""

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from cost_models import (
    CostBreakdown,
    MemoryFootprint,
    ShardingType,
    Tier,
    owner_wait,
    piece_memory,
    piece_traffic,
    placed_piece_buffers,
    priced_sides,
)
from planner.bounds import LowerBound
from planner.errors import BadInputError
from planner.estimators import table_prices
from planner.hashing import plan_hash_of, plan_hash_spliced
from planner.piece_layout import PieceLayout, from_plan_layout
from planner.plan_model import (
    BoundCertificate,
    CostTerms,
    GpuReport,
    HostReport,
    Plan,
    PlanLayout,
    SolverPoint,
    Summary,
)
from planner.problem import Problem, TableInfo

# Float rounding between two sums of the same seconds (build_plan's bound).
_ROUNDING = 1e-9


@dataclass
class GpuTotals:
    cost: CostBreakdown = field(default_factory=CostBreakdown)
    memory: MemoryFootprint = field(default_factory=MemoryFootprint)
    pieces: int = 0
    buffers: int = 0  # of memory.hbm, the step buffers


def gpu_totals(layout: PlanLayout | PieceLayout, problem: Problem) -> list[GpuTotals]:
    """Sum each piece's cost and memory onto its GPU, from the cost model alone.

    Each distinct (table, rows, columns) piece shape is costed once; the per-GPU sums are
    taken over the pieces in plan order (np.bincount adds in input order, as np.add.at did,
    so the figures are the same to the bit: 1.2M pieces at 10,000 tables x 1,024 GPUs)."""
    hw = problem.hw
    arrays = layout if isinstance(layout, PieceLayout) else from_plan_layout(layout)
    by_name = {t.name: t for t in problem.tables}
    _refuse_bad_pieces(arrays, by_name, hw.world_size)
    w = hw.world_size
    sums = np.zeros((w, 16))
    counts = np.zeros(w, dtype=np.int64)
    if len(arrays.ranks):
        geo = arrays.geometry
        # Distinct (rows, cols), then distinct (table, shape): two 1-d uniques.
        shape_keys, shape_of = np.unique(np.stack([geo[:, 1], geo[:, 3]], axis=1), axis=0,
                                         return_inverse=True) if len(geo) < 64 else \
            _unique_pairs(geo[:, 1], geo[:, 3])
        keys = arrays.table_of_piece * len(shape_keys) + shape_of.reshape(-1)
        distinct, inverse = np.unique(keys, return_inverse=True)
        known = arrays.figures or (None,) * len(arrays.names)
        rows = []
        together = not problem.estimator.per_shape
        priced: dict[int, dict[tuple[int, int], CostBreakdown]] = {}  # by table, `together`
        for i, k in zip((distinct // len(shape_keys)).tolist(),
                        (distinct % len(shape_keys)).tolist(), strict=True):
            shape = (*shape_keys[k].tolist(),)
            costed = known[i]
            if costed is not None and shape in costed:
                rows.append(costed[shape])
                continue
            info = by_name[arrays.names[i]]
            # An estimator that prices a table's pieces together sees all of them.
            if together and i not in priced:
                priced[i] = table_prices(problem, info, arrays.kinds[i], arrays.tiers[i],
                                         arrays.cache_ratios[i], _shapes_of(arrays, i))
            cost = priced[i][shape] if together else None
            rows.append(shape_figures(problem, info, arrays.kinds[i], arrays.tiers[i],
                                      arrays.cache_ratios[i], *shape, cost=cost))
        values = np.array(rows)[inverse.reshape(-1)]
        for col in range(16):
            sums[:, col] = np.bincount(arrays.ranks, weights=values[:, col], minlength=w)
        counts = np.bincount(arrays.ranks, minlength=w)
    host_of = np.arange(w) // hw.gpus_per_host
    host_rate = np.zeros((hw.hosts, 3))
    np.add.at(host_rate, host_of, sums[:, 12:15])
    extra = owner_wait(sums[:, 9:12], host_rate, host_of, problem.model.batch_per_gpu,
                       hw.eff_nic_bw)
    # Byte counts are integers below 2**53, so their float sums are exact. Every GPU also
    # holds the owner side's step buffers (problem.step_reserve).
    reserve = problem.step_reserve.total
    # ... and pays the step's all-to-all call latency whatever it holds (the estimator's).
    fixed = problem.estimator.fixed()
    return [
        GpuTotals(
            cost=CostBreakdown(*(float(x) for x in sums[r, :6]), owner_a2a=float(extra[r]))
            + fixed,
            memory=MemoryFootprint(int(sums[r, 6]) + reserve, int(sums[r, 7]),
                                   int(sums[r, 8])),
            pieces=int(counts[r]),
            buffers=int(sums[r, 15]) + reserve,
        )
        for r in range(w)
    ]


def _shapes_of(arrays: PieceLayout, i: int) -> list[tuple[int, int]]:
    """Table i's pieces' (rows, cols), in plan order."""
    geo = arrays.geometry[int(arrays.starts[i]):int(arrays.starts[i + 1])]
    return [(int(r), int(c)) for r, c in geo[:, [1, 3]].tolist()]


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique over rows (a, b) of non-negative int64 columns, with the inverse, by a
    unique of a, of b, then of their combined index (each 1-d, fast)."""
    ua, ia = np.unique(a, return_inverse=True)
    ub, ib = np.unique(b, return_inverse=True)
    pair, inverse = np.unique(ia.reshape(-1) * len(ub) + ib.reshape(-1), return_inverse=True)
    return np.stack([ua[pair // len(ub)], ub[pair % len(ub)]], axis=1), inverse.reshape(-1)


def shape_figures(problem: Problem, info: TableInfo, kind: ShardingType, tier: Tier,
                  cache_ratio: float | None, rows: int, cols: int,
                  cost: CostBreakdown | None = None) -> list[float]:
    """One piece shape's 16 per-GPU figures: the six cost terms, hbm (with the step
    buffers), ddr, ssd, the three inter-host bytes, the three owner rates, the buffers.
    planner.candidates costs the same figures for its candidates (Candidate.figures), and
    gpu_totals takes them from there when the layout carries them: a change here goes there
    too (tests/test_piece_layout.py checks that the two agree). `cost`: the piece's price
    (table_prices), when the estimator prices a table's pieces together."""
    hw = problem.hw
    ratio = cache_ratio if cache_ratio is not None else 1.0
    traffic = piece_traffic(info.geom, kind, tier, ratio, rows, cols, hw, problem.model)
    c = cost if cost is not None else problem.estimator.pieces(
        info.index, kind, tier, ratio, [(rows, cols)], [traffic])[0]
    m = piece_memory(info.geom, tier, ratio, rows, cols, hw)
    buf = placed_piece_buffers(info.geom, kind, tier, ratio, rows, cols, hw,
                               problem.model).total
    inter, rate = priced_sides(problem.estimator, traffic)
    return [c.lookup, c.backward, c.cache_miss, c.input_a2a, c.output_a2a, c.allreduce,
            m.hbm + buf, m.ddr, m.ssd, *inter.tolist(), *rate.tolist(), buf]


def _refuse_bad_pieces(arrays: PieceLayout, by_name: dict[str, TableInfo], world: int) -> None:
    """The first of: a table the request does not name, a piece on a rank that does not
    exist, a piece without rows or columns; in plan order, a table's name before its pieces
    (as the per-piece loop this replaced found them)."""
    bad_name = next((i for i, n in enumerate(arrays.names) if n not in by_name), None)
    geo = arrays.geometry
    bad_rank = arrays.ranks >= world
    bad = bad_rank | (geo[:, 1] < 1) | (geo[:, 3] < 1)
    first = int(np.argmax(bad)) if bad.any() else None
    table = None if first is None else int(np.searchsorted(arrays.starts, first, "right")) - 1
    if bad_name is not None and (table is None or bad_name <= table):
        raise BadInputError(f"tables[{bad_name}].name", "no table of this name in the request",
                            table=arrays.names[bad_name])
    if first is None or table is None:
        return
    j = first - int(arrays.starts[table])
    if bad_rank[first]:
        raise BadInputError(f"tables[{table}].pieces[{j}].rank",
                            f"rank {int(arrays.ranks[first])} does not exist "
                            f"(world size {world})", table=arrays.names[table])
    raise BadInputError(f"tables[{table}].pieces[{j}]", "a piece needs rows and columns",
                        table=arrays.names[table])


def cost_terms(c: CostBreakdown, pipelined: bool, overlap: float) -> CostTerms:
    return CostTerms(
        lookup_s=c.lookup, backward_s=c.backward, cache_miss_s=c.cache_miss,
        input_a2a_s=c.input_a2a, output_a2a_s=c.output_a2a, allreduce_s=c.allreduce,
        owner_a2a_s=c.owner_a2a,
        compute_s=c.compute, comm_s=c.comm, total_s=c.total(pipelined, overlap),
    )


def build_plan(
    layout: PlanLayout | PieceLayout,
    problem: Problem,
    bound: LowerBound,
    solver: str,
    status: str,
    warnings: list[str],
    decisions: list[str],
    det_time: float = 0.0,
    history: list[SolverPoint] | None = None,
    certificate: BoundCertificate | None = None,
) -> Plan:
    """The full plan of a layout. `certificate` says how `planner check` can re-derive the
    bound (planner/certificate.py); when not given it is read off `bound` (which candidate
    set it was computed on is then left to the checker to find)."""
    hw = problem.hw
    pipelined = problem.model.pipelined
    totals = gpu_totals(layout, problem)
    kinds = (layout.kinds if isinstance(layout, PieceLayout)
             else [t.sharding_type for t in layout.tables])
    tiers = (layout.tiers if isinstance(layout, PieceLayout)
             else [t.tier for t in layout.tables])
    gpus = [
        GpuReport(
            rank=r, host=hw.host_of(r), pieces=t.pieces, hbm_bytes=t.memory.hbm,
            hbm_cap_bytes=problem.hbm_cap_reported, hbm_buffer_bytes=t.buffers,
            ddr_bytes=t.memory.ddr, ssd_bytes=t.memory.ssd,
            cost=cost_terms(t.cost, pipelined, hw.constants.pipeline_overlap),
        )
        for r, t in enumerate(totals)
    ]
    g = hw.gpus_per_host
    hosts = [
        HostReport(
            host=h,
            ddr_bytes=sum(x.ddr_bytes for x in gpus[h * g:(h + 1) * g]),
            ddr_cap_bytes=hw.ddr_cap,
            ssd_bytes=sum(x.ssd_bytes for x in gpus[h * g:(h + 1) * g]),
            ssd_cap_bytes=hw.ssd_cap,
        )
        for h in range(hw.hosts)
    ]
    step = max(x.cost.total_s for x in gpus)
    mean = math.fsum(x.cost.total_s for x in gpus) / len(gpus)
    # The bound and the step add the same seconds in different orders: where they meet, the
    # bound can come out an ulp above the step. It is reported as the step there (a bound
    # may always be lowered), so no plan shows a bound above its own step or a gap below 0.
    lb = step if step < bound.value_s <= step * (1 + _ROUNDING) else bound.value_s
    summary = Summary(
        step_time_s=step,
        mean_gpu_time_s=mean,
        imbalance=step / mean if mean > 0 else 1.0,
        lower_bound_s=lb,
        gap=step / lb - 1.0 if lb > 0 else 0.0,
        lower_bound_note=bound_note(bound),
        solver=solver,
        status=status,
        solver_det_time=det_time,
        solver_history=history or [],
        tables_per_type=dict(sorted(Counter(k.value for k in kinds).items())),
        tables_per_tier=dict(sorted(Counter(t.value for t in tiers).items())),
        warnings=warnings,
        decisions=decisions,
        bound_certificate=certificate or certificate_of(bound, problem),
    )
    if isinstance(layout, PieceLayout):
        # The tables' canonical JSON comes straight from the arrays and is spliced into the
        # rest's; their pydantic objects are built once, for the Plan that is returned.
        rest = Plan.model_construct(schema_version=layout.schema_version,
                                    request=layout.request, tables=[], gpus=gpus,
                                    hosts=hosts, summary=summary, plan_hash="")
        digest = plan_hash_spliced(rest.model_dump(mode="json"), "tables",
                                   layout.tables_json())
        return Plan.model_construct(schema_version=layout.schema_version,
                                    request=layout.request, tables=layout.tables(),
                                    gpus=gpus, hosts=hosts, summary=summary,
                                    plan_hash=digest)
    body = {
        "schema_version": layout.schema_version,
        "request": layout.request,
        "tables": layout.tables,
        "gpus": gpus,
        "hosts": hosts,
        "summary": summary,
    }
    unhashed = Plan.model_construct(**body, plan_hash="")
    digest = plan_hash_of(unhashed.model_dump(mode="json"))
    return Plan(**body, plan_hash=digest)


def analytic_value(b: LowerBound) -> float:
    """The bound before any solver's: what planner.bounds.lower_bound returned (value_s,
    unless with_solver raised it to the solver's; then the largest of its parts)."""
    if b.solver_s <= 0 or b.value_s > b.solver_s:
        return b.value_s
    return min(b.value_s, max(b.average_s, b.largest_piece_s, b.balanced_s, b.owner_s,
                              b.host_s, b.replica_s, b.packing_s))


def certificate_of(bound: LowerBound, problem: Problem, candidates: str | None = None,
                   model: str | None = None) -> BoundCertificate:
    """The certificate of a bound: analytic unless a solver's bound is the tighter one.
    `model` defaults to the one pipeline.improve uses for this many hosts (flat up to 2)."""
    analytic = analytic_value(bound)
    if bound.solver_s <= 0:
        return BoundCertificate(kind="analytic", candidates=candidates, analytic_s=analytic)
    if model is None:
        model = "exact" if problem.hw.hosts <= 2 else "hierarchical"
    # A solver bound no tighter than the analytic one is kept for the note, not proven.
    kind = "cp-sat" if bound.solver_s > analytic else "analytic"
    return BoundCertificate(kind=kind, candidates=candidates, analytic_s=analytic,
                            claimed_s=bound.solver_s, model=model)


def bound_note(b: LowerBound) -> str:
    parts = [f"average work {b.average_s:.6g} s"]
    if b.memory_priced:
        parts[0] += " (with memory caps priced in)"
    parts.append(f"largest unsplittable piece {b.largest_piece_s:.6g} s")
    parts.append(f"work that fits under the makespan {b.balanced_s:.6g} s")
    if b.owner_s > 0:
        parts.append(f"the busiest piece's GPU with replicas and owner side {b.owner_s:.6g} s")
    if b.host_s > 0:
        parts.append(f"each host's GPUs with the owner side, the heaviest table placed "
                     f"{b.host_s:.6g} s")
    if b.replica_s > 0:
        parts.append(f"each large piece's GPU with the replicas beside it {b.replica_s:.6g} s")
    if b.packing_s > 0:
        nic = (", a heavy piece's GPU carrying its host's owner side" if b.nic_floor
               else "")
        parts.append(f"the chosen pieces packed whole into the GPUs{nic} {b.packing_s:.6g} s")
    if b.solver_s > 0:
        parts.append(f"CP-SAT's proven bound on the exact model {b.solver_s:.6g} s")
    return "max of " + ", ".join(parts) + ", over all plans in the candidate space"
