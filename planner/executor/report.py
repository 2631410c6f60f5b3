"""The executor's report as tables: per rank, measured beside predicted; then the checks."""

from rich.console import Console
from rich.table import Table

from planner.executor.run import ExecutionReport

_PHASES = [  # (measured phases, predicted cost term)
    (("input_a2a",), "input_a2a"),
    (("lookup",), "lookup"),
    (("output_a2a_fwd", "output_a2a_bwd"), "output_a2a"),
    (("backward",), "backward"),
    (("allreduce",), "allreduce"),
]


def _b(x: float) -> str:
    return f"{x:,.0f}"


_MATCH = {True: "same", False: "different", None: "every rank predicted alike"}


def _t(x: float | None) -> str:
    """Seconds in the unit that fits."""
    if x is None:
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if abs(x) * f >= 1.0:
            return f"{x * f:.3g} {unit}"
    return f"{x * 1e9:.3g} ns"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _abs_pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def render_compare(rep: ExecutionReport, out: Console, cpu_clock: bool = False) -> None:
    """`--compare`: per rank and phase, predicted / measured / error, then the plan's line."""
    c = rep.compare_cpu if cpu_clock else rep.compare
    if not c:
        return
    plan = c["plan"]
    style = "" if plan["same_machine"] else "[bold yellow]"
    out.print(f"{style}{plan['hardware_note']}")
    phases = [ph for ph in ("input_a2a", "lookup", "cache_miss", "output_a2a_fwd", "backward",
                            "output_a2a_bwd", "allreduce", "other")
              if any(ph in r["phases"] for r in c["ranks"])]
    t = Table(title="seconds per step: predicted / measured (error = predicted/measured - 1); "
                    "compute: the rank's CPU time, collectives: "
                    f"{'their threads CPU time' if cpu_clock else 'wall after a barrier'}, "
                    "medians over the steps")
    t.add_column("rank", justify="right")
    for ph in phases:
        t.add_column(ph, justify="right")
    t.add_column("total", justify="right")
    t.add_column("unmodelled (loss, packing)", justify="right")
    for r in c["ranks"]:
        cells = []
        for ph in phases:
            v = r["phases"].get(ph)
            cells.append("-" if v is None else
                         f"{_t(v['predicted'])} / {_t(v['measured'])} {_pct(v['error'])}")
        u = r["unmodelled"]
        t.add_row(str(r["rank"]), *cells,
                  f"{_t(r['predicted_total'])} / {_t(r['measured_total'])} {_pct(r['error'])}",
                  f"{_t(u['loss_cpu'])}, {_t(u['packing_cpu'])}")
    out.print(t)
    sp = plan["spearman_ranks"]
    out.print(
        f"plan: step predicted {_t(plan['predicted_step_s'])}, measured "
        f"{_t(plan['measured_step_s'])}; mean |error| {_t(plan['mean_abs_error_s'])} "
        f"({_abs_pct(plan['mean_abs_rel_error'])} relative, median "
        f"{_abs_pct(plan['median_abs_rel_error'])}); Spearman over ranks "
        f"{'undefined (ties)' if sp is None else f'{sp:.3f}'}; predicted slowest rank "
        f"{plan['predicted_slowest']}, measured {plan['measured_slowest']}: "
        f"{_MATCH[plan['slowest_match']]}")


def render(rep: ExecutionReport, out: Console, compare: bool = False,
           cpu_clock: bool = False) -> None:
    out.print(f"plan {rep.plan_hash[:12]}: {rep.world} ranks on {rep.device}, batch {rep.batch} "
              f"per rank, {rep.steps} measured steps, rows x {rep.scale_rows:g}")
    if rep.kernels == "fbgemm":
        on_tbe = sorted(k for k, v in rep.piece_kernels.items() if v == "fbgemm")
        rest = {k: v for k, v in rep.piece_kernels.items() if v != "fbgemm"}
        out.print(f"kernels: FBGEMM TBE for {len(on_tbe)} pieces; torch for {len(rest)}"
                  + (f" ({'; '.join(f'{k} {v[7:]}' for k, v in sorted(rest.items()))})"
                     if rest else ""), markup=False)
    t = Table(title="bytes per step (measured / predicted)")
    t.add_column("rank", justify="right")
    for name in ("input lengths recv", "input ids recv", "output fwd sent", "output bwd recv",
                 "all-reduce sent"):
        t.add_column(name, justify="right")
    for r in rep.ranks:
        b = r["bytes"]
        t.add_row(str(r["rank"]), *[f"{_b(b[k]['measured'])} / {_b(b[k]['predicted'])}" for k in
                                    ("input_lengths", "input_ids", "output_fwd",
                                     "output_bwd", "allreduce")])
    out.print(t)
    if compare:
        render_compare(rep, out, cpu_clock)
    else:
        t = Table(title="seconds per step, wall (measured here / predicted for the plan's "
                        "hardware; --compare for per-rank CPU time and errors)")
        t.add_column("rank", justify="right")
        for _, name in _PHASES:
            t.add_column(name, justify="right")
        t.add_column("cache miss (pred.)", justify="right")
        for r in rep.ranks:
            m, p = r["seconds_measured"], r["seconds_predicted"]
            cells = [f"{sum(m.get(x, 0.0) for x in ms):.2e} / {p.get(name, 0.0):.2e}"
                     for ms, name in _PHASES]
            t.add_row(str(r["rank"]), *cells, f"{p.get('cache_miss', 0.0):.2e}")
        out.print(t)
    t = Table(title="memory held, bytes (measured / predicted)")
    t.add_column("rank", justify="right")
    for tier in ("hbm", "ddr", "ssd"):
        t.add_column(tier, justify="right")
    t.add_column("LFU counters (not modeled)", justify="right")
    for r in rep.ranks:
        mem = r["memory"]
        t.add_row(str(r["rank"]), *[f"{_b(mem[k]['measured'])} / {_b(mem[k]['predicted'])}"
                                    for k in ("hbm", "ddr", "ssd")], _b(r["executor_extra_ddr"]))
    out.print(t)
    if any("peak_memory" in r for r in rep.ranks):
        t = Table(title="memory peak, bytes, allocator-measured (per phase, over the measured "
                        "steps) / memory model")
        t.add_column("rank", justify="right")
        t.add_column("model", justify="right")
        t.add_column("step peak", justify="right")
        t.add_column("ratio", justify="right")
        t.add_column("held after init", justify="right")
        t.add_column("largest phase transients", justify="left")
        for r in rep.ranks:
            pm = r.get("peak_memory")
            if pm is None:
                continue
            tr = sorted(pm["phase_transient"].items(), key=lambda kv: -kv[1])[:3]
            t.add_row(str(r["rank"]), _b(pm["predicted"]), _b(pm["measured_step_peak"]),
                      f"{pm['ratio']:.3g}", _b(pm["held_after_init"]),
                      ", ".join(f"{k} +{_b(v)}" for k, v in tr))
        out.print(t)
    cached = [p for p in rep.pieces if p["hit_rate"]["predicted"] is not None]
    if cached:
        t = Table(title="cache hit rate (measured / predicted)")
        for c in ("table", "piece", "rank", "tier", "hit rate"):
            t.add_column(c)
        for p in cached:
            h = p["hit_rate"]
            meas = "-" if h["measured"] is None else f"{h['measured']:.4f}"
            t.add_row(p["table"], p["key"], str(p["rank"]), p["tier"],
                      f"{meas} / {h['predicted']:.4f}")
        out.print(t)
    t = Table(title="checks")
    t.add_column("")
    t.add_column("check")
    t.add_column("detail")
    for c in rep.checks:
        t.add_row("[green]pass[/]" if c.ok else "[red]FAIL[/]", c.name, c.detail)
    out.print(t)
