"""The human view of a plan: per-GPU memory against caps and cost terms, then the summary."""

from rich.console import Console
from rich.table import Table

from planner.plan_model import GpuReport, Plan

# Above this many GPUs the table shows the slowest ones only.
_MAX_GPU_ROWS = 32


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f}"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def render(plan: Plan, console: Console, planning_time_s: float | None = None) -> None:
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
    t = Table(title="Per GPU (ms per step; memory in GiB)", show_lines=False)
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
    if tiers:
        h = Table(title="Per host (GiB)")
        for col in ("host", "DDR / cap", "SSD / cap"):
            h.add_column(col, justify="right")
        for x in plan.hosts[:_MAX_GPU_ROWS]:
            h.add_row(str(x.host), f"{_gib(x.ddr_bytes)} / {_gib(x.ddr_cap_bytes)}",
                      f"{_gib(x.ssd_bytes)} / {_gib(x.ssd_cap_bytes)}")
        console.print(h)
    s = plan.summary
    console.print(f"[bold]step estimate[/] {_ms(s.step_time_s)} ms (slowest GPU), mean "
                  f"{_ms(s.mean_gpu_time_s)} ms, imbalance {s.imbalance:.3f}")
    console.print(f"[bold]lower bound[/] {_ms(s.lower_bound_s)} ms, gap {s.gap:.2%}  "
                  f"({s.lower_bound_note})")
    timing = f", planned in {planning_time_s:.2f} s" if planning_time_s is not None else ""
    det = f", CP-SAT {s.solver_det_time:.3g} deterministic s" if s.solver_det_time else ""
    console.print(f"[bold]solver[/] {s.solver}: {s.status}{timing}{det}")
    console.print("sharding: " + ", ".join(f"{k} {v}" for k, v in s.tables_per_type.items())
                  + "; tiers: " + ", ".join(f"{k} {v}" for k, v in s.tables_per_tier.items()))
    for d in s.decisions:
        console.print(f"  - {d}")
    for wmsg in s.warnings:
        console.print(f"[yellow]warning:[/] {wmsg}")
    console.print(f"plan {plan.plan_hash[:23]}..., schema {plan.schema_version}")
