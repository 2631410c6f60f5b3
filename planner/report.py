"""The human view of a plan: per-GPU memory against caps and cost terms, then the summary.

Times are shown in one unit per plan, chosen from its step time (s, ms or µs), so a small
model's cells do not all read 0.000."""

from collections import defaultdict
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.plan_model import GpuReport, Plan

# Above this many GPUs the table shows the slowest ones only.
_MAX_GPU_ROWS = 32
# Per GPU, the --detail view names this many pieces (in table order), then a count.
_MAX_DETAIL_TABLES = 40


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f}"


@dataclass(frozen=True)
class TimeUnit:
    name: str
    per_s: float

    def fmt(self, seconds: float) -> str:
        return f"{seconds * self.per_s:.3f}"

    def with_name(self, seconds: float) -> str:
        return f"{self.fmt(seconds)} {self.name}"


def time_unit(step_s: float) -> TimeUnit:
    """The unit that shows `step_s` with 1 to 3 digits before the point."""
    if step_s >= 1.0:
        return TimeUnit("s", 1.0)
    if step_s >= 1e-3:
        return TimeUnit("ms", 1e3)
    return TimeUnit("µs", 1e6)


def summary_line(plan: Plan) -> str:
    """One line: the step estimate, bound, gap, status and hash (for `plan -o`)."""
    s = plan.summary
    u = time_unit(s.step_time_s)
    return (f"{plan.request.model.name}: step estimate {u.with_name(s.step_time_s)} (slowest "
            f"GPU), lower bound {u.with_name(s.lower_bound_s)}, gap {s.gap:.2%}, {s.solver}: "
            f"{s.status}; {plan.plan_hash[:23]}...")


def _tables_by_rank(plan: Plan) -> dict[int, list[str]]:
    """Per rank, its tables: `name` when a piece is the whole table, else the rows and
    columns it holds (data-parallel replicas are marked `dp`)."""
    out: dict[int, list[str]] = defaultdict(list)
    for t in plan.tables:
        kind = t.sharding_type.value
        for pc in t.pieces:
            if kind == "data_parallel":
                label = f"{t.name} (dp)"
            elif pc.row_offset == 0 and pc.col_offset == 0 and len(t.pieces) == 1:
                label = t.name
            else:
                label = (f"{t.name}[rows {pc.row_offset}+{pc.row_count}, cols "
                         f"{pc.col_offset}+{pc.col_count}]")
            if t.tier.value != "hbm":
                label += f" {t.tier.value}"
            out[pc.rank].append(label)
    return out


def render(plan: Plan, console: Console, planning_time_s: float | None = None,
           detail: bool = False) -> None:
    req = plan.request
    hw = req.hardware
    console.print(
        f"[bold]{req.model.name}[/]: {len(req.model.tables)} tables on {hw.hosts} x "
        f"{hw.gpus_per_host} {hw.gpu.name} ({hw.name}), batch {req.model.batch_size_per_gpu}"
        f"/GPU, comm {req.model.fwd_comm_precision.value}/{req.model.bwd_comm_precision.value}"
    )
    gpus: list[GpuReport] = plan.gpus
    shown = gpus
    if len(gpus) > _MAX_GPU_ROWS:
        shown = sorted(gpus, key=lambda x: (-x.cost.total_s, x.rank))[:_MAX_GPU_ROWS]
        shown.sort(key=lambda x: x.rank)
    tiers = set(plan.summary.tables_per_tier) - {"hbm"}
    unit = time_unit(plan.summary.step_time_s)
    _ms = unit.fmt
    t = Table(title=f"Per GPU ({unit.name} per step; memory in GiB)", show_lines=False)
    for col in ("rank", "host", "pieces", "HBM / cap"):
        t.add_column(col, justify="right")
    if tiers:
        t.add_column("DDR", justify="right")
        t.add_column("SSD", justify="right")
    for col in ("lookup", "backward", "cache miss", "in a2a", "out a2a", "owner a2a",
                "allreduce", "total"):
        t.add_column(col, justify="right")
    step = plan.summary.step_time_s
    for g in shown:
        c = g.cost
        row = [str(g.rank), str(g.host), str(g.pieces),
               f"{_gib(g.hbm_bytes)} / {_gib(g.hbm_cap_bytes)}"]
        if tiers:
            row += [_gib(g.ddr_bytes), _gib(g.ssd_bytes)]
        total = _ms(c.total_s)
        if c.total_s >= step:
            total = f"[bold red]{total}[/]"
        row += [_ms(c.lookup_s), _ms(c.backward_s), _ms(c.cache_miss_s), _ms(c.input_a2a_s),
                _ms(c.output_a2a_s), _ms(c.owner_a2a_s), _ms(c.allreduce_s), total]
        t.add_row(*row)
    if len(shown) < len(gpus):
        t.caption = f"the {len(shown)} slowest of {len(gpus)} GPUs"
    console.print(t)
    if detail:
        by_rank = _tables_by_rank(plan)
        for g in shown:
            names = by_rank.get(g.rank, [])
            more = len(names) - _MAX_DETAIL_TABLES
            text = ", ".join(names[:_MAX_DETAIL_TABLES]) + (f" ... and {more} more"
                                                             if more > 0 else "")
            console.print(f"rank {g.rank} ({len(names)} pieces): {escape(text)}",
                          highlight=False, soft_wrap=True)
    if tiers:
        h = Table(title="Per host (GiB)")
        for col in ("host", "DDR / cap", "SSD / cap"):
            h.add_column(col, justify="right")
        for x in plan.hosts[:_MAX_GPU_ROWS]:
            h.add_row(str(x.host), f"{_gib(x.ddr_bytes)} / {_gib(x.ddr_cap_bytes)}",
                      f"{_gib(x.ssd_bytes)} / {_gib(x.ssd_cap_bytes)}")
        console.print(h)
    s = plan.summary
    console.print(f"[bold]step estimate[/] {unit.with_name(s.step_time_s)} (slowest GPU), "
                  f"mean {unit.with_name(s.mean_gpu_time_s)}, imbalance {s.imbalance:.3f}")
    console.print(f"[bold]lower bound[/] {unit.with_name(s.lower_bound_s)}, gap {s.gap:.2%}  "
                  f"({s.lower_bound_note})")
    timing = f", planned in {planning_time_s:.2f} s" if planning_time_s is not None else ""
    det = f", search {s.solver_det_time:.3g} deterministic s" if s.solver_det_time else ""
    console.print(f"[bold]solver[/] {s.solver}: {s.status}{timing}{det}")
    console.print("sharding: " + ", ".join(f"{k} {v}" for k, v in s.tables_per_type.items())
                  + "; tiers: " + ", ".join(f"{k} {v}" for k, v in s.tables_per_tier.items()))
    for d in s.decisions:
        console.print(f"  - {d}")
    for wmsg in s.warnings:
        console.print(f"[yellow]warning:[/] {wmsg}")
    console.print(f"plan {plan.plan_hash[:23]}..., schema {plan.schema_version}")
